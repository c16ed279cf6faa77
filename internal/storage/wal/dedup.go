package wal

import (
	"cmp"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/record"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

// Producer de-duplication (storage.Engine.MessagesAppend). Each topic keeps, in memory, the
// producer ids of the messages appended within its dedup_window: id -> position and expiry. An
// append reserves its new ids (pending entries) under the table's lock before it queues its
// records, so that of two concurrent appends with the same id exactly one stores it; the other
// waits for the first one's outcome and answers its position with Duplicate set (or its error:
// an append that fails forgets its reservations, so a retry stores the message).
//
// Durability: the producer id is in the message record (record.AppendMessage), durable with the
// message. Open rebuilds each table from the records of the last dedup_window of every partition
// log (wlog.SearchTime, then record.ProducerID of each record), so a crash between the commit
// and the answer still de-duplicates the retry. Memory is bounded by the window: entries are
// dropped once expired, on each append to the topic and by RetentionApply. A record that
// retention removed is no longer found by a rebuild: with message_retention shorter than
// dedup_window, a restart forgets those ids early (docs/storage.md).

// A table remembers an id by its dedupKey, not its text, in pointer-free entries: ~106 bytes per
// id whatever its length (BenchmarkDedupMemory), and nothing for the garbage collector to mark
// (entries with pointers cost ~180 bytes per 36-byte id and half a second of marking per cycle
// at a million ids).

// dedupKey is a producer id's 128-bit hash: two maphash sums under the table's random seeds, so
// that ids cannot be chosen to collide. Two ids with one key (odds ~n^2 / 2^129: ~10^-27 for a
// million ids) would make the second a duplicate of the first.
type dedupKey [2]uint64

// Entry states.
const (
	entryStored  uint8 = iota // the message is stored at the entry's position
	entryPending              // its append has not completed; waiters wait for it
	entryDead                 // its append failed; not counted in Engine.dedupIDs
)

// dedupEntry is one producer id of a topic.
type dedupEntry struct {
	key     dedupKey
	expires int64 // unix ns: a later message with the id is a duplicate until then
	at      int64 // the stored message's publish time, unix ns
	offset  int64
	part    int32
	state   uint8
}

// position returns the stored message's position.
func (en *dedupEntry) position() storage.MessagePosition {
	return storage.MessagePosition{Partition: en.part, Offset: en.offset, PublishedAt: time.Unix(0, en.at).UTC()}
}

// dedupTable is a topic's producer ids. The entries are in the queue in the order they were
// added, which is expiry order unless dedup_window shrank meanwhile (then an entry may outlive
// its expiry by at most the old window; lookups check expires, so that changes no answer). An
// entry is named by its sequence number: queue[seq-base], from head on.
type dedupTable struct {
	mu     sync.Mutex
	seeded bool
	seeds  [2]maphash.Seed
	ids    map[dedupKey]uint64 // key -> seq of its latest entry
	queue  []dedupEntry
	head   int
	base   uint64 // seq of queue[0]
	// waiters of pending entries, by seq: called with the append's outcome.
	waiters map[uint64][]func(storage.MessagePosition, error)
}

// keyLocked returns the key of id.
func (d *dedupTable) keyLocked(id string) dedupKey {
	if !d.seeded {
		d.seeds, d.seeded = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}, true
	}
	return dedupKey{maphash.String(d.seeds[0], id), maphash.String(d.seeds[1], id)}
}

// entryLocked returns the entry seq, nil when it left the queue (or the table was dropped).
func (d *dedupTable) entryLocked(seq uint64) *dedupEntry {
	if seq < d.base+uint64(d.head) || seq >= d.base+uint64(len(d.queue)) {
		return nil
	}
	return &d.queue[seq-d.base]
}

// lookupLocked returns the entry of key, nil when there is none.
func (d *dedupTable) lookupLocked(k dedupKey) (uint64, *dedupEntry) {
	seq, ok := d.ids[k]
	if !ok {
		return 0, nil
	}
	return seq, d.entryLocked(seq)
}

// pruneLocked drops the entries expired at now (unix ns) from the head of the queue, and counts
// them out of total (the engine's count of queued entries, Engine.dedupIDs).
func (d *dedupTable) pruneLocked(now int64, total *atomic.Int64) {
	dropped := 0
	for d.head < len(d.queue) {
		en := &d.queue[d.head]
		if en.expires > now || en.state == entryPending {
			break
		}
		if seq, ok := d.ids[en.key]; ok && seq == d.base+uint64(d.head) {
			delete(d.ids, en.key)
		}
		d.head++
		if en.state != entryDead {
			dropped++
		}
	}
	total.Add(-int64(dropped))
	// Reuse the space before head once it is most of the slice.
	if d.head > 64 && d.head*2 > len(d.queue) {
		n := copy(d.queue, d.queue[d.head:])
		d.queue = d.queue[:n]
		d.base += uint64(d.head)
		d.head = 0
	}
}

