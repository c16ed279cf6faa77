package wal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/substate"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

// DLQ logs. Each subscription that ever dead-lettered a message has a DLQ log, <dir>/dlq/<id>/: a
// segmented log (wlog) whose record index is the DLQ ID minus one, holding each entry with its
// copy of the message. Memory keeps only which IDs are in the DLQ (substate, one bit each), and the
// snapshot only that index, so neither grows with the entries. Records are never rewritten: a
// purged, replayed or expired entry's record stays until every record of its segment is no longer
// needed (retention deletes whole segments below the lowest ID still in the DLQ or read by a
// replayed copy).
//
// The state log's dead-letter record (type 13) keeps the whole entry: it is what makes a
// dead-lettering durable. The DLQ log is appended to in the same group commit without ordering
// between the two logs, so after a crash Open appends to the DLQ log the entries of replayed
// dead-letter records that it lacks, and a DLQ log that is ahead of the state (its records whose
// state records were lost) only makes the next IDs skip those. A snapshot is written only once the
// DLQ log records of every entry it holds are durable.

const dlqDir = "dlq"

// DLQ log record kinds: the first byte of a record body. Part of the on-disk format.
const (
	dlqRecFiller byte = 0 // no entry: an ID whose record was lost in a crash (keeps index = ID-1)
	dlqRecEntry  byte = 1 // enc.dlqEntry: the entry and its message
)

// maxDLQFill bounds the filler records appended at once: more means damaged input, not a crash.
const maxDLQFill = 1 << 20

// dlqLog is a subscription's DLQ log. Its fields are guarded by the subscription's mutex (or used
// by recovery alone), except the appends' state, guarded by mu.
type dlqLog struct {
	log    *wlog.Log
	nextID int64 // the ID of the next record queued (its index + 1)
	lastTS int64 // frame timestamps never decrease (SearchTime finds expired entries)
	// batch holds the records queued by dead-letterings of the current operation, handed to the
	// appends by flushDLQLocked before the operation releases the subscription's mutex.
	batch []wlog.Record

	// The appends: one at a time (sending, from ID sendFirst), the records queued meanwhile
	// waiting in pend (from ID pendFirst), so that every record lands at index ID-1 even when an
	// append fails. An append that found no room for the log's next segment (wlog.ErrNoSegment:
	// the disk is full) leaves its records at the head of pend and the log stalled: they are
	// appended again by the next dead-lettering or retryDLQs, reads find them in memory meanwhile,
	// and no snapshot is written (the state log's dead-letter records rebuild them after a
	// restart). mu is taken after the subscription's mutex and never held while appending.
	mu        sync.Mutex
	sending   []wlog.Record
	sendFirst int64
	pend      []wlog.Record
	pendFirst int64
	stalled   bool
	// idle is closed while nothing is sent or waits to be sent but stalled records.
	idle       chan struct{}
	idleClosed bool
}

// maxDLQHeld bounds the bytes of DLQ records not yet in their logs (Engine.dlqHeld): past it, while
// the disk has no room for their segments, dead-letterings stop the engine (errDLQHeld).
const maxDLQHeld = 64 << 20

// dlqRetryEvery is how often retryDLQs appends the records of stalled DLQ logs again.
const dlqRetryEvery = time.Second

func (e *Engine) dlqPath(id int64) string {
	return filepath.Join(e.dir, dlqDir, strconv.FormatInt(id, 10))
}

// dlqOf returns the DLQ log of s, opening it (recovery found it) or, when firstID > 0, creating it
// with firstID as the ID of its first record. It returns nil without an error when the log does not
// exist and firstID is 0. s.mu must be held (or recovery).
func (e *Engine) dlqOf(s *sub, firstID int64) (*dlqLog, error) {
	if s.dlq != nil || e.committer == nil { // no committer: the codec tests' engine without files
		return s.dlq, nil
	}
	_, found := e.dlqFound[s.meta.ID]
	if !found && firstID <= 0 {
		return nil, nil
	}
	opts := e.logOptions()
	opts.FirstIndex = max(firstID-1, 0)
	l, err := wlog.Open(e.dlqPath(s.meta.ID), opts)
	if errors.Is(err, storage.ErrCorrupt) {
		// Unlike a partition's, a DLQ log cannot be left out (its IDs follow the state).
		return nil, dlqDamaged(s.meta.ID, err)
	}
	if err != nil {
		return nil, fmt.Errorf("wal: open DLQ log of subscription %d: %w", s.meta.ID, err)
	}
	delete(e.dlqFound, s.meta.ID)
	dl := &dlqLog{log: l, nextID: l.NextIndex() + 1}
	for _, seg := range l.Segments() {
		dl.lastTS = max(dl.lastTS, seg.MaxTime)
	}
	s.dlq = dl
	return dl, nil
}

