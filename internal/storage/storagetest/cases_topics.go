package storagetest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
)

func topicCases() []testCase {
	return []testCase{
		{name: "create_defaults", fn: testTopicCreateDefaults},
		{name: "create_custom_config", fn: testTopicCreateCustom},
		{name: "create_twice", fn: testTopicCreateTwice},
		{name: "create_past_max_topics", fn: testTopicCreateMaxTopics},
		{name: "invalid_names", fn: testTopicInvalidNames},
		{name: "invalid_config", fn: testTopicInvalidConfig},
		{name: "list_ordered_by_name", fn: testTopicList},
		{name: "unknown_topic", fn: testTopicUnknown},
		{name: "stats", fn: testTopicStats},
		{name: "update_partitions_grow", fn: testTopicGrowPartitions},
		{name: "update_partitions_shrink_refused", fn: testTopicShrinkPartitions},
		{name: "update_config", fn: testTopicUpdateConfig},
		{name: "update_expect", fn: testTopicUpdateExpect},
		{name: "update_expect_concurrent", fn: testTopicUpdateExpectConcurrent},
		{name: "backlog_config_round_trip", restart: true, fn: testTopicBacklogConfig},
		{name: "update_queue_to_pubsub", fn: testTopicQueueToPubSub},
		{name: "update_pubsub_to_queue", fn: testTopicPubSubToQueue},
		{name: "delete_refused_with_live_subscription", fn: testTopicDeleteLive},
		{name: "delete_without_live_subscription", fn: testTopicDeleteNotLive},
		{name: "delete_queue_topic", fn: testTopicDeleteQueue},
		{name: "delete_queue_topic_with_pending_messages", fn: testTopicDeleteQueuePending},
	}
}

func testTopicCreateDefaults(t *testing.T, x *env) {
	tp := x.createTopic("orders.created", storage.TopicConfig{})
	equal(t, tp.Name, "orders.created", "name")
	want := storage.TopicConfig{
		Semantics:                      storage.Queue,
		Partitions:                     1,
		AckWait:                        30 * time.Second,
		MaxDeliveries:                  5,
		MessageRetention:               24 * time.Hour,
		ZeroSubscriptionRetention:      24 * time.Hour,
		BlockWritesOnZeroSubscriptions: false,
		CompletionTracking:             storage.Watermark,
		MaxRetention:                   30 * 24 * time.Hour,
		ZombieTTL:                      7 * 24 * time.Hour,
		MaxMessageBytes:                1 << 20,
		DedupWindow:                    2 * time.Minute,
	}
	deepEqual(t, tp.Config, want, "TopicCreate config with defaults (BRIEF section 5)")
	deepEqual(t, want, storage.TopicConfig{}.WithDefaults(), "WithDefaults agrees with BRIEF section 5")
	timeEqual(t, tp.CreatedAt, baseTime, "CreatedAt is the engine clock")

	got := x.getTopic("orders.created")
	equal(t, got.Name, "orders.created", "TopicGet name")
	deepEqual(t, got.Config, want, "TopicGet config")
	timeEqual(t, got.CreatedAt, baseTime, "TopicGet CreatedAt")
}

func testTopicCreateCustom(t *testing.T, x *env) {
	cfg := storage.TopicConfig{
		Semantics:                      storage.PubSub,
		Partitions:                     3,
		AckWait:                        5 * time.Second,
		MaxDeliveries:                  7,
		MessageRetention:               2 * time.Hour,
		BlockWritesOnZeroSubscriptions: true,
		MaxRetention:                   48 * time.Hour,
		MaxMessageBytes:                4096,
	}
	x.advance(90 * time.Second)
	tp := x.createTopic("sensors.temp", cfg)
	deepEqual(t, tp.Config, cfg.WithDefaults(), "config: given fields kept, zero fields defaulted")
	timeEqual(t, tp.CreatedAt, baseTime.Add(90*time.Second), "CreatedAt")
	deepEqual(t, x.getTopic("sensors.temp").Config, cfg.WithDefaults(), "TopicGet config")
	equal(t, len(x.highWaters("sensors.temp")), 3, "partitions in TopicStats")
	equal(t, len(x.listSubs("sensors.temp")), 0, "a PUB_SUB topic without bindings has no subscription")
}

