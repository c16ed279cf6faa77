package pgstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

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
// starts a transaction at once: an idle engine adds no delay. The next transaction starts as soon
// as the running one holds its partitions' rows, and waits for them in PostgreSQL (laneTurn).
// Lanes exist while a topic has calls running or queued.
//
// Each call gets the answer it would have got alone: its positions, in its own message order;
// the keyless messages of each call go together to a partition of their own (planAppend); a
// producer id seen in an earlier call of the same transaction makes the later message a
// duplicate of the earlier one, as if the calls had run one after the other. When the combined
// transaction fails (one call's message is too large, a partition out of range, a database
// error the server reported), every call runs again alone, so that one cannot fail the others; a
// transaction that exceeded Config.TxTimeout fails all of its calls with the timeout instead (as a
// delivery lane's, see runOps), and so does a storage failure (unavailable, full, or a connection
// lost during the COMMIT, whose outcome is unknown: running the calls again could store their
// messages twice), with that failure (rerunAlone).

// maxCombinedMessages and maxCombinedBytes bound one combined append transaction (the first call
// is taken whatever its size).
const (
	maxCombinedMessages = 4096
	maxCombinedBytes    = 8 << 20
)

// appendOp is a MessagesAppend or MessagesAppendAsync call waiting for its topic's lane.
type appendOp struct {
	p     *storage.MessagesAppendParams
	bytes int
	res   *storage.MessagesAppendResult
	err   error
	// A MessagesAppend call waits on done and lead; a MessagesAppendAsync call has cb instead, and
	// a batch it leads runs on a goroutine of its own.
	done chan struct{}  // closed when res and err are set
	lead chan *laneTurn // hands this call the next batch of its lane to run (which includes it)
	cb   func(*storage.MessagesAppendResult, error)
}

// newAppendOp makes the operation of a call appending p.
func newAppendOp(p *storage.MessagesAppendParams, cb func(*storage.MessagesAppendResult, error)) *appendOp {
	op := &appendOp{p: p, cb: cb}
	if cb == nil {
		op.done, op.lead = make(chan struct{}), make(chan *laneTurn, 1)
	}
	for i := range p.Messages {
		op.bytes += appendSize(&p.Messages[i])
	}
	return op
}

// finish hands op its result.
func (op *appendOp) finish() {
	if op.cb != nil {
		op.cb(op.res, op.err)
		return
	}
	close(op.done)
}

// maxLaneTxs is how many transactions of one lane run at once: the newest one, once it holds the
// rows of its partitions, and the one before it, committing. See laneTurn.
const maxLaneTxs = 2

// A transaction starts before the one before it ended only for at least minEarlyMessages
// messages or minEarlyBytes bytes: every transaction costs the database some 200 us of CPU
// whatever it carries, and a trickle of publishes (an open-loop publisher) made one transaction of
// one or two messages each time the one before took its offsets, about twice as many as waiting
// for its end, which lets them gather. From 4 messages on the early start is worth its
// transaction: the commits of a partition follow one another without a round trip to the broker
// in between (10 synchronous publishers +17% against 64, 10,000 msg/s e2e p99 -40%; 2 was worse).
const (
	minEarlyMessages = 4
	minEarlyBytes    = 64 << 10
)

// laneTurn is one transaction of a lane: its batch, and what orders it after the one before.
//
// A transaction may start as soon as the lane's newest one took its offsets (holds its partitions'
// rows; laneOffsetsTaken), not only when it ended: it then waits in PostgreSQL for those rows and
// runs the moment the other commits, so the lane's commits follow one another without a round
// trip to the broker in between (the row lock is held through the commit's WAL flush, which is
// what a lane of one transaction at a time waited for). It must not commit if the one before it
// did not (its calls queued later, and the ones before may run again alone): expect holds, per
// partition, the id of the lane's last transaction that took the row before it, and
// takeOffsetsSQL fails the transaction (errLaneBroken, nothing written) unless that one committed
// (pg_xact_status; it has ended once this one holds the row); its calls then queue again at the
// head of the lane and run once no transaction of the lane runs. Other instances and the
// sequencer appending to the partition in between change nothing.
type laneTurn struct {
	batch  []*appendOp
	seq    uint64
	expect map[int32]string
	prev   <-chan struct{} // closed when the transaction before ended (nil: none)
	done   chan struct{}   // closed when this one ended
}

