package pgstore

import (
	"maps"
	"sync"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// msgCache keeps the most recent messages of each partition in memory, so that the claims of many
// groups on one broker instance read a message from PostgreSQL at most once (fan-out to 16 groups
// would otherwise read every message 16 times). Messages are immutable and topic ids are never
// reused, so an entry is never stale; retention only makes old entries useless (claims start at
// the subscription's cursor, never below the low offset). It is filled by MessagesAppend after
// commit (copies of the caller's bytes) and by claims that read from the database. The cached
// messages are shared by every delivery made from them: nothing may modify a delivered message's
// key, headers or payload.
//
// Each partition keeps a window of consecutive offsets [base, base+len(msgs)); the total size is
// bounded by budget bytes (a partition's window drops its oldest entries first, then other
// partitions' windows go).
type msgCache struct {
	mu     sync.Mutex
	budget int64
	bytes  int64
	parts  map[cacheKey]*cacheWindow
}

type cacheKey struct {
	topicID   int64
	partition int32
}

type cacheWindow struct {
	base  int64
	msgs  []*storage.Message
	bytes int64
}

// cacheEntryOverhead is the bookkeeping counted per cached message besides its bytes.
const cacheEntryOverhead = 160

func newMsgCache(budget int64) *msgCache {
	if budget <= 0 {
		return nil
	}
	return &msgCache{budget: budget, parts: map[cacheKey]*cacheWindow{}}
}

func cachedSize(m *storage.Message) int64 { return int64(m.Size() + cacheEntryOverhead) }

// get returns up to n cached messages of the partition from offset from on, consecutive; fewer
// (or none) when the window does not cover them. A nil cache has nothing.
func (c *msgCache) get(topicID int64, partition int32, from int64, n int) []*storage.Message {
	if c == nil || n <= 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.parts[cacheKey{topicID, partition}]
	if w == nil || from < w.base || from >= w.base+int64(len(w.msgs)) {
		return nil
	}
	i := int(from - w.base)
	j := min(len(w.msgs), i+n)
	out := make([]*storage.Message, j-i)
	copy(out, w.msgs[i:j])
	return out
}

// put adds ms (ascending offsets of one partition) to the window: the consecutive run that
// continues the window, or, when ms starts after the window's end, a new window. Messages
// already cached or before the window are ignored.
func (c *msgCache) put(topicID int64, partition int32, ms []*storage.Message) {
	if c == nil || len(ms) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	k := cacheKey{topicID, partition}
	w := c.parts[k]
	end := int64(-1)
	if w != nil {
		end = w.base + int64(len(w.msgs))
	}
	for i, m := range ms {
		if i > 0 && m.Offset != ms[i-1].Offset+1 {
			break // a gap (retention): keep the window consecutive
		}
		switch {
		case w != nil && m.Offset < end:
			continue
		case w == nil || m.Offset > end:
			if w != nil {
				c.bytes -= w.bytes
			}
			w = &cacheWindow{base: m.Offset}
			c.parts[k] = w
		}
		w.msgs = append(w.msgs, m)
		sz := cachedSize(m)
		w.bytes += sz
		c.bytes += sz
		end = m.Offset + 1
	}
	c.shrinkLocked(k)
}

// shrinkLocked brings the cache under its budget: the oldest entries of the window just written
// go first (a partition may use at most half the budget), then whole other windows.
func (c *msgCache) shrinkLocked(k cacheKey) {
	w := c.parts[k]
	drop := 0
	for w != nil && drop < len(w.msgs)-1 && (w.bytes > c.budget/2 || c.bytes > c.budget) {
		sz := cachedSize(w.msgs[drop])
		w.bytes -= sz
		c.bytes -= sz
		w.msgs[drop] = nil
		drop++
	}
	if w != nil && drop > 0 {
		// Reslice, not copy: a full window drops an entry at nearly every put, and copying the
		// window (tens of thousands of pointers) each time cost ~10% of a publishing broker's
		// CPU. append moves the live entries to a new array when the old one is used up.
		w.msgs = w.msgs[drop:]
		w.base += int64(drop)
	}
	for ok, ow := range c.parts {
		if c.bytes <= c.budget {
			break
		}
		if ok != k {
			c.bytes -= ow.bytes
			delete(c.parts, ok)
		}
	}
}

// appendedMessage is the message MessagesAppend stored, as a claim would read it back from the
// database: the caller's bytes copied, times at microseconds in UTC, empty payload non-nil, no
// empty headers map.
func appendedMessage(topic string, am *storage.AppendMessage, pos storage.MessagePosition) *storage.Message {
	m := &storage.Message{
		Topic: topic, Partition: pos.Partition, Offset: pos.Offset, PublishedAt: pos.PublishedAt.UTC(),
		ProducerID: am.ProducerID, Payload: append([]byte{}, am.Payload...),
	}
	if am.Key != nil {
		m.Key = append([]byte{}, am.Key...)
	}
	if len(am.Headers) > 0 {
		m.Headers = maps.Clone(am.Headers)
	}
	if !am.NotBefore.IsZero() {
		m.NotBefore = am.NotBefore.Truncate(time.Microsecond).UTC()
	}
	if !am.ExpiresAt.IsZero() {
		m.ExpiresAt = am.ExpiresAt.Truncate(time.Microsecond).UTC()
	}
	return m
}
