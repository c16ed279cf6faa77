package storagetest

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

func publishCases() []testCase {
	return []testCase{
		{name: "batch_positions", fn: testPublishPositions},
		{name: "read_ranges", fn: testPublishRead},
		{name: "keyed_partitioning", fn: testPublishKeyed},
		{name: "keyless_spread", fn: testPublishKeyless},
		{name: "explicit_partition", fn: testPublishExplicit},
		{name: "partition_out_of_range", fn: testPublishBadPartition},
		{name: "oversize", fn: testPublishOversize},
		{name: "unknown_topic", fn: testPublishUnknownTopic},
		{name: "roundtrip_byte_exact", fn: testPublishRoundTrip},
		{name: "published_at_engine_clock", fn: testPublishPublishedAt},
		{name: "not_before", fn: testPublishNotBefore},
		{name: "expires_at", fn: testPublishExpiresAt},
		{name: "block_writes_on_zero_subscriptions", fn: testPublishBlockWrites},
		{name: "async_append", async: true, fn: testPublishAsync},
	}
}

func testPublishPositions(t *testing.T, x *env) {
	x.createTopic("pos", storage.TopicConfig{})
	pos := x.publishN("pos", storage.PartitionAuto, 5)
	for i, p := range pos {
		equal(t, p, storage.MessagePosition{Partition: 0, Offset: int64(i), PublishedAt: p.PublishedAt}, "position %d", i)
		timeEqual(t, p.PublishedAt, baseTime, "PublishedAt of position %d", i)
	}
	pos = x.publishN("pos", 0, 3)
	for i, p := range pos {
		equal(t, p.Offset, int64(5+i), "offset of the second batch's message %d", i)
	}
	ms := x.read("pos", 0, 0)
	deepEqual(t, msgOffsets(ms), span(0, 8), "offsets read")
	for i, m := range ms {
		equal(t, string(m.Payload), fmt.Sprintf("payload-%d", i+1), "payload of offset %d (batch order)", i)
		equal(t, m.Topic, "pos", "topic of offset %d", i)
	}
	deepEqual(t, x.highWaters("pos"), []int64{8}, "high water")
}

func testPublishRead(t *testing.T, x *env) {
	x.createTopic("rd", storage.TopicConfig{})
	x.publishN("rd", 0, 150)
	page, err := x.e.MessagesRead(x.ctx, &storage.MessagesReadParams{Topic: "rd", Partition: 0, Offset: 0})
	noErr(t, err, "MessagesRead with Limit 0")
	deepEqual(t, msgOffsets(page), span(0, 100), "Limit 0 means 100")
	page, err = x.e.MessagesRead(x.ctx, &storage.MessagesReadParams{Topic: "rd", Partition: 0, Offset: 3, Limit: 2})
	noErr(t, err, "MessagesRead(3, 2)")
	deepEqual(t, msgOffsets(page), []int64{3, 4}, "offsets of MessagesRead(3, 2)")
	page, err = x.e.MessagesRead(x.ctx, &storage.MessagesReadParams{Topic: "rd", Partition: 0, Offset: 148, Limit: 10})
	noErr(t, err, "MessagesRead(148, 10)")
	deepEqual(t, msgOffsets(page), []int64{148, 149}, "read stops at the high water")
	page, err = x.e.MessagesRead(x.ctx, &storage.MessagesReadParams{Topic: "rd", Partition: 0, Offset: 150})
	noErr(t, err, "MessagesRead at the high water")
	equal(t, len(page), 0, "messages at the high water")
	_, err = x.e.MessagesRead(x.ctx, &storage.MessagesReadParams{Topic: "rd", Partition: 0, Offset: 151})
	errIs(t, err, storage.ErrOffsetOutOfRange, "MessagesRead above the high water")
	_, err = x.e.MessagesRead(x.ctx, &storage.MessagesReadParams{Topic: "rd", Partition: 1})
	errIsAny(t, err, "MessagesRead of a partition that does not exist", storage.ErrInvalidArgument, storage.ErrOffsetOutOfRange)
}

