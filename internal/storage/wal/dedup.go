package wal

import (
	"cmp"
	"errors"
	"fmt"
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

// dedupEntry is one producer id of a topic.
type dedupEntry struct {
	id      string
	expires int64 // unix ns: a later message with the id is a duplicate until then
	// pending: the append that stores the message has not completed; waiters are called with its
	// outcome. Guarded by dedupTable.mu.
	pending bool
	// dead: its append failed; it is no longer counted in Engine.dedupIDs.
	dead    bool
	waiters []func(storage.MessagePosition, error)
	pos     storage.MessagePosition // once not pending
}

// dedupTable is a topic's producer ids. The entries are in the queue in the order they were
// added, which is expiry order unless dedup_window shrank meanwhile (then an entry may outlive
// its expiry by at most the old window; lookups check expires, so that changes no answer).
type dedupTable struct {
	mu    sync.Mutex
	ids   map[string]*dedupEntry
	queue []*dedupEntry
	head  int
}

// pruneLocked drops the entries expired at now (unix ns) from the head of the queue, and counts
// them out of total (the engine's count of queued entries, Engine.dedupIDs).
func (d *dedupTable) pruneLocked(now int64, total *atomic.Int64) {
	dropped := 0
	for d.head < len(d.queue) {
		en := d.queue[d.head]
		if en.expires > now || en.pending {
			break
		}
		if d.ids[en.id] == en {
			delete(d.ids, en.id)
		}
		d.queue[d.head] = nil
		d.head++
		if !en.dead {
			dropped++
		}
	}
	total.Add(-int64(dropped))
	// Reuse the space before head once it is most of the slice.
	if d.head > 64 && d.head*2 > len(d.queue) {
		n := copy(d.queue, d.queue[d.head:])
		clear(d.queue[n:])
		d.queue = d.queue[:n]
		d.head = 0
	}
}

// prune drops expired entries.
func (d *dedupTable) prune(now int64, total *atomic.Int64) {
	d.mu.Lock()
	d.pruneLocked(now, total)
	d.mu.Unlock()
}

// drop forgets every entry (the topic was deleted) and counts them out of total.
func (d *dedupTable) drop(total *atomic.Int64) {
	d.mu.Lock()
	total.Add(-int64(d.countedLocked()))
	d.ids, d.queue, d.head = nil, nil, 0
	d.mu.Unlock()
}

// countedLocked is how many queued entries count toward Engine.dedupIDs.
func (d *dedupTable) countedLocked() int {
	n := 0
	for _, en := range d.queue[d.head:] {
		if !en.dead {
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
		if en := d.ids[id]; en == nil || (!en.pending && en.expires <= now) {
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
	// mine are the entries this append reserved, by message index.
	mine map[int]*dedupEntry
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
				mine: map[int]*dedupEntry{}}
			for j := range dp.dupOf {
				dp.dupOf[j] = -1
			}
			first = map[string]int{}
			if d.ids == nil {
				d.ids = map[string]*dedupEntry{}
			}
		}
		if j, ok := first[id]; ok {
			dp.dupOf[i] = j
			continue
		}
		first[id] = i
		if en := d.ids[id]; en != nil && (en.pending || en.expires > now) {
			dp.dup[i] = true
			if !en.pending {
				dp.pos[i] = en.pos
				dp.pos[i].Duplicate = true
				continue
			}
			waiting.Add(1)
			en.waiters = append(en.waiters, func(pos storage.MessagePosition, err error) {
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
		en := &dedupEntry{id: id, expires: now + int64(window), pending: true}
		d.ids[id] = en
		d.queue = append(d.queue, en)
		total.Add(1)
		dp.mine[i] = en
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
		en := dp.mine[i]
		if en == nil {
			continue
		}
		en.pending = false
		if err != nil {
			// Forget the id, so that a retry stores the message; it no longer counts toward
			// MaxProducerIDs (its queue slot goes when it reaches the head).
			if d.ids[en.id] == en {
				delete(d.ids, en.id)
			}
			en.expires, en.dead = 0, true
			total.Add(-1)
		} else {
			en.pos = pos(j)
		}
		if len(en.waiters) > 0 {
			calls = append(calls, call{en.waiters, en.pos})
			en.waiters = nil
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
	var entries []*dedupEntry
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
				entries = append(entries, &dedupEntry{id: string(id), expires: rec.Timestamp + int64(window),
					pos: storage.MessagePosition{Partition: p.index, Offset: i, PublishedAt: time.Unix(0, rec.Timestamp).UTC()}})
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
	slices.SortStableFunc(entries, func(a, b *dedupEntry) int { return cmp.Compare(a.expires, b.expires) })
	d := &t.dedup
	d.mu.Lock()
	defer d.mu.Unlock()
	e.dedupIDs.Add(-int64(d.countedLocked()))
	d.ids, d.queue, d.head = nil, nil, 0
	if len(entries) == 0 {
		return nil
	}
	d.ids = make(map[string]*dedupEntry, len(entries))
	for _, en := range entries {
		d.ids[en.id] = en // later expiry wins
	}
	d.queue = entries
	e.dedupIDs.Add(int64(len(entries)))
	d.pruneLocked(now.UnixNano(), &e.dedupIDs)
	return nil
}
