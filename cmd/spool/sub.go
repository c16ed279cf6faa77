package main

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spoolmq/spool/client"
	"github.com/spoolmq/spool/internal/cli"
	"github.com/spoolmq/spool/internal/names"
)

// maxCredit is the broker's cap on a subscription's credit (docs/protocol.md, server.max_credit).
const maxCredit = 65536

var subSpec = cmdSpec{
	name: "sub",
	args: "[flags] <topic-or-pattern>",
	desc: `Consumes a topic or a wildcard pattern (orders.*.created, orders.#) over the binary protocol and
prints each delivery as it arrives: topic, message id, attempt, key, headers, payload (quoted when
it is not plain one-line text). Each printed delivery is acked (acks are batched and all sent
before sub exits), or with --ack=false left unsettled: it is delivered again when its lease
expires, or at once when sub exits. sub exits after --max deliveries, or on SIGINT, cleanly:
deliveries it holds unsettled go back to the group at once.

Without --group, a QUEUE topic's messages are shared with its other consumers and a PUB_SUB
topic gets an ephemeral subscription that ends with sub. --from applies only when this call
creates the subscription (a durable group continues where its acks left off). When the broker
ends the subscription (group cancelled, topic deleted), sub exits with its error; with a pattern
it says so and goes on with the other topics. --ordered joins --group as an ordered group (a
PUB_SUB topic name, no pattern): each partition goes to one member at a time, in offset order;
members joining and leaving rebalance the partitions (spool group describe shows the assignment).
--batch N (with --ordered) takes per-key batches: per partition up to N consecutive messages,
extended so that the messages of one key written by one publish are never split, printed
together and acked as a unit.
--filter takes only the messages whose headers match an expression ('region=eu',
'tier in (gold,silver), !test'; grammar in docs/protocol.md); a message that no member of the
group matches, on any broker instance, is completed for the group without a delivery.

Credit: at most --max-in-flight deliveries are held at a time (default 2 x --concurrency, at
most --max; with --max and --ack=false, --max). A delivery holds its credit until the broker has
stored its ack, so raise it for throughput (--max-in-flight 256). Deliveries prefetched when sub
stops (beyond --max, or at SIGINT) are not printed and go back to the group when sub closes, with
their attempt count raised but not counted as failures (released, not nacked); --max-in-flight 1
prefetches nothing.`,
	examples: []string{
		`spool sub orders.created`,
		`spool sub --group billing --from beginning --max 10 'orders.#'`,
		`spool sub --json --from 2025-01-02T15:04:05Z orders.created | jq .payload`,
		`spool sub --from FROM_MESSAGE_ID=1:42 --max 5 orders.created   # the seed's names work too`,
		`spool sub --group billing --ack=false --max 1 orders.created   # peek: not acked, delivered again`,
	},
}

// messageIDPattern is a message id: offset, or partition:offset.
var messageIDPattern = regexp.MustCompile(`^[0-9]+(:[0-9]+)?$`)

