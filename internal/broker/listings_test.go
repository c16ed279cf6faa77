package broker

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// countingEngine counts the calls of the engine's listings whose cost is the number of
// subscriptions (the embedded engine scans all of them, also for one topic's).
type countingEngine struct {
	storage.Engine
	subLists atomic.Int64
	stats    atomic.Int64
}

func (c *countingEngine) SubscriptionStats(ctx context.Context, id int64) (*storage.SubscriptionStats, error) {
	c.stats.Add(1)
	return c.Engine.SubscriptionStats(ctx, id)
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

// claimCounter counts the engine's claims.
type claimCounter struct {
	storage.Engine
	claims atomic.Int64
}

func (c *claimCounter) DeliveriesClaim(ctx context.Context, p *storage.DeliveriesClaimParams) (*storage.DeliveriesClaimResult, error) {
	c.claims.Add(1)
	return c.Engine.DeliveriesClaim(ctx, p)
}

// TestIdlePollsBackOff: an idle dispatcher's polls, which find nothing, come farther and farther
// apart, up to maxIdlePolls poll intervals: with a 2 ms poll interval it claims at most every
// 32 ms once backed off, not every 2 ms. (Slow timers can only make fewer claims: the bound
// cannot fail for a busy machine.)
func TestIdlePollsBackOff(t *testing.T) {
	t.Parallel()
	const poll = 2 * time.Millisecond
	e := newEnv(t, func(c *Config) { c.PollInterval = poll })
	cc := &claimCounter{Engine: e.b.engine}
	e.b.engine = cc // before any member exists: nothing else reads it yet
	if _, err := e.b.CreateTopic(e.ctx(), "idle.t", storage.TopicConfig{Semantics: storage.PubSub}); err != nil {
		t.Fatal(err)
	}
	e.subscribe(SubscribeParams{Pattern: "idle.t", Group: "a"}) // closed by Stop
	// Backed off after 2+4+8+16 ms: wait for 6 polls, then count over 320 ms.
	deadline := time.Now().Add(10 * time.Second)
	for cc.claims.Load() < 6 {
		if time.Now().After(deadline) {
			t.Fatalf("%d claims in 10 s", cc.claims.Load())
		}
		time.Sleep(time.Millisecond)
	}
	c0, t0 := cc.claims.Load(), time.Now()
	time.Sleep(320 * time.Millisecond)
	n, took := cc.claims.Load()-c0, time.Since(t0)
	// Every 32 ms at most: took/32ms + 1; polling every 2 ms would make about 160.
	if limit := int64(took/(maxIdlePolls*poll)) + 2; n > limit {
		t.Errorf("an idle dispatcher claimed %d times in %s, want at most %d (one per %s)", n, took, limit, maxIdlePolls*poll)
	}
}

func TestIdlePoll(t *testing.T) {
	t.Parallel()
	want := []time.Duration{1, 2, 4, 8, 16, 16, 16}
	for quiet, w := range want {
		if got := idlePoll(time.Second, quiet); got != w*time.Second {
			t.Errorf("idlePoll(1s, %d) = %s, want %s", quiet, got, w*time.Second)
		}
	}
	if got := idlePoll(time.Second, 1000); got != maxIdlePolls*time.Second {
		t.Errorf("idlePoll(1s, 1000) = %s", got)
	}
}

// TestTopicGroupsReadsItsOwnStats: the groups of one topic cost the stats of that topic's
// subscriptions only, not of every subscription of the broker (the dashboard's topic page polls
// them), and agree with Groups filtered by topic.
func TestTopicGroupsReadsItsOwnStats(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ce := &countingEngine{Engine: e.b.engine}
	e.b.engine = ce // swapped before any member or call exists, as above
	for _, topic := range []string{"tg.a", "tg.b"} {
		if _, err := e.b.CreateTopic(e.ctx(), topic, storage.TopicConfig{Semantics: storage.PubSub}); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []struct{ topic, group string }{{"tg.a", "x"}, {"tg.b", "x"}, {"tg.b", "y"}, {"tg.b", "z"}} {
		if _, err := ce.SubscriptionCreate(e.ctx(), &storage.SubscriptionCreateParams{Topic: s.topic, Group: s.group}); err != nil {
			t.Fatal(err)
		}
	}
	ce.stats.Store(0)
	got, err := e.b.TopicGroups(e.ctx(), "tg.a")
	if err != nil {
		t.Fatal(err)
	}
	if n := ce.stats.Load(); n != 1 {
		t.Errorf("TopicGroups(tg.a) read the stats of %d subscriptions, want 1 (its own)", n)
	}
	if len(got) != 1 || got[0].Topic != "tg.a" || got[0].Group != "x" || got[0].Stats == nil {
		t.Fatalf("TopicGroups(tg.a): %+v", got)
	}
	all, err := e.b.Groups(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	var b []string
	for _, g := range all {
		if g.Topic == "tg.b" {
			b = append(b, g.Group)
		}
	}
	onlyB, err := e.b.TopicGroups(e.ctx(), "tg.b")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 4 || len(onlyB) != len(b) || len(b) != 3 {
		t.Fatalf("Groups: %d, of tg.b %v; TopicGroups(tg.b): %d", len(all), b, len(onlyB))
	}
	if none, err := e.b.TopicGroups(e.ctx(), "tg.nope"); err != nil || len(none) != 0 {
		t.Fatalf("TopicGroups of an unknown topic: %v, %v", none, err)
	}
}
