package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/storage"
)

// Claims, acks, nacks and extends of an Engine share transactions. Every delivery transaction
// locks the sub_partitions rows of its subscriptions and holds them until its commit is flushed;
// on a small machine, a transaction per claim and per ack (two per delivered batch and group), or
// per nack in a nack storm (a consumer that gives back every message while its downstream is
// down), spends the CPU on statements, round trips and WAL flushes, and the flushes queue behind
// each other. So the operations queue on a lane (subscription id modulo deliveryLanes): while a
// transaction of the lane runs, later operations wait, and the next transaction takes all of them,
// whatever their subscriptions, loading every subscription once (six statements for all of them,
// one round trip) and saving them with the COMMIT (one more). A lane with nothing running starts a transaction at
// once: an idle engine adds no delay.
//
// Lock order: a transaction locks its subscriptions in id order, each one's partitions in order,
// as every other transaction that locks several sub_partitions rows (retention: one partition,
// subscriptions in id order), so that transactions of several instances never deadlock.
//
// Operations of one subscription run in arrival order on the state loaded once (every delivery
// row and replayed DLQ entry: loadDue), so each gets the result it would have got alone: a run of
// acks together, claims, nacks and extends one by one. One that fails on its own (a cancelled
// subscription, a bad partition) fails alone; when the transaction fails, every operation runs
// again in a transaction of its own so that one cannot fail the others.
//
// A lane's transaction is bounded by Config.TxTimeout (runOps): without a deadline, a
// database that stops answering without closing the connection (a network black hole, a row lock
// another session holds, a stuck server) would hold every operation of the lane until TCP gives
// up, which can take hours. A transaction that exceeds it fails all of its operations (nacks and
// extends included) with a timeout error, and the lane goes on with the operations that queued
// meanwhile. Releases do not use the lanes: a member leaves rarely, and a release reads only the
// member's rows (loadMember); DeliveriesRelease bounds its transaction by the same deadline.

// deliveryLanes is the number of delivery transactions of an Engine that run at once.
const deliveryLanes = 2

// slowLaneTx is the duration above which a lane's transaction is logged (debug).
const slowLaneTx = 100 * time.Millisecond

// dop is a claim, an ack, a nack or an extend waiting for its lane.
type dop struct {
	sub    int64
	claim  *storage.DeliveriesClaimParams  // set for a claim
	nack   *storage.DeliveriesNackParams   // set for a nack
	extend *storage.DeliveriesExtendParams // set for an extend
	refs   []storage.DeliveryRef           // an ack's refs (an ack has none of the three above)
	// ackMember and ackGeneration are an ack's member and generation (ordered subscriptions).
	ackMember     string
	ackGeneration int64
	ackBatch      bool // a batch ack (storage.CheckBatchRefs)

	claimRes  *storage.DeliveriesClaimResult
	ackRes    *storage.DeliveriesAckResult
	nackRes   *storage.DeliveriesNackResult
	extendRes *storage.DeliveriesExtendResult
	err       error
	done      chan struct{} // closed when the results are set
	lead      chan []*dop   // hands this operation the next batch of its lane to run (which includes it)
}

// isAck reports whether op is an ack.
func (op *dop) isAck() bool { return op.claim == nil && op.nack == nil && op.extend == nil }

// setErr clears the results of op and sets its error.
func (op *dop) setErr(err error) {
	op.claimRes, op.ackRes, op.nackRes, op.extendRes, op.err = nil, nil, nil, nil, err
}

// opLane queues the operations of its subscriptions while one of its transactions runs.
type opLane struct {
	mu      sync.Mutex
	running bool
	pending []*dop
}