func runSub(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(subSpec)
	addr := e.addrFlag(fs)
	group := fs.String("group", "", "consumer group (default: none; see above)")
	from := fs.String("from", "now", "where a new subscription starts: "+fromForms)
	maxN := fs.Int("max", 0, "exit after this many deliveries (0: run until SIGINT)")
	ack := fs.Bool("ack", true, "ack each delivery after printing it (false: leave it unsettled)")
	concurrency := fs.Int("concurrency", 1, "deliveries handled at a time")
	maxInFlight := fs.Int("max-in-flight", 0, "credit: most unsettled deliveries held at a time (0: see above)")
	jsonOut := fs.Bool("json", false, "print one JSON object per delivery")
	ordered := fs.Bool("ordered", false, "join --group as an ordered group: each partition to one member, in offset order")
	filter := fs.String("filter", "", "member filter over headers, e.g. 'region=eu' or 'tier in (gold,silver), !test'")
	batch := fs.Int("batch", 0, "with --ordered: per-key batches of up to this many messages per partition, acked as a unit (1 to 1000)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, 1, "<topic-or-pattern>"); err != nil {
		return err
	}
	start, err := parseStart(*from)
	if err != nil {
		return usagef(fs, "sub: %v", err)
	}
	switch {
	case *maxN < 0:
		return usagef(fs, "sub: --max must not be negative, got %d", *maxN)
	case *ordered && *group == "":
		return usagef(fs, "sub: --ordered needs --group")
	case *ordered && *filter != "":
		return usagef(fs, "sub: --filter does not go with --ordered (a partition's owner gets all its messages)")
	case *batch != 0 && !*ordered:
		return usagef(fs, "sub: --batch needs --ordered")
	case *batch < 0 || *batch > 1000:
		return usagef(fs, "sub: --batch must be between 1 and 1000, got %d", *batch)
	case *batch != 0 && !*ack:
		return usagef(fs, "sub: --batch does not go with --ack=false (a batch is settled as a unit)")
	case *concurrency < 1 || *concurrency > maxCredit:
		return usagef(fs, "sub: --concurrency must be between 1 and %d, got %d", maxCredit, *concurrency)
	case *maxInFlight < 0 || *maxInFlight > maxCredit:
		return usagef(fs, "sub: --max-in-flight must be between 0 and %d, got %d", maxCredit, *maxInFlight)
	}
	credit := *maxInFlight
	if credit == 0 && *maxN > 0 {
		if *ack {
			credit = min(2**concurrency, *maxN, maxCredit)
		} else {
			credit = min(*maxN, maxCredit)
		}
	}

	// A subscription the broker ends (its group cancelled, its topic deleted) leaves the handle
	// open for the pattern's other topics: for a topic name, sub ends with the broker's reason.
	ended := &subEnded{e: e, pattern: names.IsPattern(pos[0]), err: make(chan error, 1)}
	c, err := e.dial(ctx, *addr, "sub", ended)
	if err != nil {
		return err
	}
	defer func() {
		// After the Close below this is a no-op; it matters when Subscribe failed.
		cctx, cancel := closeCtx(ctx)
		defer cancel()
		_ = c.Close(cctx)
	}()

	s := &subscriber{e: e, max: int64(*maxN), ack: *ack, reached: make(chan struct{})}
	if *jsonOut {
		s.jsonOut = cli.NewJSONLines(e.stdout)
	}
	opts := []client.SubscribeOpt{client.Concurrency(*concurrency)}
	if !*ack {
		opts = append(opts, client.ManualAck())
	}
	params := client.SubscribeParams{Topic: pos[0], Group: *group, MaxInFlight: credit, Start: start, Ordered: *ordered,
		Filter: *filter, BatchSize: *batch}
	var sub *client.Subscription
	if *batch > 0 {
		sub, err = c.SubscribeBatch(ctx, params, s.handleBatch, opts...)
	} else {
		sub, err = c.Subscribe(ctx, params, s.handle, opts...)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil // SIGINT while connecting
		}
		return err
	}
	var endErr error
	select {
	case <-ctx.Done():
	case <-s.reached:
	case <-sub.Done():
	case endErr = <-ended.err:
	}
	// The clean shutdown gets its own time, however long sub ran.
	cctx, cancel := closeCtx(ctx)
	defer cancel()
	// Close waits for the handlers running, sends their acks, then unsubscribes.
	closeErr := sub.Close(cctx)
	if err := sub.Err(); err != nil {
		return err
	}
	if endErr != nil {
		return endErr
	}
	if err := c.Close(cctx); err != nil && closeErr == nil {
		closeErr = err
	}
	if closeErr != nil {
		return fmt.Errorf("closing the subscription: %w", closeErr)
	}
	return nil
}

// subEnded receives the broker's SubscriptionEnded pushes: for a topic name it ends sub, for a
// pattern it prints a notice (the other topics go on). It also reports acks that failed.
type subEnded struct {
	e       *cliEnv
	pattern bool
	err     chan error
}

// OnSubscriptionEnded implements client.SubscriptionEndedHook.
func (h *subEnded) OnSubscriptionEnded(ev client.SubscriptionEndedEvent) {
	if h.pattern && !ev.HandleClosed {
		group := ev.Group
		if group == "" {
			group = "(none)"
		}
		fmt.Fprintf(h.e.stderr, "spool: the subscription of group %s on topic %s ended: %s\n", group, ev.Topic, errorText(ev.Err))
		return
	}
	err := ev.Err
	if err == nil {
		err = fmt.Errorf("the broker ended the subscription on %s", ev.Topic)
	}
	select {
	case h.err <- err:
	default:
	}
}

// OnHandle implements client.HandleHook: an ack that could not be sent is reported (the broker
// delivers the message again).
func (h *subEnded) OnHandle(ev client.HandleEvent) {
	if ev.Err == nil && ev.SettleErr != nil {
		fmt.Fprintf(h.e.stderr, "spool: an ack on %s failed (%s); the broker will deliver the message again\n", ev.Topic, errorText(ev.SettleErr))
	}
}

// subscriber prints deliveries; its handle runs on the subscription's handler goroutines.
type subscriber struct {
	e       *cliEnv
	jsonOut *cli.JSONLines
	max     int64
	ack     bool
	// reached is closed when the max-th delivery is being printed.
	reached chan struct{}

	mu sync.Mutex
	// n counts the deliveries printed.
	n int64
}