// Past MaxTopics a creation fails with ErrLimitExceeded and creates nothing, concurrent creations
// included; once a topic is deleted there is room again.
func testTopicCreateMaxTopics(t *testing.T, x *env) {
	x.createTopic("lim.a", storage.TopicConfig{})
	x.createTopic("lim.b", storage.TopicConfig{})
	_, err := x.e.TopicCreate(x.ctx, &storage.TopicCreateParams{Name: "lim.c", Config: pubSub(1), MaxTopics: 2})
	errIs(t, err, storage.ErrLimitExceeded, "TopicCreate past MaxTopics")
	_, err = x.e.TopicGet(x.ctx, "lim.c")
	errIs(t, err, storage.ErrTopicNotFound, "TopicGet of the refused topic")
	created := createConcurrently(t, 4, "concurrent TopicCreate", func(i int) error {
		_, err := x.e.TopicCreate(x.ctx, &storage.TopicCreateParams{Name: "lim.r" + string(rune('0'+i)), Config: pubSub(1), MaxTopics: 4})
		return err
	})
	equal(t, created, 2, "concurrent creations up to MaxTopics 4 with 2 topics")
	topics, err := x.e.TopicList(x.ctx)
	noErr(t, err, "TopicList")
	equal(t, len(topics), 4, "topics")
	noErr(t, x.e.TopicDelete(x.ctx, &storage.TopicDeleteParams{Name: "lim.a"}), "TopicDelete")
	_, err = x.e.TopicCreate(x.ctx, &storage.TopicCreateParams{Name: "lim.c", Config: pubSub(1), MaxTopics: 4})
	noErr(t, err, "TopicCreate after a delete")
}

func testTopicCreateTwice(t *testing.T, x *env) {
	x.createTopic("a.b", storage.TopicConfig{AckWait: 3 * time.Second})
	_, err := x.e.TopicCreate(x.ctx, &storage.TopicCreateParams{Name: "a.b", Config: pubSub(2)})
	errIs(t, err, storage.ErrTopicExists, "second TopicCreate")
	tp := x.getTopic("a.b")
	equal(t, tp.Config.AckWait, 3*time.Second, "config of the first create kept")
	equal(t, tp.Config.Semantics, storage.Queue, "semantics of the first create kept")
	equal(t, len(x.listSubs("a.b")), 1, "still one queue subscription")
}

func testTopicInvalidNames(t *testing.T, x *env) {
	bad := []string{"", "a..b", "a/b", "orders.*", "orders.#", strings.Repeat("a", 256), ".a", "a.", "a b", "ä", "../etc"}
	var sawArg, sawName bool
	for _, name := range bad {
		_, err := x.e.TopicCreate(x.ctx, &storage.TopicCreateParams{Name: name})
		isArg, isName := errors.Is(err, storage.ErrInvalidArgument), errors.Is(err, names.ErrInvalidName)
		if !isArg && !isName {
			t.Fatalf("TopicCreate(%q) = %v, want an error wrapping storage.ErrInvalidArgument or names.ErrInvalidName", name, err)
		}
		sawArg = sawArg || isArg
		sawName = sawName || isName
		if name != "" {
			_, err = x.e.MessagesAppend(x.ctx, &storage.MessagesAppendParams{Topic: name, Messages: []storage.AppendMessage{msg("x")}})
			isTrue(t, err != nil, "MessagesAppend to invalid topic %q succeeded", name)
		}
	}
	t.Logf("invalid topic names: engine wraps storage.ErrInvalidArgument: %v, names.ErrInvalidName: %v (preferred: ErrInvalidArgument wrapping the names error text)", sawArg, sawName)
	topics, err := x.e.TopicList(x.ctx)
	noErr(t, err, "TopicList")
	equal(t, len(topics), 0, "topics after invalid creates")

	long := strings.Repeat("a", 255)
	x.createTopic(long, storage.TopicConfig{})
	equal(t, x.getTopic(long).Name, long, "a 255-byte name is valid")
	x.createTopic("Orders_2024.eu-west.created", storage.TopicConfig{})
}

func testTopicInvalidConfig(t *testing.T, x *env) {
	bad := map[string]storage.TopicConfig{
		"semantics":                 {Semantics: "FANOUT"},
		"partitions negative":       {Partitions: -1},
		"partitions too many":       {Partitions: storage.MaxPartitions + 1},
		"ack_wait negative":         {AckWait: -time.Second},
		"ack_wait too long":         {AckWait: 25 * time.Hour},
		"max_deliveries negative":   {MaxDeliveries: -1},
		"max_deliveries too many":   {MaxDeliveries: 1001},
		"message_retention":         {MessageRetention: -time.Second},
		"zero_sub_retention":        {ZeroSubscriptionRetention: -time.Second},
		"completion_tracking":       {CompletionTracking: "exactly-once"},
		"max_retention too short":   {MaxRetention: 500 * time.Millisecond},
		"retention above max":       {MessageRetention: 48 * time.Hour, MaxRetention: 24 * time.Hour},
		"zombie_ttl":                {ZombieTTL: time.Millisecond},
		"zombie_ttl above max":      {ZombieTTL: 72 * time.Hour, MaxRetention: 48 * time.Hour},
		"max_messages negative":     {MaxMessages: -1},
		"max_bytes negative":        {MaxBytes: -1},
		"size_policy unknown":       {MaxBytes: 1 << 20, SizePolicy: "drop_newest"},
		"max_message_bytes too big": {MaxMessageBytes: storage.MaxMessageBytesLimit + 1},
		"max_message_bytes neg":     {MaxMessageBytes: -1},
		"dedup_window negative":     {DedupWindow: -time.Second},
		"dedup_window too long":     {DedupWindow: 25 * time.Hour},
	}
	for what, cfg := range bad {
		_, err := x.e.TopicCreate(x.ctx, &storage.TopicCreateParams{Name: "bad.config", Config: cfg})
		errIs(t, err, storage.ErrInvalidArgument, "TopicCreate with invalid %s", what)
		_, err = x.e.TopicGet(x.ctx, "bad.config")
		errIs(t, err, storage.ErrTopicNotFound, "TopicGet after refused create (%s)", what)
	}
}

