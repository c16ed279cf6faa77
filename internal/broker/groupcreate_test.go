package broker

import (
	"errors"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// A group created ahead of its consumers keeps what is published from its start; its start can
// change until it delivers something; bad input changes nothing.
func TestCreateGroupAheadOfConsumers(t *testing.T) {
	e := newEnv(t, nil)
	ctx := e.ctx()
	e.createTopic("orders", storage.TopicConfig{Semantics: storage.PubSub})
	e.createTopic("jobs", storage.TopicConfig{})
	e.publishN("orders", "early", 2)

	sub, err := e.b.CreateGroup(ctx, CreateGroupParams{Topic: "orders", Group: "billing", HeartbeatTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if sub.Start.Kind != storage.FromNow || sub.HeartbeatTimeout != time.Minute || sub.State != storage.Active {
		t.Fatalf("created group: %+v", sub)
	}
	for _, c := range []struct {
		p    CreateGroupParams
		want error
	}{
		{CreateGroupParams{Topic: "orders", Group: "billing"}, storage.ErrSubscriptionExists},
		{CreateGroupParams{Topic: "nope", Group: "g"}, storage.ErrTopicNotFound},
		{CreateGroupParams{Topic: "jobs", Group: "g"}, storage.ErrInvalidArgument},
		{CreateGroupParams{Topic: "orders", Group: "bad group"}, storage.ErrInvalidArgument},
		{CreateGroupParams{Topic: "orders", Group: "g", HeartbeatTimeout: time.Millisecond}, storage.ErrInvalidArgument},
		{CreateGroupParams{Topic: "orders", Group: "g", Start: storage.StartPosition{Kind: storage.FromTimestamp}}, storage.ErrInvalidArgument},
	} {
		if _, err := e.b.CreateGroup(ctx, c.p); !errors.Is(err, c.want) {
			t.Errorf("CreateGroup(%+v): %v, want %v", c.p, err, c.want)
		}
	}
	if _, err := e.engine.SubscriptionGetByGroup(ctx, "orders", "g"); !errors.Is(err, storage.ErrSubscriptionNotFound) {
		t.Errorf("a refused CreateGroup created a subscription: %v", err)
	}

	// No progress yet: the start moves to the beginning, and the members get everything.
	from := storage.StartPosition{Kind: storage.FromBeginning}
	if _, err := e.b.UpdateGroup(ctx, UpdateGroupParams{Topic: "orders", Group: "billing", Start: &from}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.UpdateGroup(ctx, UpdateGroupParams{Topic: "orders", Group: "billing"}); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Errorf("UpdateGroup with nothing to change: %v", err)
	}
	e.publishN("orders", "late", 1)
	m := e.subscribe(SubscribeParams{Pattern: "orders", Group: "billing"})
	ds := recv(t, m, 3)
	ack(t, m, ds...)
	now := storage.StartPosition{Kind: storage.FromNow}
	if _, err := e.b.UpdateGroup(ctx, UpdateGroupParams{Topic: "orders", Group: "billing", Start: &now}); !errors.Is(err, storage.ErrSubscriptionHasProgress) {
		t.Errorf("UpdateGroup of the start after progress: %v", err)
	}
	up, err := e.b.UpdateGroup(ctx, UpdateGroupParams{Topic: "orders", Group: "billing", HeartbeatTimeout: 2 * time.Minute})
	if err != nil || up.HeartbeatTimeout != 2*time.Minute || up.Start.Kind != storage.FromBeginning {
		t.Fatalf("UpdateGroup of the timeout after progress: %+v, %v", up, err)
	}
}

// An ordered group created ahead of its consumers keeps its strategy and per-partition limit: a
// member that joins later gets that many unsettled messages of a partition, not one; a shared
// member cannot join it; ordered settings on a shared group, or out of range, are refused.
func TestCreateOrderedGroupAhead(t *testing.T) {
	e := newEnv(t, nil)
	ctx := e.ctx()
	e.createTopic("ledger", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 1})
	for _, p := range []CreateGroupParams{
		{Topic: "ledger", Group: "g", Strategy: storage.StrategySticky},
		{Topic: "ledger", Group: "g", MaxInFlightPerPartition: 2},
		{Topic: "ledger", Group: "g", Ordered: true, MaxInFlightPerPartition: storage.MaxInFlightPerPartitionLimit + 1},
		{Topic: "ledger", Group: "g", Ordered: true, Strategy: "random"},
	} {
		if _, err := e.b.CreateGroup(ctx, p); !errors.Is(err, storage.ErrInvalidArgument) {
			t.Errorf("CreateGroup(%+v): %v, want INVALID_ARGUMENT", p, err)
		}
	}
	sub, err := e.b.CreateGroup(ctx, CreateGroupParams{Topic: "ledger", Group: "books", Ordered: true, Strategy: storage.StrategySticky,
		MaxInFlightPerPartition: 3, Start: storage.StartPosition{Kind: storage.FromBeginning}})
	if err != nil {
		t.Fatal(err)
	}
	if sub.Mode != storage.ModeOrdered || sub.Strategy != storage.StrategySticky || sub.MaxInFlightPerPartition != 3 {
		t.Fatalf("created ordered group: mode %q strategy %q max_in_flight_per_partition %d", sub.Mode, sub.Strategy, sub.MaxInFlightPerPartition)
	}
	if _, err := e.b.Subscribe(ctx, SubscribeParams{Pattern: "ledger", Group: "books", MaxInFlight: 10}); !errors.Is(err, storage.ErrSubscriptionExists) {
		t.Errorf("a shared member joined the ordered group: %v", err)
	}
	e.publishN("ledger", "m", 5)
	m := e.subscribe(SubscribeParams{Pattern: "ledger", Group: "books", Mode: storage.ModeOrdered, MaxInFlight: 10})
	ds := recv(t, m, 3) // with the default of 1 per partition, only one would come
	for i, d := range ds {
		if d.Offset != int64(i) {
			t.Fatalf("delivery %d has offset %d: out of order", i, d.Offset)
		}
	}
	ack(t, m, ds...)
	ack(t, m, recv(t, m, 2)...)
}