// queueLocked adds the record of entry d (whose ID is at or above nextID: fillers stand for the
// IDs between) to the batch. s.mu must be held.
func (dl *dlqLog) queueLocked(d *storage.DLQEntry) error {
	if d.ID < dl.nextID || d.ID-dl.nextID > maxDLQFill {
		return fmt.Errorf("%w: wal: DLQ entry %d does not follow the DLQ log (next ID %d)", storage.ErrCorrupt, d.ID, dl.nextID)
	}
	for ; dl.nextID < d.ID; dl.nextID++ {
		dl.batch = append(dl.batch, wlog.Record{Timestamp: dl.lastTS, Body: []byte{dlqRecFiller}})
	}
	dl.lastTS = max(dl.lastTS, d.DeadAt.UnixNano())
	en := enc{b: make([]byte, 0, 64+len(d.Message.Payload)+len(d.Message.Key))}
	en.u8(dlqRecEntry)
	en.dlqEntry(d)
	dl.batch = append(dl.batch, wlog.Record{Timestamp: dl.lastTS, Body: en.b})
	dl.nextID++
	return nil
}

// flushDLQLocked hands the DLQ records the current operation on s added to the log's appends
// (dlqLog). Past maxDLQHeld bytes waiting, the engine stops (a DLQ log must take every entry in
// ID order; the next Open rebuilds what is missing from the state log). s.mu must be held.
func (e *Engine) flushDLQLocked(s *sub) {
	dl := s.dlq
	if dl == nil || len(dl.batch) == 0 {
		return
	}
	n := recordsBytes(dl.batch)
	dl.mu.Lock()
	if len(dl.pend) == 0 {
		dl.pendFirst = dl.nextID - int64(len(dl.batch))
	}
	dl.pend = append(dl.pend, dl.batch...)
	if dl.stalled { // try again now
		dl.stalled = false
		e.dlqStalled.Add(-1)
	}
	dl.busyLocked()
	dl.mu.Unlock()
	dl.batch = nil
	if held := e.dlqHeld.Add(n); held > maxDLQHeld {
		e.fail(fmt.Errorf("%w: %d bytes of dead-lettered messages wait for room in their DLQ logs (at most %d)",
			errDLQHeld, held, maxDLQHeld))
	}
	e.sendDLQ(dl)
}

// recordsBytes returns the bytes of the bodies of recs (what Engine.dlqHeld counts).
func recordsBytes(recs []wlog.Record) int64 {
	var n int64
	for _, r := range recs {
		n += int64(len(r.Body))
	}
	return n
}

// errDLQHeld: DLQ records wait in memory because their log could not make its next segment.
var errDLQHeld = errors.New("wal: the disk has no room for the next segment of a DLQ log")

// busyLocked opens dl.idle (records to send). dl.mu must be held.
func (dl *dlqLog) busyLocked() {
	if dl.idle == nil || dl.idleClosed {
		dl.idle, dl.idleClosed = make(chan struct{}), false
	}
}

// settled returns a channel closed once nothing is being appended to dl or waits to be but stalled
// records; held reports those.
func (dl *dlqLog) settled() <-chan struct{} {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if dl.idle == nil {
		dl.idle, dl.idleClosed = make(chan struct{}), true
		close(dl.idle)
	}
	return dl.idle
}

// held reports whether records of dl wait for room (stalled).
func (dl *dlqLog) held() bool {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	return dl.stalled
}

// busy reports whether records of dl are not in the log yet.
func (dl *dlqLog) busy() bool {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	return len(dl.sending)+len(dl.pend) > 0
}

// settleLocked closes dl.idle when nothing is sent and nothing waits to be but stalled records.
// dl.mu must be held.
func (dl *dlqLog) settleLocked() {
	if dl.sending == nil && (len(dl.pend) == 0 || dl.stalled) && dl.idle != nil && !dl.idleClosed {
		close(dl.idle)
		dl.idleClosed = true
	}
}