func testPublishKeyed(t *testing.T, x *env) {
	const parts = 4
	x.createTopic("keyed", storage.TopicConfig{Partitions: parts})
	next := make([]int64, parts)
	for batch := range 2 {
		var msgs []storage.AppendMessage
		for i := range 20 {
			msgs = append(msgs, keyed(fmt.Sprintf("key-%d", i%7), fmt.Sprintf("b%d-%d", batch, i)))
		}
		pos := x.publish("keyed", msgs...)
		for i, p := range pos {
			want := storage.PartitionForKey(msgs[i].Key, parts)
			equal(t, p.Partition, want, "partition of %q", msgs[i].Key)
			equal(t, p.Offset, next[want], "offset of message %d of batch %d in partition %d", i, batch, want)
			next[want]++
		}
	}
	deepEqual(t, x.highWaters("keyed"), next, "high waters")
	for p := range int32(parts) {
		for _, m := range x.read("keyed", p, 0) {
			equal(t, storage.PartitionForKey(m.Key, parts), p, "stored partition of key %q", m.Key)
		}
	}
}

func testPublishKeyless(t *testing.T, x *env) {
	const parts = 4
	x.createTopic("keyless", storage.TopicConfig{Partitions: parts})
	next := make([]int64, parts)
	used := map[int32]bool{}
	for range 40 {
		p := x.publish("keyless", msg(x.payload()))[0]
		isTrue(t, p.Partition >= 0 && p.Partition < parts, "partition %d out of range", p.Partition)
		equal(t, p.Offset, next[p.Partition], "offset in partition %d", p.Partition)
		next[p.Partition]++
		used[p.Partition] = true
	}
	isTrue(t, len(used) > 1, "40 keyless messages all went to one partition: keyless messages must be spread")
	deepEqual(t, x.highWaters("keyless"), next, "high waters")
}

func testPublishExplicit(t *testing.T, x *env) {
	x.createTopic("explicit", storage.TopicConfig{Partitions: 3})
	key := ""
	for i := 0; ; i++ {
		key = fmt.Sprintf("k%d", i)
		if storage.PartitionForKey([]byte(key), 3) != 2 {
			break
		}
	}
	pos := x.publish("explicit", storage.AppendMessage{Partition: 2, Key: []byte(key), Payload: []byte("x")}, toPartition(2, "y"), toPartition(0, "z"))
	equal(t, pos[0], storage.MessagePosition{Partition: 2, Offset: 0, PublishedAt: pos[0].PublishedAt}, "explicit partition wins over the key")
	equal(t, pos[1], storage.MessagePosition{Partition: 2, Offset: 1, PublishedAt: pos[1].PublishedAt}, "second message of partition 2")
	equal(t, pos[2], storage.MessagePosition{Partition: 0, Offset: 0, PublishedAt: pos[2].PublishedAt}, "message of partition 0")
	deepEqual(t, x.highWaters("explicit"), []int64{1, 0, 2}, "high waters")
}

func testPublishBadPartition(t *testing.T, x *env) {
	x.createTopic("badpart", storage.TopicConfig{Partitions: 3})
	for _, p := range []int32{3, 100, -2} {
		_, err := x.e.MessagesAppend(x.ctx, &storage.MessagesAppendParams{Topic: "badpart",
			Messages: []storage.AppendMessage{toPartition(0, "ok"), toPartition(p, "bad")}})
		errIs(t, err, storage.ErrInvalidArgument, "batch with partition %d", p)
	}
	deepEqual(t, x.highWaters("badpart"), []int64{0, 0, 0}, "a refused batch writes nothing")
	equal(t, x.topicStats("badpart").Messages, int64(0), "messages after refused batches")
}

