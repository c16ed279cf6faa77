package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
)

var (
	queueCfg  = storage.TopicConfig{Semantics: storage.Queue}
	pubSubCfg = storage.TopicConfig{Semantics: storage.PubSub}
)

func TestQueueCompetingConsumers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	// The members subscribe before the topic exists; the first publish auto-creates it as QUEUE.
	// Two of them name a group: on a QUEUE topic everybody shares the one subscription.
	a := e.subscribe(SubscribeParams{Pattern: "jobs"})
	b := e.subscribe(SubscribeParams{Pattern: "jobs", Group: "workers"})
	c := e.subscribe(SubscribeParams{Pattern: "jobs", Group: "others"})
	const n = 300
	e.publishN("jobs", "job", n)

	gs := consumeAll(t, n, a, b, c)
	expectPayloads(t, "queue", gs, "job", n)
	counts := byMember(gs)
	for _, m := range []*Member{a, b, c} {
		if counts[m.ID()] == 0 {
			t.Errorf("member %s got nothing; counts %v", m.ID(), counts)
		}
	}
	info, err := e.b.Topic(e.ctx(), "jobs")
	if err != nil {
		t.Fatal(err)
	}
	if info.Topic.Config.Semantics != storage.Queue || info.Subscriptions != 1 || info.Members != 3 {
		t.Fatalf("topic info: semantics %s, subscriptions %d, members %d; want QUEUE, 1, 3",
			info.Topic.Config.Semantics, info.Subscriptions, info.Members)
	}
	eventually(t, "all acked", func() error {
		if st := e.groupStats("jobs", ""); st.Pending != 0 || st.InFlight != 0 {
			return fmt.Errorf("pending %d, in flight %d", st.Pending, st.InFlight)
		}
		return nil
	})
}

func TestPubSubFanOutToGroups(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("events", pubSubCfg)
	groups := []string{"billing", "audit", "search"}
	members := map[string][]*Member{}
	for _, g := range groups {
		for range 2 {
			members[g] = append(members[g], e.subscribe(SubscribeParams{Pattern: "events", Group: g}))
		}
	}
	const n = 100
	e.publishN("events", "ev", n)
	for _, g := range groups {
		gs := consumeAll(t, n, members[g]...)
		expectPayloads(t, "group "+g, gs, "ev", n)
		counts := byMember(gs)
		for _, m := range members[g] {
			if counts[m.ID()] == 0 {
				t.Errorf("group %s: member %s got nothing; counts %v", g, m.ID(), counts)
			}
		}
	}
	gis, err := e.b.Groups(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	if len(gis) != 3 {
		t.Fatalf("Groups: %d subscriptions, want 3", len(gis))
	}
	for _, gi := range gis {
		if len(gi.Members) != 2 || gi.State != storage.Active {
			t.Errorf("group %s: members %v, state %s; want 2 members, ACTIVE", gi.Group, gi.Members, gi.State)
		}
	}
}

func TestEphemeralSubscribers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("ticks", pubSubCfg)
	a := e.subscribe(SubscribeParams{Pattern: "ticks"})
	b := e.subscribe(SubscribeParams{Pattern: "ticks"})
	const n = 50
	e.publishN("ticks", "t", n)
	expectPayloads(t, "ephemeral a", consumeAll(t, n, a), "t", n)
	expectPayloads(t, "ephemeral b", consumeAll(t, n, b), "t", n)

	subs, err := e.engine.SubscriptionList(e.ctx(), &storage.SubscriptionListParams{Topic: "ticks"})
	if err != nil {
		t.Fatal(err)
	}
	if len(subs) != 2 || !subs[0].Ephemeral || !subs[1].Ephemeral {
		t.Fatalf("subscriptions of ticks: %+v; want 2 ephemeral", subs)
	}
	if err := a.Close(e.ctx()); err != nil {
		t.Fatal(err)
	}
	subs, err = e.engine.SubscriptionList(e.ctx(), &storage.SubscriptionListParams{Topic: "ticks"})
	if err != nil {
		t.Fatal(err)
	}
	if len(subs) != 1 || subs[0].ID != b.Info().Subscriptions[0] {
		t.Fatalf("after a left: %+v; want only b's ephemeral subscription", subs)
	}
	if _, ok := <-a.Deliveries(); ok {
		t.Fatal("a's channel delivers after Close")
	}
	// b still receives; a new ephemeral member starts at FROM_NOW.
	c := e.subscribe(SubscribeParams{Pattern: "ticks"})
	e.publishN("ticks", "u", 5)
	expectPayloads(t, "b after a left", consumeAll(t, 5, b), "u", 5)
	expectPayloads(t, "new ephemeral c", consumeAll(t, 5, c), "u", 5)
}