func testTopicList(t *testing.T, x *env) {
	for _, name := range []string{"c", "b.x", "alpha", "Zeta", "a_b", "a.b", "a-b", "a.y"} {
		x.createTopic(name, storage.TopicConfig{})
	}
	topics, err := x.e.TopicList(x.ctx)
	noErr(t, err, "TopicList")
	var got []string
	for _, tp := range topics {
		got = append(got, tp.Name)
	}
	// Byte order: 'Z' < 'a', '-' < '.' < '_'.
	deepEqual(t, got, []string{"Zeta", "a-b", "a.b", "a.y", "a_b", "alpha", "b.x", "c"}, "TopicList order (byte-wise)")
}

func testTopicUnknown(t *testing.T, x *env) {
	_, err := x.e.TopicGet(x.ctx, "no.such")
	errIs(t, err, storage.ErrTopicNotFound, "TopicGet")
	_, err = x.e.TopicStats(x.ctx, "no.such")
	errIs(t, err, storage.ErrTopicNotFound, "TopicStats")
	_, err = x.e.TopicUpdate(x.ctx, &storage.TopicUpdateParams{Name: "no.such"})
	errIs(t, err, storage.ErrTopicNotFound, "TopicUpdate")
	err = x.e.TopicDelete(x.ctx, &storage.TopicDeleteParams{Name: "no.such", Force: true})
	errIs(t, err, storage.ErrTopicNotFound, "TopicDelete")
	_, err = x.e.MessagesRead(x.ctx, &storage.MessagesReadParams{Topic: "no.such"})
	errIs(t, err, storage.ErrTopicNotFound, "MessagesRead")
	_, err = x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "no.such", Group: "g"})
	errIs(t, err, storage.ErrTopicNotFound, "SubscriptionCreate")
}

func testTopicStats(t *testing.T, x *env) {
	x.createTopic("stats.t", pubSub(2))
	st := x.topicStats("stats.t")
	equal(t, st.Topic, "stats.t", "topic")
	equal(t, st.Messages, int64(0), "messages of a new topic")
	for _, ps := range st.Partitions {
		equal(t, ps.LowOffset, int64(0), "low offset of new partition %d", ps.Partition)
		equal(t, ps.HighWater, int64(0), "high water of new partition %d", ps.Partition)
	}
	x.publish("stats.t", toPartition(0, "aaaa"), toPartition(0, "bbbb"), toPartition(1, "cccc"), toPartition(0, "dddd"))
	st = x.topicStats("stats.t")
	equal(t, st.Messages, int64(4), "messages")
	want := map[int32]int64{0: 3, 1: 1}
	var sum int64
	for _, ps := range st.Partitions {
		equal(t, ps.HighWater, want[ps.Partition], "high water of partition %d", ps.Partition)
		equal(t, ps.LowOffset, int64(0), "low offset of partition %d", ps.Partition)
		isTrue(t, ps.Bytes > 0, "partition %d bytes %d after publishing", ps.Partition, ps.Bytes)
		sum += ps.Bytes
	}
	equal(t, st.Bytes, sum, "topic bytes = sum of partition bytes")
	isTrue(t, st.Bytes >= 16, "topic bytes %d below the 16 payload bytes stored", st.Bytes)
}

