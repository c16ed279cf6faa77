package broker

import (
	"errors"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// TestGoneReason: a subscription the engine no longer has ends its members with TOPIC_NOT_FOUND
// when its topic is gone, as a rejoining Subscribe of the topic is refused, and with
// SUBSCRIPTION_NOT_FOUND when a topic of that name exists (the subscription deleted, or the topic
// created again). The owner's read of its subscription (endReason: a deletion through another
// broker instance found by a claim or a reread before the notification) judges the same way as
// the notification of the deletion (detachTopic). Before, endReason said SUBSCRIPTION_NOT_FOUND
// for a deleted topic, so a client was told one code or the other for the same deletion,
// depending on which of the two the broker ran first.
func TestGoneReason(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	pubSub := storage.TopicConfig{Semantics: storage.PubSub}
	e.createTopic("gone", pubSub)
	e.createTopic("kept", pubSub)
	e.subscribe(SubscribeParams{Pattern: "gone", Group: "g"})
	m := e.subscribe(SubscribeParams{Pattern: "kept", Group: "g"})
	owner := func(topic string) *owner {
		t.Helper()
		e.b.mu.RLock()
		defer e.b.mu.RUnlock()
		for _, o := range e.b.byTopic[topic] {
			return o
		}
		t.Fatalf("no owner of %q", topic)
		return nil
	}
	gone, kept := owner("gone"), owner("kept")
	notFound := storage.ErrSubscriptionNotFound

	// The topic deleted in the engine (as through another broker instance).
	if err := e.engine.TopicDelete(e.ctx(), &storage.TopicDeleteParams{Name: "gone", Force: true}); err != nil {
		t.Fatal(err)
	}
	for _, read := range []struct {
		sub *storage.Subscription
		err error
	}{{nil, notFound}, {&storage.Subscription{ID: gone.id, Topic: "gone", State: storage.Deleted}, nil}} {
		end := gone.endReason(read.sub, read.err)
		if !errors.Is(end, storage.ErrTopicNotFound) || errors.Is(end, notFound) {
			t.Fatalf("endReason of a deleted topic's subscription (read %+v, %v) = %v, want TOPIC_NOT_FOUND", read.sub, read.err, end)
		}
	}
	// Created again: the subscription that ended is not the topic's any more.
	e.createTopic("gone", pubSub)
	if end := gone.endReason(nil, notFound); !errors.Is(end, notFound) || errors.Is(end, storage.ErrTopicNotFound) {
		t.Fatalf("endReason after the topic was created again = %v, want SUBSCRIPTION_NOT_FOUND", end)
	}

	// A subscription deleted, its topic still there.
	if err := e.engine.SubscriptionDelete(e.ctx(), m.Info().Subscriptions[0]); err != nil {
		t.Fatal(err)
	}
	if end := kept.endReason(nil, notFound); !errors.Is(end, notFound) || errors.Is(end, storage.ErrTopicNotFound) {
		t.Fatalf("endReason of a deleted subscription = %v, want SUBSCRIPTION_NOT_FOUND", end)
	}
}