func TestWildcardExistingAndLaterTopics(t *testing.T) {
	t.Parallel()
	// Auto-created topics are PUB_SUB here, so every subscriber of a new topic gets each message.
	e := newEnv(t, func(c *Config) { c.AutoCreateConfig = pubSubCfg })
	for _, name := range []string{"orders.payments.created", "orders.shipping.created", "orders.created",
		"orders.payments.items.created", "inventory.created"} {
		e.createTopic(name, pubSubCfg)
	}
	star := e.subscribe(SubscribeParams{Pattern: "orders.*.created", Group: "g-star"})
	hash := e.subscribe(SubscribeParams{Pattern: "orders.#", Group: "g-hash"})
	eph := e.subscribe(SubscribeParams{Pattern: "orders.*.created"})

	if got := len(star.Info().Subscriptions); got != 2 {
		t.Fatalf("orders.*.created attached to %d subscriptions, want 2", got)
	}
	if got := len(hash.Info().Subscriptions); got != 4 {
		t.Fatalf("orders.# attached to %d subscriptions, want 4", got)
	}

	publishTo := func(topic, payload string) {
		t.Helper()
		if _, err := e.b.Publish(e.ctx(), topic, []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte(payload)}}); err != nil {
			t.Fatalf("Publish(%q): %v", topic, err)
		}
	}
	for _, topic := range []string{"orders.payments.created", "orders.shipping.created", "orders.created",
		"orders.payments.items.created", "inventory.created"} {
		publishTo(topic, topic)
	}
	// Topics created later: one auto-created by publish, one by an admin call, one directly in the
	// engine (as another broker instance would): the notifier attaches the members.
	publishTo("orders.refunds.created", "orders.refunds.created")
	// Publish attached the members before it appended, and CreateTopic before it returned.
	if n := len(eph.Info().Subscriptions); n != 3 {
		t.Fatalf("after the auto-create the ephemeral member has %d subscriptions, want 3", n)
	}
	e.createTopic("orders.returns.created", pubSubCfg)
	if n := len(star.Info().Subscriptions); n != 4 {
		t.Fatalf("after CreateTopic the star member has %d subscriptions, want 4", n)
	}
	if _, err := e.engine.TopicCreate(e.ctx(), &storage.TopicCreateParams{Name: "orders.gifts.created", Config: pubSubCfg}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "members attached to orders.gifts.created", func() error {
		if n := len(eph.Info().Subscriptions); n != 5 {
			return fmt.Errorf("ephemeral member has %d subscriptions, want 5", n)
		}
		if n := len(star.Info().Subscriptions); n != 5 {
			return fmt.Errorf("star member has %d subscriptions, want 5", n)
		}
		return nil
	})
	publishTo("orders.returns.created", "orders.returns.created")
	publishTo("orders.gifts.created", "orders.gifts.created")

	starWant := []string{"orders.gifts.created", "orders.payments.created", "orders.refunds.created",
		"orders.returns.created", "orders.shipping.created"}
	hashWant := append([]string{"orders.created", "orders.payments.items.created"}, starWant...)
	for _, c := range []struct {
		m    *Member
		want []string
	}{{star, starWant}, {eph, starWant}, {hash, hashWant}} {
		gs := consumeAll(t, len(c.want), c.m)
		have := payloads(gs)
		if want := sortedCopy(c.want); !slices.Equal(have, want) {
			t.Errorf("member %s (%s): got %v, want %v", c.m.ID(), c.m.Pattern(), have, want)
		}
	}
	// The groups' bindings are durable: a later topic gets their subscriptions even with no
	// member connected.
	bs, err := e.b.Bindings(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 2 {
		t.Fatalf("bindings: %+v, want 2", bs)
	}
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

func TestWildcardMixedQueueAndPubSub(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("shop.orders", queueCfg)
	e.createTopic("shop.news", pubSubCfg)
	// Two groups and a member without a group on the same pattern.
	g1 := e.subscribe(SubscribeParams{Pattern: "shop.*", Group: "g1"})
	g2 := e.subscribe(SubscribeParams{Pattern: "shop.*", Group: "g2"})
	solo := e.subscribe(SubscribeParams{Pattern: "shop.*"})

	const n = 30
	e.publishN("shop.news", "news", n)
	// PUB_SUB: every one of them gets every message.
	for _, m := range []*Member{g1, g2, solo} {
		expectPayloads(t, "news to "+m.ID(), consumeAll(t, n, m), "news", n)
	}
	// QUEUE: the three share one subscription; each message goes to exactly one of them.
	e.publishN("shop.orders", "order", n)
	gs := consumeAll(t, n, g1, g2, solo)
	expectPayloads(t, "orders", gs, "order", n)
	subs, err := e.engine.SubscriptionList(e.ctx(), &storage.SubscriptionListParams{Topic: "shop.orders"})
	if err != nil {
		t.Fatal(err)
	}
	if len(subs) != 1 || subs[0].Group != storage.QueueGroup {
		t.Fatalf("subscriptions of the QUEUE topic: %+v; want only the queue subscription", subs)
	}
}

func TestMaxInFlightCredit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("slow", queueCfg)
	m := e.subscribe(SubscribeParams{Pattern: "slow", MaxInFlight: 2})
	const n = 10
	e.publishN("slow", "s", n)

	held := recv(t, m, 2)
	for received := 2; ; {
		// The member holds 2 unacked deliveries: the engine must agree that no more are leased.
		st := e.groupStats("slow", "")
		if st.InFlight > 2 {
			t.Fatalf("after %d received: engine has %d in flight for a member with credit 2", received, st.InFlight)
		}
		if l := len(m.Deliveries()); l+len(held) > 2 {
			t.Fatalf("after %d received: %d buffered + %d held > credit 2", received, l, len(held))
		}
		if received == n {
			break
		}
		ack(t, m, held[0])
		held = append(held[1:], recv(t, m, 1)...)
		received++
	}
	ack(t, m, held...)
	if info := m.Info(); info.InFlight != 0 || info.Delivered != n {
		t.Fatalf("member info %+v: want 0 in flight, %d delivered", info, n)
	}
}

func TestNackRedeliveredToDifferentMember(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("retry", queueCfg)
	a := e.subscribe(SubscribeParams{Pattern: "retry", MaxInFlight: 1})
	b := e.subscribe(SubscribeParams{Pattern: "retry", MaxInFlight: 1})
	e.publishN("retry", "r", 1)

	var first, other *Member
	var d *storage.Delivery
	select {
	case d = <-a.Deliveries():
		first, other = a, b
	case d = <-b.Deliveries():
		first, other = b, a
	case <-time.After(waitTimeout):
		t.Fatal("no delivery")
	}
	if err := first.Nack(e.ctx(), d.SubscriptionID, []storage.DeliveryRef{d.Ref()}, NackOptions{}); err != nil {
		t.Fatal(err)
	}
	again := recv(t, other, 1)[0]
	if again.Ref() != d.Ref() || again.Attempt != 2 {
		t.Fatalf("redelivery %+v: want the same message, attempt 2", again)
	}
	// With the other member full, a nack comes back to the same member.
	if err := other.Nack(e.ctx(), again.SubscriptionID, []storage.DeliveryRef{again.Ref()}, NackOptions{}); err != nil {
		t.Fatal(err)
	}
	third := recv(t, first, 1)[0]
	if third.Attempt != 3 {
		t.Fatalf("third delivery attempt %d, want 3", third.Attempt)
	}
	if err := first.Nack(e.ctx(), third.SubscriptionID, []storage.DeliveryRef{third.Ref()}, NackOptions{}); err != nil {
		t.Fatal(err)
	}
	// first nacked; other has credit, so other gets it, even though first has credit too.
	fourth := recv(t, other, 1)[0]
	ack(t, other, fourth)
}

