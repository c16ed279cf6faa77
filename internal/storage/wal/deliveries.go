package wal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/policy"
	"github.com/spoolmq/spool/internal/storage/wal/substate"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

// claimReadChunk is how many records a claim reads from a log at a time (it looks at no more than
// policy.ScanLimit records that it does not deliver).
const claimReadChunk = 512

// recordBatch collects the state records of one operation, queued together.
type recordBatch [][]byte

// queueStates queues records (with e.mu held) and returns a channel for their durability, or nil
// when there is nothing to queue or wait for (ephemeral subscriptions are not persisted). durable,
// if not nil, is called from the committer goroutine once the records are durable; it must not
// block.
func (e *Engine) queueStates(s *sub, recs recordBatch, waitDurable bool, durable func()) <-chan error {
	e.flushDLQLocked(s) // the DLQ records of the dead-letterings among recs
	if len(recs) == 0 || s.meta.Ephemeral {
		return nil
	}
	wr := make([]wlog.Record, len(recs))
	ts := e.clock.Now().UnixNano()
	n := 0
	for i, r := range recs {
		wr[i] = wlog.Record{Timestamp: ts, Body: r}
		n += len(r) + wlog.FrameHeaderBytes
	}
	var ch chan error
	if waitDurable {
		ch = make(chan error, 1)
	}
	e.committer.AppendAsync(e.state, wr, func(_ int64, err error) {
		if err != nil {
			e.fail(fmt.Errorf("wal: state log append: %w", err))
		} else if durable != nil {
			durable()
		}
		if ch != nil {
			ch <- err
		}
	})
	if e.stateBytes.Add(int64(n)) >= e.cfg.StateLogSnapshotBytes && e.snapPending.CompareAndSwap(false, true) {
		select {
		case e.snapReq <- struct{}{}:
		default:
		}
	}
	return ch
}

// deadLetterLocked moves an entry to the subscription's DLQ with a copy of its message (queued to
// the DLQ log, appended by the operation's queueStates) and returns the DLQ state record (nil if
// the message no longer exists: the entry is dropped; or if it cannot be read or stored now: the
// entry is kept). e.mu (read) and s.mu must be held.
func (e *Engine) deadLetterLocked(s *sub, en *substate.Entry, reason storage.DLQReason, lastErr string, now time.Time) []byte {
	return e.deadLetterRuleLocked(s, en, reason, "", lastErr, now)
}

// deadLetterRuleLocked is deadLetterLocked with the poison rule that fired (empty for none).
// The entry's failure history goes into the DLQ entry.
func (e *Engine) deadLetterRuleLocked(s *sub, en *substate.Entry, reason storage.DLQReason, rule storage.PoisonRule, lastErr string, now time.Time) []byte {
	var msg storage.Message
	if en.Replayed() {
		de, err := e.dlqRead(s, en.DLQ)
		if err != nil {
			e.logger.Error("wal: replayed DLQ message to dead-letter is unreadable, kept", slog.Int64("subscription", s.meta.ID),
				slog.Int("partition", int(en.Partition)), slog.Int64("offset", en.Offset), slog.Any("error", err))
			s.st.Keep(en)
			return nil
		}
		msg = de.Message
	} else {
		var err error
		msg, err = e.readMessage(s.topic, en.Partition, en.Offset)
		if errors.Is(err, storage.ErrPartitionDamaged) {
			// Not gone: unreadable until the repair. It stays pending instead of being dropped.
			e.logger.Warn("wal: message to dead-letter is in a damaged partition, kept", slog.Int64("subscription", s.meta.ID),
				slog.Int("partition", int(en.Partition)), slog.Int64("offset", en.Offset))
			s.st.Keep(en)
			return nil
		}
		if err != nil {
			e.logger.Warn("wal: message to dead-letter is gone, dropped", slog.Int64("subscription", s.meta.ID),
				slog.Int("partition", int(en.Partition)), slog.Int64("offset", en.Offset), slog.Any("error", err))
			s.st.Drop(en.Partition, en.Offset)
			return nil
		}
	}
	dl, err := e.dlqOf(s, s.st.NextDLQID())
	if err != nil {
		e.logger.Error("wal: DLQ log unavailable, message kept", slog.Int64("subscription", s.meta.ID),
			slog.Int("partition", int(en.Partition)), slog.Int64("offset", en.Offset), slog.Any("error", err))
		s.st.Keep(en)
		return nil
	}
	d := &storage.DLQEntry{
		SubscriptionID: s.meta.ID, Message: msg, Reason: reason, Attempts: en.Attempt, LastError: lastErr, DeadAt: now,
		Rule: rule, Failures: policy.Failures(en.Failures),
	}
	d.ID = s.st.DeadLetter(en)
	recordCompletionLocked(s, en.Partition, en.Offset, now.UnixNano(), runDLQ)
	if err := dl.queueLocked(d); err != nil {
		e.fail(err) // the DLQ log and the state disagree: stop before it gets worse
	}
	return encodeDLQ(s.meta.ID, d)
}