func testTopicGrowPartitions(t *testing.T, x *env) {
	x.createTopic("grow", storage.TopicConfig{})
	sub := x.queueSub("grow")
	x.publishN("grow", 0, 2)
	cfg := x.getTopic("grow").Config
	cfg.Partitions = 3
	tp := x.updateTopic(storage.TopicUpdateParams{Name: "grow", Config: cfg})
	equal(t, tp.Config.Partitions, 3, "partitions after update")
	equal(t, x.getTopic("grow").Config.Partitions, 3, "TopicGet partitions")
	deepEqual(t, x.highWaters("grow"), []int64{2, 0, 0}, "high waters after growing")
	pos := x.publish("grow", toPartition(2, "p2"))
	equal(t, pos[0], storage.MessagePosition{Partition: 2, Offset: 0, PublishedAt: pos[0].PublishedAt}, "position in the new partition")
	key := "grow-key"
	pos = x.publish("grow", keyed(key, "k"))
	equal(t, pos[0].Partition, storage.PartitionForKey([]byte(key), 3), "keyed message uses the new partition count")
	equal(t, len(x.stats(sub.ID).Partitions), 3, "the subscription covers the new partitions")
	ds := x.claimAll(sub.ID, "m1")
	equal(t, len(ds), 4, "every message of old and new partitions is delivered")
}

func testTopicShrinkPartitions(t *testing.T, x *env) {
	x.createTopic("shrink", storage.TopicConfig{Partitions: 3})
	cfg := x.getTopic("shrink").Config
	cfg.Partitions = 2
	_, err := x.e.TopicUpdate(x.ctx, &storage.TopicUpdateParams{Name: "shrink", Config: cfg})
	errIs(t, err, storage.ErrInvalidArgument, "shrinking partitions")
	equal(t, x.getTopic("shrink").Config.Partitions, 3, "partitions unchanged")
	equal(t, len(x.highWaters("shrink")), 3, "partitions in stats unchanged")
}

func testTopicUpdateConfig(t *testing.T, x *env) {
	x.createTopic("upd", storage.TopicConfig{})
	sub := x.queueSub("upd")
	cfg := x.getTopic("upd").Config
	cfg.AckWait = 5 * time.Second
	cfg.MaxDeliveries = 9
	tp := x.updateTopic(storage.TopicUpdateParams{Name: "upd", Config: cfg})
	deepEqual(t, tp.Config, cfg, "updated config")
	deepEqual(t, x.getTopic("upd").Config, cfg, "TopicGet after update")

	bad := cfg
	bad.AckWait = -time.Second
	_, err := x.e.TopicUpdate(x.ctx, &storage.TopicUpdateParams{Name: "upd", Config: bad})
	errIs(t, err, storage.ErrInvalidArgument, "update with invalid ack_wait")
	deepEqual(t, x.getTopic("upd").Config, cfg, "config unchanged by refused update")

	x.publishN("upd", 0, 1)
	ds := x.claim(sub.ID, "m1", 1)
	equal(t, len(ds), 1, "claimed")
	timeEqual(t, ds[0].LeaseDeadline, x.now().Add(5*time.Second), "lease uses the updated ack_wait")

	// A partial config is completed with defaults: the zero MaxDeliveries becomes 5 again.
	tp = x.updateTopic(storage.TopicUpdateParams{Name: "upd", Config: storage.TopicConfig{AckWait: 7 * time.Second}})
	deepEqual(t, tp.Config, storage.TopicConfig{AckWait: 7 * time.Second}.WithDefaults(), "config replaced and defaulted")
}

// An update with Expect is a compare-and-set on the configuration: over a stale Expect (another
// update landed after it was read) it fails with ErrTopicChanged and changes nothing, not even the
// partitions it would add; over the current one it applies. Expect is compared after defaults, so
// the partial configuration a topic was created from matches too.
func testTopicUpdateExpect(t *testing.T, x *env) {
	x.createTopic("cas", pubSub(1))
	read := x.getTopic("cas").Config // what two updaters read
	first := read
	first.MessageRetention = time.Hour
	x.updateTopic(storage.TopicUpdateParams{Name: "cas", Config: first, Expect: &read})

	second := read
	second.MaxMessageBytes = 2048
	second.Partitions = 3
	_, err := x.e.TopicUpdate(x.ctx, &storage.TopicUpdateParams{Name: "cas", Config: second, Expect: &read})
	errIs(t, err, storage.ErrTopicChanged, "TopicUpdate over a stale Expect")
	deepEqual(t, x.getTopic("cas").Config, first, "config after the refused update")
	equal(t, len(x.highWaters("cas")), 1, "partitions after the refused update")

	cur := x.getTopic("cas").Config
	second = cur
	second.MaxMessageBytes = 2048
	second.Partitions = 3
	deepEqual(t, x.updateTopic(storage.TopicUpdateParams{Name: "cas", Config: second, Expect: &cur}).Config, second,
		"TopicUpdate over the current Expect")
	deepEqual(t, x.getTopic("cas").Config, second, "TopicGet after it")
	equal(t, len(x.highWaters("cas")), 3, "partitions after it")

	x.createTopic("cas.partial", storage.TopicConfig{AckWait: 3 * time.Second})
	up := x.updateTopic(storage.TopicUpdateParams{Name: "cas.partial", Config: storage.TopicConfig{AckWait: 4 * time.Second},
		Expect: &storage.TopicConfig{AckWait: 3 * time.Second}})
	equal(t, up.Config.AckWait, 4*time.Second, "TopicUpdate over a partial Expect")

	_, err = x.e.TopicUpdate(x.ctx, &storage.TopicUpdateParams{Name: "cas.none", Config: cur, Expect: &cur})
	errIs(t, err, storage.ErrTopicNotFound, "TopicUpdate with Expect of an unknown topic")
}

