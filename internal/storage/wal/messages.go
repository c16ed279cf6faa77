package wal

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/record"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

// appendSize is Message.Size of an AppendMessage: key, header names and values, payload.
func appendSize(m *storage.AppendMessage) int {
	n := len(m.Key) + len(m.Payload)
	for k, v := range m.Headers {
		n += len(k) + len(v)
	}
	return n
}

// hasActiveLocked reports whether a topic has an ACTIVE subscription (ephemeral ones count).
func hasActiveLocked(t *topic) bool {
	for _, s := range t.subs {
		if s.meta.State == storage.Active {
			return true
		}
	}
	return false
}

// partBatch is the share of one partition in an append.
type partBatch struct {
	p     *partition
	idx   []int // positions in the batch
	recs  []wlog.Record
	buf   *[]byte // the encoded records (recs point into it), from recordBufs
	first int64
	ts    int64
	err   error
}

// recordBufs recycles the buffers MessagesAppend encodes records into (about one message's size
// per message published): the committer copies them into its own write buffer and drops them
// when the append completes.
var recordBufs = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledRecordBuf is the largest record buffer kept for reuse.
const maxPooledRecordBuf = 256 << 10

func getRecordBuf(size int) *[]byte {
	b := recordBufs.Get().(*[]byte)
	if cap(*b) < size {
		*b = make([]byte, 0, size)
	}
	*b = (*b)[:0]
	return b
}

func putRecordBuf(b *[]byte) {
	if b == nil || cap(*b) > maxPooledRecordBuf {
		return
	}
	recordBufs.Put(b)
}

// MessagesAppend appends a batch of messages to a topic and returns once they are durable and
// visible. Everything is validated before anything is written: sizes against max_message_bytes
// (storage.ErrMessageTooLarge), explicit partitions and producer ids longer than
// storage.MaxProducerIDLen (storage.ErrInvalidArgument) and, for a PUB_SUB topic with
// block_writes_on_zero_subscriptions, the presence of an ACTIVE subscription
// (storage.ErrNoSubscriptions, checked atomically with the append). Messages whose producer id
// the topic saw within its dedup_window are not stored (dedup.go). Keyed messages go to
// storage.PartitionForKey; the keyless messages of one call go together to the next partition in
// round-robin order (so a batch stays one write). PublishedAt is the engine clock, made
// non-decreasing per partition.
//
// A batch that spans partitions is one write per partition log; an I/O failure of one of them
// (which stops the engine, see Close) can leave the others written.
func (e *Engine) MessagesAppend(ctx context.Context, params *storage.MessagesAppendParams) (*storage.MessagesAppendResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// The outcome is worked out here, not on the committer goroutine, which completes the
	// appends of every caller one after the other.
	ch := make(chan *appendOp, 1)
	if err := e.queueAppend(params, func(op *appendOp) { ch <- op }); err != nil {
		return nil, err
	}
	var op *appendOp
	select {
	case op = <-ch:
	case <-ctx.Done():
		return nil, fmt.Errorf("wal: append may or may not complete: %w", ctx.Err())
	}
	return e.appended(params, op)
}

// MessagesAppendAsync is MessagesAppend without a waiting goroutine (storage.AsyncAppender):
// it validates and queues the batch like MessagesAppend and returns; done runs on the committer
// goroutine (or the goroutine that synced the batch's last partition log) once every partition's
// append completed. A batch of duplicates only that are all known calls done before
// MessagesAppendAsync returns, on the caller's goroutine (with no lock held).
func (e *Engine) MessagesAppendAsync(params *storage.MessagesAppendParams, done func(*storage.MessagesAppendResult, error)) error {
	return e.queueAppend(params, func(op *appendOp) { done(e.appended(params, op)) })
}

// appendOp is an append in flight: its partition batches and its de-duplication.
type appendOp struct {
	batches []*partBatch // by partition; nil where the append has no message
	dedup   *dedupPlan   // nil when no message has a producer id
}