// sendDLQ appends the records waiting in dl.pend unless an append of dl is in flight or dl is
// stalled.
func (e *Engine) sendDLQ(dl *dlqLog) {
	dl.mu.Lock()
	if dl.sending != nil || len(dl.pend) == 0 || dl.stalled {
		dl.mu.Unlock()
		return
	}
	recs := dl.pend
	dl.sending, dl.sendFirst = recs, dl.pendFirst
	dl.pend, dl.pendFirst = nil, 0
	dl.mu.Unlock()
	e.committer.AppendAsync(dl.log, recs, func(_ int64, err error) { e.dlqSent(dl, err) })
}

// dlqSent completes the append in flight of dl: on success the records waiting are sent; on a
// full disk (wlog.ErrNoSegment: nothing was written) its records go back to the head of the queue
// and dl stalls; any other failure stops the engine.
func (e *Engine) dlqSent(dl *dlqLog, err error) {
	dl.mu.Lock()
	recs, first := dl.sending, dl.sendFirst
	dl.sending = nil
	var n int64 // the bytes now in the log (Engine.dlqHeld)
	switch {
	case err == nil:
		n = recordsBytes(recs)
	default: // kept for reads; after a failure other than a full disk the engine stops
		if !dl.stalled {
			e.dlqStalled.Add(1)
		}
		dl.pend, dl.pendFirst, dl.stalled = append(recs, dl.pend...), first, true
	}
	dl.settleLocked()
	dl.mu.Unlock()
	e.dlqHeld.Add(-n)
	switch {
	case err == nil:
		e.sendDLQ(dl)
	case errors.Is(err, wlog.ErrNoSegment):
		e.warnDLQHeld(err)
	default:
		e.fail(fmt.Errorf("wal: DLQ log append: %w", err))
	}
}

// warnDLQHeld logs that DLQ records wait for room, at most once per fdWarnEvery.
func (e *Engine) warnDLQHeld(err error) {
	if !e.warnDue(&e.dlqWarnAt) {
		return
	}
	e.logger.Warn("wal: dead-lettered messages wait in memory for room in their DLQ logs (free disk space); they are appended again every second",
		slog.Int64("bytes", e.dlqHeld.Load()), slog.Any("error", err))
}

// DLQHeld returns, while a DLQ log waits for room (a full disk), the bytes of dead-lettered
// messages not in their DLQ logs yet; 0 otherwise (appends in flight are not reported).
func (e *Engine) DLQHeld() int64 {
	if e.dlqStalled.Load() == 0 {
		return 0
	}
	return e.dlqHeld.Load()
}

// retryDLQs appends again the records of the stalled DLQ logs (dlqRetryLoop).
func (e *Engine) retryDLQs() {
	if e.dlqStalled.Load() == 0 {
		return
	}
	var stalled []*dlqLog
	e.mu.RLock()
	for _, s := range e.subs {
		s.mu.Lock()
		if dl := s.dlq; dl != nil {
			dl.mu.Lock()
			if dl.stalled {
				dl.stalled = false
				e.dlqStalled.Add(-1)
				dl.busyLocked()
				stalled = append(stalled, dl)
			}
			dl.mu.Unlock()
		}
		s.mu.Unlock()
	}
	e.mu.RUnlock()
	for _, dl := range stalled {
		e.sendDLQ(dl)
	}
}

// dlqRetryLoop runs retryDLQs every dlqRetryEvery until Close.
func (e *Engine) dlqRetryLoop() {
	defer e.wg.Done()
	t := time.NewTicker(dlqRetryEvery)
	defer t.Stop()
	for {
		select {
		case <-e.quit:
			return
		case <-t.C:
			e.retryDLQs()
		}
	}
}

// memRecord returns the body of the record of id while it is not in the log yet.
func (dl *dlqLog) memRecord(id int64) ([]byte, bool) {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if i := id - dl.sendFirst; dl.sending != nil && i >= 0 && i < int64(len(dl.sending)) {
		return dl.sending[i].Body, true
	}
	if i := id - dl.pendFirst; len(dl.pend) > 0 && i >= 0 && i < int64(len(dl.pend)) {
		return dl.pend[i].Body, true
	}
	return nil, false
}

