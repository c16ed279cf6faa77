package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// orderedEnv is an env whose ordered groups rebalance at once (no debounce).
func orderedEnv(t *testing.T) *env {
	return newEnv(t, func(c *Config) { c.RebalanceDelay = -1 })
}

// publishTo publishes n messages "<prefix>-<i>" to partition i mod parts.
func (e *env) publishTo(topic, prefix string, n, parts int) {
	e.t.Helper()
	for i := range n {
		_, err := e.b.Publish(e.ctx(), topic, []storage.AppendMessage{{
			Partition: int32(i % parts), Payload: fmt.Appendf(nil, "%s-%d", prefix, i),
		}})
		if err != nil {
			e.t.Fatalf("Publish: %v", err)
		}
	}
}

func (e *env) subscribeOrdered(topic, group, id string) *Member {
	e.t.Helper()
	return e.subscribe(SubscribeParams{Pattern: topic, Group: group, MemberID: id, Mode: storage.ModeOrdered,
		Start: storage.StartPosition{Kind: storage.FromBeginning}})
}

// waitAssignment waits until the group's assignment lists exactly members and returns it.
func (e *env) waitAssignment(topic, group string, members ...string) *storage.Assignment {
	e.t.Helper()
	var a *storage.Assignment
	eventually(e.t, fmt.Sprintf("assignment of %v", members), func() error {
		var err error
		a, err = e.b.GroupAssignment(e.ctx(), topic, group)
		if err != nil {
			return err
		}
		var have []string
		for m := range a.Members {
			have = append(have, m)
		}
		slices.Sort(have)
		want := slices.Sorted(slices.Values(members))
		if !slices.Equal(have, want) {
			return fmt.Errorf("generation %d members %v, want %v", a.Generation, have, want)
		}
		return nil
	})
	return a
}

// TestOrderedGroupDeliversPartitionsInOrderToOneOwner: three ordered members of a 6-partition
// topic each get only their partitions, each partition in offset order; a fourth joining makes a
// new generation that covers it and the rest is delivered too.
func TestOrderedGroupDeliversPartitionsInOrderToOneOwner(t *testing.T) {
	e := orderedEnv(t)
	e.createTopic("o", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 6})
	ms := []*Member{e.subscribeOrdered("o", "g", "a"), e.subscribeOrdered("o", "g", "b"), e.subscribeOrdered("o", "g", "c")}
	a1 := e.waitAssignment("o", "g", "a", "b", "c")
	e.publishTo("o", "x", 60, 6)
	gs := consumeAll(t, 60, ms...)
	expectPayloads(t, "first batch", gs, "x", 60)
	checkOrdered(t, gs, a1)

	d := e.subscribeOrdered("o", "g", "d")
	a2 := e.waitAssignment("o", "g", "a", "b", "c", "d")
	if a2.Generation <= a1.Generation {
		t.Fatalf("generation after a join %d, before %d", a2.Generation, a1.Generation)
	}
	e.publishTo("o", "y", 60, 6)
	gs = consumeAll(t, 60, append(ms, d)...)
	expectPayloads(t, "after the join", gs, "y", 60)
	checkOrdered(t, gs, a2)
}

// checkOrdered checks that every delivery came from a partition its member owns in a, and each
// partition's offsets increase.
func checkOrdered(t *testing.T, gs []got, a *storage.Assignment) {
	t.Helper()
	last := map[int32]int64{}
	for _, g := range gs {
		if owner := a.Owner(g.d.Partition); owner != g.member {
			t.Fatalf("partition %d offset %d went to %s, its owner is %q", g.d.Partition, g.d.Offset, g.member, owner)
		}
		if g.d.Generation < a.Since[g.d.Partition] || g.d.Generation > a.Generation {
			t.Fatalf("partition %d: delivery of generation %d, owned since %d, current %d", g.d.Partition, g.d.Generation, a.Since[g.d.Partition], a.Generation)
		}
		if l, ok := last[g.d.Partition]; ok && g.d.Offset <= l {
			t.Fatalf("partition %d: offset %d after %d", g.d.Partition, g.d.Offset, l)
		}
		last[g.d.Partition] = g.d.Offset
	}
}