// Concurrent read-modify-write updates of different fields, each retrying on ErrTopicChanged,
// all survive: the comparison is atomic with the write. A refusal means another updater's write
// landed, and each writes once, so no updater needs more attempts than there are updaters.
func testTopicUpdateExpectConcurrent(t *testing.T, x *env) {
	x.createTopic("cas.many", pubSub(1))
	set := []func(*storage.TopicConfig){
		func(c *storage.TopicConfig) { c.AckWait = 7 * time.Second },
		func(c *storage.TopicConfig) { c.MaxDeliveries = 9 },
		func(c *storage.TopicConfig) { c.MessageRetention = time.Hour },
		func(c *storage.TopicConfig) { c.MaxMessageBytes = 4096 },
		func(c *storage.TopicConfig) { c.BlockWritesOnZeroSubscriptions = true },
	}
	want := x.getTopic("cas.many").Config
	errs := make(chan error, len(set))
	for _, change := range set {
		change(&want)
		go func() {
			for range len(set) {
				cur, err := x.e.TopicGet(x.ctx, "cas.many")
				if err != nil {
					errs <- err
					return
				}
				cfg := cur.Config
				change(&cfg)
				_, err = x.e.TopicUpdate(x.ctx, &storage.TopicUpdateParams{Name: "cas.many", Config: cfg, Expect: &cur.Config})
				if !errors.Is(err, storage.ErrTopicChanged) {
					errs <- err
					return
				}
			}
			errs <- fmt.Errorf("refused %d times with %d updaters", len(set), len(set))
		}()
	}
	for range set {
		noErr(t, <-errs, "read-modify-write update")
	}
	deepEqual(t, x.getTopic("cas.many").Config, want, "every updater's field")
}

// The backpressure settings (broker backpressure.go) are stored, listed, updated and survive a
// restart; bad ones are refused and change nothing.
func testTopicBacklogConfig(t *testing.T, x *env) {
	tp := x.createTopic("bp", storage.TopicConfig{MaxBacklogMessages: 1000, MaxBacklogBytes: 1 << 20, BacklogPolicy: storage.BacklogThrottle})
	want := storage.TopicConfig{MaxBacklogMessages: 1000, MaxBacklogBytes: 1 << 20, BacklogPolicy: storage.BacklogThrottle}.WithDefaults()
	deepEqual(t, tp.Config, want, "created config")
	isTrue(t, want.HasBacklogBound(), "bounded")
	plain := x.createTopic("plain", storage.TopicConfig{})
	isTrue(t, !plain.Config.HasBacklogBound() && plain.Config.BacklogPolicy == "", "no bound by default, got %+v", plain.Config)
	for _, bad := range []storage.TopicConfig{{MaxBacklogMessages: -1}, {MaxBacklogBytes: -1}, {BacklogPolicy: "drop"}} {
		_, err := x.e.TopicUpdate(x.ctx, &storage.TopicUpdateParams{Name: "bp", Config: bad})
		errIs(t, err, storage.ErrInvalidArgument, "update with %+v", bad)
	}
	deepEqual(t, x.getTopic("bp").Config, want, "config unchanged by refused updates")
	x.restart()
	deepEqual(t, x.getTopic("bp").Config, want, "config after restart")
	want.MaxBacklogBytes, want.BacklogPolicy = 0, storage.BacklogReject
	deepEqual(t, x.updateTopic(storage.TopicUpdateParams{Name: "bp", Config: want}).Config, want, "updated config")
	x.restart()
	list, err := x.e.TopicList(x.ctx)
	noErr(t, err, "TopicList")
	deepEqual(t, list[0].Config, want, "listed config after restart")
}