// decodeDLQRecord decodes the DLQ log record of entry id.
func decodeDLQRecord(subID, id int64, body []byte) (*storage.DLQEntry, error) {
	if len(body) == 0 || body[0] != dlqRecEntry {
		return nil, fmt.Errorf("%w: wal: DLQ log of subscription %d: no entry at ID %d", storage.ErrCorrupt, subID, id)
	}
	d := dec{b: body[1:]}
	de := d.dlqEntry(subID)
	d.dlqPoison(de)
	if err := d.done("DLQ log record"); err != nil {
		return nil, fmt.Errorf("%w: %v", storage.ErrCorrupt, err)
	}
	if de.ID != id {
		return nil, fmt.Errorf("%w: wal: DLQ log of subscription %d: entry %d at ID %d", storage.ErrCorrupt, subID, de.ID, id)
	}
	return de, nil
}

// dlqDamaged is the error of a damaged DLQ log (err wraps storage.ErrCorrupt), naming the repair:
// with the broker stopped, the operator cuts the log at its first damage.
func dlqDamaged(subID int64, err error) error {
	return fmt.Errorf("wal: the DLQ log of subscription %d is damaged (with the broker stopped, spool data verify shows the damage and spool data truncate --dlq %d cuts the log there): %w",
		subID, subID, err)
}

// read returns the entries of ids (increasing), nil for those whose records are not readable:
// deleted (retention compacted the log after they left the DLQ). Records not in the log yet are
// read from memory (dlqLog). It stops before the entry that would take the messages it returns
// past maxBytes (storage.Message.Size), returning at least one. Other read errors are returned.
func (dl *dlqLog) read(subID int64, ids []int64, maxBytes int) ([]*storage.DLQEntry, error) {
	out := make([]*storage.DLQEntry, len(ids))
	end, total := len(ids), 0
	err := dl.scan(ids, func(i int, body []byte) error {
		de, err := decodeDLQRecord(subID, ids[i], body)
		if err != nil {
			return err
		}
		n := de.Message.Size()
		if total > 0 && total+n > maxBytes {
			end = i
			return errFull
		}
		total += n
		out[i] = de
		return nil
	})
	if errors.Is(err, errFull) {
		err = nil
	}
	if errors.Is(err, storage.ErrCorrupt) {
		return nil, dlqDamaged(subID, err)
	}
	if err != nil {
		return nil, err
	}
	return out[:end], nil
}

// errFull stops a read at its byte bound.
var errFull = errors.New("wal: read bound reached")

// scan calls fn with the record body of each of ids (increasing) that is readable (see read), in
// order; body is only valid during the call.
func (dl *dlqLog) scan(ids []int64, fn func(i int, body []byte) error) error {
	for i := 0; i < len(ids); {
		j := i + 1
		for j < len(ids) && ids[j] == ids[j-1]+1 {
			j++
		}
		for i < j {
			if ids[i]-1 >= dl.log.NextIndex() {
				if body, ok := dl.memRecord(ids[i]); ok {
					if err := fn(i, body); err != nil {
						return err
					}
					i++
					continue
				}
				if ids[i]-1 >= dl.log.NextIndex() {
					i = j // not queued
					break
				}
				continue // it reached the log meanwhile
			}
			recs, err := dl.log.Read(ids[i]-1, j-i, readBatchBytes)
			if errors.Is(err, storage.ErrOffsetOutOfRange) {
				i++
				continue
			}
			if err != nil {
				return err
			}
			if len(recs) == 0 {
				i = j
				break
			}
			for _, r := range recs {
				if err := fn(i, r.Body); err != nil {
					return err
				}
				i++
			}
		}
	}
	return nil
}

// decodeDLQPosition decodes the message position of the DLQ log record of entry id (its prefix
// only: a replay does not copy the payload).
func decodeDLQPosition(subID, id int64, body []byte) (int32, int64, error) {
	if len(body) == 0 || body[0] != dlqRecEntry {
		return 0, 0, fmt.Errorf("%w: wal: DLQ log of subscription %d: no entry at ID %d", storage.ErrCorrupt, subID, id)
	}
	d := dec{b: body[1:]}
	got := int64(d.uvarint())
	d.str() // reason
	d.uvarint()
	d.str() // last error
	d.time()
	d.str() // topic
	p := int32(d.varint())
	o := d.varint()
	if d.err != nil || got != id {
		return 0, 0, fmt.Errorf("%w: wal: DLQ log of subscription %d: bad entry at ID %d", storage.ErrCorrupt, subID, id)
	}
	return p, o, nil
}