func TestCloseReleasesLeasesToOtherMember(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("work", pubSubCfg)
	a := e.subscribe(SubscribeParams{Pattern: "work", Group: "g", MaxInFlight: 5})
	e.publishN("work", "w", 5)
	held := recv(t, a, 5)
	b := e.subscribe(SubscribeParams{Pattern: "work", Group: "g", MaxInFlight: 5})
	e.waitIdle() // b's join was handled: only a's leaving can wake the dispatcher now
	if err := a.Close(e.ctx()); err != nil {
		t.Fatal(err)
	}
	got := recv(t, b, 5)
	for i, d := range got {
		if d.Attempt != 2 {
			t.Errorf("redelivery %d: attempt %d, want 2", i, d.Attempt)
		}
	}
	ack(t, b, got...)
	// a's acks after Close are refused; the durable subscription stays.
	if err := a.Ack(e.ctx(), held[0].SubscriptionID, held[0].Ref()); !errors.Is(err, ErrMemberClosed) {
		t.Fatalf("ack after close: %v, want ErrMemberClosed", err)
	}
	if st := e.groupStats("work", "g"); st.Pending != 0 {
		t.Fatalf("pending %d after b acked everything", st.Pending)
	}
	if err := a.Close(e.ctx()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestExtendKeepsLease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("long", storage.TopicConfig{Semantics: storage.Queue, AckWait: 10 * time.Second})
	a := e.subscribe(SubscribeParams{Pattern: "long"})
	e.publishN("long", "l", 2)
	ds := recv(t, a, 2)
	sub := ds[0].SubscriptionID

	deadline, err := a.Extend(e.ctx(), sub, []storage.DeliveryRef{ds[0].Ref()}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if want := e.clock.Now().Add(time.Minute); !deadline.Equal(want) {
		t.Fatalf("deadline %v, want %v", deadline, want)
	}
	// 30 s later the lease of ds[1] (10 s) expired, the extended one (60 s) did not.
	e.clock.Advance(30 * time.Second)
	b := e.subscribe(SubscribeParams{Pattern: "long"}) // joining makes the dispatcher claim
	if err := a.Nack(e.ctx(), sub, []storage.DeliveryRef{ds[1].Ref()}, NackOptions{}); !errors.Is(err, storage.ErrLeaseNotHeld) {
		t.Fatalf("nack of the expired delivery: %v, want ErrLeaseNotHeld", err)
	}
	if err := a.Nack(e.ctx(), sub, []storage.DeliveryRef{ds[0].Ref()}, NackOptions{}); err != nil {
		t.Fatalf("nack of the extended delivery: %v", err)
	}
	// Both come back: the nacked one at once (to b, which did not have it), the expired one after
	// its backoff.
	e.clock.Advance(storage.RedeliveryBackoff(1))
	e.b.wakeAll()
	gs := consumeAll(t, 2, b)
	expectPayloads(t, "redelivered", gs, "l", 2)
}

// TestExtendShorterLeaseFreesCredit: an Extend that shortens the leases (1 h to 1 s) of a member
// whose credit they fill gives that credit back when the new deadline passes, so the expired
// messages come back to the member; before, the member's earliest-deadline mark stayed at the
// old 1 h, its credit stayed used, and nothing was delivered for an hour.
func TestExtendShorterLeaseFreesCredit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("short", storage.TopicConfig{Semantics: storage.Queue, AckWait: time.Hour})
	m := e.subscribe(SubscribeParams{Pattern: "short", MaxInFlight: 2})
	e.publishN("short", "s", 2)
	ds := recv(t, m, 2)
	sub := ds[0].SubscriptionID
	refs := []storage.DeliveryRef{ds[0].Ref(), ds[1].Ref()}
	if _, err := m.Extend(e.ctx(), sub, refs, time.Second); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(2*time.Second + storage.RedeliveryBackoff(1))
	e.b.wakeAll()
	again := recv(t, m, 2)
	for _, d := range again {
		if d.Attempt != 2 {
			t.Fatalf("redelivery of offset %d with attempt %d, want 2", d.Offset, d.Attempt)
		}
	}
}

func TestDLQAfterMaxDeliveriesAndReplay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("poison", storage.TopicConfig{Semantics: storage.Queue, MaxDeliveries: 3})
	m := e.subscribe(SubscribeParams{Pattern: "poison"})
	e.publishN("poison", "p", 1)
	for attempt := 1; attempt <= 3; attempt++ {
		d := recv(t, m, 1)[0]
		if d.Attempt != attempt {
			t.Fatalf("delivery attempt %d, want %d", d.Attempt, attempt)
		}
		if err := m.Nack(e.ctx(), d.SubscriptionID, []storage.DeliveryRef{d.Ref()}, NackOptions{Reason: "boom"}); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := e.b.DLQ(e.ctx(), "poison", "", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Attempts != 3 || entries[0].Reason != storage.DLQMaxDeliveries ||
		entries[0].LastError != "boom" || string(entries[0].Message.Payload) != "p-0" {
		t.Fatalf("DLQ entries %+v: want one p-0 after 3 attempts, max_deliveries, last error boom", entries)
	}
	if st := e.groupStats("poison", ""); st.Pending != 0 || st.DeadLettered != 1 {
		t.Fatalf("stats pending %d, dead-lettered %d; want 0, 1", st.Pending, st.DeadLettered)
	}
	e.waitIdle()
	n, err := e.b.ReplayDLQ(e.ctx(), "poison", "", nil)
	if err != nil || n != 1 {
		t.Fatalf("ReplayDLQ = %d, %v; want 1", n, err)
	}
	d := recv(t, m, 1)[0]
	if d.Attempt != 1 || string(d.Payload) != "p-0" {
		t.Fatalf("replayed delivery %+v: want p-0 with a fresh attempt count", d)
	}
	ack(t, m, d)
	if entries, _ := e.b.DLQ(e.ctx(), "poison", "", 0, 0); len(entries) != 0 {
		t.Fatalf("DLQ after replay: %+v", entries)
	}
}

func TestReplayDLQToThatGroupOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("fanout", pubSubCfg)
	g1 := e.subscribe(SubscribeParams{Pattern: "fanout", Group: "g1"})
	g2 := e.subscribe(SubscribeParams{Pattern: "fanout", Group: "g2"})
	e.publishN("fanout", "f", 1)
	d1 := recv(t, g1, 1)[0]
	d2 := recv(t, g2, 1)[0]
	ack(t, g2, d2)
	if err := g1.Nack(e.ctx(), d1.SubscriptionID, []storage.DeliveryRef{d1.Ref()}, NackOptions{ToDLQ: true, Reason: "bad"}); err != nil {
		t.Fatal(err)
	}
	entries, err := e.b.DLQ(e.ctx(), "fanout", "g1", 0, 10)
	if err != nil || len(entries) != 1 || entries[0].Reason != storage.DLQRejected {
		t.Fatalf("g1 DLQ = %+v, %v; want one rejected entry", entries, err)
	}
	if n, err := e.b.ReplayDLQ(e.ctx(), "fanout", "g1", []int64{entries[0].ID}); err != nil || n != 1 {
		t.Fatalf("ReplayDLQ = %d, %v", n, err)
	}
	if st := e.groupStats("fanout", "g2"); st.Pending != 0 || st.InFlight != 0 {
		t.Fatalf("g2 after g1's replay: pending %d, in flight %d; want 0, 0", st.Pending, st.InFlight)
	}
	again := recv(t, g1, 1)[0]
	if string(again.Payload) != "f-0" {
		t.Fatalf("replayed %q", again.Payload)
	}
	ack(t, g1, again)
	if l := len(g2.Deliveries()); l != 0 {
		t.Fatalf("g2 has %d deliveries after g1's replay", l)
	}
	// Purge: dead-letter again and purge.
	e.publishN("fanout", "x", 1)
	dx := recv(t, g1, 1)[0]
	ack(t, g2, recv(t, g2, 1)...)
	if err := g1.Nack(e.ctx(), dx.SubscriptionID, []storage.DeliveryRef{dx.Ref()}, NackOptions{ToDLQ: true}); err != nil {
		t.Fatal(err)
	}
	if n, err := e.b.PurgeDLQ(e.ctx(), "fanout", "g1", nil); err != nil || n != 1 {
		t.Fatalf("PurgeDLQ = %d, %v; want 1", n, err)
	}
}

func TestAutoCreate(t *testing.T) {
	t.Parallel()
	t.Run("on", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, nil)
		pos := e.publishN("new.topic", "n", 2)
		if len(pos) != 2 || pos[0].Offset != 0 || pos[1].Offset != 1 {
			t.Fatalf("positions %+v", pos)
		}
		info, err := e.b.Topic(e.ctx(), "new.topic")
		if err != nil {
			t.Fatal(err)
		}
		if info.Topic.Config.Semantics != storage.Queue || info.Stats.Messages != 2 {
			t.Fatalf("auto-created topic %+v, stats %+v; want QUEUE with 2 messages", info.Topic, info.Stats)
		}
	})
	t.Run("off", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, func(c *Config) { c.DisableAutoCreate = true })
		_, err := e.b.Publish(e.ctx(), "missing", []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("x")}})
		if !errors.Is(err, storage.ErrTopicNotFound) {
			t.Fatalf("publish to a missing topic: %v, want ErrTopicNotFound", err)
		}
		if ts, _ := e.b.Topics(e.ctx()); len(ts) != 0 {
			t.Fatalf("topics after a refused publish: %+v", ts)
		}
		// A subscriber may wait for a topic that does not exist yet.
		m := e.subscribe(SubscribeParams{Pattern: "missing"})
		e.createTopic("missing", queueCfg)
		e.publishN("missing", "m", 1)
		ack(t, m, recv(t, m, 1)...)
	})
}