// dlqRead reads DLQ entry id of s from its DLQ log (a replayed copy's: durable). s.mu must be
// held.
func (e *Engine) dlqRead(s *sub, id int64) (*storage.DLQEntry, error) {
	if s.dlq == nil {
		return nil, fmt.Errorf("%w: wal: subscription %d has no DLQ log", storage.ErrCorrupt, s.meta.ID)
	}
	return s.dlq.readOne(s.meta.ID, id)
}

// DeliveriesClaim leases up to Max messages of an ACTIVE subscription to Member: first expired
// leases are processed (backoff, or the DLQ at max_deliveries), then due redeliveries go out
// (oldest due first; with AvoidMember not to the member that had them last), then new messages
// from the cursor, rotating the partition read first from one claim to the next. Messages whose
// NotBefore is in the future wait without a delivery; messages past ExpiresAt are completed
// without one; a message whose next attempt would exceed max_deliveries (possible only after an
// unclean restart) goes to the DLQ instead. The claim is recorded in the state log without
// waiting for it to be durable, except in the cases that keep attempt numbers from repeating
// after a crash (doc.go, "Attempt numbers after a crash"): a new message at or beyond the durable
// claim horizon, a delivery of a message whose previous delivery is not durably recorded yet, and
// the first delivery of a message that may have been delivered before a crash.
func (e *Engine) DeliveriesClaim(ctx context.Context, params *storage.DeliveriesClaimParams) (*storage.DeliveriesClaimResult, error) {
	if err := params.Check(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	res, ch, err := e.claim(params)
	if err != nil {
		return nil, err
	}
	// The deliveries stay leased if this fails (ctx): their leases expire as if they had been
	// handed out.
	if err := wait(ctx, ch); err != nil {
		return nil, err
	}
	return res, nil
}

// horizonAhead is how far beyond the cursor a claim records the claim horizon of a partition, and
// twice how close the cursor may come to the recorded horizon before the next horizon record is
// queued. Records are written ahead, so a claim waits for one only when its subscription
// delivers horizonAhead/2 messages of a partition within one group commit (or when it is the first
// claim of a partition after it was created). After a crash up to horizonAhead never-delivered
// messages per partition come back with attempt 2.
const horizonAhead = 1024

// possiblyDelivered is the DLQ reason detail of a message whose next attempt would exceed
// max_deliveries.
const possiblyDelivered = "max_deliveries reached: the last delivery may have been lost in an engine crash"

// claim does the work of DeliveriesClaim under the locks, following the plan of a policy.Claim
// (the rules are there; this reads the logs, changes the state and records it). The returned
// channel, if not nil, must be waited for (with no lock held) before the deliveries are handed
// out.
func (e *Engine) claim(params *storage.DeliveriesClaimParams) (*storage.DeliveriesClaimResult, <-chan error, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if err := e.checkLocked(); err != nil {
		return nil, nil, err
	}
	s, err := e.subLocked(params.SubscriptionID)
	if err != nil {
		return nil, nil, err
	}
	if s.meta.State != storage.Active || s.st == nil {
		return nil, nil, fmt.Errorf("%w: subscription %d is %s", storage.ErrSubscriptionNotActive, s.meta.ID, s.meta.State)
	}
	t := s.topic
	cfg := t.meta.Config
	params, maxInFlight, err := orderedClaim(s, params)
	if err != nil {
		return nil, nil, err
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	now := e.now()
	var pl policy.Claim
	if healthy := healthyParts(t, params.Partitions); healthy != nil {
		// Damaged partitions are left out: the others are served (their redeliveries wait).
		if len(healthy) == 0 { // every partition it may read is damaged
			for _, p := range t.parts {
				if p.damaged() != nil && (params.Partitions == nil || slices.Contains(params.Partitions, p.index)) {
					return nil, nil, unavailable(t.meta.Name, p)
				}
			}
		}
		cp := *params
		cp.Partitions = healthy
		params = &cp
	}
	if err := pl.Start(policy.Input{Params: params, Topic: t.meta.Name, Partitions: len(t.parts), AckWait: cfg.AckWait,
		MaxDeliveries: cfg.MaxDeliveries, Now: now.UnixNano(), Rotor: uint64(s.rr), MaxInFlight: maxInFlight, BatchSize: params.BatchSize}); err != nil {
		return nil, nil, err
	}
	s.rr++
	deadline := time.Unix(0, pl.Deadline()).UTC()
	var recs recordBatch
	var items []claimItem
	mustWait := false
	s.claimSeq++
	seq := s.claimSeq
	durableClaim := s.durableClaim.Load()

	// 1. Expired leases.
	res := &storage.DeliveriesClaimResult{}
	for _, en := range s.st.ExpireLeases(&pl) {
		if r := e.deadLetterLocked(s, en, storage.DLQMaxDeliveries, policy.ExpiredError, now); r != nil {
			recs = append(recs, r)
			res.DeadLettered++
		}
	}

	deliver := func(en *substate.Entry, m *storage.Message) {
		d := &storage.Delivery{Message: *m, SubscriptionID: s.meta.ID, Attempt: en.Attempt, Member: params.Member, LeaseDeadline: deadline}
		if maxInFlight > 0 {
			d.Generation = params.Generation
		}
		res.Deliveries = append(res.Deliveries, d)
	}
	// lane is the plan of the partition being served by an ordered claim (nil otherwise);
	// unlease gives back a place the claim leased but did not deliver.
	var lane *policy.Lane
	unlease := func() {
		if lane != nil {
			lane.Unlease()
		} else {
			pl.Unlease()
		}
	}
	// tooMany dead-letters an entry whose attempt exceeds max_deliveries instead of delivering it.
	tooMany := func(en *substate.Entry) bool {
		if !pl.TooMany(en.Attempt) {
			return false
		}
		en.Attempt = cfg.MaxDeliveries
		if r := e.deadLetterLocked(s, en, storage.DLQMaxDeliveries, possiblyDelivered, now); r != nil {
			recs = append(recs, r)
			res.DeadLettered++
		}
		unlease()
		return true
	}

	// 2. Due redeliveries: oldest due first; in an ordered claim partition by partition, in
	// offset order (policy.Lane).
	var lanes []policy.Lane
	var due []*substate.Entry
	if pl.Ordered() {
		for k := 0; ; k++ {
			pi, ok := pl.Partition(k)
			if !ok {
				break
			}
			lanes = append(lanes, pl.Lane(pi, s.st.InFlight(pi)))
		}
	} else {
		due = s.st.TakeDue(&pl)
	}
	for k := 0; k == 0 || k < len(lanes); k++ {
		if lanes != nil {
			pi, _ := pl.Partition(k)
			lane = &lanes[k]
			due = s.st.TakeDueOrdered(pi, lane, params.Member, pl.Deadline())
		}
		for _, en := range due {
			if en.Claim > durableClaim {
				// Its previous delivery is not durably recorded yet: this claim waits until it is
				// (its own records come later), so a message never has two unrecorded deliveries.
				mustWait = true
			}
			if tooMany(en) {
				continue
			}
			en.Claim = seq
			if en.Replayed() {
				de, err := e.dlqRead(s, en.DLQ)
				if err != nil {
					// Kept for a later claim, undelivered (this one is not recorded).
					e.logger.Error("wal: replayed DLQ message unreadable", slog.Int64("subscription", s.meta.ID),
						slog.Int("partition", int(en.Partition)), slog.Int64("offset", en.Offset), slog.Any("error", err))
					en.Attempt--
					s.st.Keep(en)
					unlease()
					continue
				}
				deliver(en, &de.Message)
				if lane != nil {
					lane.Redelivered(false) // a DLQ copy: replayed on its own
				}
				items = append(items, claimItem{kind: claimReplayed, partition: en.Partition, offset: en.Offset, n: int64(en.Attempt)})
				continue
			}
			m, err := e.readMessage(t, en.Partition, en.Offset)
			if errors.Is(err, storage.ErrPartitionDamaged) {
				// Not gone: unreadable until the repair (this read found the damage). It waits,
				// undelivered, with its attempt count.
				en.Attempt--
				s.st.Keep(en)
				unlease()
				continue
			}
			if err != nil {
				e.logger.Warn("wal: message to redeliver is gone, dropped", slog.Int64("subscription", s.meta.ID),
					slog.Int("partition", int(en.Partition)), slog.Int64("offset", en.Offset), slog.Any("error", err))
				s.st.Drop(en.Partition, en.Offset)
				items = append(items, claimItem{kind: claimComplete, partition: en.Partition, offset: en.Offset})
				unlease()
				continue
			}
			deliver(en, &m)
			if lane != nil {
				lane.Redelivered(m.Linked)
			}
			items = append(items, claimItem{kind: claimDeliver, partition: en.Partition, offset: en.Offset, n: int64(en.Attempt)})
		}
	}
	lane = nil
	// full reports whether the partition being read takes no more new messages: a batch
	// claim's lane decides (a started batch is not cut by the claim's Max).
	full := func() bool {
		if lane != nil && pl.Batch() {
			return lane.Blocked()
		}
		return pl.Full()
	}

	// 3. New messages, partition after partition in the plan's order.
	var cursors []cursorItem
	var horizons []horizonItem
	var horizonPtrs []*atomic.Int64
	for k := 0; pl.Batch() || !pl.Full(); k++ {
		pi, ok := pl.Partition(k)
		if !ok {
			break
		}
		if lanes != nil {
			if lane = &lanes[k]; lane.Blocked() {
				continue // waiting messages or full: nothing new from this partition
			}
		}
		l := t.parts[pi].log
		c0 := s.st.Cursor(pi)
		hz := s.durableHorizon(pi)
	read:
		for !full() {
			c := s.st.Cursor(pi)
			hw := l.NextIndex()
			if c >= hw {
				break
			}
			if fi := l.FirstIndex(); c < fi {
				// Retention removed messages this subscription had not consumed (it did not
				// hold retention): they are gone for it.
				s.st.ForceFloor(pi, fi)
				continue
			}
			want := pl.Remaining()
			if lane != nil && pl.Batch() {
				want = lane.Slots()
			}
			batch, err := l.Read(c, min(want+16, claimReadChunk), readBatchBytes)
			if err != nil {
				if errors.Is(err, storage.ErrOffsetOutOfRange) {
					continue
				}
				switch {
				case errors.Is(err, storage.ErrCorrupt):
					e.markDamaged(t.meta.Name, t.parts[pi], err) // skipped by the next claims
				case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
					// The partition's idle file could not be reopened: its messages wait for
					// the next claim. Every claim may meet it: logged every fdWarnEvery.
					e.warnOutOfFiles(t.meta.Name, pi, err)
				default:
					e.warnClaimRead(t.meta.Name, pi, err)
				}
				break
			}
			if len(batch) == 0 {
				break
			}
			for i, rec := range batch {
				if full() {
					break read // before decoding a message it would not take
				}
				o := c + int64(i)
				if o != s.st.Cursor(pi) {
					continue // completed before delivery (acked ahead): skipped by the cursor
				}
				var m storage.Message
				if err := decodeRecord(t.meta.Name, pi, o, rec, &m); err != nil {
					e.logger.Error("wal: undecodable message skipped", slog.Any("error", err))
					s.st.Complete(pi, o)
					items = append(items, claimItem{kind: claimComplete, partition: pi, offset: o})
					continue
				}
				var out policy.Outcome
				if lane != nil {
					out = lane.Take(&m)
				} else {
					out = pl.Take(&m)
				}
				switch out {
				case policy.Stop:
					break read
				case policy.Complete:
					s.st.Complete(pi, o)
					items = append(items, claimItem{kind: claimComplete, partition: pi, offset: o})
				case policy.Delay:
					nb := m.NotBefore.UnixNano()
					if en := s.st.Delay(pi, o, nb); en != nil && en.Attempt > 0 {
						// Suspect: its possible delivery before the crash is unrecorded, so its
						// next one waits for this record (see below).
						en.Claim = seq
					}
					items = append(items, claimItem{kind: claimDelay, partition: pi, offset: o, n: nb})
				case policy.Lease:
					en := s.st.Deliver(pi, o, params.Member, pl.Deadline())
					if tooMany(en) { // a suspect offset (attempt 2) and max_deliveries 1
						continue
					}
					en.Claim = seq
					if o >= hz.Load() {
						mustWait = true // beyond the durable horizon: wait for the one queued below
					}
					if en.Attempt > 1 {
						// A suspect message: it may have been delivered before a crash, without
						// a record. This delivery must be recorded before it is handed out, or
						// a second crash would make it suspect again and repeat attempt 2.
						mustWait = true
					}
					deliver(en, &m)
					items = append(items, claimItem{kind: claimDeliver, partition: pi, offset: o, n: int64(en.Attempt)})
				}
			}
		}
		if c := s.st.Cursor(pi); c != c0 {
			cursors = append(cursors, cursorItem{partition: pi, cursor: c})
			// Keep the recorded horizon ahead of the cursor (by at least twice what this claim
			// took, so large claims do not wait every time).
			if ahead, moved := e.cfg.claimHorizon, c-c0; c+max(ahead/2, moved) > s.st.Horizon(pi) {
				h := c + max(ahead, 2*moved)
				s.st.SetHorizon(pi, h)
				horizons = append(horizons, horizonItem{partition: pi, horizon: h})
				horizonPtrs = append(horizonPtrs, hz)
			}
		}
	}

	if d, ok := s.st.NextDeadline(); ok {
		pl.Leased(d)
	}
	res.NextDue = pl.NextDueTime()
	if pl.Batch() {
		storage.MarkBatches(res.Deliveries)
	}
	if len(horizons) > 0 {
		// First in the batch: a claim record is never durable without the horizon it relied on.
		recs = append(recordBatch{encodeHorizon(s.meta.ID, horizons)}, recs...)
	}
	if len(items) > 0 || len(cursors) > 0 {
		recs = append(recs, encodeClaim(s.meta.ID, items, cursors))
	}
	durable := func() {
		raise(&s.durableClaim, seq)
		for i, h := range horizons {
			raise(horizonPtrs[i], h.horizon)
		}
	}
	ch := e.queueStates(s, recs, mustWait, durable)
	return res, ch, nil
}

// updateSub runs fn on the delivery state of subscription id, holding Engine.mu shared and the
// subscription's mutex, and queues the state records fn returns. With durable, it then waits for
// them after releasing both locks (no lock is held across an fsync).
func (e *Engine) updateSub(ctx context.Context, id int64, durable bool, fn func(s *sub) recordBatch) error {
	e.mu.RLock()
	if err := e.checkLocked(); err != nil {
		e.mu.RUnlock()
		return err
	}
	s, err := e.subWithState(id)
	if err != nil {
		e.mu.RUnlock()
		return err
	}
	s.mu.Lock()
	ch := e.queueStates(s, fn(s), durable, nil)
	s.mu.Unlock()
	e.mu.RUnlock()
	return wait(ctx, ch)
}

// DeliveriesAck completes messages; the ack is durable when the call returns. Refs above the
// high-water mark or in partitions that do not exist are listed in Unknown. A replayed DLQ copy
// of a message is completed first.
func (e *Engine) DeliveriesAck(ctx context.Context, params *storage.DeliveriesAckParams) (*storage.DeliveriesAckResult, error) {
	if err := params.Check(); err != nil {
		return nil, err
	}
	res := &storage.DeliveriesAckResult{}
	var fence error
	err := e.updateSub(ctx, params.SubscriptionID, true, func(s *sub) recordBatch {
		if fence = fenceLocked(s, params.Member, params.Generation, params.Refs); fence != nil {
			return nil
		}
		if fence = e.batchCheckLocked(s, params.Batch, params.Member, params.Refs); fence != nil {
			return nil
		}
		now := e.now().UnixNano()
		var persist []storage.DeliveryRef
		for _, r := range params.Refs {
			hw := int64(-1)
			if r.Partition >= 0 && int(r.Partition) < len(s.topic.parts) {
				if p := s.topic.parts[r.Partition]; p.log != nil {
					hw = p.log.NextIndex()
				} else {
					hw = s.st.Cursor(r.Partition) // damaged at Open: what was delivered before
				}
			}
			switch s.st.Ack(r.Partition, r.Offset, hw) {
			case substate.Acked:
				res.Acked++
				recordCompletionLocked(s, r.Partition, r.Offset, now, runAcked)
				persist = append(persist, r)
			case substate.AlreadyDone:
				res.AlreadyDone++
				// Recorded again (a no-op on replay) so this call also waits until the ack that
				// completed it is durable.
				persist = append(persist, r)
			default:
				res.Unknown = append(res.Unknown, r)
			}
		}
		if len(persist) == 0 {
			return nil
		}
		return recordBatch{encodeAck(s.meta.ID, persist)}
	})
	if err == nil {
		err = fence
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

// DeliveriesNack gives back messages Member holds: due again after Delay (at once when 0; a
// claim with AvoidMember then prefers another member), or dead-lettered with ToDLQ (reason
// rejected) or when it was the max_deliveries-th delivery (reason max_deliveries). Reason is the
// DLQ entry's last error. Refs the member does not hold (lease expired, another member, never
// delivered) are listed in NotHeld. The outcome is durable when the call returns.
func (e *Engine) DeliveriesNack(ctx context.Context, params *storage.DeliveriesNackParams) (*storage.DeliveriesNackResult, error) {
	if err := params.Check(); err != nil {
		return nil, err
	}
	res := &storage.DeliveriesNackResult{}
	var fence error
	err := e.updateSub(ctx, params.SubscriptionID, true, func(s *sub) recordBatch {
		if fence = fenceLocked(s, params.Member, params.Generation, params.Refs); fence != nil {
			return nil
		}
		if fence = e.batchCheckLocked(s, params.Batch, params.Member, params.Refs); fence != nil {
			return nil
		}
		var recs recordBatch
		var nacks []nackItem
		now := e.now()
		nowNs := now.UnixNano()
		dueNs := nowNs + int64(params.Delay)
		maxDel := s.topic.meta.Config.MaxDeliveries
		poison := poisonNack{rules: s.topic.meta.Config.PoisonRules, member: params.Member, reason: params.Reason, now: nowNs}
		for _, r := range params.Refs {
			if params.GiveBack != "" {
				// As if not delivered (DeliveriesNackParams.GiveBack): no failure, no DLQ.
				if en, ok := s.st.GiveBack(r.Partition, r.Offset, params.Member, params.GiveBack, nowNs, dueNs); ok {
					res.Nacked++
					nacks = append(nacks, nackItem{partition: r.Partition, offset: r.Offset, due: dueNs, replayed: en.Replayed(), givenBack: true})
				} else {
					res.NotHeld = append(res.NotHeld, r)
				}
				continue
			}
			out, en := s.st.Nack(r.Partition, r.Offset, params.Member, nowNs, dueNs, params.ToDLQ, maxDel)
			switch out {
			case substate.NotHeld:
				res.NotHeld = append(res.NotHeld, r)
			case substate.Nacked:
				if rule := poison.fail(s, en); rule != "" {
					s.st.Pull(en)
					if rec := e.deadLetterRuleLocked(s, en, storage.DLQPoison, rule, params.Reason, now); rec != nil {
						recs = append(recs, rec)
						res.DeadLettered++
					}
					continue
				}
				poison.keep(en)
				res.Nacked++
				nacks = append(nacks, nackItem{partition: r.Partition, offset: r.Offset, due: dueNs, replayed: en.Replayed()})
			case substate.DeadLetter:
				reason := storage.DLQMaxDeliveries
				if params.ToDLQ {
					reason = storage.DLQRejected
				}
				poison.fail(s, en) // the DLQ entry shows this failure too
				if rec := e.deadLetterLocked(s, en, reason, params.Reason, now); rec != nil {
					recs = append(recs, rec)
					res.DeadLettered++ // not one deadLetterLocked kept or dropped, as a release
				}
			}
		}
		if len(nacks) > 0 {
			recs = append(recs, encodeNack(s.meta.ID, nacks))
		}
		if len(poison.items) > 0 {
			recs = append(recs, encodeFailures(s.meta.ID, poison.items))
		}
		return recs
	})
	if err == nil {
		err = fence
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

// DeliveriesExtend moves the lease deadline of messages Member holds to now + Duration (the
// topic's ack_wait when 0). Leases are not persisted, so neither is this.
func (e *Engine) DeliveriesExtend(ctx context.Context, params *storage.DeliveriesExtendParams) (*storage.DeliveriesExtendResult, error) {
	if err := params.Check(); err != nil {
		return nil, err
	}
	res := &storage.DeliveriesExtendResult{}
	var fence error
	err := e.updateSub(ctx, params.SubscriptionID, false, func(s *sub) recordBatch {
		if fence = fenceLocked(s, params.Member, params.Generation, params.Refs); fence != nil {
			return nil
		}
		if params.NewMember != "" && s.meta.Mode == storage.ModeOrdered {
			fence = storage.Invalid("subscription %d is ORDERED: leases cannot be handed to another member", s.meta.ID)
			return nil
		}
		d := params.Duration
		if d == 0 {
			d = s.topic.meta.Config.AckWait
		}
		nowNs := e.now().UnixNano()
		deadlineNs := nowNs + int64(d)
		res.Deadline = time.Unix(0, deadlineNs).UTC()
		for _, r := range params.Refs {
			if params.NewMember != "" {
				if s.st.Transfer(r.Partition, r.Offset, params.Member, params.NewMember, nowNs, deadlineNs) {
					res.Extended++
				} else {
					res.NotHeld = append(res.NotHeld, r)
				}
				continue
			}
			if s.st.Extend(r.Partition, r.Offset, params.Member, nowNs, deadlineNs) {
				res.Extended++
			} else {
				res.NotHeld = append(res.NotHeld, r)
			}
		}
		return nil // leases are not persisted
	})
	if err == nil {
		err = fence
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

// DeliveriesRelease gives back every lease Member holds: due at once, attempts kept; those on
// their max_deliveries-th delivery go to the DLQ (reason max_deliveries). DeadLettered counts
// only the entries queued in the DLQ, like a claim's: one deadLetterLocked keeps (damaged
// partition, DLQ log unavailable) or drops (message gone) is in neither count.
func (e *Engine) DeliveriesRelease(ctx context.Context, params *storage.DeliveriesReleaseParams) (*storage.DeliveriesReleaseResult, error) {
	if err := params.Check(); err != nil {
		return nil, err
	}
	res := &storage.DeliveriesReleaseResult{}
	err := e.updateSub(ctx, params.SubscriptionID, false, func(s *sub) recordBatch {
		now := e.now()
		released, dead := s.st.Release(params.Member, now.UnixNano(), s.topic.meta.Config.MaxDeliveries)
		res.Released = released
		var recs recordBatch
		for _, en := range dead {
			if rec := e.deadLetterLocked(s, en, storage.DLQMaxDeliveries, "member left", now); rec != nil {
				recs = append(recs, rec)
				res.DeadLettered++
			}
		}
		return recs
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}