// readOne reads the entry of id; it must be durable.
func (dl *dlqLog) readOne(subID, id int64) (*storage.DLQEntry, error) {
	got, err := dl.read(subID, []int64{id}, readBatchBytes)
	if err != nil {
		return nil, err
	}
	if got[0] == nil {
		return nil, fmt.Errorf("%w: wal: DLQ entry %d of subscription %d is not in its log", storage.ErrCorrupt, id, subID)
	}
	return got[0], nil
}

// dlqDurable waits until the DLQ log records queued for subscription id so far are durable or
// stalled (read from memory), so that an operation that reads them finds them in the log.
func (e *Engine) dlqDurable(ctx context.Context, id int64) error {
	e.mu.RLock()
	if e.closed {
		e.mu.RUnlock()
		return storage.ErrClosed
	}
	s, err := e.subLocked(id)
	if err != nil {
		e.mu.RUnlock()
		return err
	}
	s.mu.Lock()
	var ch <-chan struct{}
	if s.dlq != nil {
		ch = s.dlq.settled()
	}
	s.mu.Unlock()
	e.mu.RUnlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil // what is readable is read (a change is refused by checkLocked)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// replayChunk is how many DLQ entries a replay reads at a time.
const replayChunk = 1024

// replayDLQLocked moves the DLQ entries ids (in the DLQ, increasing) back into s as replayed copies
// due at due, reading each entry's record for its position (replayChunk records at a time). It
// returns the IDs moved. An entry whose record cannot be read stays in the DLQ, unless force (state
// log replay: the live replay moved it), when it leaves the DLQ without a copy. s.mu must be held.
func (e *Engine) replayDLQLocked(s *sub, ids []int64, due int64, force bool) []int64 {
	moved := ids[:0:0]
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), replayChunk)]
		ids = ids[len(chunk):]
		read := make([]bool, len(chunk))
		var err error
		if s.dlq != nil {
			err = s.dlq.scan(chunk, func(i int, body []byte) error {
				p, o, err := decodeDLQPosition(s.meta.ID, chunk[i], body)
				if err != nil {
					return err
				}
				s.st.DLQPurge(chunk[i : i+1])
				s.st.Replay(p, o, chunk[i], due)
				read[i] = true
				moved = append(moved, chunk[i])
				return nil
			})
		}
		for i, id := range chunk {
			if read[i] {
				continue
			}
			if force {
				s.st.DLQPurge([]int64{id})
			}
			e.logger.Warn("wal: DLQ entry to replay is unreadable", slog.Int64("subscription", s.meta.ID),
				slog.Int64("id", id), slog.Bool("dropped", force), slog.Any("error", err))
		}
	}
	return moved
}