func TestInvalidInputRejected(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	msg := []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("x")}}
	ctx := e.ctx()
	checks := map[string]error{}
	for _, topic := range []string{"", "a..b", "a/b", "../etc", "orders.*", "orders.#", ".a", "a."} {
		_, err := e.b.Publish(ctx, topic, msg)
		checks["publish "+topic] = err
		_, err = e.b.CreateTopic(ctx, topic, queueCfg)
		checks["create "+topic] = err
	}
	_, err := e.b.Publish(ctx, "ok", nil)
	checks["publish no messages"] = err
	_, err = e.b.CreateTopic(ctx, "ok", storage.TopicConfig{Semantics: "FANOUT"})
	checks["create bad semantics"] = err
	for name, p := range map[string]SubscribeParams{
		"pattern # not last": {Pattern: "orders.#.x"},
		"empty pattern":      {Pattern: ""},
		"bad group":          {Pattern: "orders", Group: "bad group"},
		"queue group name":   {Pattern: "orders", Group: storage.QueueGroup},
		"bad member":         {Pattern: "orders", MemberID: "a/b"},
		"negative credit":    {Pattern: "orders", MaxInFlight: -1},
		"huge credit":        {Pattern: "orders", MaxInFlight: MaxInFlightLimit + 1},
		"bad start":          {Pattern: "orders", Start: storage.StartPosition{Kind: "LATER"}},
	} {
		_, err := e.b.Subscribe(ctx, p)
		checks["subscribe "+name] = err
	}
	_, err = e.b.PauseGroup(ctx, "orders", "bad group")
	checks["pause bad group"] = err
	for name, err := range checks {
		if !errors.Is(err, storage.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	// Nothing changed.
	if ts, _ := e.b.Topics(ctx); len(ts) != 0 {
		t.Fatalf("topics after bad input: %d", len(ts))
	}
	if ms := e.b.Members(); len(ms) != 0 {
		t.Fatalf("members after bad input: %+v", ms)
	}
	if bs, _ := e.b.Bindings(ctx); len(bs) != 0 {
		t.Fatalf("bindings after bad input: %+v", bs)
	}
	// A member id can be used once at a time.
	e.subscribe(SubscribeParams{Pattern: "orders", MemberID: "dup"})
	if _, err := e.b.Subscribe(ctx, SubscribeParams{Pattern: "orders", MemberID: "dup"}); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("duplicate member id: %v, want ErrInvalidArgument", err)
	}
}

