package broker

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// countingEngine counts the calls of the engine's listings whose cost is the number of
// subscriptions (the embedded engine scans all of them, also for one topic's).
type countingEngine struct {
	storage.Engine
	subLists atomic.Int64
}

func (c *countingEngine) SubscriptionList(ctx context.Context, p *storage.SubscriptionListParams) ([]*storage.Subscription, error) {
	c.subLists.Add(1)
	return c.Engine.SubscriptionList(ctx, p)
}

// TestTopicsListsSubscriptionsOnce: Topics lists the engine's subscriptions once for all topics,
// not once per topic (quadratic: 1.3 s for 10,000 topics and as many subscriptions), and still
// counts each topic's subscriptions that are not DELETED.
func TestTopicsListsSubscriptionsOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ce := &countingEngine{Engine: e.b.engine}
	// Swapped before any member or call exists: nothing else reads it yet (retention is off).
	e.b.engine = ce
	const topics = 20
	for i := range topics {
		sem := storage.Queue
		if i%2 == 1 {
			sem = storage.PubSub
		}
		if _, err := e.b.CreateTopic(e.ctx(), fmt.Sprintf("list.t%02d", i), storage.TopicConfig{Semantics: sem}); err != nil {
			t.Fatal(err)
		}
	}
	// list.t01 gets two groups, one of them cancelled (still counted), list.t03 one.
	for _, s := range []struct{ topic, group string }{{"list.t01", "a"}, {"list.t01", "b"}, {"list.t03", "a"}} {
		if _, err := ce.SubscriptionCreate(e.ctx(), &storage.SubscriptionCreateParams{Topic: s.topic, Group: s.group}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.b.CancelGroup(e.ctx(), "list.t01", "b"); err != nil {
		t.Fatal(err)
	}
	e.subscribe(SubscribeParams{Pattern: "list.t03", Group: "a"}) // closed by Stop

	ce.subLists.Store(0)
	infos, err := e.b.Topics(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	if n := ce.subLists.Load(); n != 1 {
		t.Errorf("Topics over %d topics listed the subscriptions %d times, want 1", topics, n)
	}
	if len(infos) != topics {
		t.Fatalf("Topics: %d topics, want %d", len(infos), topics)
	}
	for i, info := range infos {
		want := map[int]int{1: 2, 3: 1}[i] // PUB_SUB topics: their groups
		if i%2 == 0 {
			want = 1 // QUEUE topics: the queue subscription
		}
		wantMembers := 0
		if i == 3 {
			wantMembers = 1
		}
		if info.Topic.Name != fmt.Sprintf("list.t%02d", i) || info.Subscriptions != want || info.Members != wantMembers {
			t.Errorf("topic %d: %s with %d subscriptions and %d members, want list.t%02d with %d and %d",
				i, info.Topic.Name, info.Subscriptions, info.Members, i, want, wantMembers)
		}
		// The single-topic description agrees.
		one, err := e.b.Topic(e.ctx(), info.Topic.Name)
		if err != nil {
			t.Fatal(err)
		}
		if one.Subscriptions != info.Subscriptions || one.Members != info.Members {
			t.Errorf("Topic(%s): %d subscriptions, %d members; Topics: %d, %d", info.Topic.Name,
				one.Subscriptions, one.Members, info.Subscriptions, info.Members)
		}
	}
}