// dlqRecover is recovery's part for DLQ logs, once the state log is replayed: it appends the
// entries the DLQ logs lack, gives the replayed copies of an old snapshot (format 2 and older, which
// held their messages) a record each, makes new IDs follow the records each log holds, drops
// what the state holds but the logs lost (only UnsafeNoSync loses durable records), and moves to
// the trash the DLQ logs of subscriptions without state and those no record of which is needed.
func (e *Engine) dlqRecover() error {
	for _, s := range e.subs {
		if s.st == nil {
			continue
		}
		if err := e.dlqSyncPending(s); err != nil {
			return err
		}
		dl, err := e.dlqOf(s, 0)
		if err != nil {
			return err
		}
		first, end := s.st.NextDLQID(), s.st.NextDLQID()
		if dl != nil {
			s.st.RaiseNextDLQID(dl.nextID)
			first, end = dl.log.FirstIndex()+1, dl.nextID
		}
		if n := s.st.DLQLost(first, end); n > 0 {
			e.logger.Warn("wal: DLQ entries missing from the DLQ log (records lost), dropped",
				slog.Int64("subscription", s.meta.ID), slog.Int("entries", n))
		}
		for _, en := range s.st.ReplayedEntries() {
			if en.DLQ < 0 {
				continue // an old snapshot's copy: given a record below
			}
			if en.DLQ < first || en.DLQ >= end {
				e.logger.Warn("wal: replayed DLQ copy missing from the DLQ log (records lost), dropped",
					slog.Int64("subscription", s.meta.ID), slog.Int("partition", int(en.Partition)), slog.Int64("offset", en.Offset))
				s.st.Drop(en.Partition, en.Offset)
			}
		}
		if dl != nil && s.st.DLQLen() == 0 && len(s.st.ReplayedEntries()) == 0 {
			// No record is needed: the log goes, with its files (the next dead-lettering makes a
			// new one, whose first ID is the next ID).
			s.dlq = nil
			dir := dl.log.Dir()
			if err := errors.Join(dl.log.Close(), e.discardDir(dir)); err != nil {
				e.logger.Warn("wal: remove an empty DLQ log", slog.String("dir", dir), slog.Any("error", err))
			}
		}
	}
	if len(e.dlqMigrate) > 0 {
		bySub := map[*sub]bool{}
		for _, m := range e.dlqMigrate {
			s := e.subs[m.sub]
			if s == nil || s.st == nil {
				continue
			}
			en := s.st.ReplayedAt(m.partition, m.offset)
			if en == nil || en.DLQ >= 0 {
				continue // completed after the snapshot
			}
			id := s.st.NextDLQID()
			dl, err := e.dlqOf(s, id)
			if err != nil {
				return err
			}
			s.st.RaiseNextDLQID(id + 1)
			en.DLQ = id
			if err := dl.queueLocked(&storage.DLQEntry{ID: id, SubscriptionID: m.sub, Message: *m.msg, DeadAt: m.msg.PublishedAt}); err != nil {
				return err
			}
			bySub[s] = true
		}
		for s := range bySub {
			if err := e.dlqAppendNow(s.dlq); err != nil {
				return err
			}
		}
		e.dlqMigrate = nil
		e.dlqMigrated = true
	}
	for id := range e.dlqFound {
		if err := e.discardDir(e.dlqPath(id)); err != nil {
			e.logger.Warn("wal: remove the DLQ log of a deleted subscription", slog.Int64("subscription", id), slog.Any("error", err))
		}
	}
	e.dlqFound = nil
	return nil
}

// dlqMigrateCopy is a replayed copy of an old snapshot, which held the message (format 2 and
// older): recovery gives it a DLQ log record (dlqRecover).
type dlqMigrateCopy struct {
	sub       int64
	partition int32
	offset    int64
	msg       *storage.Message
}

// dlqReplayEntry notes, during recovery, entry d of subscription s (a replayed dead-letter
// record, or an entry of an old snapshot): appended to the DLQ log by dlqSyncPending unless the
// log has its record.
func (e *Engine) dlqReplayEntry(s *sub, d *storage.DLQEntry) error {
	dl, err := e.dlqOf(s, 0)
	if err != nil {
		return err
	}
	if dl != nil && d.ID < dl.nextID {
		return nil
	}
	if p := e.dlqPend[s.meta.ID]; len(p) > 0 && d.ID <= p[len(p)-1].ID {
		return nil
	}
	e.dlqPend[s.meta.ID] = append(e.dlqPend[s.meta.ID], d)
	return nil
}

// dlqSyncPending appends the entries dlqReplayEntry noted for s and waits until they are durable.
func (e *Engine) dlqSyncPending(s *sub) error {
	p := e.dlqPend[s.meta.ID]
	if len(p) == 0 {
		return nil
	}
	delete(e.dlqPend, s.meta.ID)
	dl, err := e.dlqOf(s, p[0].ID)
	if err != nil || dl == nil {
		return err
	}
	for _, d := range p {
		if d.ID < dl.nextID {
			continue // the log has it (an old snapshot's entry after an earlier migration)
		}
		if err := dl.queueLocked(d); err != nil {
			return err
		}
	}
	return e.dlqAppendNow(dl)
}

// dlqAppendNow appends the batch of dl and waits until it is durable (recovery).
func (e *Engine) dlqAppendNow(dl *dlqLog) error {
	if len(dl.batch) == 0 {
		return nil
	}
	_, err := e.committer.Append(context.Background(), dl.log, dl.batch)
	dl.batch = nil
	if err != nil {
		return fmt.Errorf("wal: rebuild DLQ log: %w", err)
	}
	return nil
}

// findDLQLogs lists the DLQ log directories at Open (they are opened when recovery needs them).
func (e *Engine) findDLQLogs() error {
	e.dlqFound = make(map[int64]struct{})
	e.dlqPend = make(map[int64][]*storage.DLQEntry)
	ents, err := e.fs.ReadDir(filepath.Join(e.dir, dlqDir))
	if isNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("wal: list DLQ logs: %w", err)
	}
	for _, ent := range ents {
		id, err := strconv.ParseInt(ent.Name(), 10, 64)
		if err != nil || id <= 0 {
			e.logger.Warn("wal: unexpected entry in the DLQ directory", slog.String("name", ent.Name()))
			continue
		}
		e.dlqFound[id] = struct{}{}
	}
	return nil
}