// enqueue queues op on its topic's lane. When the topic had no lane, op leads a turn at once: a
// MessagesAppend call's is returned (its caller runs it), a MessagesAppendAsync call's runs on
// a goroutine of its own (goLane). Otherwise op waits in the lane, which may hand it a turn at
// once. Once Close began it refuses op with storage.ErrClosed.
func (e *Engine) enqueue(op *appendOp) (*laneTurn, error) {
	al := &e.appends
	al.mu.Lock()
	defer al.mu.Unlock()
	if e.closing.Load() {
		return nil, storage.ErrClosed // Close waits for those queued before (waitAppends)
	}
	if al.lanes == nil {
		al.lanes = map[string]*appendLane{}
	}
	lane := al.lanes[op.p.Topic]
	if lane == nil {
		lane = &appendLane{}
		al.lanes[op.p.Topic] = lane
		t := lane.startLocked([]*appendOp{op}, nil)
		if op.cb != nil {
			e.goLane(op.p.Topic, t)
			return nil, nil
		}
		return t, nil
	}
	lane.pending = append(lane.pending, op)
	e.startNextLocked(op.p.Topic, lane)
	return nil, nil
}

// appendLanes holds the lanes of the topics that have appends running or queued.
type appendLanes struct {
	mu    sync.Mutex
	lanes map[string]*appendLane
	// async counts the goroutines running MessagesAppendAsync batches (goLane); idle is
	// signalled (on mu) when it or the lanes drop to none, for waitAppends.
	async int
	idle  *sync.Cond
	// checked holds the topics MessagesAppendAsync (checkAppend) and append transactions read
	// (rememberTopic).
	checked map[string]checkedTopic
}

// appendLane queues the appends of one topic while its transactions run (see laneTurn).
type appendLane struct {
	pending []*appendOp
	running int
	seq     uint64 // of the newest transaction started
	// open: the newest transaction took its offsets (expect: per partition, the id of the last
	// transaction that took it, this one or one before), so the next one may start before it ends.
	open     bool
	expect   map[int32]string
	lastDone chan struct{} // done of the newest transaction started
}

// startLocked makes the turn of a new transaction of the lane running batch.
func (lane *appendLane) startLocked(batch []*appendOp, expect map[int32]string) *laneTurn {
	lane.running++
	lane.seq++
	lane.open, lane.expect = false, nil
	t := &laneTurn{batch: batch, seq: lane.seq, expect: expect, prev: lane.lastDone, done: make(chan struct{})}
	lane.lastDone = t.done
	return t
}

// startNextLocked starts the next transaction of the lane when calls are queued and either no
// transaction runs or the newest one took its offsets and fewer than maxLaneTxs run.
func (e *Engine) startNextLocked(topic string, lane *appendLane) {
	if len(lane.pending) == 0 {
		return
	}
	var expect map[int32]string
	switch {
	case lane.running == 0:
	case lane.open && lane.running < maxLaneTxs:
		expect = lane.expect
	default:
		return
	}
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
	if lane.running > 0 && msgs < minEarlyMessages && bytes < minEarlyBytes {
		return // gather until the running transaction ends (or more arrive)
	}
	lane.pending = slices.Clone(lane.pending[len(next):])
	t := lane.startLocked(next, expect)
	if next[0].cb != nil {
		e.goLane(topic, t)
		return
	}
	next[0].lead <- t
}