// queueAppend validates a batch and queues it in the partition logs' committer; it returns an
// error when nothing was queued. Otherwise complete runs once every partition's append
// completed and every duplicate of a pending append got its position, on the goroutine that
// completed the last one (the caller's, before queueAppend returns, when there was nothing to
// wait for), with the op to pass to appended.
func (e *Engine) queueAppend(params *storage.MessagesAppendParams, complete func(*appendOp)) error {
	if params == nil || len(params.Messages) == 0 {
		return invalid("no messages to append")
	}
	if err := names.ValidateTopic(params.Topic); err != nil {
		return validName(err)
	}
	msgs := params.Messages
	e.mu.RLock()
	if err := e.checkLocked(); err != nil {
		e.mu.RUnlock()
		return err
	}
	t := e.topics[params.Topic]
	if t == nil {
		e.mu.RUnlock()
		return topicNotFound(params.Topic)
	}
	cfg := t.meta.Config.WithDefaults() // dedup_window of a topic created before it existed
	n := len(t.parts)
	for i := range msgs {
		m := &msgs[i]
		if size := appendSize(m); size > cfg.MaxMessageBytes {
			e.mu.RUnlock()
			return fmt.Errorf("%w: message %d of the batch is %d bytes, topic %q allows %d",
				storage.ErrMessageTooLarge, i, size, params.Topic, cfg.MaxMessageBytes)
		}
		if m.Partition != storage.PartitionAuto && (m.Partition < 0 || int(m.Partition) >= n) {
			e.mu.RUnlock()
			return invalid("message %d: partition %d out of range, topic %q has %d", i, m.Partition, params.Topic, n)
		}
		if len(m.ProducerID) > storage.MaxProducerIDLen {
			e.mu.RUnlock()
			return invalid("message %d: producer id is %d bytes, at most %d allowed", i, len(m.ProducerID), storage.MaxProducerIDLen)
		}
	}
	if err := checkDamagedTargets(t, msgs); err != nil {
		e.mu.RUnlock()
		return err
	}
	if cfg.Semantics == storage.PubSub && cfg.BlockWritesOnZeroSubscriptions && !hasActiveLocked(t) {
		e.mu.RUnlock()
		return fmt.Errorf("%w: topic %q", storage.ErrNoSubscriptions, params.Topic)
	}

	// The producer ids the engine remembers are bounded (Config.MaxProducerIDs): an append that
	// would remember new ones past the bound is refused before anything is reserved. Concurrent
	// appends may pass the check together: the bound holds up to their new ids.
	if max := int64(e.cfg.MaxProducerIDs); e.dedupIDs.Load() >= max-int64(len(msgs)) {
		now := e.clock.Now().UnixNano()
		n := int64(t.dedup.newIDs(msgs, now))
		if n > 0 && e.dedupIDs.Load()+n > max {
			// Expired ids of idle topics still count until pruned: prune them all first (only
			// near the bound).
			for _, other := range e.topics {
				other.dedup.prune(now, &e.dedupIDs)
			}
		}
		if n > 0 && e.dedupIDs.Load()+n > max {
			e.mu.RUnlock()
			return fmt.Errorf("%w: topic %q: %d new producer ids, and the engine remembers %d of at most %d until their dedup_window ends: retry later, shorten dedup_window or publish without producer ids",
				storage.ErrRateLimited, params.Topic, n, e.dedupIDs.Load(), max)
		}
	}

	// From here on the append is queued whatever happens: reservations are only resolved by the
	// completion of the partition appends.
	op := &appendOp{batches: make([]*partBatch, n)}
	var remaining atomic.Int32
	remaining.Store(1) // released below, once everything is queued
	finish := func() {
		if remaining.Add(-1) == 0 {
			complete(op)
		}
	}
	now := e.clock.Now().UnixNano()
	// The waiters of duplicates of pending appends are counted in remaining before they can run.
	op.dedup = t.dedup.reserve(msgs, now, cfg.DedupWindow, &remaining, finish, &e.dedupIDs)

	// Assign partitions.
	batches := op.batches
	used := 0
	keyless := int32(-1)
	for i := range msgs {
		if !op.dedup.stored(i) {
			continue
		}
		m := &msgs[i]
		p := m.Partition
		if p == storage.PartitionAuto {
			if len(m.Key) > 0 {
				p = storage.PartitionForKey(m.Key, n)
			} else {
				// Past damaged partitions (checkDamagedTargets made sure one is healthy).
				for k := 0; k < n && (keyless < 0 || t.parts[keyless].damaged() != nil); k++ {
					keyless = int32((t.rr.Add(1) - 1) % uint32(n))
				}
				p = keyless
			}
		}
		b := batches[p]
		if b == nil {
			b = &partBatch{p: t.parts[p]}
			batches[p] = b
			used++
		}
		b.idx = append(b.idx, i)
	}

	// The Linked bits of the publish (storage.LinkRuns): one partition's share of it gets
	// consecutive offsets (one log append below).
	partOf := make([]int32, len(msgs))
	for i := range partOf {
		partOf[i] = -1
	}
	for _, b := range batches {
		if b != nil {
			for _, i := range b.idx {
				partOf[i] = b.p.index
			}
		}
	}
	linked := storage.LinkRuns(len(msgs), func(i int) int32 { return partOf[i] }, func(i int) []byte { return msgs[i].Key })

	remaining.Add(int32(used))
	t.inflight.Add(used)
	// Encode outside the partition locks: the body does not hold the publish time (the frame
	// timestamp does).
	var scratch storage.Message
	for _, b := range batches {
		if b == nil {
			continue
		}
		size := 0
		for _, i := range b.idx {
			size += appendSize(&msgs[i]) + 32
		}
		b.buf = getRecordBuf(size)
		buf := *b.buf
		ends := make([]int, len(b.idx))
		for j, i := range b.idx {
			m := &msgs[i]
			scratch = storage.Message{Key: m.Key, Headers: m.Headers, Payload: m.Payload, ProducerID: m.ProducerID,
				NotBefore: m.NotBefore, ExpiresAt: m.ExpiresAt, Linked: linked[i]}
			buf = record.AppendMessage(buf, &scratch)
			ends[j] = len(buf)
		}
		*b.buf = buf
		b.recs = make([]wlog.Record, len(b.idx))
		start := 0
		for j := range b.recs {
			b.recs[j] = wlog.Record{Body: buf[start:ends[j]:ends[j]]}
			start = ends[j]
		}
	}
	for _, b := range batches {
		if b == nil {
			continue
		}
		p := b.p
		p.mu.Lock()
		ts := max(now, p.lastTS)
		p.lastTS = ts
		b.ts = ts
		for j := range b.recs {
			b.recs[j].Timestamp = ts
		}
		e.committer.AppendAsyncWith(p.log, b.recs, wlog.AppendOptions{Prompt: params.Prompt}, func(first int64, err error) {
			b.first, b.err = first, err
			at := time.Unix(0, b.ts).UTC()
			t.dedup.resolve(op.dedup, b.idx, func(j int) storage.MessagePosition {
				return storage.MessagePosition{Partition: b.p.index, Offset: first + int64(j), PublishedAt: at}
			}, err, &e.dedupIDs)
			t.inflight.Done()
			finish()
		})
		p.mu.Unlock()
	}
	e.mu.RUnlock()
	finish()
	return nil
}