func testPublishOversize(t *testing.T, x *env) {
	x.createTopic("big", storage.TopicConfig{MaxMessageBytes: 100})
	// key 10 + header name 3 + header value 7 + payload 80 = 100 bytes: exactly at the limit.
	exact := storage.AppendMessage{Partition: storage.PartitionAuto, Key: []byte("0123456789"),
		Headers: map[string]string{"hdr": "abcdefg"}, Payload: []byte(strings.Repeat("p", 80))}
	x.publish("big", exact)
	over := exact
	over.Payload = []byte(strings.Repeat("p", 81))
	_, err := x.e.MessagesAppend(x.ctx, &storage.MessagesAppendParams{Topic: "big", Messages: []storage.AppendMessage{over}})
	errIs(t, err, storage.ErrMessageTooLarge, "101-byte message")
	headers := storage.AppendMessage{Partition: storage.PartitionAuto, Headers: map[string]string{strings.Repeat("h", 50): strings.Repeat("v", 51)}}
	_, err = x.e.MessagesAppend(x.ctx, &storage.MessagesAppendParams{Topic: "big", Messages: []storage.AppendMessage{headers}})
	errIs(t, err, storage.ErrMessageTooLarge, "header names and values count")
	_, err = x.e.MessagesAppend(x.ctx, &storage.MessagesAppendParams{Topic: "big", Messages: []storage.AppendMessage{msg("a"), exact, over, msg("b")}})
	errIs(t, err, storage.ErrMessageTooLarge, "batch with one oversize message")
	deepEqual(t, x.highWaters("big"), []int64{1}, "only the first message was written")
	ms := x.read("big", 0, 0)
	equal(t, len(ms), 1, "messages stored")
	requireMessage(t, ms[0], exact, "the exact-limit message")
}

func testPublishUnknownTopic(t *testing.T, x *env) {
	_, err := x.e.MessagesAppend(x.ctx, &storage.MessagesAppendParams{Topic: "not.there", Messages: []storage.AppendMessage{msg("x")}})
	errIs(t, err, storage.ErrTopicNotFound, "MessagesAppend to an unknown topic")
	topics, err := x.e.TopicList(x.ctx)
	noErr(t, err, "TopicList")
	equal(t, len(topics), 0, "the engine does not auto-create topics")
}

func testPublishRoundTrip(t *testing.T, x *env) {
	x.createTopic("rt", storage.TopicConfig{Partitions: 2})
	q := x.queueSub("rt")
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	msgs := []storage.AppendMessage{
		{Partition: 1, Key: []byte{0, 1, 2, 0xff, 0xfe}, Payload: all, ProducerID: "prod-42",
			Headers: map[string]string{"content-type": "application/octet-stream", "ünïcödé": "✓ välue", "empty": "", "sp ace": "a\nb\tc"}},
		{Partition: 1},
		{Partition: 1, Payload: []byte(strings.Repeat("0123456789", 1000)), Headers: map[string]string{"x": "y"}},
	}
	pos := x.publish("rt", msgs...)
	ms := x.read("rt", 1, 0)
	equal(t, len(ms), 3, "messages read")
	for i, m := range ms {
		requireMessage(t, m, msgs[i], fmt.Sprintf("read message %d", i))
		timeEqual(t, m.PublishedAt, pos[i].PublishedAt, "PublishedAt of message %d", i)
	}
	ds := x.claimAll(q.ID, "m1")
	equal(t, len(ds), 3, "deliveries")
	for i, d := range ds {
		requireMessage(t, &d.Message, msgs[i], fmt.Sprintf("delivered message %d", i))
		equal(t, d.Topic, "rt", "delivery topic")
		equal(t, d.Partition, int32(1), "delivery partition")
		equal(t, d.Offset, int64(i), "delivery offset")
		timeEqual(t, d.PublishedAt, pos[i].PublishedAt, "delivered PublishedAt of message %d", i)
	}
	// A caller reusing its buffers after MessagesAppend must not change what was stored.
	buf := []byte("original")
	x.publish("rt", toPartition(0, string(buf)))
	copy(buf, "CHANGED!")
	equal(t, string(x.read("rt", 0, 0)[0].Payload), "original", "stored payload")
}

