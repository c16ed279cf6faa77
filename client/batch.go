package client

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/spoolmq/spool/protocol"
)

// BatchHandler processes one per-key batch of an ordered subscription (SubscribeBatch): the
// consecutive messages of one partition, in offset order. A nil return acks the whole batch, an
// error nacks the whole batch (redelivered whole, before any later message of its partition,
// after NackDelay, or as NackWithDelay and ToDLQ say; ErrUnsettled settles nothing). The deliveries are not settled one by one:
// Ack and Nack of one delivery of a batch of several fail with an error wrapping
// protocol.ErrInvalidArgument and send nothing (the broker refuses part of a batch, and would
// refuse with it the acks of other subscriptions that share its Ack frame). ctx is as for
// Handler; a panic is recovered and treated as an error.
type BatchHandler func(ctx context.Context, batch []*Delivery) error

// SubscribeBatch is Subscribe for an ordered member that takes per-key batches: p.Ordered and
// p.BatchSize (1 to 1000) are required. Per partition it owns, the member gets one batch at a
// time, up to BatchSize messages, extended so that the messages of one key written by one publish
// are never split between batches (the extension may take the member past MaxInFlight by one
// batch: docs/protocol.md section 8.1.2). Handlers run on Concurrency goroutines, one batch per
// call; batches of different partitions may run at the same time. Not with ManualAck. Needs a
// broker speaking protocol version 4.
func (c *Client) SubscribeBatch(ctx context.Context, p SubscribeParams, handler BatchHandler, opts ...SubscribeOpt) (*Subscription, error) {
	cfg, err := newSubConfig(opts)
	if err != nil {
		return nil, err
	}
	switch {
	case handler == nil:
		return nil, fmt.Errorf("client: subscribe: %w: nil batch handler", protocol.ErrInvalidArgument)
	case !p.Ordered:
		return nil, fmt.Errorf("client: subscribe: %w: batches are for ordered subscriptions (Ordered)", protocol.ErrInvalidArgument)
	case p.BatchSize < 1 || p.BatchSize > maxBatchSize:
		return nil, fmt.Errorf("client: subscribe: %w: BatchSize %d: want 1 to %d", protocol.ErrInvalidArgument, p.BatchSize, maxBatchSize)
	case cfg.manualAck:
		return nil, fmt.Errorf("client: subscribe: %w: ManualAck is not for batch handlers (a batch is settled as a unit by the handler's return)", protocol.ErrInvalidArgument)
	}
	return c.subscribe(ctx, p, nil, handler, opts)
}

// maxBatchSize is the broker's bound on SubscribeParams.BatchSize.
const maxBatchSize = 1000

// batchKey names a batch arriving: its subscription, partition and first offset.
type batchKey struct {
	sub       int64
	partition int32
	offset    int64
}

// collectLocked adds d (of wire delivery pd) to its batch and returns the batch's first delivery,
// carrying the whole batch, once all BatchLen arrived (nil until then; at once for BatchLen 0 or
// 1). The
// broker sends a batch in offset order, possibly over several Deliver frames. s.mu must be held.
func (s *Subscription) collectLocked(d *Delivery, pd *protocol.Delivery) *Delivery {
	if pd.BatchLen <= 1 {
		d.batch = []*Delivery{d}
		return d
	}
	k := batchKey{sub: pd.SubscriptionID, partition: pd.Partition, offset: pd.BatchOffset}
	if s.pending == nil {
		s.pending = make(map[batchKey][]*Delivery)
	}
	ds := append(s.pending[k], d)
	if len(ds) < int(pd.BatchLen) {
		s.pending[k] = ds
		return nil
	}
	delete(s.pending, k)
	ds[0].batch = ds
	return ds[0]
}

// runBatchHandler calls the batch handler, turning a panic into an error.
func (s *Subscription) runBatchHandler(batch []*Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.logger.Error("panic in a batch handler", slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			err = fmt.Errorf("client: handler panic: %v", r)
		}
	}()
	return s.batchHandler(s.ctx, batch)
}

// settleBatch acks (err == nil) or nacks the whole batch in one frame, without waiting for the
// broker's answer (one Ack frame: the coalesced acks of single deliveries could cut a batch
// between two frames, which the broker would refuse).
func (s *Subscription) settleBatch(batch []*Delivery, err error) error {
	// Every ref, also of a one-message batch the handler settled itself (an idempotent ack);
	// the deliveries of a larger batch cannot be settled alone (Delivery.partOfBatch).
	refs := make([]protocol.Ref, 0, len(batch))
	for _, d := range batch {
		d.settled.Store(true)
		refs = append(refs, d.ref)
	}
	cn := batch[0].cn
	if cn.isDead() {
		return cn.lostErr()
	}
	var req protocol.ClientMessage = &protocol.Ack{Refs: refs}
	if err != nil {
		nack := s.nackRequest(batch[0], err)
		nack.Refs = refs
		req = nack
	}
	_, serr := cn.start(s.c.rootCtx, req, func(cl *call, _ bool) {
		if cl.err != nil {
			s.logger.Warn("settling a batch failed", slog.String("request", req.Opcode().String()), slog.Int("messages", len(refs)),
				slog.Int("partition", int(batch[0].Partition)), slog.Int64("offset", batch[0].Offset), slog.Any("error", cl.err))
		}
	}, false, true)
	return serr
}