// TestOrderedOldOwnerAckIsStale: a member that lost a partition in a rebalance cannot ack the
// delivery it holds of it (STALE_GENERATION); the new owner gets the message again and acks it.
func TestOrderedOldOwnerAckIsStale(t *testing.T) {
	e := orderedEnv(t)
	e.createTopic("o", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2})
	a := e.subscribeOrdered("o", "g", "a")
	e.waitAssignment("o", "g", "a")
	if _, err := e.b.Publish(e.ctx(), "o", []storage.AppendMessage{{Partition: 1, Payload: []byte("m")}}); err != nil {
		t.Fatal(err)
	}
	old := recv(t, a, 1)[0]
	// Round robin over a, b: b gets partition 1.
	b := e.subscribeOrdered("o", "g", "b")
	asg := e.waitAssignment("o", "g", "a", "b")
	if asg.Owner(1) != "b" {
		t.Fatalf("partition 1 owned by %q, want b", asg.Owner(1))
	}
	_, err := e.b.AckBatchGen(e.ctx(), old.SubscriptionID, "a", old.Generation, []storage.DeliveryRef{old.Ref()})
	if !errors.Is(err, storage.ErrStaleGeneration) {
		t.Fatalf("old owner's ack: %v, want ErrStaleGeneration", err)
	}
	if _, err := a.NackBatchGen(e.ctx(), old.SubscriptionID, old.Generation, []storage.DeliveryRef{old.Ref()}, NackOptions{}); !errors.Is(err, storage.ErrStaleGeneration) {
		t.Fatalf("old owner's nack: %v, want ErrStaleGeneration", err)
	}
	// b's claim runs after the owner adopted the assignment (same goroutine): by then the old
	// owner's credit came back, the engine having dropped the lease. (Checked before b's ack,
	// which forgets the ref in every member.)
	got := recv(t, b, 1)[0]
	if inf := a.InFlight(); inf != 0 {
		t.Fatalf("old owner still counts %d in flight: %s", inf, memberState(a))
	}
	if got.Offset != old.Offset || got.Generation != asg.Generation {
		t.Fatalf("new owner got %d:%d generation %d, want %d:%d generation %d", got.Partition, got.Offset, got.Generation, old.Partition, old.Offset, asg.Generation)
	}
	if _, err := e.b.AckBatchGen(e.ctx(), got.SubscriptionID, "b", got.Generation, []storage.DeliveryRef{got.Ref()}); err != nil {
		t.Fatalf("new owner's ack: %v", err)
	}
}

// TestOrderedLeaveMovesPartitions: when a member leaves, its partitions go to the others in a new
// generation and what it had not acked is delivered to them from the ack floor.
func TestOrderedLeaveMovesPartitions(t *testing.T) {
	e := orderedEnv(t)
	e.createTopic("o", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 4})
	a := e.subscribeOrdered("o", "g", "a")
	b := e.subscribeOrdered("o", "g", "b")
	e.waitAssignment("o", "g", "a", "b")
	e.publishTo("o", "x", 8, 4)
	// a takes one delivery of each of its partitions and leaves without acking.
	recv(t, a, 2)
	if err := a.Close(e.ctx()); err != nil {
		t.Fatal(err)
	}
	asg := e.waitAssignment("o", "g", "b")
	if len(asg.Members["b"]) != 4 {
		t.Fatalf("b owns %v after a left", asg.Members["b"])
	}
	gs := consumeAll(t, 8, b)
	expectPayloads(t, "after the leave", gs, "x", 8)
	checkOrdered(t, gs, asg)
}

// TestOrderedRebalancesCoalesce: joins within RebalanceDelay make one rebalance (one generation).
func TestOrderedRebalancesCoalesce(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.RebalanceDelay = time.Minute })
	e.createTopic("o", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 6})
	for _, id := range []string{"a", "b", "c"} {
		e.subscribeOrdered("o", "g", id)
	}
	// Nothing ran yet (a minute to go); the admin trigger runs the one rebalance now.
	asg, err := e.b.RebalanceGroup(e.ctx(), RebalanceParams{Topic: "o", Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	if asg.Generation != 1 || len(asg.Members) != 3 {
		t.Fatalf("after three joins: generation %d members %v, want generation 1 with 3 members", asg.Generation, asg.Members)
	}
}

// TestOrderedRebalanceStrategy: an admin rebalance with a new strategy stores it and increments
// the generation; sticky keeps the partitions that need not move.
func TestOrderedRebalanceStrategy(t *testing.T) {
	e := orderedEnv(t)
	e.createTopic("o", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 6})
	e.subscribeOrdered("o", "g", "a")
	e.subscribeOrdered("o", "g", "b")
	before := e.waitAssignment("o", "g", "a", "b")
	asg, err := e.b.RebalanceGroup(e.ctx(), RebalanceParams{Topic: "o", Group: "g", Strategy: storage.StrategySticky})
	if err != nil {
		t.Fatal(err)
	}
	if asg.Strategy != storage.StrategySticky || asg.Generation != before.Generation+1 {
		t.Fatalf("strategy %q generation %d, want sticky at %d", asg.Strategy, asg.Generation, before.Generation+1)
	}
	for m, ps := range before.Members {
		if !slices.Equal(asg.Members[m], ps) {
			t.Fatalf("sticky moved %s's partitions %v to %v", m, ps, asg.Members[m])
		}
	}
}

