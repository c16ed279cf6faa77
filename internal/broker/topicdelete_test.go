package broker

import (
	"errors"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// TestTopicDeleteEndsTopicNameBinding: a durable group subscribed to a topic name before the
// topic existed (which registers a binding on the name); the topic is created (the binding
// subscribes the group), the member leaves, the topic is deleted and created again: the group
// gets no subscription on the new topic, which nobody asked for and which would hold its
// messages without members until DEAD. A group on a wildcard still gets one (a pattern binds
// topics created later by design).
func TestTopicDeleteEndsTopicNameBinding(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	pubSub := storage.TopicConfig{Semantics: storage.PubSub}
	named := e.subscribe(SubscribeParams{Pattern: "orders", Group: "named"})
	wild := e.subscribe(SubscribeParams{Pattern: "*", Group: "wild"})
	e.createTopic("orders", pubSub)
	for _, m := range []*Member{named, wild} {
		if err := m.Close(e.ctx()); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.b.DeleteTopic(e.ctx(), "orders", true); err != nil {
		t.Fatal(err)
	}
	e.createTopic("orders", pubSub)
	if _, err := e.engine.SubscriptionGetByGroup(e.ctx(), "orders", "named"); !errors.Is(err, storage.ErrSubscriptionNotFound) {
		t.Fatalf("group named on the topic created again: %v, want no subscription", err)
	}
	if _, err := e.engine.SubscriptionGetByGroup(e.ctx(), "orders", "wild"); err != nil {
		t.Fatalf("group wild on the topic created again: %v, want its subscription", err)
	}
	bs, err := e.b.Bindings(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 1 || bs[0].Group != "wild" {
		t.Fatalf("bindings %+v, want wild's only", bs)
	}
}