// laneOffsetsTaken is called by t's transaction once it holds its partitions' rows, with its id
// per partition: if t is its lane's newest transaction, the next one may start.
func (e *Engine) laneOffsetsTaken(topic string, t *laneTurn, after map[int32]string) {
	al := &e.appends
	al.mu.Lock()
	defer al.mu.Unlock()
	lane := al.lanes[topic]
	if lane == nil || lane.seq != t.seq {
		return
	}
	expect := maps.Clone(t.expect)
	if expect == nil {
		expect = map[int32]string{}
	}
	maps.Copy(expect, after)
	lane.open, lane.expect = true, expect
	e.startNextLocked(topic, lane)
}

// laneEnd records the end of t's transaction: its calls queue again at the head of the lane when
// requeue (errLaneBroken), the next transaction starts if it may, and the lane goes away when
// nothing runs or waits.
func (e *Engine) laneEnd(topic string, t *laneTurn, requeue bool) {
	al := &e.appends
	al.mu.Lock()
	lane := al.lanes[topic]
	lane.running--
	if requeue {
		lane.pending = append(slices.Clone(t.batch), lane.pending...)
	}
	if lane.seq == t.seq {
		lane.open, lane.expect = false, nil // a next one waits until none runs
	}
	e.startNextLocked(topic, lane)
	if lane.running == 0 && len(lane.pending) == 0 {
		delete(al.lanes, topic)
		if len(al.lanes) == 0 && al.idle != nil {
			al.idle.Broadcast()
		}
	}
	al.mu.Unlock()
	close(t.done)
}

// submitAppend runs p in a transaction of its topic's lane and returns its result. It returns
// ctx's error, leaving p unwritten, only if ctx ends while p waits in the lane; once taken into a
// transaction, it waits for the transaction whatever ctx does.
func (e *Engine) submitAppend(ctx context.Context, p *storage.MessagesAppendParams) (*storage.MessagesAppendResult, error) {
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	op := newAppendOp(p, nil)
	t, err := e.enqueue(op)
	if err != nil {
		return nil, err
	}
	if t != nil {
		e.runAppendLane(ctx, p.Topic, t)
	}
	cancelled := ctx.Done()
	for {
		select {
		case <-op.done:
			return op.res, op.err
		case t := <-op.lead:
			e.runAppendLane(ctx, p.Topic, t)
		case <-cancelled:
			al := &e.appends
			al.mu.Lock()
			if lane := al.lanes[p.Topic]; lane != nil {
				if i := slices.Index(lane.pending, op); i >= 0 {
					lane.pending = slices.Delete(lane.pending, i, i+1)
					al.mu.Unlock()
					return nil, ctx.Err()
				}
			}
			al.mu.Unlock()
			cancelled = nil // taken into a transaction already: wait for it, or run it
		}
	}
}

// runAppendLane runs t's transaction and hands its calls their results, or queues them again
// (laneTurn).
func (e *Engine) runAppendLane(ctx context.Context, topic string, t *laneTurn) {
	e.appendTxs.Add(1)
	e.appendOps.Add(int64(len(t.batch)))
	requeue := e.runAppends(context.WithoutCancel(ctx), topic, t)
	if !requeue {
		for _, op := range t.batch {
			op.finish()
		}
	}
	e.laneEnd(topic, t, requeue)
}

// MessagesAppendAsync is MessagesAppend without a goroutine waiting for the commit
// (storage.AsyncAppender): it checks the batch against the topic's configuration (read at most
// topicCheckTTL ago; a batch that a newer configuration refuses fails through done), queues it on
// the topic's lane and returns; done is called from the lane's goroutine once the transaction that
// appended it committed or failed. So a connection's publish worker hands over its publishes one
// after the other and they share the lane's transactions (broker.PublishAsync): one connection
// publishes at the commit rate times the batch, not one commit per publish. Batches queued one
// after the other keep their order in each partition (the lane appends in queue order). Queued
// batches are not bounded by Config.TxTimeout until their transaction starts; each transaction
// is.
func (e *Engine) MessagesAppendAsync(p *storage.MessagesAppendParams, done func(*storage.MessagesAppendResult, error)) error {
	if err := validateAppend(p); err != nil {
		return err
	}
	if err := e.checkOpen(); err != nil {
		return err
	}
	if done == nil {
		return invalid("nil done function")
	}
	if err := e.checkAppend(p); err != nil {
		return err
	}
	_, err := e.enqueue(newAppendOp(p, done))
	return err
}