// prune drops expired entries.
func (d *dedupTable) prune(now int64, total *atomic.Int64) {
	d.mu.Lock()
	d.pruneLocked(now, total)
	d.mu.Unlock()
}

// resetLocked forgets every entry; sequence numbers go on from where they were, so that an
// append still pending finds its entry gone (resolve), not another one. Waiters stay.
func (d *dedupTable) resetLocked() {
	d.base += uint64(len(d.queue))
	d.ids, d.queue, d.head = nil, nil, 0
}

// drop forgets every entry (the topic was deleted) and counts them out of total.
func (d *dedupTable) drop(total *atomic.Int64) {
	d.mu.Lock()
	total.Add(-int64(d.countedLocked()))
	d.resetLocked()
	d.mu.Unlock()
}

// countedLocked is how many queued entries count toward Engine.dedupIDs.
func (d *dedupTable) countedLocked() int {
	n := 0
	for i := d.head; i < len(d.queue); i++ {
		if d.queue[i].state != entryDead {
			n++
		}
	}
	return n
}

// newIDs counts the producer ids of msgs that reserve would remember anew at now (not known, or
// expired; repeats inside the batch once).
func (d *dedupTable) newIDs(msgs []storage.AppendMessage, now int64) int {
	n := 0
	var seen map[string]bool
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range msgs {
		id := msgs[i].ProducerID
		if id == "" || seen[id] {
			continue
		}
		if seen == nil {
			seen = map[string]bool{}
		}
		seen[id] = true
		if _, en := d.lookupLocked(d.keyLocked(id)); en == nil || (en.state != entryPending && en.expires <= now) {
			n++
		}
	}
	return n
}

// len returns the number of ids remembered (tests).
func (d *dedupTable) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.ids)
}

// dedupPlan is the de-duplication of one append: which messages are not stored, and where their
// positions come from.
type dedupPlan struct {
	// dupOf[i] >= 0: message i is a duplicate of message dupOf[i] of the same batch. -1 otherwise.
	dupOf []int
	// dup[i]: message i is a duplicate of a stored message whose position is known (set) or of
	// a pending append (filled in by a waiter before the append completes).
	dup []bool
	pos []storage.MessagePosition
	// mine are the entries (seq) this append reserved, by message index.
	mine map[int]uint64
	err  error // a pending append that failed
	mu   sync.Mutex
}

// stored reports whether message i is stored (not a duplicate).
func (dp *dedupPlan) stored(i int) bool {
	return dp == nil || (!dp.dup[i] && dp.dupOf[i] < 0)
}

// reserve works out the duplicates of a batch and reserves the ids of the messages it will store,
// at now with the topic's window. It returns nil when no message has a producer id. For each
// duplicate of a pending append it adds one to waiting, before that append can complete (under
// the lock resolve takes), and registers a waiter that sets the position (or error) and calls
// onDone.
func (d *dedupTable) reserve(msgs []storage.AppendMessage, now int64, window time.Duration, waiting *atomic.Int32, onDone func(), total *atomic.Int64) *dedupPlan {
	if !slices.ContainsFunc(msgs, func(m storage.AppendMessage) bool { return m.ProducerID != "" }) {
		return nil // no lock on the path of appends without producer ids
	}
	var dp *dedupPlan
	var first map[string]int
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pruneLocked(now, total)
	for i := range msgs {
		id := msgs[i].ProducerID
		if id == "" {
			continue
		}
		if dp == nil {
			n := len(msgs)
			dp = &dedupPlan{dupOf: make([]int, n), dup: make([]bool, n), pos: make([]storage.MessagePosition, n),
				mine: map[int]uint64{}}
			for j := range dp.dupOf {
				dp.dupOf[j] = -1
			}
			first = map[string]int{}
			if d.ids == nil {
				d.ids = map[dedupKey]uint64{}
			}
		}
		if j, ok := first[id]; ok {
			dp.dupOf[i] = j
			continue
		}
		first[id] = i
		k := d.keyLocked(id)
		if seq, en := d.lookupLocked(k); en != nil && (en.state == entryPending || en.expires > now) {
			dp.dup[i] = true
			if en.state != entryPending {
				dp.pos[i] = en.position()
				dp.pos[i].Duplicate = true
				continue
			}
			waiting.Add(1)
			if d.waiters == nil {
				d.waiters = map[uint64][]func(storage.MessagePosition, error){}
			}
			d.waiters[seq] = append(d.waiters[seq], func(pos storage.MessagePosition, err error) {
				dp.mu.Lock()
				if err != nil {
					dp.err = err
				}
				pos.Duplicate = true
				dp.pos[i] = pos
				dp.mu.Unlock()
				onDone()
			})
			continue
		}
		seq := d.base + uint64(len(d.queue))
		d.queue = append(d.queue, dedupEntry{key: k, expires: now + int64(window), state: entryPending})
		d.ids[k] = seq
		total.Add(1)
		dp.mine[i] = seq
	}
	return dp
}