// appended is the outcome of an append whose partition appends all completed: it frees the
// records (the committer no longer holds them), fails the engine on a write error and notifies
// of the new messages.
func (e *Engine) appended(params *storage.MessagesAppendParams, op *appendOp) (*storage.MessagesAppendResult, error) {
	msgs := params.Messages
	for _, b := range op.batches {
		if b != nil {
			putRecordBuf(b.buf)
			b.buf, b.recs = nil, nil
		}
	}
	res := &storage.MessagesAppendResult{Positions: make([]storage.MessagePosition, len(msgs))}
	// The batch stored nothing only if no partition's share was written (each was refused after
	// an earlier failure, or found no room for a new segment); otherwise its outcome is unknown
	// (see ioFailure). No room for a segment (wlog.ErrNoSegment) or no file handle to reopen the
	// active segment (wlog.ErrNotOpened) leaves the log working: the engine does not fail, and
	// publishes resume once space or handles are freed.
	var failed *partBatch
	written := false
	for _, b := range op.batches {
		switch {
		case b == nil:
		case b.err == nil:
			written = true
		default:
			if !errors.Is(b.err, storage.ErrClosed) && !errors.Is(b.err, wlog.ErrNoSegment) && !errors.Is(b.err, wlog.ErrNotOpened) {
				e.fail(fmt.Errorf("wal: append to %s: %w", b.p.dir, b.err))
			}
			written = written || writtenBefore(b.err)
			if failed == nil {
				failed = b
			}
		}
	}
	if failed != nil {
		return nil, ioFailure(fmt.Errorf("wal: append to topic %q partition %d: %w", params.Topic, failed.p.index, failed.err), written)
	}
	stored := false
	for _, b := range op.batches {
		if b == nil {
			continue
		}
		stored = true
		at := time.Unix(0, b.ts).UTC()
		for j, i := range b.idx {
			res.Positions[i] = storage.MessagePosition{Partition: b.p.index, Offset: b.first + int64(j), PublishedAt: at}
		}
	}
	if dp := op.dedup; dp != nil {
		dp.mu.Lock()
		err := dp.err
		dp.mu.Unlock()
		if err != nil {
			return nil, ioFailure(fmt.Errorf("wal: append to topic %q: the earlier append of a producer id failed: %w", params.Topic, err), stored)
		}
		for i := range msgs {
			if dp.dup[i] {
				res.Positions[i] = dp.pos[i]
			}
		}
		// Duplicates inside the batch, after every other position is known.
		for i, j := range dp.dupOf {
			if j >= 0 {
				res.Positions[i] = res.Positions[j]
				res.Positions[i].Duplicate = true
			}
		}
	}
	if stored {
		e.notify(storage.Notification{Kind: storage.NotifyMessages, Topic: params.Topic})
	}
	return res, nil
}

