package broker

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
)

// overtakingEngine lands another update between UpdateTopic's read and its write: after each of
// the next n reads of a topic (TopicGet) it runs overtake.
type overtakingEngine struct {
	storage.Engine
	mu       sync.Mutex
	n        int
	overtake func()
}

func (o *overtakingEngine) arm(n int, overtake func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n, o.overtake = n, overtake
}

func (o *overtakingEngine) TopicGet(ctx context.Context, name string) (*storage.Topic, error) {
	t, err := o.Engine.TopicGet(ctx, name)
	o.mu.Lock()
	var f func()
	if o.n > 0 {
		o.n--
		f = o.overtake
	}
	o.mu.Unlock()
	if f != nil {
		f()
	}
	return t, err
}

// overtaken swaps the engine of e's broker for an overtakingEngine over it. Swapped before any
// member or call exists: nothing else reads it yet (retention is off).
func overtaken(e *env) *overtakingEngine {
	oe := &overtakingEngine{Engine: e.b.engine}
	e.b.engine = oe
	return oe
}

// TestUpdateTopicJudgesFromTheConfigurationItReplaced: UpdateTopic moves the members when its
// own write changes the semantics, judged from the configuration the write replaced, not from its
// earlier read. Here the topic is read as PUB_SUB, another update makes it QUEUE (the group g's
// subscription becomes the queue's), and this update makes it PUB_SUB again with the queue
// becoming group h: g's member must move off h's subscription to one of its own group. Judged
// from the read (PUB_SUB to PUB_SUB) it stayed there and got group h's messages.
func TestUpdateTopicJudgesFromTheConfigurationItReplaced(t *testing.T) {
	t.Parallel()
	t.Run("wal", func(t *testing.T) {
		t.Parallel()
		testUpdateTopicJudgesFromReplaced(t, newEnv(t, nil))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		url := testutil.DatabaseURL(t)
		in := startPGInstance(t, url, testutil.PGSchema(t, url, "t_bupdate_"), newFakeClock())
		testUpdateTopicJudgesFromReplaced(t, &env{t: t, b: in.b})
	})
}

func testUpdateTopicJudgesFromReplaced(t *testing.T, e *env) {
	oe := overtaken(e)
	e.createTopic("upd", pubSubCfg)
	m := e.subscribe(SubscribeParams{Pattern: "upd", Group: "g"})
	e.publishN("upd", "before", 2)
	oe.arm(1, func() {
		if _, err := e.b.UpdateTopic(e.ctx(), UpdateTopicParams{Name: "upd", Config: queueCfg}); err != nil {
			t.Errorf("the overtaking update: %v", err)
		}
	})
	tp, err := e.b.UpdateTopic(e.ctx(), UpdateTopicParams{Name: "upd", Config: pubSubCfg, QueueToGroup: "h"})
	if err != nil || tp.Config.Semantics != storage.PubSub {
		t.Fatalf("UpdateTopic: %+v, %v", tp, err)
	}
	subs := m.Info().Subscriptions
	if len(subs) != 1 {
		t.Fatalf("g's member is attached to %v, want one subscription", subs)
	}
	sub, err := oe.SubscriptionGet(e.ctx(), subs[0])
	if err != nil {
		t.Fatal(err)
	}
	if sub.Group != "g" {
		t.Fatalf("g's member is attached to subscription %d of group %q, want group g's", sub.ID, sub.Group)
	}
	// What g had pending went with the subscription that became h's (nothing pending is lost).
	if st := e.groupStats("upd", "h"); st.Pending != 2 {
		t.Fatalf("group h has %d pending, want the 2 messages published before", st.Pending)
	}
}

// TestUpdateTopicWithoutExpectRetries: without Expect, an update overtaken by others is applied
// to a fresh read, up to updateTopicAttempts times; then it fails with storage.ErrTopicChanged
// and changes nothing. With Expect it is not retried.
func TestUpdateTopicWithoutExpectRetries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	oe := overtaken(e)
	e.createTopic("upd", queueCfg)
	wait := time.Minute
	overtake := func() { // changes ack_wait only (as another instance's compare-and-set would)
		cur, err := e.engine.TopicGet(e.ctx(), "upd")
		if err != nil {
			t.Errorf("the overtaking read: %v", err)
			return
		}
		wait += time.Second
		cfg := cur.Config
		cfg.AckWait = wait
		if _, err := e.engine.TopicUpdate(e.ctx(), &storage.TopicUpdateParams{Name: "upd", Config: cfg, Expect: &cur.Config}); err != nil {
			t.Errorf("the overtaking update: %v", err)
		}
	}
	oe.arm(updateTopicAttempts-1, overtake)
	want := storage.TopicConfig{Semantics: storage.Queue, MaxDeliveries: 7}
	if tp, err := e.b.UpdateTopic(e.ctx(), UpdateTopicParams{Name: "upd", Config: want}); err != nil || tp.Config.MaxDeliveries != 7 {
		t.Fatalf("UpdateTopic overtaken %d times: %+v, %v", updateTopicAttempts-1, tp, err)
	}

	oe.arm(updateTopicAttempts, overtake)
	want.MaxDeliveries = 8
	if _, err := e.b.UpdateTopic(e.ctx(), UpdateTopicParams{Name: "upd", Config: want}); !errors.Is(err, storage.ErrTopicChanged) {
		t.Fatalf("UpdateTopic overtaken %d times: %v, want ErrTopicChanged", updateTopicAttempts, err)
	}
	tp, err := e.engine.TopicGet(e.ctx(), "upd")
	if err != nil || tp.Config.MaxDeliveries != 7 || tp.Config.AckWait != wait {
		t.Fatalf("topic after the failed update: %+v, %v; want max_deliveries 7, ack_wait %s", tp, err, wait)
	}

	stale := storage.TopicConfig{Semantics: storage.Queue}
	if _, err := e.b.UpdateTopic(e.ctx(), UpdateTopicParams{Name: "upd", Config: want, Expect: &stale}); !errors.Is(err, storage.ErrTopicChanged) {
		t.Fatalf("UpdateTopic with a stale Expect: %v, want ErrTopicChanged", err)
	}
	cur := tp.Config
	if tp, err := e.b.UpdateTopic(e.ctx(), UpdateTopicParams{Name: "upd", Config: want, Expect: &cur}); err != nil || tp.Config.MaxDeliveries != 8 {
		t.Fatalf("UpdateTopic with the current Expect: %+v, %v", tp, err)
	}
}