// TestOrderedSubscribeChecks: bad ordered subscriptions are refused and change nothing.
func TestOrderedSubscribeChecks(t *testing.T) {
	e := orderedEnv(t)
	e.createTopic("o", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2})
	e.createTopic("q", storage.TopicConfig{Semantics: storage.Queue, Partitions: 2})
	e.subscribe(SubscribeParams{Pattern: "o", Group: "shared", MemberID: "s"})
	for _, c := range []struct {
		name string
		p    SubscribeParams
		want error
	}{
		{"no group", SubscribeParams{Pattern: "o", Mode: storage.ModeOrdered}, storage.ErrInvalidArgument},
		{"pattern", SubscribeParams{Pattern: "o.*", Group: "g", Mode: storage.ModeOrdered}, storage.ErrInvalidArgument},
		{"strategy", SubscribeParams{Pattern: "o", Group: "g", Mode: storage.ModeOrdered, Strategy: "random"}, storage.ErrInvalidArgument},
		{"shared with strategy", SubscribeParams{Pattern: "o", Group: "g", Strategy: "sticky"}, storage.ErrInvalidArgument},
		{"queue topic", SubscribeParams{Pattern: "q", Group: "g", Mode: storage.ModeOrdered}, storage.ErrInvalidArgument},
		{"shared group", SubscribeParams{Pattern: "o", Group: "shared", Mode: storage.ModeOrdered}, storage.ErrModeConflict},
	} {
		if _, err := e.b.Subscribe(e.ctx(), c.p); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := e.b.GroupAssignment(context.Background(), "o", "g"); !errors.Is(err, storage.ErrSubscriptionNotFound) {
		t.Errorf("group g: %v, want not found (nothing created)", err)
	}
}

// TestOrderedSharedEngineExpiredMemberLosesPartitions: two brokers on one engine (SharedEngine,
// as two instances on one PostgreSQL database), member a on the first, b on the second. The
// second stops renewing b (a crash: b never leaves). Within the member timeout nothing moves;
// past it the first broker's renewal finds b expired and its owner rebalances without b: a gets
// b's partition, starting with the message b held. b's ack is refused STALE_GENERATION; when the
// second broker claims again (it was only cut off) it rebalances b back in.
func TestOrderedSharedEngineExpiredMemberLosesPartitions(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.RebalanceDelay, c.SharedEngine = -1, true })
	b2, err := New(Config{Engine: e.engine, Clock: e.clock, Logger: testLogger(t), RetentionInterval: -1, PollInterval: time.Hour,
		RebalanceDelay: -1, SharedEngine: true, LifecycleInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	b2.livenessInterval = time.Hour // the test renews b2's members by hand
	if err := b2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b2.Stop(context.Background()); err != nil {
			t.Errorf("second broker Stop: %v", err)
		}
	})
	e.createTopic("o", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2, AckWait: time.Hour})
	a := e.subscribeOrdered("o", "g", "a")
	e.waitAssignment("o", "g", "a")
	mb, err := b2.Subscribe(e.ctx(), SubscribeParams{Pattern: "o", Group: "g", MemberID: "b", Mode: storage.ModeOrdered,
		Start: storage.StartPosition{Kind: storage.FromBeginning}})
	if err != nil {
		t.Fatal(err)
	}
	g1 := e.waitAssignment("o", "g", "a", "b")
	if g1.Owner(1) != "b" {
		t.Fatalf("partition 1 owned by %q, want b", g1.Owner(1))
	}
	e.publishTo("o", "x", 2, 2)
	ack(t, a, recv(t, a, 1)...)
	held := recv(t, mb, 1)[0]

	// Within the timeout b is live: the first broker's renewal changes nothing.
	e.clock.Advance(DefaultMemberTimeout - time.Second)
	if err := e.b.renewLiveness(e.ctx()); err != nil {
		t.Fatal(err)
	}
	e.waitIdle()
	if cur := e.waitAssignment("o", "g", "a", "b"); cur.Generation != g1.Generation {
		t.Fatalf("generation %d within the member timeout, want %d", cur.Generation, g1.Generation)
	}
	// Past it, b is gone: a owns both partitions and gets what b held, in order.
	e.clock.Advance(time.Second)
	if err := e.b.renewLiveness(e.ctx()); err != nil {
		t.Fatal(err)
	}
	g2 := e.waitAssignment("o", "g", "a")
	if len(g2.Members["a"]) != 2 {
		t.Fatalf("a owns %v after b expired", g2.Members["a"])
	}
	got := recv(t, a, 1)[0]
	if got.Partition != held.Partition || got.Offset != held.Offset || got.Attempt != 2 {
		t.Fatalf("a got %d:%d attempt %d, want b's %d:%d again", got.Partition, got.Offset, got.Attempt, held.Partition, held.Offset)
	}
	if _, err := b2.AckBatchGen(e.ctx(), held.SubscriptionID, "b", held.Generation, []storage.DeliveryRef{held.Ref()}); !errors.Is(err, storage.ErrStaleGeneration) {
		t.Fatalf("expired member's ack: %v, want ErrStaleGeneration", err)
	}
	ack(t, a, got)
	// The second broker comes back: its next claim (woken by a publish) rejoins b.
	if err := b2.renewLiveness(e.ctx()); err != nil {
		t.Fatal(err)
	}
	e.publishTo("o", "y", 2, 2)
	g3 := e.waitAssignment("o", "g", "a", "b")
	if g3.Generation <= g2.Generation {
		t.Fatalf("generation %d after b rejoined, want above %d", g3.Generation, g2.Generation)
	}
}