// readBatchBytes bounds the bodies one log read returns.
const readBatchBytes = storage.ReadBatchBytes

// decodeRecord decodes a partition log record into m.
func decodeRecord(topicName string, p int32, offset int64, rec wlog.Record, m *storage.Message) error {
	if err := record.DecodeMessage(rec.Body, m); err != nil {
		return fmt.Errorf("%w: wal: topic %q partition %d offset %d: %v", storage.ErrCorrupt, topicName, p, offset, err)
	}
	m.Topic = topicName
	m.Partition = p
	m.Offset = offset
	m.PublishedAt = time.Unix(0, rec.Timestamp).UTC()
	return nil
}

// checkDamagedTargets refuses a batch with a message for a damaged partition (its own, or its
// key's), or with keyless messages when every partition is damaged: nothing is stored.
func checkDamagedTargets(t *topic, msgs []storage.AppendMessage) error {
	n := len(t.parts)
	healthy := 0
	for _, p := range t.parts {
		if p.damaged() == nil {
			healthy++
		}
	}
	if healthy == n {
		return nil
	}
	for i := range msgs {
		m := &msgs[i]
		p := m.Partition
		if p == storage.PartitionAuto {
			if len(m.Key) == 0 {
				if healthy == 0 {
					return unavailable(t.meta.Name, t.parts[0])
				}
				continue
			}
			p = storage.PartitionForKey(m.Key, n)
		}
		if t.parts[p].damaged() != nil {
			return unavailable(t.meta.Name, t.parts[p])
		}
	}
	return nil
}

// readMessage reads one message of a partition. A damaged partition's error is unavailable's
// (the partition is marked damaged when the read meets the damage).
func (e *Engine) readMessage(t *topic, p int32, offset int64) (storage.Message, error) {
	var m storage.Message
	part := t.parts[p]
	if part.damaged() != nil {
		return m, unavailable(t.meta.Name, part)
	}
	recs, err := part.log.Read(offset, 1, 0)
	if err != nil {
		return m, e.readFailure(t.meta.Name, part, err)
	}
	if len(recs) == 0 {
		return m, fmt.Errorf("%w: offset %d is at the high-water mark", storage.ErrOffsetOutOfRange, offset)
	}
	err = decodeRecord(t.meta.Name, p, offset, recs[0], &m)
	return m, err
}

// MessagesRead reads up to Limit (default 100) retained messages of a partition from Offset
// (from the first retained one when Offset is below it), without leasing them. An Offset above
// the high-water mark fails with storage.ErrOffsetOutOfRange; at the high-water mark the result
// is empty.
func (e *Engine) MessagesRead(ctx context.Context, params *storage.MessagesReadParams) ([]*storage.Message, error) {
	if params == nil {
		return nil, invalid("nil params")
	}
	if params.Offset < 0 || params.Limit < 0 {
		return nil, invalid("offset and limit must not be negative, got %d and %d", params.Offset, params.Limit)
	}
	limit := params.Limit
	if limit == 0 {
		limit = 100
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return nil, storage.ErrClosed
	}
	t := e.topics[params.Topic]
	if t == nil {
		return nil, topicNotFound(params.Topic)
	}
	if params.Partition < 0 || int(params.Partition) >= len(t.parts) {
		return nil, invalid("partition %d out of range, topic %q has %d", params.Partition, params.Topic, len(t.parts))
	}
	part := t.parts[params.Partition]
	if part.damaged() != nil {
		return nil, unavailable(params.Topic, part)
	}
	l := part.log
	for {
		hw := l.NextIndex()
		if params.Offset > hw {
			return nil, fmt.Errorf("%w: offset %d is above the high-water mark %d of topic %q partition %d",
				storage.ErrOffsetOutOfRange, params.Offset, hw, params.Topic, params.Partition)
		}
		from := max(params.Offset, l.FirstIndex())
		if from >= hw {
			return []*storage.Message{}, nil
		}
		recs, err := l.Read(from, limit, readBatchBytes)
		if errors.Is(err, storage.ErrOffsetOutOfRange) && from < l.FirstIndex() {
			continue // retention removed the segment meanwhile
		}
		if err != nil {
			return nil, e.readFailure(params.Topic, part, fmt.Errorf("wal: read topic %q partition %d: %w", params.Topic, params.Partition, err))
		}
		out := make([]*storage.Message, len(recs))
		for i, rec := range recs {
			m := new(storage.Message)
			if err := decodeRecord(params.Topic, params.Partition, from+int64(i), rec, m); err != nil {
				return nil, err
			}
			out[i] = m
		}
		return out, nil
	}
}