func testPublishPublishedAt(t *testing.T, x *env) {
	x.createTopic("clock", storage.TopicConfig{})
	a := x.publish("clock", msg("a"))[0]
	x.advance(1500 * time.Millisecond)
	b := x.publish("clock", msg("b"))[0]
	timeEqual(t, a.PublishedAt, baseTime, "first PublishedAt")
	timeEqual(t, b.PublishedAt, baseTime.Add(1500*time.Millisecond), "second PublishedAt")
	ms := x.read("clock", 0, 0)
	timeEqual(t, ms[0].PublishedAt, a.PublishedAt, "stored PublishedAt of a")
	timeEqual(t, ms[1].PublishedAt, b.PublishedAt, "stored PublishedAt of b")
}

func testPublishNotBefore(t *testing.T, x *env) {
	x.createTopic("delayed", storage.TopicConfig{})
	q := x.queueSub("delayed")
	due := x.now().Add(10 * time.Second)
	m := storage.AppendMessage{Partition: storage.PartitionAuto, Payload: []byte("later"), NotBefore: due}
	x.publish("delayed", m)
	requireMessage(t, x.read("delayed", 0, 0)[0], m, "stored delayed message")
	res := x.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m1", Max: 10})
	equal(t, len(res.Deliveries), 0, "deliveries before NotBefore")
	timeEqual(t, res.NextDue, due, "NextDue is when the delayed message matures")
	x.advance(10*time.Second - time.Millisecond)
	equal(t, len(x.claim(q.ID, "m1", 10)), 0, "deliveries 1 ms before NotBefore")
	x.advance(time.Millisecond)
	ds := x.claim(q.ID, "m1", 10)
	requireOffsets(t, ds, []int64{0}, "deliveries at NotBefore")
	equal(t, ds[0].Attempt, 1, "attempt")
	timeEqual(t, ds[0].NotBefore, due, "delivered NotBefore")
}

func testPublishExpiresAt(t *testing.T, x *env) {
	x.createTopic("ttl", storage.TopicConfig{})
	q := x.queueSub("ttl")
	now := x.now()
	x.publish("ttl",
		storage.AppendMessage{Partition: storage.PartitionAuto, Payload: []byte("short"), ExpiresAt: now.Add(10 * time.Second)},
		msg("forever"),
		storage.AppendMessage{Partition: storage.PartitionAuto, Payload: []byte("long"), ExpiresAt: now.Add(time.Hour)})
	timeEqual(t, x.read("ttl", 0, 0)[0].ExpiresAt, now.Add(10*time.Second), "stored ExpiresAt")
	x.advance(11 * time.Second)
	ds := x.claimAll(q.ID, "m1")
	requireOffsets(t, ds, []int64{1, 2}, "an expired message is dropped undelivered")
	x.ack(q.ID, "m1", RefsOf(ds)...)
	x.requireStats(q.ID, wantStats{}, "an expired message is not pending")
	x.requireFloor(q.ID, 0, 3, 3, "ack floor passes the expired message")
}

func testPublishBlockWrites(t *testing.T, x *env) {
	x.createTopic("blocked", storage.TopicConfig{Semantics: storage.PubSub, BlockWritesOnZeroSubscriptions: true})
	appendOne := func() error {
		_, err := x.e.MessagesAppend(x.ctx, &storage.MessagesAppendParams{Topic: "blocked", Messages: []storage.AppendMessage{msg(x.payload())}})
		return err
	}
	errIs(t, appendOne(), storage.ErrNoSubscriptions, "publish without subscriptions")
	deepEqual(t, x.highWaters("blocked"), []int64{0}, "nothing written")
	s := x.subscribe("blocked", "g", storage.StartPosition{})
	noErr(t, appendOne(), "publish with an ACTIVE subscription")
	x.setState(s.ID, storage.Paused)
	errIs(t, appendOne(), storage.ErrNoSubscriptions, "publish with only a PAUSED subscription")
	x.setState(s.ID, storage.Active)
	noErr(t, appendOne(), "publish after resume")
	deepEqual(t, x.highWaters("blocked"), []int64{2}, "high water")
	requireOffsets(t, x.claimAll(s.ID, "m1"), []int64{0, 1}, "deliveries")

	// Without the setting, a PUB_SUB topic takes publishes without subscriptions.
	x.createTopic("open", pubSub(1))
	x.publish("open", msg("kept"))
	// A QUEUE topic always has its subscription.
	x.createTopic("blocked.q", storage.TopicConfig{BlockWritesOnZeroSubscriptions: true})
	x.publish("blocked.q", msg("ok"))
}

