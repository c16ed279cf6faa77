package pgstore

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Broker publishes (MessagesAppend) of one topic share transactions. An append locks the rows of
// its partitions in spool.partitions until it commits (that is what keeps offsets gapless in
// visibility order), so appends of one partition commit one after the other: with a transaction
// each, a partition's publish rate is one commit per message (~1,000/s on a small machine, each
// commit a WAL flush), however many publishers wait. So the calls of a topic queue on its lane:
// while a transaction of the topic runs, the calls that arrive wait, and the next transaction
// appends all of them (up to maxCombinedMessages messages or maxCombinedBytes), one topic load,
// one UPDATE per partition, one INSERT and one COMMIT for the lot. A topic with nothing running
// starts a transaction at once: an idle engine adds no delay. Lanes exist while a topic has calls
// running or queued.
//
// Each call gets the answer it would have got alone: its positions, in its own message order;
// the keyless messages of each call go together to a partition of their own (planAppend); a
// producer id seen in an earlier call of the same transaction makes the later message a
// duplicate of the earlier one, as if the calls had run one after the other. When the combined
// transaction fails (one call's message is too large, a partition out of range, a database
// error), every call runs again alone, so that one cannot fail the others; a transaction that
// exceeded Config.TxTimeout fails all of its calls with the timeout instead (as a delivery lane's,
// see runOps).

// maxCombinedMessages and maxCombinedBytes bound one combined append transaction (the first call
// is taken whatever its size).
const (
	maxCombinedMessages = 4096
	maxCombinedBytes    = 8 << 20
)

// appendOp is a MessagesAppend call waiting for its topic's lane.
type appendOp struct {
	p     *storage.MessagesAppendParams
	bytes int
	res   *storage.MessagesAppendResult
	err   error
	done  chan struct{}    // closed when res and err are set
	lead  chan []*appendOp // hands this call the next batch of its lane to run (which includes it)
}

// appendLanes holds the lanes of the topics that have appends running or queued.
type appendLanes struct {
	mu    sync.Mutex
	lanes map[string]*appendLane
}

// appendLane queues the appends of one topic while one of its transactions runs.
type appendLane struct {
	pending []*appendOp
}

// submitAppend runs p in a transaction of its topic's lane and returns its result. It returns
// ctx's error, leaving p unwritten, only if ctx ends before p was taken into a transaction; once
// taken, it waits for the transaction whatever ctx does.
func (e *Engine) submitAppend(ctx context.Context, p *storage.MessagesAppendParams) (*storage.MessagesAppendResult, error) {
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	op := &appendOp{p: p, done: make(chan struct{}), lead: make(chan []*appendOp, 1)}
	for i := range p.Messages {
		op.bytes += appendSize(&p.Messages[i])
	}
	al := &e.appends
	al.mu.Lock()
	if al.lanes == nil {
		al.lanes = map[string]*appendLane{}
	}
	lane := al.lanes[p.Topic]
	if lane == nil {
		al.lanes[p.Topic] = &appendLane{}
		al.mu.Unlock()
		e.runAppendLane(ctx, p.Topic, []*appendOp{op})
		return op.res, op.err
	}
	lane.pending = append(lane.pending, op)
	al.mu.Unlock()
	select {
	case <-op.done:
		return op.res, op.err
	case batch := <-op.lead:
		e.runAppendLane(ctx, p.Topic, batch)
		return op.res, op.err
	case <-ctx.Done():
	}
	al.mu.Lock()
	if i := slices.Index(lane.pending, op); i >= 0 {
		lane.pending = slices.Delete(lane.pending, i, i+1)
		al.mu.Unlock()
		return nil, ctx.Err()
	}
	al.mu.Unlock()
	select { // taken into a transaction already: wait for it, or run it
	case <-op.done:
	case batch := <-op.lead:
		e.runAppendLane(ctx, p.Topic, batch)
	}
	return op.res, op.err
}

// runAppendLane runs batch, then hands the next batch of what queued meanwhile to its first
// call, or removes the topic's lane when nothing did.
func (e *Engine) runAppendLane(ctx context.Context, topic string, batch []*appendOp) {
	e.appendTxs.Add(1)
	e.appendOps.Add(int64(len(batch)))
	e.runAppends(context.WithoutCancel(ctx), batch)
	for _, op := range batch {
		close(op.done)
	}
	al := &e.appends
	al.mu.Lock()
	lane := al.lanes[topic]
	var next []*appendOp
	msgs, bytes := 0, 0
	for len(next) < len(lane.pending) {
		op := lane.pending[len(next)]
		if len(next) > 0 && (msgs+len(op.p.Messages) > maxCombinedMessages || bytes+op.bytes > maxCombinedBytes) {
			break
		}
		next = append(next, op)
		msgs += len(op.p.Messages)
		bytes += op.bytes
	}
	lane.pending = slices.Clone(lane.pending[len(next):])
	if len(next) == 0 {
		delete(al.lanes, topic)
	}
	al.mu.Unlock()
	if len(next) > 0 {
		next[0].lead <- next
	}
}

// runAppends appends the calls of batch in one transaction bounded by Config.TxTimeout and sets
// their results; see the comment at the top of the file for failures.
func (e *Engine) runAppends(ctx context.Context, batch []*appendOp) {
	tctx, cancel := context.WithTimeout(ctx, e.cfg.TxTimeout)
	defer cancel()
	p, calls := batch[0].p, []int(nil)
	if len(batch) > 1 {
		p = &storage.MessagesAppendParams{Topic: batch[0].p.Topic}
		for _, op := range batch {
			calls = append(calls, len(p.Messages))
			p.Messages = append(p.Messages, op.p.Messages...)
		}
	}
	t0 := time.Now()
	res, err := e.appendTx(tctx, p, calls)
	if d := time.Since(t0); d > slowLaneTx {
		e.log.Debug("pgstore: slow publish transaction", "duration", d, "calls", len(batch), "messages", len(p.Messages))
	}
	switch {
	case err == nil:
		for i, op := range batch {
			if calls == nil {
				op.res = res
				break
			}
			n := len(op.p.Messages)
			op.res = &storage.MessagesAppendResult{Positions: res.Positions[calls[i] : calls[i]+n : calls[i]+n]}
		}
		return
	case tctx.Err() != nil && ctx.Err() == nil:
		err = e.txTimeout(err)
		e.log.Warn("pgstore: publish transaction timed out", "timeout", e.cfg.TxTimeout, "calls", len(batch), "err", err)
		for _, op := range batch {
			op.err = err
		}
		return
	case len(batch) > 1:
		e.log.Debug("pgstore: combined publish transaction failed, running its calls one by one", "calls", len(batch), "err", err)
		for _, op := range batch {
			e.runAppends(ctx, []*appendOp{op})
		}
		return
	}
	batch[0].err = err
}