func TestPauseResumeCancel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("p", pubSubCfg)
	m := e.subscribe(SubscribeParams{Pattern: "p", Group: "g"})
	if _, err := e.b.PauseGroup(e.ctx(), "p", "g"); err != nil {
		t.Fatal(err)
	}
	e.publishN("p", "p", 3)
	if st := e.groupStats("p", "g"); st.Lag != 3 {
		t.Fatalf("paused group lag %d, want 3", st.Lag)
	}
	e.waitIdle() // the dispatcher saw the messages and the pause: only the resume can wake it
	if st := e.groupStats("p", "g"); st.Lag != 3 {
		t.Fatalf("paused group lag %d after its dispatcher looked, want 3", st.Lag)
	}
	if _, err := e.b.ResumeGroup(e.ctx(), "p", "g"); err != nil {
		t.Fatal(err)
	}
	ack(t, m, recv(t, m, 3)...)
	if _, err := e.b.CancelGroup(e.ctx(), "p", "g"); err != nil {
		t.Fatal(err)
	}
	if info, err := e.b.Group(e.ctx(), "p", "g"); err != nil || info.State != storage.Cancelled {
		t.Fatalf("group after cancel: %+v, %v", info, err)
	}
	// Subscribing again creates a new subscription.
	m2 := e.subscribe(SubscribeParams{Pattern: "p", Group: "g"})
	e.publishN("p", "q", 1)
	d := recv(t, m2, 1)[0]
	if string(d.Payload) != "q-0" {
		t.Fatalf("new subscription got %q", d.Payload)
	}
	ack(t, m2, d)
}

func TestDeleteTopicDetachesAndRecreateReattaches(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("tmp.a", queueCfg)
	m := e.subscribe(SubscribeParams{Pattern: "tmp.*"})
	if err := e.b.DeleteTopic(e.ctx(), "tmp.a", true); err != nil {
		t.Fatal(err)
	}
	if n := len(m.Info().Subscriptions); n != 0 {
		t.Fatalf("member still attached to %d subscriptions after the topic was deleted", n)
	}
	e.publishN("tmp.a", "again", 1) // auto-created again
	ack(t, m, recv(t, m, 1)...)
}

func TestUpdateTopicQueueToPubSubMovesMembers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("mig", queueCfg)
	keep := e.subscribe(SubscribeParams{Pattern: "mig", Group: "legacy"})
	other := e.subscribe(SubscribeParams{Pattern: "mig", Group: "fresh"})
	e.publishN("mig", "before", 4)
	if _, err := e.b.UpdateTopic(e.ctx(), UpdateTopicParams{Name: "mig", Config: pubSubCfg}); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("QUEUE to PUB_SUB without QueueToGroup: %v, want ErrInvalidArgument", err)
	}
	if _, err := e.b.UpdateTopic(e.ctx(), UpdateTopicParams{Name: "mig", Config: pubSubCfg, QueueToGroup: "legacy"}); err != nil {
		t.Fatal(err)
	}
	// What was pending in the queue is now the group legacy's, which keep is a member of.
	e.publishN("mig", "after", 2)
	gs := consumeAll(t, 6, keep)
	if fmt.Sprint(payloads(gs)) != "[after-0 after-1 before-0 before-1 before-2 before-3]" {
		t.Fatalf("legacy got %v", payloads(gs))
	}
	// fresh has its own subscription, created FROM_NOW when it moved.
	gs = consumeAll(t, 2, other)
	expectPayloads(t, "fresh", gs, "after", 2)
}

func TestStopWithLiveMembers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("q", queueCfg)
	e.createTopic("ps", pubSubCfg)
	a := e.subscribe(SubscribeParams{Pattern: "q"})
	b := e.subscribe(SubscribeParams{Pattern: "ps"})
	c := e.subscribe(SubscribeParams{Pattern: "ps", Group: "all"})
	d := e.subscribe(SubscribeParams{Pattern: "nothing.#", Group: "waiting"})
	e.publishN("q", "q", 3)
	e.publishN("ps", "ps", 3)
	recv(t, a, 1)
	recv(t, b, 3)
	recv(t, c, 3)

	if err := e.b.Stop(e.ctx()); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*Member{a, b, c, d} {
		select {
		case <-m.Done():
		default:
			t.Fatalf("member %s not closed by Stop", m.ID())
		}
		for range m.Deliveries() {
			t.Fatalf("member %s: delivery after Stop", m.ID())
		}
	}
	if _, err := e.b.Subscribe(e.ctx(), SubscribeParams{Pattern: "q"}); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Subscribe after Stop: %v, want ErrNotRunning", err)
	}
	if _, err := e.b.Publish(e.ctx(), "q", []storage.AppendMessage{{Payload: []byte("x")}}); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Publish after Stop: %v, want ErrNotRunning", err)
	}
	if err := e.b.Stop(e.ctx()); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	// The leases were released and the ephemeral subscription deleted.
	subs, err := e.engine.SubscriptionList(e.ctx(), &storage.SubscriptionListParams{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range subs {
		if s.Ephemeral {
			t.Errorf("ephemeral subscription %d left after Stop", s.ID)
		}
		st, err := e.engine.SubscriptionStats(e.ctx(), s.ID)
		if err != nil {
			t.Fatal(err)
		}
		if st.InFlight != 0 {
			t.Errorf("subscription %d (%s/%s) has %d in flight after Stop", s.ID, s.Topic, s.Group, st.InFlight)
		}
	}
}

func TestStopBeforeStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	b, err := New(Config{Engine: e.engine})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Start after Stop: %v, want ErrNotRunning", err)
	}
	b2, err := New(Config{Engine: e.engine})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b2.Subscribe(e.ctx(), SubscribeParams{Pattern: "x"}); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Subscribe before Start: %v, want ErrNotRunning", err)
	}
}

