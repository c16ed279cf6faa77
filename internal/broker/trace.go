package broker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// CorrelationHeader is the message header that names a message's correlation id: every DEBUG log
// line of the broker about the message (published, delivered, acked, nacked) carries it as the
// correlation_id attribute, so that one message can be traced end to end (seed 002 M4-13).
const CorrelationHeader = "correlation_id"

// DefaultSlowOperation is the duration above which a broker operation (publish, claim, ack, nack,
// read, retention run) is logged at WARN (seed 002 M4-13: "operations slower than 100 ms are
// logged").
const DefaultSlowOperation = 100 * time.Millisecond

// maxTracedLeases bounds the correlation ids the tracer remembers for leased deliveries (to name
// them in the ack and nack lines). Past it the map is emptied: some ack lines then lack the id.
const maxTracedLeases = 1 << 16

// tracer writes the per-message DEBUG lines and the slow-operation WARN lines. Its methods cost a
// level check when DEBUG is off and nothing is slow.
type tracer struct {
	logger *slog.Logger
	// slow is the slow-operation threshold; negative: off.
	slow time.Duration
	// now measures operations (real time: the broker's clock may be a test's fake clock).
	now func() time.Time

	mu sync.Mutex
	// leases maps leased deliveries that carry a correlation id to it, from delivery to settling.
	leases map[leaseKey]string
}

func newTracer(logger *slog.Logger, slow time.Duration) *tracer {
	if slow == 0 {
		slow = DefaultSlowOperation
	}
	return &tracer{logger: logger, slow: slow, now: time.Now, leases: make(map[leaseKey]string)}
}

func (t *tracer) debug(ctx context.Context) bool { return t.logger.Enabled(ctx, slog.LevelDebug) }

// isSlow reports how long an operation started at start took, and whether that is over the
// threshold. Callers build the attributes of logSlow only then: the fast path allocates nothing.
func (t *tracer) isSlow(start time.Time) (time.Duration, bool) {
	if t.slow < 0 {
		return 0, false
	}
	took := t.now().Sub(start)
	return took, took > t.slow
}

// logSlow logs an operation isSlow found slow at WARN.
func (t *tracer) logSlow(ctx context.Context, op string, took time.Duration, attrs ...slog.Attr) {
	attrs = append(attrs, slog.String("op", op), slog.Duration("took", took), slog.Duration("threshold", t.slow))
	t.logger.LogAttrs(context.WithoutCancel(ctx), slog.LevelWarn, "slow broker operation", attrs...)
}

// correlationIDs returns the correlation ids of msgs, nil when DEBUG is off or none has one
// (taken before an asynchronous append, after which the caller may reuse msgs).
func (t *tracer) correlationIDs(ctx context.Context, msgs []storage.AppendMessage) []string {
	if !t.debug(ctx) {
		return nil
	}
	var ids []string
	for i, m := range msgs {
		if c := m.Headers[CorrelationHeader]; c != "" {
			if ids == nil {
				ids = make([]string, len(msgs))
			}
			ids[i] = c
		}
	}
	return ids
}

// published logs each message of a successful publish at DEBUG; ids are correlationIDs(msgs).
func (t *tracer) published(ctx context.Context, topic string, ids []string, pos []storage.MessagePosition) {
	if !t.debug(ctx) {
		return
	}
	for i, p := range pos {
		attrs := []slog.Attr{slog.String("topic", topic), slog.Int("partition", int(p.Partition)), slog.Int64("offset", p.Offset)}
		if p.Duplicate {
			attrs = append(attrs, slog.Bool("duplicate", true))
		}
		if i < len(ids) && ids[i] != "" {
			attrs = append(attrs, slog.String("correlation_id", ids[i]))
		}
		t.logger.LogAttrs(ctx, slog.LevelDebug, "message published", attrs...)
	}
}

// delivered logs deliveries claimed for member on subscription subID of topic at DEBUG and remembers their
// correlation ids for the ack and nack lines.
func (t *tracer) delivered(member, topic string, subID int64, ds []*storage.Delivery) {
	ctx := context.Background()
	if len(ds) == 0 || !t.debug(ctx) {
		return
	}
	for _, d := range ds {
		attrs := []slog.Attr{slog.String("topic", topic), slog.Int64("subscription", subID), slog.String("member", member),
			slog.Int("partition", int(d.Partition)), slog.Int64("offset", d.Offset), slog.Int("attempt", d.Attempt)}
		if c := d.Message.Headers[CorrelationHeader]; c != "" {
			attrs = append(attrs, slog.String("correlation_id", c))
			t.mu.Lock()
			if len(t.leases) >= maxTracedLeases {
				clear(t.leases)
			}
			t.leases[leaseKey{sub: subID, partition: d.Partition, offset: d.Offset}] = c
			t.mu.Unlock()
		}
		t.logger.LogAttrs(ctx, slog.LevelDebug, "message delivered", attrs...)
	}
}

// settled logs refs of subscription subID acked or nacked (what) by member at DEBUG, with the
// correlation ids remembered at delivery, and forgets them.
func (t *tracer) settled(ctx context.Context, what string, subID int64, member string, refs []storage.DeliveryRef, attrs ...slog.Attr) {
	if !t.debug(ctx) {
		return
	}
	for _, r := range refs {
		k := leaseKey{sub: subID, partition: r.Partition, offset: r.Offset}
		t.mu.Lock()
		c, ok := t.leases[k]
		delete(t.leases, k)
		t.mu.Unlock()
		line := append([]slog.Attr{slog.Int64("subscription", subID), slog.String("member", member),
			slog.Int("partition", int(r.Partition)), slog.Int64("offset", r.Offset)}, attrs...)
		if ok {
			line = append(line, slog.String("correlation_id", c))
		}
		t.logger.LogAttrs(ctx, slog.LevelDebug, "message "+what, line...)
	}
}
