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