func TestRestartRedeliversUnacked(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("durable", pubSubCfg)
	m := e.subscribe(SubscribeParams{Pattern: "durable", Group: "g", Start: storage.StartPosition{Kind: storage.FromBeginning}})
	e.publishN("durable", "d", 10)
	ds := recv(t, m, 10)
	ack(t, m, ds[:4]...)

	e.restart()
	m = e.subscribe(SubscribeParams{Pattern: "durable", Group: "g"})
	gs := consumeAll(t, 6, m)
	have := payloads(gs)
	if fmt.Sprint(have) != "[d-4 d-5 d-6 d-7 d-8 d-9]" {
		t.Fatalf("after restart got %v, want d-4..d-9", have)
	}
	for _, g := range gs {
		if g.d.Attempt != 2 {
			t.Errorf("%s: attempt %d, want 2", g.d.Payload, g.d.Attempt)
		}
	}
}

func TestCrashRedeliversAfterLeaseExpiry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("crash", storage.TopicConfig{Semantics: storage.Queue, AckWait: 5 * time.Second})
	m := e.subscribe(SubscribeParams{Pattern: "crash"})
	e.publishN("crash", "c", 3)
	ds := recv(t, m, 3)
	ack(t, m, ds[0])

	// Crash: the engine goes away under the broker without the members releasing their leases.
	if err := e.engine.Close(); err != nil {
		t.Fatal(err)
	}
	_ = e.b.Stop(e.ctx()) // fails to release (engine closed); that is the point
	e.b, e.engine = nil, nil
	e.open()
	m = e.subscribe(SubscribeParams{Pattern: "crash"})
	// Whether or not the engine kept the leases, they are over after ack_wait plus the backoff.
	e.clock.Advance(5*time.Second + storage.RedeliveryBackoff(1))
	e.b.wakeAll()
	gs := consumeAll(t, 2, m)
	if fmt.Sprint(payloads(gs)) != "[c-1 c-2]" {
		t.Fatalf("after crash got %v, want c-1 c-2", payloads(gs))
	}
}

func TestPatternMembersGetFirstMessagesOfTopicCreatedElsewhere(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.AutoCreateConfig = pubSubCfg })
	eph := e.subscribe(SubscribeParams{Pattern: "late.#"})
	grp := e.subscribe(SubscribeParams{Pattern: "late.#", Group: "g"})
	// Another broker instance creates a PUB_SUB topic and publishes at once; this broker hears of
	// the new topic only afterwards (a late notification). The members' new subscriptions start at
	// the topic's beginning, so they miss nothing.
	ctx := e.ctx()
	e.b.mu.Lock()
	e.b.unregister()
	e.b.unregister = e.engine.NotifyRegister(func(n storage.Notification) {
		if n.Kind != storage.NotifyTopicCreated {
			e.b.onNotify(n)
		}
	})
	e.b.mu.Unlock()
	if _, err := e.engine.TopicCreate(ctx, &storage.TopicCreateParams{Name: "late.x", Config: pubSubCfg}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := e.engine.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "late.x", Messages: []storage.AppendMessage{
			{Partition: storage.PartitionAuto, Payload: fmt.Appendf(nil, "x-%d", i)},
		}}); err != nil {
			t.Fatal(err)
		}
	}
	e.b.onNotify(storage.Notification{Kind: storage.NotifyTopicCreated, Topic: "late.x"})
	expectPayloads(t, "ephemeral", consumeAll(t, 3, eph), "x", 3)
	expectPayloads(t, "group", consumeAll(t, 3, grp), "x", 3)

	// This broker's own auto-create attaches the members itself, without the notification.
	e.publishN("late.y", "y", 1)
	if n := len(eph.Info().Subscriptions); n != 2 {
		t.Fatalf("after the auto-create of late.y the member has %d subscriptions, want 2", n)
	}
	expectPayloads(t, "ephemeral on late.y", consumeAll(t, 1, eph), "y", 1)
	expectPayloads(t, "group on late.y", consumeAll(t, 1, grp), "y", 1)
}