// resolve completes the reservations of message indexes idx (stored at positions pos, or failed
// with err) and calls their waiters, with no lock held.
func (d *dedupTable) resolve(dp *dedupPlan, idx []int, pos func(j int) storage.MessagePosition, err error, total *atomic.Int64) {
	if dp == nil || len(dp.mine) == 0 {
		return
	}
	type call struct {
		fns []func(storage.MessagePosition, error)
		pos storage.MessagePosition
	}
	var calls []call
	d.mu.Lock()
	for j, i := range idx {
		seq, ok := dp.mine[i]
		if !ok {
			continue
		}
		var p storage.MessagePosition
		en := d.entryLocked(seq) // nil: the topic was deleted meanwhile
		switch {
		case err != nil && en != nil:
			// Forget the id, so that a retry stores the message; it no longer counts toward
			// MaxProducerIDs (its queue slot goes when it reaches the head).
			if s, ok := d.ids[en.key]; ok && s == seq {
				delete(d.ids, en.key)
			}
			en.expires, en.state = 0, entryDead
			total.Add(-1)
		case err == nil:
			p = pos(j)
			if en != nil {
				en.part, en.offset, en.at, en.state = p.Partition, p.Offset, p.PublishedAt.UnixNano(), entryStored
			}
		}
		if fns := d.waiters[seq]; len(fns) > 0 {
			calls = append(calls, call{fns, p})
			delete(d.waiters, seq)
		}
	}
	d.mu.Unlock()
	for _, c := range calls {
		for _, fn := range c.fns {
			fn(c.pos, err)
		}
	}
}

// rebuildDedup fills a topic's table from the records of the last dedup_window of its partition
// logs (Open). An id found twice (stored again after its window) keeps its latest message.
func (e *Engine) rebuildDedup(t *topic, now time.Time) error {
	window := t.meta.Config.WithDefaults().DedupWindow
	from := now.Add(-window).UnixNano() + 1
	d := &t.dedup
	d.mu.Lock()
	defer d.mu.Unlock()
	var entries []dedupEntry
	for _, p := range t.parts {
		if p.damaged() != nil {
			continue
		}
		start, err := p.log.SearchTime(from)
		if err != nil {
			return fmt.Errorf("wal: rebuild producer ids of topic %q partition %d: %w", t.meta.Name, p.index, err)
		}
		start = max(start, p.log.FirstIndex())
		err = p.log.Scan(start, func(i int64, rec wlog.Record) (bool, error) {
			id, err := record.ProducerID(rec.Body)
			if err != nil {
				return false, fmt.Errorf("%w: wal: topic %q partition %d offset %d: %v", storage.ErrCorrupt, t.meta.Name, p.index, i, err)
			}
			if len(id) > 0 {
				entries = append(entries, dedupEntry{key: d.keyLocked(string(id)), expires: rec.Timestamp + int64(window),
					at: rec.Timestamp, offset: i, part: p.index})
			}
			return true, nil
		})
		if errors.Is(err, storage.ErrCorrupt) {
			// A damaged sealed segment (Open trusts its index): the partition is unavailable,
			// the ids read before the damage are kept.
			e.markDamaged(t.meta.Name, p, err)
			continue
		}
		if err != nil {
			return fmt.Errorf("wal: rebuild producer ids of topic %q partition %d: %w", t.meta.Name, p.index, err)
		}
	}
	slices.SortStableFunc(entries, func(a, b dedupEntry) int { return cmp.Compare(a.expires, b.expires) })
	e.dedupIDs.Add(-int64(d.countedLocked()))
	d.resetLocked()
	if len(entries) == 0 {
		return nil
	}
	d.ids = make(map[dedupKey]uint64, len(entries))
	for i := range entries {
		d.ids[entries[i].key] = d.base + uint64(i) // later expiry wins
	}
	d.queue = entries
	e.dedupIDs.Add(int64(len(entries)))
	d.pruneLocked(now.UnixNano(), &e.dedupIDs)
	return nil
}
