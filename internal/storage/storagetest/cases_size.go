package storagetest

import (
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// sizeCases: the size bounds max_messages and max_bytes (storage.TopicConfig) remove a topic's
// oldest messages, only completed ones unless size_policy is drop_oldest, and count them. An
// engine that removes whole segments (Capabilities.SegmentBytes) may remove up to one segment
// more than the bound requires.
func sizeCases() []testCase {
	return []testCase{
		{name: "max_messages_keeps_needed", fn: testSizeMessagesKeepNeeded},
		{name: "max_bytes_drop_oldest", fn: testSizeBytesDropOldest},
		{name: "oldest_first_across_partitions", fn: testSizeAcrossPartitions},
	}
}

// sizePayload is the payload size of the size cases: large, so that an engine with 64 KiB
// segments rolls one every few messages.
const sizePayload = 10 << 10

func (x *env) publishBig(topic string, n int) { x.publishBigTo(topic, 0, n) }

func (x *env) publishBigTo(topic string, partition int32, n int) {
	x.t.Helper()
	msgs := make([]storage.AppendMessage, n)
	for i := range msgs {
		p := x.payload()
		msgs[i] = storage.AppendMessage{Partition: partition, Payload: []byte(p + strings.Repeat(".", sizePayload-len(p)))}
	}
	x.publish(topic, msgs...)
}

// sizeSlack is how many messages of sizePayload a run may remove beyond what the bound requires.
func (x *env) sizeSlack() int64 { return x.caps.SegmentBytes / sizePayload }

// testSizeMessagesKeepNeeded: above max_messages, retention removes the oldest messages every
// ACTIVE and PAUSED subscription completed, however young, down to the bound (within the
// engine's granularity); messages only a DEAD subscription had not completed go too, expired with
// reason size. It never removes what a holding subscription still needs, so the topic stays above
// its bound until that subscription completes them.
func testSizeMessagesKeepNeeded(t *testing.T, x *env) {
	x.createTopic("sz", storage.TopicConfig{Semantics: storage.PubSub, MaxMessages: 30})
	a := x.subscribe("sz", "a", fromBeginning)
	p := x.subscribe("sz", "p", fromBeginning)
	d := x.subscribe("sz", "d", fromBeginning)
	x.publishBig("sz", 60)
	for _, s := range []*storage.Subscription{a, p} {
		equal(t, len(x.claimAll(s.ID, "m")), 60, "claimed")
		x.ack(s.ID, "m", refSpan(0, 0, 40)...)
	}
	x.ack(d.ID, "m", RefsOf(x.claim(d.ID, "m", 10))...)
	x.setState(p.ID, storage.Paused)
	x.setState(d.ID, storage.Dead)
	x.advance(time.Second)

	res, removed := x.retention("sz")
	low := x.lowOffsets("sz")[0]
	st := x.topicStats("sz")
	isTrue(t, st.Messages <= 30 && st.Messages >= 30-x.sizeSlack(), "%d messages left, want 30 (slack %d)", st.Messages, x.sizeSlack())
	isTrue(t, low <= 40, "low offset %d: a and p have not completed 40..59", low)
	equal(t, removed, low, "removed")
	deepEqual(t, res.Expired, []storage.ExpiredCount{{Topic: "sz", Reason: storage.ExpiredSize, Messages: low - 10}},
		"expired: what DEAD d had not completed")
	equal(t, len(res.SizeRemoved), 1, "size removals")
	equal(t, res.SizeRemoved[0].Messages, low, "size removals")
	isTrue(t, res.SizeRemoved[0].Bytes >= low*sizePayload, "size removals: %d bytes for %d messages", res.SizeRemoved[0].Bytes, low)
	isTrue(t, !storage.TopicConfig{MaxMessages: 30}.SizeBoundExceeded(st), "within the bound")

	// 20 more: p (PAUSED) still needs 40..79, so the topic stays above its bound.
	x.publishBig("sz", 20)
	x.ack(a.ID, "m", RefsOf(x.claimAll(a.ID, "m"))...)
	x.ack(a.ID, "m", refSpan(0, 40, 60)...)
	x.retention("sz")
	low = x.lowOffsets("sz")[0]
	isTrue(t, low <= 40, "low offset %d: paused p has not completed 40..79", low)
	st = x.topicStats("sz")
	isTrue(t, storage.TopicConfig{MaxMessages: 30}.SizeBoundExceeded(st), "%d messages: above the bound while p needs them", st.Messages)

	// p resumes and completes: the bound applies again.
	x.setState(p.ID, storage.Active)
	x.ack(p.ID, "m", RefsOf(x.claimAll(p.ID, "m"))...)
	x.ack(p.ID, "m", refSpan(0, 40, 60)...)
	x.retention("sz")
	st = x.topicStats("sz")
	isTrue(t, st.Messages <= 30 && st.Messages >= 30-x.sizeSlack(), "%d messages left, want 30 (slack %d)", st.Messages, x.sizeSlack())
	low = x.lowOffsets("sz")[0]
	// d, resurrected, continues from the oldest retained message.
	x.setState(d.ID, storage.Active)
	requireOffsets(t, x.claimAll(d.ID, "m"), span(low, 80), "resurrected d gets what is retained")
}

// testSizeBytesDropOldest: with size_policy drop_oldest, max_bytes removes the oldest messages
// even though a subscription needs them, counted as expired with reason size; the subscription
// goes on from the oldest retained message.
func testSizeBytesDropOldest(t *testing.T, x *env) {
	const bound = 20 * sizePayload
	x.createTopic("szb", storage.TopicConfig{Semantics: storage.PubSub, MaxBytes: bound, SizePolicy: storage.SizeDropOldest})
	s := x.subscribe("szb", "s", fromBeginning)
	x.publishBig("szb", 40)
	x.advance(time.Second)
	before := x.topicStats("szb").Bytes
	isTrue(t, before > bound, "%d bytes, above the bound %d", before, bound)
	res, removed := x.retention("szb")
	st := x.topicStats("szb")
	slack := max(x.caps.SegmentBytes, 2*sizePayload)
	isTrue(t, st.Bytes <= bound && st.Bytes >= bound-slack, "%d bytes left, want at most %d and at least %d", st.Bytes, bound, bound-slack)
	isTrue(t, removed > 0, "nothing removed")
	deepEqual(t, res.Expired, []storage.ExpiredCount{{Topic: "szb", Reason: storage.ExpiredSize, Messages: removed}},
		"expired: s needed everything removed")
	deepEqual(t, res.SizeRemoved, []storage.SizeRemoval{{Topic: "szb", Messages: removed, Bytes: before - st.Bytes}}, "size removals")
	requireOffsets(t, x.claimAll(s.ID, "m"), span(removed, 40), "s gets what is retained")
}

// testSizeAcrossPartitions: the bound is the topic's; the oldest messages go first whichever
// partition holds them (24 messages, bound 12: partition 1's first 6, then 6 of partition 0).
func testSizeAcrossPartitions(t *testing.T, x *env) {
	x.createTopic("szp", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2, MaxMessages: 12})
	s := x.subscribe("szp", "s", fromBeginning)
	x.publishBigTo("szp", 1, 6)
	x.advance(time.Second)
	x.publishBigTo("szp", 0, 12)
	x.advance(time.Second)
	x.publishBigTo("szp", 1, 6)
	x.ack(s.ID, "m", RefsOf(x.claimAll(s.ID, "m"))...)
	x.retention("szp")
	low := x.lowOffsets("szp")
	isTrue(t, low[1] == 6 && low[0] >= 6 && low[0] <= 6+x.sizeSlack(),
		"low offsets %v: want partition 1's 6 oldest gone, then 6 (up to %d) of partition 0, before partition 1's newer ones", low, 6+x.sizeSlack())
	equal(t, x.topicStats("szp").Messages, int64(24-6-low[0]), "messages left")
}