// errNotHandled leaves a delivery that arrived after the max-th unsettled: sub's close releases
// it (back to the group without counting as a failure, as a nack would).
var errNotHandled = fmt.Errorf("spool sub: --max reached before this delivery was handled: %w", client.ErrUnsettled)

// handle prints a delivery. With --ack (automatic settlement) the nil return acks it, coalesced
// with the others and sent before the subscription's Close returns; errNotHandled leaves it to
// the close, which releases it. With --ack=false (ManualAck) the return value only reaches the logs and
// nothing is settled: the unsubscribe at exit releases what sub holds.
func (s *subscriber) handle(_ context.Context, d *client.Delivery) error {
	s.mu.Lock()
	if s.max > 0 && s.n >= s.max {
		s.mu.Unlock()
		return errNotHandled
	}
	s.n++
	if s.n == s.max {
		close(s.reached)
	}
	s.mu.Unlock()
	s.print(d)
	return nil
}

// handleBatch prints a per-key batch (--batch); the nil return acks it as a unit. With --max it
// is printed whole even past --max (a batch is not split); one that arrives after the max-th
// delivery is left to the close, which releases it.
func (s *subscriber) handleBatch(_ context.Context, batch []*client.Delivery) error {
	s.mu.Lock()
	if s.max > 0 && s.n >= s.max {
		s.mu.Unlock()
		return errNotHandled
	}
	before := s.n
	s.n += int64(len(batch))
	if s.max > 0 && before < s.max && s.n >= s.max {
		close(s.reached)
	}
	s.mu.Unlock()
	for _, d := range batch {
		s.print(d)
	}
	return nil
}

// subJSON is the --json line of a delivery: the admin API's message shape (key and payload as
// text when valid UTF-8, else base64) with the delivery's attempt and lease.
type subJSON struct {
	Topic          string            `json:"topic"`
	ID             string            `json:"id"`
	Partition      int32             `json:"partition"`
	Offset         int64             `json:"offset"`
	Attempt        int               `json:"attempt"`
	Key            *string           `json:"key,omitempty"`
	KeyBase64      *string           `json:"key_base64,omitempty"`
	Headers        map[string]string `json:"headers,omitempty"`
	Payload        *string           `json:"payload,omitempty"`
	PayloadBase64  *string           `json:"payload_base64,omitempty"`
	PublishedAt    time.Time         `json:"published_at"`
	ProducerID     string            `json:"producer_id,omitempty"`
	SubscriptionID int64             `json:"subscription_id"`
	LeaseDeadline  time.Time         `json:"lease_deadline"`
	// BatchOffset and BatchLen name the delivery's per-key batch (--batch): its first offset and
	// size.
	BatchOffset *int64 `json:"batch_offset,omitempty"`
	BatchLen    int    `json:"batch_len,omitempty"`
	// Acked says sub acks the delivery right after printing it (false with --ack=false); a failed
	// ack is reported on stderr.
	Acked bool `json:"acked"`
}

func (s *subscriber) print(d *client.Delivery) {
	if s.jsonOut != nil {
		out := subJSON{Topic: d.Topic, ID: d.MessageID(), Partition: d.Partition, Offset: d.Offset, Attempt: d.Attempt,
			Headers: d.Headers, PublishedAt: d.PublishTime, ProducerID: d.ProducerID,
			SubscriptionID: d.SubscriptionID, LeaseDeadline: d.LeaseDeadline, Acked: s.ack}
		if len(d.Key) > 0 {
			out.Key, out.KeyBase64 = cli.TextOrBase64(d.Key)
		}
		out.Payload, out.PayloadBase64 = cli.TextOrBase64(d.Payload)
		if d.BatchLen > 0 {
			out.BatchOffset, out.BatchLen = &d.BatchOffset, d.BatchLen
		}
		_ = s.jsonOut.Write(out)
		return
	}
	fmt.Fprintln(s.e.stdout, deliveryLine(d))
}

// deliveryLine is the human line of a delivery:
//
//	orders.created 0:42 attempt=1 key=user-7 [trace=abc] {"id":1}
//
// (the message id is 42 alone on a one-partition topic).
func deliveryLine(d *client.Delivery) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s attempt=%d", d.Topic, d.MessageID(), d.Attempt)
	if d.BatchLen > 0 {
		fmt.Fprintf(&b, " batch=%d+%d", d.BatchOffset, d.BatchLen) // first offset + size
	}
	if len(d.Key) > 0 {
		b.WriteString(" key=" + cli.Text(d.Key))
	}
	if len(d.Headers) > 0 {
		b.WriteString(" [")
		for i, k := range slices.Sorted(maps.Keys(d.Headers)) {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(cli.Cell(k) + "=" + cli.Cell(d.Headers[k]))
		}
		b.WriteByte(']')
	}
	b.WriteString(" " + cli.Text(d.Payload))
	return b.String()
}