// dropDLQ hands the DLQ log of s (cancelled or deleted) to the trash loop, which closes and
// removes it once its appends and the state record of the change are durable (reapDLQs). e.mu must
// be held exclusively.
func (e *Engine) dropDLQ(s *sub) {
	if s.dlq == nil {
		return
	}
	e.dlqMu.Lock()
	e.dlqDoomed = append(e.dlqDoomed, s.dlq)
	e.dlqMu.Unlock()
	s.dlq = nil
	select {
	case e.trashKick <- struct{}{}:
	default:
	}
}

// reapDLQs closes and removes the DLQ logs dropDLQ handed over (trash loop). Calls are serialized:
// one returns once the logs handed over before it are removed.
func (e *Engine) reapDLQs() {
	e.reapMu.Lock()
	defer e.reapMu.Unlock()
	e.dlqMu.Lock()
	doomed := e.dlqDoomed
	e.dlqDoomed = nil
	e.dlqMu.Unlock()
	if len(doomed) == 0 {
		return
	}
	for _, dl := range doomed {
		<-dl.settled()
		e.discardHeld(dl) // stalled records of a subscription that is gone
	}
	// The change that dropped them was queued with e.mu held: once it is released, a record queued
	// now comes after it, and durable means that change is.
	e.mu.RLock()
	closed := e.closed
	var ch <-chan error
	if !closed && e.failedErr() == nil {
		ch = e.queueStateWait([]byte{recMarker})
	}
	e.mu.RUnlock()
	if ch == nil || <-ch != nil {
		e.dlqMu.Lock()
		e.dlqDoomed = append(e.dlqDoomed, doomed...) // closed by closeFiles, removed at the next Open
		e.dlqMu.Unlock()
		return
	}
	for _, dl := range doomed {
		dir := dl.log.Dir()
		if err := dl.log.Close(); err != nil {
			e.logger.Warn("wal: close a DLQ log", slog.String("dir", dir), slog.Any("error", err))
		}
		if err := e.discardDir(dir); err != nil {
			e.logger.Warn("wal: remove a DLQ log", slog.String("dir", dir), slog.Any("error", err))
		}
	}
}

// discardHeld drops the records of dl waiting for room (its subscription is gone); dl is settled.
func (e *Engine) discardHeld(dl *dlqLog) {
	dl.mu.Lock()
	n := recordsBytes(dl.pend)
	if dl.stalled {
		dl.stalled = false
		e.dlqStalled.Add(-1)
	}
	dl.pend = nil
	dl.mu.Unlock()
	e.dlqHeld.Add(-n)
}

// dropIdleDLQLocked removes the DLQ log of s when none of its records is needed (the DLQ is empty
// and no replayed copy reads from it) and nothing is being appended to it, and reports whether it
// did: a drained DLQ gives back its disk and files at once. It runs with s.mu held, so that a
// dead-lettering cannot open the log again meanwhile (it makes a new one, from the next ID). A
// change that drained the DLQ may not be durable yet; if a crash loses it, Open finds its entries
// or copies without their records and drops them, which is an outcome the change, not confirmed,
// allowed. e.mu (read) and s.mu must be held.
func (e *Engine) dropIdleDLQLocked(s *sub) bool {
	dl := s.dlq
	if s.st.DLQLen() > 0 || s.st.MinReplayedDLQ() < s.st.NextDLQID() || len(dl.batch) > 0 || dl.busy() {
		return false // an append in flight or waiting: at the next run
	}
	s.dlq = nil
	dir := dl.log.Dir()
	if err := errors.Join(dl.log.Close(), e.discardDir(dir)); err != nil {
		e.logger.Warn("wal: remove an empty DLQ log", slog.String("dir", dir), slog.Any("error", err))
	}
	return true
}

// dlqKeepFrom returns the index below which a DLQ log holds no record still needed: none in the
// DLQ, none read by a replayed copy.
func dlqKeepFrom(st *substate.Sub) int64 {
	return min(st.DLQFirst(), st.MinReplayedDLQ()) - 1
}