// testPublishAsync: an engine that appends asynchronously (storage.AsyncAppender) refuses a bad
// batch before queueing it (done is not called), keeps the order of the batches one goroutine
// queues, calls each done exactly once, and the messages are readable when it runs.
func testPublishAsync(t *testing.T, x *env) {
	ae, ok := x.rec.engine().(storage.AsyncAppender) // the recorder does not track appends
	if !ok {
		t.Fatal("Capabilities.AsyncAppend is declared, but the engine does not implement storage.AsyncAppender")
	}
	x.createTopic("async", storage.TopicConfig{MaxMessageBytes: 64})
	never := func(*storage.MessagesAppendResult, error) { t.Error("done called for a refused batch") }
	err := ae.MessagesAppendAsync(&storage.MessagesAppendParams{Topic: "nope", Messages: []storage.AppendMessage{toPartition(0, "x")}}, never)
	errIs(t, err, storage.ErrTopicNotFound, "async append to an unknown topic")
	err = ae.MessagesAppendAsync(&storage.MessagesAppendParams{Topic: "async", Messages: []storage.AppendMessage{toPartition(0, strings.Repeat("z", 100))}}, never)
	errIs(t, err, storage.ErrMessageTooLarge, "async append of an oversize message")

	const n = 20
	type outcome struct {
		i    int
		res  *storage.MessagesAppendResult
		err  error
		read int // messages readable when done ran
	}
	outs := make(chan outcome, 2*n)
	var calls atomic.Int32
	for i := range n {
		err := ae.MessagesAppendAsync(&storage.MessagesAppendParams{Topic: "async", Messages: []storage.AppendMessage{toPartition(0, fmt.Sprint("a", i))}},
			func(res *storage.MessagesAppendResult, err error) {
				calls.Add(1)
				// done must not call the engine: the check reads from another goroutine.
				got := make(chan int, 1)
				go func() {
					ms, _ := x.e.MessagesRead(x.ctx, &storage.MessagesReadParams{Topic: "async", Partition: 0, Limit: 2 * n})
					got <- len(ms)
				}()
				o := outcome{i: i, res: res, err: err}
				go func() { o.read = <-got; outs <- o }()
			})
		noErr(t, err, "async append %d", i)
	}
	seen := make(map[int]bool, n)
	for range n {
		select {
		case o := <-outs:
			noErr(t, o.err, "outcome of async append %d", o.i)
			if seen[o.i] {
				t.Fatalf("done of async append %d called twice", o.i)
			}
			seen[o.i] = true
			equal(t, len(o.res.Positions), 1, "positions of async append %d", o.i)
			equal(t, o.res.Positions[0].Offset, int64(o.i), "offset of async append %d (queue order)", o.i)
			if o.read < o.i+1 {
				t.Fatalf("async append %d done, but only %d messages readable", o.i, o.read)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d async appends completed", len(seen), n)
		}
	}
	// An append queued after them to the same partition completes after them: a second call of
	// one of their dones would have been made by then.
	x.publish("async", toPartition(0, fmt.Sprint("a", n)))
	if c := calls.Load(); c != n {
		t.Fatalf("%d done calls for %d async appends", c, n)
	}
	ms := x.read("async", 0, 0)
	for i, m := range ms {
		equal(t, string(m.Payload), fmt.Sprint("a", i), "payload at offset %d", i)
	}
}
