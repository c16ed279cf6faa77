package broker

import (
	"context"
	"errors"
	"sync/atomic"
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

// topicReadFails is the real engine whose TopicGet fails as an unreachable storage while armed.
type topicReadFails struct {
	storage.Engine
	armed atomic.Bool
}

func (f *topicReadFails) TopicGet(ctx context.Context, name string) (*storage.Topic, error) {
	if f.armed.Load() {
		return nil, &storage.IOError{Kind: storage.ErrUnavailable, Reason: "database unreachable", Err: errors.New("injected")}
	}
	return f.Engine.TopicGet(ctx, name)
}

// TestGoneReasonTopicReadFails: when the read of the topic that tells TOPIC_NOT_FOUND from
// SUBSCRIPTION_NOT_FOUND fails otherwise (the storage unavailable), the members of the
// subscription that ended are told neither: the reason carries the read's failure (retryable:
// the client subscribes again and its rejoin is refused with the code judged then). Before,
// they were told SUBSCRIPTION_NOT_FOUND, false for a deleted topic. Both paths: the owner's
// read finding the subscription gone (endReason), and a topic deleted through this broker
// (detachTopic), whose member is told the reason.
func TestGoneReasonTopicReadFails(t *testing.T) {
	t.Parallel()
	var f *topicReadFails
	e := newEnvWrapped(t, func(eng storage.Engine) storage.Engine {
		f = &topicReadFails{Engine: eng}
		return f
	}, nil)
	b, eng := e.b, e.engine
	ctx := context.Background()
	pubSub := storage.TopicConfig{Semantics: storage.PubSub}
	for _, topic := range []string{"gone", "kept"} {
		if _, err := b.CreateTopic(ctx, topic, pubSub); err != nil {
			t.Fatal(err)
		}
	}
	m, err := b.Subscribe(ctx, SubscribeParams{Pattern: "gone", Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Subscribe(ctx, SubscribeParams{Pattern: "kept", Group: "g"}); err != nil {
		t.Fatal(err)
	}
	b.mu.RLock()
	var kept *owner
	for _, o := range b.byTopic["kept"] {
		kept = o
	}
	b.mu.RUnlock()
	neither := func(what string, end error) {
		t.Helper()
		if !errors.Is(end, storage.ErrUnavailable) || errors.Is(end, storage.ErrSubscriptionNotFound) || errors.Is(end, storage.ErrTopicNotFound) {
			t.Fatalf("%s = %v, want the topic read's failure (unavailable), neither SUBSCRIPTION_NOT_FOUND nor TOPIC_NOT_FOUND", what, end)
		}
	}

	// The owner finds its subscription gone (deleted, as through another broker instance).
	if err := eng.SubscriptionDelete(ctx, kept.id); err != nil {
		t.Fatal(err)
	}
	f.armed.Store(true)
	neither("endReason while the topic cannot be read", kept.endReason(nil, storage.ErrSubscriptionNotFound))
	f.armed.Store(false)
	if end := kept.endReason(nil, storage.ErrSubscriptionNotFound); !errors.Is(end, storage.ErrSubscriptionNotFound) {
		t.Fatalf("endReason once the topic can be read = %v, want SUBSCRIPTION_NOT_FOUND", end)
	}

	// A topic deleted through this broker while its name cannot be read.
	f.armed.Store(true)
	if err := b.DeleteTopic(ctx, "gone", true); err != nil {
		t.Fatal(err)
	}
	var ended []EndedSubscription
	eventually(t, "the end of gone's subscription", func() error {
		ended = append(ended, m.TakeEnded()...)
		if len(ended) == 0 {
			return errors.New("not ended")
		}
		return nil
	})
	neither("the reason the member of a deleted topic was told", ended[0].Err)
	if len(m.Subscriptions()) != 0 {
		t.Fatalf("member still on %+v", m.Subscriptions())
	}
}
