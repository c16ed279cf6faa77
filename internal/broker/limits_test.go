package broker

import (
	"errors"
	"slices"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// TestTopicAndPartitionLimits: a client cannot make the broker keep unbounded topics or
// partitions (issue 16: five text PUBLISHes to new topics reserved 320 MiB): past MaxTopics an
// explicit creation and an auto-creating publish fail with ErrLimitExceeded and create nothing,
// past MaxPartitions a creation and a growth fail the same way, and a deleted topic makes room.
func TestTopicAndPartitionLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.MaxTopics, c.MaxPartitions = 2, 4 })
	ctx := e.ctx()
	e.createTopic("lim.one", storage.TopicConfig{Partitions: 4})
	if _, err := e.b.CreateTopic(ctx, "lim.wide", storage.TopicConfig{Partitions: 5}); !errors.Is(err, storage.ErrLimitExceeded) {
		t.Fatalf("CreateTopic with 5 partitions: %v, want ErrLimitExceeded", err)
	}
	if _, err := e.b.UpdateTopic(ctx, UpdateTopicParams{Name: "lim.one", Config: storage.TopicConfig{Partitions: 5}}); !errors.Is(err, storage.ErrLimitExceeded) {
		t.Fatalf("UpdateTopic to 5 partitions: %v, want ErrLimitExceeded", err)
	}
	e.publishN("lim.auto", "m", 1) // auto-created: the second topic
	_, err := e.b.Publish(ctx, "lim.three", []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("x")}})
	if !errors.Is(err, storage.ErrLimitExceeded) {
		t.Fatalf("publish auto-creating a third topic: %v, want ErrLimitExceeded", err)
	}
	if _, err := e.b.CreateTopic(ctx, "lim.three", storage.TopicConfig{}); !errors.Is(err, storage.ErrLimitExceeded) {
		t.Fatalf("CreateTopic of a third topic: %v, want ErrLimitExceeded", err)
	}
	topics, err := e.engine.TopicList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(topics) != 2 {
		t.Fatalf("%d topics, want 2", len(topics))
	}
	if st, err := e.engine.TopicStats(ctx, "lim.one"); err != nil || len(st.Partitions) != 4 {
		t.Fatalf("lim.one after the refused growth: %+v, %v", st, err)
	}
	if err := e.b.DeleteTopic(ctx, "lim.auto", true); err != nil {
		t.Fatal(err)
	}
	e.publishN("lim.three", "m", 1)
}

// TestOrderedGroupMemberLimit: an ordered group takes at most maxOrderedMembers members on one
// instance (storage.MaxAssignmentMembers: one assignment, and one liveness renewal, holds no
// more). A join past it fails with ErrLimitExceeded and changes nothing: the assignment and the
// liveness records keep the members in, none is cut. A leave makes room again.
func TestOrderedGroupMemberLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.RebalanceDelay, c.SharedEngine = -1, true })
	e.b.maxOrderedMembers = 2
	e.createTopic("lim.ord", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 4})
	a := e.subscribeOrdered("lim.ord", "g", "a")
	e.subscribeOrdered("lim.ord", "g", "b")
	e.waitAssignment("lim.ord", "g", "a", "b")
	p := SubscribeParams{Pattern: "lim.ord", Group: "g", MemberID: "c", Mode: storage.ModeOrdered}
	if _, err := e.b.Subscribe(e.ctx(), p); !errors.Is(err, storage.ErrLimitExceeded) {
		t.Fatalf("third member: %v, want ErrLimitExceeded", err)
	}
	e.waitIdle()
	e.waitAssignment("lim.ord", "g", "a", "b")
	live := func() []string {
		t.Helper()
		if err := e.b.renewLiveness(e.ctx()); err != nil {
			t.Fatal(err)
		}
		sub, err := e.b.lookup(e.ctx(), "lim.ord", "g")
		if err != nil {
			t.Fatal(err)
		}
		res, err := e.engine.SubscriptionMembersRenew(e.ctx(), &storage.SubscriptionMembersRenewParams{
			Subscriptions: []int64{sub.ID}, TTL: DefaultMemberTimeout,
		})
		if err != nil {
			t.Fatal(err)
		}
		return slices.Sorted(slices.Values(res.Live[sub.ID]))
	}
	if got := live(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("live members %v, want [a b]", got)
	}
	if err := a.Close(e.ctx()); err != nil {
		t.Fatal(err)
	}
	e.subscribe(p) // a left: room for c
	e.waitAssignment("lim.ord", "g", "b", "c")
	if got := live(); !slices.Contains(got, "b") || !slices.Contains(got, "c") {
		t.Fatalf("live members %v after a left and c joined, want b and c (a's record expires later)", got)
	}
}
