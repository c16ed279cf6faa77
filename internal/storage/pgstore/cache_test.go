package pgstore

import (
	"fmt"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

func cacheMsgs(from, n int64, size int) []*storage.Message {
	var ms []*storage.Message
	for o := from; o < from+n; o++ {
		ms = append(ms, &storage.Message{Offset: o, Payload: make([]byte, size)})
	}
	return ms
}

func offsetsOf(ms []*storage.Message) []int64 {
	var out []int64
	for _, m := range ms {
		out = append(out, m.Offset)
	}
	return out
}

// TestMsgCacheWindow: a window holds consecutive offsets; reads outside it miss; a gap starts a
// new window; messages before the window or already held are ignored.
func TestMsgCacheWindow(t *testing.T) {
	c := newMsgCache(1 << 20)
	c.put(1, 0, cacheMsgs(10, 5, 10))
	if got := offsetsOf(c.get(1, 0, 11, 3)); len(got) != 3 || got[0] != 11 || got[2] != 13 {
		t.Fatalf("get 11..13: %v", got)
	}
	if got := c.get(1, 0, 12, 10); len(got) != 3 {
		t.Fatalf("get from 12, 10 wanted: %v, want the 3 held", offsetsOf(got))
	}
	for _, miss := range []int64{9, 15} {
		if got := c.get(1, 0, miss, 1); len(got) != 0 {
			t.Fatalf("get %d: %v, want a miss", miss, offsetsOf(got))
		}
	}
	if got := c.get(1, 1, 10, 1); len(got) != 0 {
		t.Fatal("another partition hit")
	}
	c.put(1, 0, cacheMsgs(8, 9, 10)) // 8..16: 8, 9 before the window, 10..14 held, 15, 16 new
	if got := offsetsOf(c.get(1, 0, 10, 100)); len(got) != 7 || got[6] != 16 {
		t.Fatalf("after overlapping put: %v", got)
	}
	c.put(1, 0, cacheMsgs(30, 2, 10)) // a gap: new window
	if got := c.get(1, 0, 10, 1); len(got) != 0 {
		t.Fatal("old window still answers after a gap")
	}
	if got := offsetsOf(c.get(1, 0, 30, 5)); len(got) != 2 {
		t.Fatalf("new window: %v", got)
	}
	ms := append(cacheMsgs(40, 2, 10), cacheMsgs(50, 2, 10)...) // a gap inside one put
	c.put(1, 2, ms)
	if got := offsetsOf(c.get(1, 2, 40, 10)); len(got) != 2 {
		t.Fatalf("run before the gap: %v", got)
	}
	if got := c.get(1, 2, 50, 1); len(got) != 0 {
		t.Fatal("messages after a gap inside one put were cached")
	}
}

// TestMsgCacheBudget: the total stays within the budget; a partition keeps its newest messages
// and may use at most half of it; other partitions' windows are dropped for a busy one.
func TestMsgCacheBudget(t *testing.T) {
	per := cachedSize(cacheMsgs(0, 1, 1000)[0])
	c := newMsgCache(100 * per)
	c.put(1, 0, cacheMsgs(0, 40, 1000))
	c.put(2, 0, cacheMsgs(0, 200, 1000))
	if c.bytes > c.budget {
		t.Fatalf("cache holds %d bytes, budget %d", c.bytes, c.budget)
	}
	w := c.parts[cacheKey{2, 0}]
	if w == nil || w.bytes > c.budget/2 || w.base+int64(len(w.msgs)) != 200 {
		t.Fatalf("busy window: %+v", w)
	}
	if got := c.get(2, 0, 199, 1); len(got) != 1 {
		t.Fatal("newest message evicted")
	}
	var sum int64
	for _, w := range c.parts {
		sum += w.bytes
	}
	if sum != c.bytes {
		t.Fatalf("windows hold %d bytes, counter says %d", sum, c.bytes)
	}
	if newMsgCache(-1) != nil {
		t.Fatal("a negative budget must disable the cache")
	}
	var off *msgCache
	off.put(1, 0, cacheMsgs(0, 1, 1))
	if off.get(1, 0, 0, 1) != nil {
		t.Fatal("a disabled cache answered")
	}
}

// TestMsgCacheFullWindowAmortized: putting one message into a full window does not copy the
// window (it did at every put: ~10% of a publishing broker's CPU at the default budget).
func TestMsgCacheFullWindowAmortized(t *testing.T) {
	per := cachedSize(cacheMsgs(0, 1, 100)[0])
	c := newMsgCache(2000 * per)
	c.put(1, 0, cacheMsgs(0, 1000, 100)) // the window is full: half the budget
	ms := cacheMsgs(1000, 5000, 100)
	i := 0
	allocs := testing.AllocsPerRun(len(ms)-1, func() {
		c.put(1, 0, ms[i:i+1])
		i++
	})
	if allocs >= 1 {
		t.Fatalf("%v allocations per put into a full window, want fewer than 1 (amortized)", allocs)
	}
	w := c.parts[cacheKey{1, 0}]
	if got := offsetsOf(c.get(1, 0, w.base, 2000)); len(got) != len(w.msgs) || got[len(got)-1] != 5999 || w.bytes > c.budget/2 {
		t.Fatalf("window after the puts: base %d, %d messages, %d bytes", w.base, len(got), w.bytes)
	}
}

// TestClaimReadsPastTheCachedRun: a claim whose messages the cache holds only in part takes that
// run from the cache and reads only what follows it from the database (here the messages another
// instance published, which this instance's cache never held).
func TestClaimReadsPastTheCachedRun(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, nil)
	e1, e2 := logOpen(t, cfg), logOpen(t, cfg)
	ctx := t.Context()
	if _, err := e1.TopicCreate(ctx, &storage.TopicCreateParams{Name: "prefix.q"}); err != nil {
		t.Fatal(err)
	}
	for i, e := range []*Engine{e1, e1, e1, e2, e2} {
		if _, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "prefix.q", Messages: []storage.AppendMessage{
			{Partition: 0, Payload: fmt.Appendf(nil, "m%d", 2*i)}, {Partition: 0, Payload: fmt.Appendf(nil, "m%d", 2*i+1)}}}); err != nil {
			t.Fatal(err)
		}
	}
	var topicID int64
	if err := e1.pool.QueryRow(ctx, e1.sql("SELECT id FROM spool.topics WHERE name = 'prefix.q'")).Scan(&topicID); err != nil {
		t.Fatal(err)
	}
	cached := e1.cache.get(topicID, 0, 0, 10)
	if len(cached) != 6 {
		t.Fatalf("instance 1 caches %d messages, want its own 6", len(cached))
	}
	sub, err := e1.SubscriptionGetByGroup(ctx, "prefix.q", storage.QueueGroup)
	if err != nil {
		t.Fatal(err)
	}
	res, err := e1.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: "m", Max: 10})
	if err != nil || len(res.Deliveries) != 10 {
		t.Fatalf("claim: %v %v", res, err)
	}
	for i, d := range res.Deliveries {
		if d.Offset != int64(i) || string(d.Payload) != fmt.Sprintf("m%d", i) {
			t.Fatalf("delivery %d: offset %d payload %q", i, d.Offset, d.Payload)
		}
		if i < len(cached) && &d.Payload[0] != &cached[i].Payload[0] {
			t.Errorf("offset %d was read from the database, not taken from the cache", i)
		}
	}
}