func testTopicQueueToPubSub(t *testing.T, x *env) {
	x.createTopic("conv", storage.TopicConfig{})
	q := x.queueSub("conv")
	x.publishN("conv", 0, 5)
	ds := x.claim(q.ID, "m1", 2)
	requireOffsets(t, ds, []int64{0, 1}, "claimed before the change")
	x.ack(q.ID, "m1", ref(0, 0))

	cfg := x.getTopic("conv").Config
	cfg.Semantics = storage.PubSub
	_, err := x.e.TopicUpdate(x.ctx, &storage.TopicUpdateParams{Name: "conv", Config: cfg})
	errIs(t, err, storage.ErrInvalidArgument, "QUEUE to PUB_SUB without QueueToGroup")
	equal(t, x.getTopic("conv").Config.Semantics, storage.Queue, "semantics unchanged")
	_, err = x.e.TopicUpdate(x.ctx, &storage.TopicUpdateParams{Name: "conv", Config: cfg, QueueToGroup: "bad group!"})
	isTrue(t, errors.Is(err, storage.ErrInvalidArgument) || errors.Is(err, names.ErrInvalidName),
		"QUEUE to PUB_SUB with an invalid group name: got %v", err)

	x.advance(time.Second)
	tp := x.updateTopic(storage.TopicUpdateParams{Name: "conv", Config: cfg, QueueToGroup: "billing"})
	equal(t, tp.Config.Semantics, storage.PubSub, "semantics after update")
	billing, err := x.e.SubscriptionGetByGroup(x.ctx, "conv", "billing")
	noErr(t, err, "GetByGroup(billing)")
	equal(t, billing.ID, q.ID, "the queue subscription becomes the group (same subscription)")
	equal(t, billing.Group, "billing", "group")
	equal(t, billing.State, storage.Active, "state")
	_, err = x.e.SubscriptionGetByGroup(x.ctx, "conv", storage.QueueGroup)
	errIs(t, err, storage.ErrSubscriptionNotFound, "GetByGroup($queue) after the change")
	equal(t, len(x.listSubs("conv")), 1, "subscriptions after the change")
	_, err = x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "conv", Group: "billing"})
	errIs(t, err, storage.ErrSubscriptionExists, "SubscriptionCreate(billing)")

	// Nothing pending is lost: offset 1 is still leased to m1, 2..4 never delivered, 0 acked.
	ds = x.claimAll(billing.ID, "m2")
	requireOffsets(t, ds, []int64{2, 3, 4}, "pending messages under the new group")
	requireAttempts(t, ds, 1, "pending messages under the new group")
	res := x.ack(billing.ID, "m1", ref(0, 1))
	equal(t, res.Acked, 1, "the lease taken before the change is still acked")
	x.ack(billing.ID, "m2", RefsOf(ds)...)
	x.requireStats(billing.ID, wantStats{}, "billing after acking everything")

	audit := x.subscribe("conv", "audit", fromBeginning)
	requireOffsets(t, x.claimAll(audit.ID, "a1"), span(0, 5), "a new group starts where its start position says")
}

func testTopicPubSubToQueue(t *testing.T, x *env) {
	x.createTopic("ps2q", pubSub(1))
	a := x.subscribe("ps2q", "a", fromBeginning)
	b := x.subscribe("ps2q", "b", fromBeginning)
	x.publishN("ps2q", 0, 2)
	cfg := x.getTopic("ps2q").Config
	cfg.Semantics = storage.Queue
	_, err := x.e.TopicUpdate(x.ctx, &storage.TopicUpdateParams{Name: "ps2q", Config: cfg})
	got := errIsAny(t, err, "PUB_SUB to QUEUE with two live subscriptions", storage.ErrInvalidArgument, storage.ErrTopicHasSubscriptions)
	t.Logf("PUB_SUB to QUEUE with two live subscriptions is refused with %v", got)
	equal(t, x.getTopic("ps2q").Config.Semantics, storage.PubSub, "semantics unchanged")

	x.setState(b.ID, storage.Cancelled)
	x.updateTopic(storage.TopicUpdateParams{Name: "ps2q", Config: cfg})
	equal(t, x.getTopic("ps2q").Config.Semantics, storage.Queue, "semantics after the change with one live subscription")
	var live []*storage.Subscription
	for _, s := range x.listSubs("ps2q") {
		if s.State == storage.Active || s.State == storage.Paused {
			live = append(live, s)
		}
	}
	equal(t, len(live), 1, "live subscriptions of the QUEUE topic")
	t.Logf("PUB_SUB to QUEUE keeps subscription %d as group %q (subscription a was %d)", live[0].ID, live[0].Group, a.ID)
	_, err = x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "ps2q", Group: "c"})
	errIs(t, err, storage.ErrSubscriptionExists, "SubscriptionCreate on the topic now QUEUE")

	// One live subscription, but an ordered group's: refused, the queue's one subscription is
	// shared; once it is cancelled, the change makes a new queue subscription.
	x.createTopic("ps2q.ordered", pubSub(1))
	o, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "ps2q.ordered", Group: "o",
		Start: storage.StartPosition{Kind: storage.FromBeginning}, Mode: storage.ModeOrdered})
	noErr(t, err, "SubscriptionCreate(ordered o)")
	for _, state := range []storage.SubscriptionState{storage.Active, storage.Paused} {
		if state != storage.Active {
			x.setState(o.ID, state)
		}
		_, err = x.e.TopicUpdate(x.ctx, &storage.TopicUpdateParams{Name: "ps2q.ordered", Config: cfg})
		errIs(t, err, storage.ErrTopicHasSubscriptions, "PUB_SUB to QUEUE with only an %s ordered group", state)
		equal(t, x.getTopic("ps2q.ordered").Config.Semantics, storage.PubSub, "semantics unchanged")
	}
	x.setState(o.ID, storage.Cancelled)
	x.updateTopic(storage.TopicUpdateParams{Name: "ps2q.ordered", Config: cfg})
	isTrue(t, x.queueSub("ps2q.ordered").ID != o.ID, "the queue's subscription is a new one")

	// With no live subscription at all, the QUEUE topic gets its queue subscription.
	x.createTopic("ps2q.empty", pubSub(1))
	x.updateTopic(storage.TopicUpdateParams{Name: "ps2q.empty", Config: cfg})
	q := x.queueSub("ps2q.empty")
	equal(t, q.State, storage.Active, "queue subscription created by the change")
}