// submit runs op in a transaction of its lane and sets its results. It returns ctx's error, and
// leaves op unrun, only if ctx ends before op was taken into a transaction; once taken, op waits
// for the transaction whatever ctx does.
func (e *Engine) submit(ctx context.Context, op *dop) error {
	if err := e.checkOpen(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	op.done, op.lead = make(chan struct{}), make(chan []*dop, 1)
	lane := &e.lanes[uint64(op.sub)%deliveryLanes]
	lane.mu.Lock()
	if !lane.running {
		lane.running = true
		lane.mu.Unlock()
		e.runLane(ctx, lane, []*dop{op})
		return nil
	}
	lane.pending = append(lane.pending, op)
	lane.mu.Unlock()
	select {
	case <-op.done:
		return nil
	case batch := <-op.lead:
		e.runLane(ctx, lane, batch)
		return nil
	case <-ctx.Done():
	}
	lane.mu.Lock()
	if i := slices.Index(lane.pending, op); i >= 0 {
		lane.pending = slices.Delete(lane.pending, i, i+1)
		lane.mu.Unlock()
		return ctx.Err()
	}
	lane.mu.Unlock()
	select { // taken into a transaction already: wait for it, or run it
	case <-op.done:
	case batch := <-op.lead:
		e.runLane(ctx, lane, batch)
	}
	return nil
}

// runLane runs batch, then hands what queued meanwhile to the first of those operations, or
// marks the lane idle.
func (e *Engine) runLane(ctx context.Context, lane *opLane, batch []*dop) {
	e.laneTxs.Add(1)
	e.laneOps.Add(int64(len(batch)))
	t0 := time.Now()
	e.runOps(context.WithoutCancel(ctx), batch)
	if d := time.Since(t0); d > slowLaneTx {
		e.log.Debug("pgstore: slow delivery transaction", "duration", d, "operations", len(batch))
	}
	for _, op := range batch {
		close(op.done)
	}
	lane.mu.Lock()
	next := lane.pending
	lane.pending = nil
	if len(next) == 0 {
		lane.running = false
	}
	lane.mu.Unlock()
	if len(next) > 0 {
		next[0].lead <- next
	}
}

// runOps runs batch in one transaction bounded by Config.TxTimeout. If the transaction
// fails, each operation runs again alone; if it exceeded its deadline, every operation fails with
// the timeout error instead (see txTimeout).
//
// A timed-out transaction is not run again one by one: the database did not answer in time, and
// running the operations again, each waiting up to the deadline, would multiply the wait by the
// size of the batch for every operation of the lane. Its operations fail at once and the clients
// retry (TIMEOUT is retryable).
//
// A timeout once the batch carrying the COMMIT was sent leaves the outcome unknown: the backend
// may still run the COMMIT if the cancel request (below) comes after the lock it waited for was
// released, and PostgreSQL cancels a wait for a synchronous standby only after the local commit.
// That is safe for at-least-once delivery: a claim reported failed but committed leaves leases
// nobody was given, which expire, and the messages are delivered again (the attempt counts); an
// ack reported failed but committed is harmless to retry, the engine reporting its messages as
// AlreadyDone, not as an error; a nack reported failed but committed gave the messages back (a
// retry lists them as NotHeld), and an extend is set again by its retry.
//
// The connection is not reused: pgx closes a connection whose context ended in the middle of a
// query (after sending PostgreSQL a cancel request, so that its backend stops waiting and gives
// up its locks), and runPipeTx, which rolls back with a context of its own (no deadline from ctx,
// bounded by maxRollbackWait), finds it closed and releases it; the pool drops it.
func (e *Engine) runOps(ctx context.Context, batch []*dop) {
	tctx, cancel := context.WithTimeout(ctx, e.cfg.TxTimeout)
	var nacked []string
	err := e.pipeTx(tctx, func(tx pgx.Tx) error {
		nacked = nacked[:0]
		return e.opsTx(tctx, tx, batch, &nacked)
	})
	timedOut := tctx.Err() != nil // ctx itself has no deadline (runLane)
	cancel()
	switch {
	case err == nil:
		for _, topic := range nacked {
			e.announceToOthers(storage.Notification{Kind: storage.NotifyMessages, Topic: topic})
		}
		return
	case timedOut:
		err = e.txTimeout(err)
		e.log.Warn("pgstore: delivery transaction timed out", "timeout", e.cfg.TxTimeout, "operations", len(batch), "err", err)
		for _, op := range batch {
			op.setErr(err)
		}
		return
	case len(batch) > 1:
		e.log.Debug("pgstore: combined delivery transaction failed, running its operations one by one", "ops", len(batch), "err", err)
		for _, op := range batch {
			e.runOps(ctx, []*dop{op})
		}
		return
	}
	batch[0].setErr(err)
}

// txTimeout is the error of a request whose transaction (a lane's, a release, a publish, a DLQ
// or catalog operation, a read) failed with err after exceeding Config.TxTimeout. It wraps
// context.DeadlineExceeded, which the protocol reports as TIMEOUT (retryable: "the request may or
// may not have taken effect").
func (e *Engine) txTimeout(err error) error {
	if errors.As(err, new(*txTimeoutError)) {
		return err // already said
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &txTimeoutError{fmt.Errorf("pgstore: transaction exceeded tx_timeout %s: %w", e.cfg.TxTimeout, err)}
	}
	return &txTimeoutError{fmt.Errorf("pgstore: transaction exceeded tx_timeout %s: %w (%w)", e.cfg.TxTimeout, context.DeadlineExceeded, err)}
}

// txTimeoutError is txTimeout's error, so that it is not wrapped twice.
type txTimeoutError struct{ err error }

func (t *txTimeoutError) Error() string { return t.err.Error() }
func (t *txTimeoutError) Unwrap() error { return t.err }

// withTxTimeout runs fn (operation what: a release, a publish, a DLQ or catalog operation, a read,
// statistics) with ctx bounded by Config.TxTimeout. When fn fails after that deadline passed (and
// ctx itself has not ended), the error is txTimeout's, logged as a warning.
func withTxTimeout[T any](e *Engine, ctx context.Context, what string, fn func(ctx context.Context) (T, error)) (T, error) {
	tctx, cancel := context.WithTimeout(ctx, e.cfg.TxTimeout)
	defer cancel()
	res, err := fn(tctx)
	if err != nil && ctx.Err() == nil && tctx.Err() != nil && !errors.As(err, new(*txTimeoutError)) {
		err = e.txTimeout(err)
		e.log.Warn("pgstore: transaction timed out", "operation", what, "timeout", e.cfg.TxTimeout, "err", err)
		var zero T
		return zero, err
	}
	return res, err
}

// txLocksBounded runs fn in a transaction (retried after a serialization failure or a deadlock,
// as by Engine.tx) of which only the first part is bounded by Config.TxTimeout: waiting for a
// pooled connection, the BEGIN and fn's statements until fn calls locked, once it holds every lock
// it needs. What follows (a delete of as many rows as a subscription's DLQ holds, which may
// legitimately take longer, and the COMMIT) is bounded by ctx only. When the deadline passes
// first, the call fails with txTimeout's error (logged as a warning, operation what) and the
// transaction is rolled back; locked then returns an error wrapping context.DeadlineExceeded,
// which fn must return. When fn does not call locked, the whole transaction, COMMIT included, is
// bounded. Each attempt has a deadline of its own.
func (e *Engine) txLocksBounded(ctx context.Context, what string, fn func(ctx context.Context, tx pgx.Tx, locked func() error) error) error {
	if err := e.checkOpen(); err != nil {
		return err
	}
	const running, holding, timedOut = 0, 1, 2
	for attempt := 0; ; attempt++ {
		tctx, cancel := context.WithCancel(ctx)
		var phase atomic.Int32
		timer := time.AfterFunc(e.cfg.TxTimeout, func() {
			if phase.CompareAndSwap(running, timedOut) {
				cancel()
			}
		})
		done := func() error {
			if phase.CompareAndSwap(running, holding) || phase.Load() == holding {
				timer.Stop()
				return nil
			}
			return fmt.Errorf("pgstore: taking the locks: %w", context.DeadlineExceeded)
		}
		committing := false // fn succeeded: BeginTxFunc sends the COMMIT
		err := pgx.BeginTxFunc(tctx, e.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
			if err := fn(tctx, tx, done); err != nil {
				return err
			}
			committing = true
			return nil
		})
		timer.Stop()
		cancel()
		switch {
		case err == nil:
			return nil
		case phase.Load() == timedOut && ctx.Err() == nil:
			err = e.txTimeout(err)
			e.log.Warn("pgstore: transaction timed out", "operation", what, "timeout", e.cfg.TxTimeout, "err", err)
			return err
		case attempt < maxTxRetries && retryable(err):
			e.log.Debug("pgstore: retrying transaction", "attempt", attempt+1, "err", err)
			continue
		}
		return e.mapTxErr(err, committing)
	}
}