// goLane runs t, a batch that a MessagesAppendAsync call leads, on a goroutine of its own,
// counted in appendLanes.async: Close waits for them (waitAppends), so the batches queued before it
// are appended and answered before it returns, as the embedded engine's Close completes queued
// appends. Called with appends.mu held.
func (e *Engine) goLane(topic string, t *laneTurn) {
	al := &e.appends
	al.async++
	go func() {
		e.runAppendLane(context.Background(), topic, t)
		al.mu.Lock()
		if al.async--; al.async == 0 && al.idle != nil {
			al.idle.Broadcast()
		}
		al.mu.Unlock()
	}()
}

// waitAppends waits until no append runs or waits in a lane and no goroutine of goLane is left
// (Close: enqueue refuses new appends by then).
func (e *Engine) waitAppends() {
	al := &e.appends
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.idle == nil {
		al.idle = sync.NewCond(&al.mu)
	}
	for al.async > 0 || len(al.lanes) > 0 {
		al.idle.Wait()
	}
}

// topicCheckTTL is how long MessagesAppendAsync trusts a topic configuration it read.
const topicCheckTTL = time.Second

// checkedTopic is a topic that MessagesAppendAsync or an append's transaction read.
type checkedTopic struct {
	t  *topicRow
	at time.Time
}

// maxCheckedTopics bounds the configurations MessagesAppendAsync keeps (all are forgotten at once
// past it).
const maxCheckedTopics = 10000

// checkAppend refuses a batch that the topic's configuration refuses (unknown topic, a message
// too large, a partition out of range), reading the configuration at most topicCheckTTL ago
// (bounded by Config.TxTimeout). The append's transaction checks again.
func (e *Engine) checkAppend(p *storage.MessagesAppendParams) error {
	al := &e.appends
	al.mu.Lock()
	ct, ok := al.checked[p.Topic]
	al.mu.Unlock()
	if !ok || time.Since(ct.at) > topicCheckTTL {
		t, err := withTxTimeout(e, context.Background(), "publish", func(ctx context.Context) (*topicRow, error) {
			return e.loadTopic(ctx, e.pool, p.Topic, noLock)
		})
		if err != nil {
			return e.mapErr(err)
		}
		ct = checkedTopic{t: t, at: time.Now()}
		e.rememberTopic(t)
	}
	cfg := ct.t.cfg.WithDefaults()
	for i := range p.Messages {
		m := &p.Messages[i]
		if size := appendSize(m); size > cfg.MaxMessageBytes {
			return fmt.Errorf("%w: message %d of the batch is %d bytes, topic %q allows %d",
				storage.ErrMessageTooLarge, i, size, p.Topic, cfg.MaxMessageBytes)
		}
		if m.Partition != storage.PartitionAuto && (m.Partition < 0 || int(m.Partition) >= cfg.Partitions) {
			return invalid("message %d: partition %d out of range, topic %q has %d", i, m.Partition, p.Topic, cfg.Partitions)
		}
	}
	return nil
}

// rememberTopic keeps t (loaded now) for checkAppend and for planning appends without loading
// the topic (planAppend).
func (e *Engine) rememberTopic(t *topicRow) {
	al := &e.appends
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.checked == nil || len(al.checked) >= maxCheckedTopics {
		al.checked = map[string]checkedTopic{}
	}
	al.checked[t.name] = checkedTopic{t: t, at: time.Now()}
}

// rememberedTopic returns the topic rememberTopic kept under name, however old (an append planned
// from it checks it, see takeOffsetsSQL), or nil.
func (e *Engine) rememberedTopic(name string) *topicRow {
	al := &e.appends
	al.mu.Lock()
	defer al.mu.Unlock()
	return al.checked[name].t
}