func TestRetentionJob(t *testing.T) {
	t.Parallel()
	logs := &testutil.SyncBuffer{}
	e := newEnv(t, func(c *Config) {
		c.RetentionInterval = 5 * time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	e.createTopic("old", storage.TopicConfig{Semantics: storage.Queue, MessageRetention: time.Minute})
	m := e.subscribe(SubscribeParams{Pattern: "old"})
	e.publishN("old", "o", 5)
	ack(t, m, recv(t, m, 5)...)
	// Completed and two hours old: the retention job removes them and says so at INFO.
	e.clock.Advance(2 * time.Hour)
	eventually(t, "retention removed the completed messages", func() error {
		info, err := e.b.Topic(e.ctx(), "old")
		if err != nil {
			return err
		}
		if info.Stats.Messages != 0 {
			return fmt.Errorf("%d messages retained", info.Stats.Messages)
		}
		if !strings.Contains(logs.String(), `msg="retention applied"`) || !strings.Contains(logs.String(), "messages_deleted=5") {
			return fmt.Errorf("no retention log line yet")
		}
		return nil
	})
}

// TestRetentionReportsExpired: a retention run hands its result to Config.OnRetention (what the
// metrics count) and logs each topic and reason of messages removed while a subscription had not
// completed them at WARN, besides the totals at INFO.
func TestRetentionReportsExpired(t *testing.T) {
	t.Parallel()
	logs := &testutil.SyncBuffer{}
	var got []*storage.RetentionResult
	e := newEnv(t, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
		c.OnRetention = func(res *storage.RetentionResult) { got = append(got, res) }
	})
	e.createTopic("cap", storage.TopicConfig{Semantics: storage.PubSub, MessageRetention: time.Second, MaxRetention: 3 * time.Second})
	_, err := e.engine.SubscriptionCreate(e.ctx(), &storage.SubscriptionCreateParams{Topic: "cap", Group: "g",
		Start: storage.StartPosition{Kind: storage.FromBeginning}})
	if err != nil {
		t.Fatal(err)
	}
	e.publishN("cap", "c", 5)
	e.b.runRetention(e.ctx()) // nothing is old yet: reported, not logged
	e.clock.Advance(4 * time.Second)
	e.b.runRetention(e.ctx())
	if len(got) != 2 {
		t.Fatalf("OnRetention called %d times for 2 runs", len(got))
	}
	want := []storage.ExpiredCount{{Topic: "cap", Reason: storage.ExpiredMaxRetention, Messages: 5}}
	if got[0].MessagesExpired != 0 || !slices.Equal(got[1].Expired, want) || got[1].MessagesExpired != 5 {
		t.Fatalf("results %+v, %+v; want the second to expire %+v", *got[0], *got[1], want)
	}
	out := logs.String()
	for _, s := range []string{
		`level=WARN msg="retention expired messages a subscription had not completed" component=broker topic=cap reason=max_retention messages=5`,
		`msg="retention applied" component=broker messages_deleted=0 messages_expired=5`,
	} {
		if !strings.Contains(out, s) {
			t.Errorf("log lacks %s:\n%s", s, out)
		}
	}
	if n := strings.Count(out, `msg="retention`); n != 2 {
		t.Errorf("%d log lines about retention, want 2:\n%s", n, out)
	}
}

// TestRetentionReportsZombies: a run that force-advances a stuck floor (zombie_ttl) hands the
// subscription and what it gave up to Config.OnRetention and logs it at WARN with the group.
func TestRetentionReportsZombies(t *testing.T) {
	t.Parallel()
	logs := &testutil.SyncBuffer{}
	var got []*storage.RetentionResult
	e := newEnv(t, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
		c.OnRetention = func(res *storage.RetentionResult) { got = append(got, res) }
	})
	e.createTopic("zt", storage.TopicConfig{Semantics: storage.PubSub, ZombieTTL: time.Minute})
	s, err := e.engine.SubscriptionCreate(e.ctx(), &storage.SubscriptionCreateParams{Topic: "zt", Group: "stuck",
		Start: storage.StartPosition{Kind: storage.FromBeginning}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.engine.SubscriptionUpdate(e.ctx(), &storage.SubscriptionUpdateParams{ID: s.ID, State: storage.Paused}); err != nil {
		t.Fatal(err)
	}
	e.publishN("zt", "z", 4)
	e.b.runRetention(e.ctx()) // the floor is first seen
	e.clock.Advance(time.Minute + time.Second)
	e.b.runRetention(e.ctx())
	want := []storage.ZombieCount{{Topic: "zt", Group: "stuck", SubscriptionID: s.ID, Messages: 4}}
	if len(got) != 2 || len(got[0].Zombies) != 0 || !slices.Equal(got[1].Zombies, want) {
		t.Fatalf("results %+v; want the second to list %+v", got, want)
	}
	line := fmt.Sprintf(`level=WARN msg="zombie_ttl force-advanced a stuck subscription: it gave up messages it had not completed" `+
		`component=broker topic=zt group=stuck subscription=%d messages=4`, s.ID)
	if out := logs.String(); !strings.Contains(out, line) {
		t.Errorf("log lacks %s:\n%s", line, out)
	}
}

// TestRetentionReportsSize: what a topic's size bound removed is handed to Config.OnRetention
// and logged at INFO with the topic.
func TestRetentionReportsSize(t *testing.T) {
	t.Parallel()
	logs := &testutil.SyncBuffer{}
	var got []*storage.RetentionResult
	e := newEnv(t, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
		c.OnRetention = func(res *storage.RetentionResult) { got = append(got, res) }
	})
	e.createTopic("sb", storage.TopicConfig{Semantics: storage.PubSub, MaxMessages: 2, SizePolicy: storage.SizeDropOldest})
	e.publishN("sb", "s", 5)
	e.b.runRetention(e.ctx())
	if len(got) != 1 || len(got[0].SizeRemoved) != 1 || got[0].SizeRemoved[0].Topic != "sb" || got[0].SizeRemoved[0].Messages < 3 {
		t.Fatalf("results %+v; want at least 3 messages of sb removed by its size bound", got)
	}
	line := fmt.Sprintf(`level=INFO msg="retention removed the oldest messages of a topic above its size bound" component=broker topic=sb messages=%d`,
		got[0].SizeRemoved[0].Messages)
	if out := logs.String(); !strings.Contains(out, line) {
		t.Errorf("log lacks %s:\n%s", line, out)
	}
}

func TestChurnLosesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	// Deliveries received and not acked by leaving members count as attempts: keep them out of the DLQ.
	e.createTopic("churn", storage.TopicConfig{Semantics: storage.Queue, MaxDeliveries: 1000})
	const n = 400
	var (
		mu    sync.Mutex
		acked = map[string]bool{}
	)
	// Each worker joins, acks a few deliveries, receives a few more without acking them, and
	// leaves; what it held goes back to the others.
	br := e.b
	worker := func(id int) error {
		for round := 0; ; round++ {
			mu.Lock()
			done := len(acked) == n
			mu.Unlock()
			if done {
				return nil
			}
			m, err := br.Subscribe(context.Background(), SubscribeParams{Pattern: "churn", MaxInFlight: 1 + (id+round)%4})
			if err != nil {
				return err
			}
			for i := 0; i < 8; i++ {
				var d *storage.Delivery
				select {
				case d = <-m.Deliveries():
				case <-time.After(20 * time.Millisecond): // nothing for this member right now: leave
				}
				if d == nil {
					break
				}
				if i%3 == 2 {
					continue // received, never acked: released when the member leaves
				}
				if err := m.Ack(context.Background(), d.SubscriptionID, d.Ref()); err != nil {
					return fmt.Errorf("worker %d: ack: %w", id, err)
				}
				mu.Lock()
				acked[string(d.Payload)] = true
				mu.Unlock()
			}
			if err := m.Close(context.Background()); err != nil {
				return fmt.Errorf("worker %d: close: %w", id, err)
			}
		}
	}
	errs := make(chan error, 4)
	for i := range 4 {
		go func() { errs <- worker(i) }()
	}
	e.publishN("churn", "c", n)
	timer := time.NewTimer(2 * waitTimeout)
	defer timer.Stop()
	for range 4 {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-timer.C:
			mu.Lock()
			k := len(acked)
			mu.Unlock()
			st := e.groupStats("churn", "")
			t.Fatalf("workers did not finish: %d of %d acked; stats %+v", k, n, st)
		}
	}
	if st := e.groupStats("churn", ""); st.Pending != 0 || st.InFlight != 0 {
		t.Fatalf("after churn: pending %d, in flight %d", st.Pending, st.InFlight)
	}
	if ms := e.b.Members(); len(ms) != 0 {
		t.Fatalf("members left: %+v", ms)
	}
}