func testTopicDeleteLive(t *testing.T, x *env) {
	x.createTopic("del.me", pubSub(2))
	s := x.subscribe("del.me", "g", fromBeginning)
	x.publishN("del.me", 0, 3)
	x.claim(s.ID, "m1", 1)
	err := x.e.TopicDelete(x.ctx, &storage.TopicDeleteParams{Name: "del.me"})
	errIs(t, err, storage.ErrTopicHasSubscriptions, "TopicDelete with an ACTIVE subscription")
	x.setState(s.ID, storage.Paused)
	err = x.e.TopicDelete(x.ctx, &storage.TopicDeleteParams{Name: "del.me"})
	errIs(t, err, storage.ErrTopicHasSubscriptions, "TopicDelete with a PAUSED subscription")
	equal(t, x.highWaters("del.me")[0], int64(3), "messages kept by the refused delete")
	equal(t, x.getSub(s.ID).State, storage.Paused, "subscription kept by the refused delete")

	noErr(t, x.e.TopicDelete(x.ctx, &storage.TopicDeleteParams{Name: "del.me", Force: true}), "forced TopicDelete")
	requireTopicGone(t, x, "del.me", []int64{s.ID}, "g")

	// The name can be used again, from scratch.
	x.createTopic("del.me", pubSub(1))
	deepEqual(t, x.highWaters("del.me"), []int64{0}, "high water of the recreated topic")
	equal(t, len(x.read("del.me", 0, 0)), 0, "messages of the recreated topic")
	equal(t, len(x.listSubs("del.me")), 0, "subscriptions of the recreated topic")
	s2 := x.subscribe("del.me", "g", fromBeginning)
	isTrue(t, s2.ID > s.ID, "subscription IDs are never reused: %d after %d", s2.ID, s.ID)
}

// requireTopicGone checks that a deleted topic, its messages and its subscriptions are gone.
func requireTopicGone(t *testing.T, x *env, name string, subIDs []int64, groups ...string) {
	t.Helper()
	_, err := x.e.TopicGet(x.ctx, name)
	errIs(t, err, storage.ErrTopicNotFound, "TopicGet after delete")
	topics, err := x.e.TopicList(x.ctx)
	noErr(t, err, "TopicList")
	for _, tp := range topics {
		isTrue(t, tp.Name != name, "TopicList still lists deleted topic %q", name)
	}
	_, err = x.e.TopicStats(x.ctx, name)
	errIs(t, err, storage.ErrTopicNotFound, "TopicStats after delete")
	_, err = x.e.MessagesRead(x.ctx, &storage.MessagesReadParams{Topic: name})
	errIs(t, err, storage.ErrTopicNotFound, "MessagesRead after delete")
	_, err = x.e.MessagesAppend(x.ctx, &storage.MessagesAppendParams{Topic: name, Messages: []storage.AppendMessage{msg("x")}})
	errIs(t, err, storage.ErrTopicNotFound, "MessagesAppend after delete")
	all, err := x.e.SubscriptionList(x.ctx, &storage.SubscriptionListParams{})
	noErr(t, err, "SubscriptionList")
	for _, s := range all {
		isTrue(t, s.Topic != name, "subscription %d of deleted topic %q still listed", s.ID, name)
	}
	for _, g := range groups {
		_, err = x.e.SubscriptionGetByGroup(x.ctx, name, g)
		errIs(t, err, storage.ErrSubscriptionNotFound, "GetByGroup(%q) after delete", g)
	}
	for _, id := range subIDs {
		s, err := x.e.SubscriptionGet(x.ctx, id)
		if err == nil {
			isTrue(t, s.State == storage.Cancelled || s.State == storage.Deleted,
				"subscription %d of the deleted topic is %s, want it gone, CANCELLED or DELETED", id, s.State)
		} else {
			errIs(t, err, storage.ErrSubscriptionNotFound, "SubscriptionGet(%d) after delete", id)
		}
		_, err = x.e.DeliveriesClaim(x.ctx, &storage.DeliveriesClaimParams{SubscriptionID: id, Member: "m", Max: 1})
		errIsAny(t, err, "claim on a subscription of a deleted topic", storage.ErrSubscriptionNotFound, storage.ErrSubscriptionNotActive)
	}
}