// forgetTopic drops what rememberTopic kept of a topic that changed.
func (e *Engine) forgetTopic(name string) {
	al := &e.appends
	al.mu.Lock()
	defer al.mu.Unlock()
	delete(al.checked, name)
}

// runAppends appends the calls of t's batch in one transaction bounded by Config.TxTimeout and
// sets their results; see the comment at the top of the file for failures. It reports instead
// whether the calls must queue again (the transaction before t's did not commit, see laneTurn).
func (e *Engine) runAppends(ctx context.Context, topic string, t *laneTurn) (requeue bool) {
	tctx, cancel := context.WithTimeout(ctx, e.cfg.TxTimeout)
	defer cancel()
	batch := t.batch
	p, calls := batch[0].p, []int(nil)
	if len(batch) > 1 {
		p = &storage.MessagesAppendParams{Topic: batch[0].p.Topic}
		for _, op := range batch {
			calls = append(calls, len(p.Messages))
			p.Messages = append(p.Messages, op.p.Messages...)
		}
	}
	t0 := time.Now()
	seq := &appendSeq{expect: t.expect, prev: t.prev, took: func(after map[int32]string) { e.laneOffsetsTaken(topic, t, after) }}
	res, err := e.appendTx(tctx, p, calls, seq)
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
		return false
	case errors.Is(err, errLaneBroken):
		e.appendRequeues.Add(1)
		return true
	case tctx.Err() != nil && ctx.Err() == nil:
		err = e.txTimeout(err)
		e.log.Warn("pgstore: publish transaction timed out", "timeout", e.cfg.TxTimeout, "calls", len(batch), "err", err)
		for _, op := range batch {
			op.err = err
		}
		return false
	case len(batch) > 1 && rerunAlone(err):
		e.log.Debug("pgstore: combined publish transaction failed, running its calls one by one", "calls", len(batch), "err", err)
		// After the transaction before (its calls may run again alone too), one at a time.
		waitPrev(t.prev)
		for _, op := range batch {
			e.runAlone(ctx, op)
		}
		return false
	}
	if len(batch) > 1 {
		e.log.Warn("pgstore: combined publish transaction failed", "calls", len(batch), "err", err)
	}
	for _, op := range batch {
		op.err = err
	}
	return false
}

// runAlone appends op's call in a transaction of its own, once no earlier transaction of its
// lane runs, and sets its result.
func (e *Engine) runAlone(ctx context.Context, op *appendOp) {
	tctx, cancel := context.WithTimeout(ctx, e.cfg.TxTimeout)
	defer cancel()
	op.res, op.err = e.appendTx(tctx, op.p, nil, nil)
	if op.err != nil && tctx.Err() != nil && ctx.Err() == nil {
		op.err = e.txTimeout(op.err)
	}
}

// waitPrev waits until the transaction before ended (prev closed; nil: none).
func waitPrev(prev <-chan struct{}) {
	if prev != nil {
		<-prev
	}
}

// rerunAlone reports whether the calls of a combined append that failed with err may run again
// one by one: the transaction certainly did not commit and one call may be the cause (a storage
// sentinel such as ErrMessageTooLarge or ErrInvalidArgument, an error the server reported for a
// statement, or a producer id held by an open transaction). Not after a storage failure
// (storage.IOError: the database is unavailable or full, or the connection broke after the
// COMMIT was sent and the outcome is unknown, so running again could store the messages twice)
// nor after any other error.
func rerunAlone(err error) bool {
	if errors.Is(err, errProducerIDHeld) {
		return true // one call's producer id (claimErr)
	}
	var ioe *storage.IOError
	if errors.As(err, &ioe) || errors.Is(err, storage.ErrUnavailable) || errors.Is(err, storage.ErrFull) ||
		errors.Is(err, storage.ErrClosed) {
		return false
	}
	var pe *pgconn.PgError
	return isStorageErr(err) || errors.As(err, &pe)
}