// opsTx runs the operations of batch in transaction tx, and appends to nacked the topics of the
// subscriptions whose nacks gave messages back (to announce once it committed).
func (e *Engine) opsTx(ctx context.Context, tx pgx.Tx, batch []*dop, nacked *[]string) error {
	now := e.now()
	var subs []int64
	bySub := map[int64][]*dop{}
	for _, op := range batch {
		op.setErr(nil)
		if bySub[op.sub] == nil {
			subs = append(subs, op.sub)
		}
		bySub[op.sub] = append(bySub[op.sub], op)
	}
	slices.Sort(subs) // the lock order

	b := &pgx.Batch{}
	wants := make([]loadWant, len(subs))
	for i, id := range subs {
		wants[i] = wantFor(bySub[id])
	}
	e.queueLoad(b, subs, loadDue, "", wants)
	br := tx.SendBatch(ctx, b)
	states, errs, err := e.readStates(br, subs, loadDue, wants)
	if err != nil {
		_ = br.Close()
		return err
	}
	for i, id := range subs {
		for _, op := range bySub[id] {
			op.err = errs[i]
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("pgstore: load delivery state: %w", err)
	}

	save := &pgx.Batch{}
	var saved []*dstate
	for i, id := range subs {
		st := states[i]
		if st == nil {
			continue
		}
		ops := bySub[id]
		if err := e.loadAckedRows(ctx, tx, st, ops); err != nil {
			return err
		}
		for j := 0; j < len(ops); {
			op := ops[j]
			switch {
			case op.isAck(): // a run of acks is applied together
				k := j + 1
				for k < len(ops) && ops[k].isAck() {
					k++
				}
				ackOn(st, st.fenceAcks(ops[j:k], now), now)
				j = k
				continue
			case st.fenceOp(op, now) != nil:
				op.err = st.fenceOp(op, now) // refused before changing anything
			case op.nack != nil:
				op.nackRes = nackOn(st, op.nack, now)
				if op.nackRes.Nacked > 0 && !slices.Contains(*nacked, st.sub.Topic) {
					*nacked = append(*nacked, st.sub.Topic)
				}
			case op.extend != nil:
				op.extendRes = extendOn(st, op.extend, now)
			default:
				res, err := e.claimOn(ctx, tx, st, op.claim, now)
				if errors.Is(err, errMessageMissing) {
					// st is half changed: not saved, so every operation of this subscription in
					// the transaction fails (retryable) and the others go on.
					for _, o := range ops {
						o.claimRes, o.ackRes, o.nackRes, o.extendRes, o.err = nil, nil, nil, nil, err
					}
					st = nil
					j = len(ops)
					continue
				}
				if err != nil && !opError(err) {
					return err
				}
				op.claimRes, op.err = res, err
			}
			j++
		}
		if st != nil {
			saved = append(saved, st)
		}
	}
	e.queueSave(save, saved, now)
	finalBatch(tx)
	if save.Len() == 0 {
		return nil // pipeTx sends the COMMIT alone
	}
	if err := tx.SendBatch(ctx, save).Close(); err != nil {
		return fmt.Errorf("pgstore: save delivery state: %w", err)
	}
	return nil
}

// opError reports whether err fails one operation only (found before the operation changed
// anything), not its transaction.
func opError(err error) bool {
	return errors.Is(err, storage.ErrSubscriptionNotFound) || errors.Is(err, storage.ErrSubscriptionNotActive) ||
		errors.Is(err, storage.ErrInvalidArgument) || errors.Is(err, storage.ErrStaleGeneration)
}