// syncOnly hides the engine's storage.AsyncAppender (both engines have one), to test the
// synchronous fallback of PublishAsync.
type syncOnly struct{ storage.Engine }

// gatedAsync holds the done of each asynchronous append until the gate that was set when it was
// queued is closed (waiting on a goroutine of its own, so that the engine's committer goes on):
// a PublishAsync that waited for its append would never return.
type gatedAsync struct {
	storage.Engine
	gate atomic.Pointer[chan struct{}]
}

func (g *gatedAsync) MessagesAppendAsync(p *storage.MessagesAppendParams, done func(*storage.MessagesAppendResult, error)) error {
	gate := *g.gate.Load()
	return g.Engine.(storage.AsyncAppender).MessagesAppendAsync(p, func(r *storage.MessagesAppendResult, err error) {
		go func() {
			<-gate
			done(r, err)
		}()
	})
}

// TestPublishAsync: PublishAsync refuses a bad batch with an error and never calls done;
// otherwise it calls done exactly once with the positions: later when the engine appends
// asynchronously (also for a topic it auto-creates first), and before it returns on an engine
// that cannot append asynchronously. A subscriber receives what it published.
func TestPublishAsync(t *testing.T) {
	t.Parallel()
	type outcome struct {
		ps  []storage.MessagePosition
		err error
	}
	// calls counts the done calls of one PublishAsync, which must be want once the engine is
	// closed (it completes every append it queued): 1 after a nil error, 0 after an error.
	type calls struct {
		n    atomic.Int32
		want int32
	}
	// publish returns PublishAsync's error, or done's outcome and whether done ran before
	// PublishAsync returned; it adds the call's counter to counted.
	publish := func(t *testing.T, e *env, counted *[]*calls, topic string, payloads ...string) (o outcome, inline bool, err error) {
		t.Helper()
		msgs := make([]storage.AppendMessage, len(payloads))
		for i, p := range payloads {
			msgs[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: []byte(p)}
		}
		got := make(chan outcome, 2)
		var returned atomic.Bool
		c := &calls{}
		gate := make(chan struct{})
		if g, ok := e.b.engine.(*gatedAsync); ok {
			g.gate.Store(&gate)
		}
		err = e.b.PublishAsync(e.ctx(), topic, msgs, PublishOptions{}, func(ps []storage.MessagePosition, err error) {
			c.n.Add(1)
			inline = !returned.Load()
			got <- outcome{ps, err}
		})
		returned.Store(true)
		close(gate)
		if err == nil {
			c.want = 1
			o = <-got
		}
		*counted = append(*counted, c)
		return o, inline, err
	}
	for _, tc := range []struct {
		name   string
		engine func(storage.Engine) storage.Engine
		inline bool // done runs before PublishAsync returns
	}{
		{"async engine", func(e storage.Engine) storage.Engine { return &gatedAsync{Engine: e} }, false},
		{"engine without AsyncAppender", func(e storage.Engine) storage.Engine { return syncOnly{e} }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, nil)
			// Swapped before any member or call exists: nothing else reads it yet (retention is off).
			e.b.engine = tc.engine(e.b.engine)
			m := e.subscribe(SubscribeParams{Pattern: "async.t"})
			var counted []*calls
			o, inline, err := publish(t, e, &counted, "async.t", "a", "b") // auto-creates the topic
			if err != nil || o.err != nil || len(o.ps) != 2 || o.ps[0].Offset != 0 || o.ps[1].Offset != 1 {
				t.Fatalf("publish: %+v, %v", o, err)
			}
			if inline != tc.inline {
				t.Fatalf("done before PublishAsync returned: %v, want %v", inline, tc.inline)
			}
			o, inline, err = publish(t, e, &counted, "async.t", "c")
			if err != nil || o.err != nil || len(o.ps) != 1 || o.ps[0].Offset != 2 || inline != tc.inline {
				t.Fatalf("second publish: %+v, %v (inline %v)", o, err, inline)
			}
			ack(t, m, recv(t, m, 3)...)

			// Refusals are PublishAsync's error; done is not called.
			for _, bad := range []struct {
				topic string
				msgs  []string
			}{{"a..b", []string{"x"}}, {"async.t", nil}} {
				if _, _, err := publish(t, e, &counted, bad.topic, bad.msgs...); !errors.Is(err, storage.ErrInvalidArgument) {
					t.Fatalf("publish to %q of %d messages: %v, want ErrInvalidArgument", bad.topic, len(bad.msgs), err)
				}
			}
			e.close() // every append the engine queued is completed
			for i, c := range counted {
				if n := c.n.Load(); n != c.want {
					t.Errorf("publish %d: done called %d times, want %d", i, n, c.want)
				}
			}
		})
	}
}

// TestExtendNotHeldFreesCredit: refs an Extend finds no longer held (here: their lease expired)
// give the member's credit back and wake the owner that waits for it; before, the member dropped
// them silently and the owner slept until its next poll (an hour here) with messages waiting.
func TestExtendNotHeldFreesCredit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("expired", storage.TopicConfig{Semantics: storage.Queue, AckWait: time.Hour})
	m := e.subscribe(SubscribeParams{Pattern: "expired", MaxInFlight: 1})
	e.publishN("expired", "x", 2)
	d := recv(t, m, 1)[0]
	// The owner found m without credit for offset 1 and waits for it (or for the lease's hour).
	e.waitIdle()
	e.clock.Advance(2 * time.Hour)
	res, err := m.ExtendBatch(e.ctx(), d.SubscriptionID, []storage.DeliveryRef{d.Ref()}, time.Minute)
	if err != nil || len(res.NotHeld) != 1 {
		t.Fatalf("ExtendBatch of an expired lease = %+v, %v; want it not held", res, err)
	}
	// The expired offset 0 comes back first (due since its lease ended), then offset 1.
	if next := recv(t, m, 1)[0]; next.Offset != 0 || next.Attempt != 2 {
		t.Fatalf("delivery after the extend: offset %d attempt %d, want offset 0 attempt 2", next.Offset, next.Attempt)
	}
}