func testTopicDeleteNotLive(t *testing.T, x *env) {
	x.createTopic("del.quiet", pubSub(1))
	s := x.subscribe("del.quiet", "gone", fromBeginning)
	x.setState(s.ID, storage.Cancelled)
	eph, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "del.quiet", Group: "eph-1", Ephemeral: true})
	noErr(t, err, "ephemeral SubscriptionCreate")
	x.publishN("del.quiet", 0, 2)
	noErr(t, x.e.TopicDelete(x.ctx, &storage.TopicDeleteParams{Name: "del.quiet"}),
		"TopicDelete without Force: only a CANCELLED and an ephemeral subscription")
	requireTopicGone(t, x, "del.quiet", []int64{s.ID, eph.ID}, "gone", "eph-1")
}

func testTopicDeleteQueue(t *testing.T, x *env) {
	x.createTopic("del.q", storage.TopicConfig{Partitions: 2})
	q := x.queueSub("del.q")
	x.publishN("del.q", 1, 4)
	x.claim(q.ID, "m1", 2)
	noErr(t, x.e.TopicDelete(x.ctx, &storage.TopicDeleteParams{Name: "del.q", Force: true}), "TopicDelete")
	requireTopicGone(t, x, "del.q", []int64{q.ID}, storage.QueueGroup)
	x.createTopic("del.q", storage.TopicConfig{})
	q2 := x.queueSub("del.q")
	isTrue(t, q2.ID != q.ID, "the recreated QUEUE topic has a new subscription")
	equal(t, len(x.claimAll(q2.ID, "m1")), 0, "nothing to claim on the recreated topic")
}

// A QUEUE topic with work not done is not deleted without Force; once every message is acked it
// is.
func testTopicDeleteQueuePending(t *testing.T, x *env) {
	x.createTopic("del.work", storage.TopicConfig{Partitions: 2})
	x.queueSub("del.work")
	noErr(t, x.e.TopicDelete(x.ctx, &storage.TopicDeleteParams{Name: "del.work"}), "TopicDelete of an empty queue")
	x.createTopic("del.work", storage.TopicConfig{Partitions: 2})
	q := x.queueSub("del.work")
	x.publishN("del.work", 1, 3)
	err := x.e.TopicDelete(x.ctx, &storage.TopicDeleteParams{Name: "del.work"})
	errIs(t, err, storage.ErrTopicHasSubscriptions, "TopicDelete of a queue with 3 pending messages")
	ds := x.claimAll(q.ID, "m1")
	equal(t, len(ds), 3, "the refused delete changed nothing: all 3 messages are still claimable")
	refs := make([]storage.DeliveryRef, 0, len(ds))
	for _, d := range ds[:2] {
		refs = append(refs, d.Ref())
	}
	x.ack(q.ID, "m1", refs...)
	err = x.e.TopicDelete(x.ctx, &storage.TopicDeleteParams{Name: "del.work"})
	errIs(t, err, storage.ErrTopicHasSubscriptions, "TopicDelete of a queue with 1 leased message")
	x.ack(q.ID, "m1", ds[2].Ref())
	noErr(t, x.e.TopicDelete(x.ctx, &storage.TopicDeleteParams{Name: "del.work"}), "TopicDelete of a drained queue")
	requireTopicGone(t, x, "del.work", []int64{q.ID}, storage.QueueGroup)
}

// createConcurrently runs create(0..n-1) at once and returns how many succeeded; the others must
// fail with ErrLimitExceeded.
func createConcurrently(t *testing.T, n int, what string, create func(i int) error) int {
	t.Helper()
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- create(i) }()
	}
	created := 0
	for range n {
		if err := <-errs; err == nil {
			created++
		} else {
			errIs(t, err, storage.ErrLimitExceeded, "%s", what)
		}
	}
	return created
}
