package broker

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Force-complete acks, for one group, the messages published before the cutoff, also those a
// member holds a lease on (its later ack answers already done, not an error); newer messages and
// other groups are untouched; the hook gets the count; a limit truncates; bad input changes nothing.
func TestForceCompleteGroup(t *testing.T) {
	forced := map[string]int{}
	e := newEnv(t, func(c *Config) {
		c.OnForceComplete = func(topic, group string, n int) { forced[topic+"/"+group] += n }
	})
	ctx := e.ctx()
	e.createTopic("orders", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2})
	for _, g := range []string{"g", "other"} {
		if _, err := e.b.CreateGroup(ctx, CreateGroupParams{Topic: "orders", Group: g, Start: storage.StartPosition{Kind: storage.FromBeginning}}); err != nil {
			t.Fatal(err)
		}
	}
	e.publishN("orders", "old", 4)
	e.clock.Advance(2 * time.Hour)
	e.publishN("orders", "new", 2)
	m := e.subscribe(SubscribeParams{Pattern: "orders", Group: "g"})
	ds := recv(t, m, 6) // every message leased

	for _, bad := range []ForceCompleteParams{
		{Topic: "orders", Group: "g", OlderThan: 0},
		{Topic: "orders", Group: "g", OlderThan: time.Hour, Limit: MaxForceComplete + 1},
	} {
		if _, err := e.b.ForceCompleteGroup(ctx, bad); !errors.Is(err, storage.ErrInvalidArgument) {
			t.Errorf("ForceCompleteGroup(%+v): %v, want ErrInvalidArgument", bad, err)
		}
	}
	res, err := e.b.ForceCompleteGroup(ctx, ForceCompleteParams{Topic: "orders", Group: "g", OlderThan: time.Hour, Limit: 3})
	if err != nil || res.Completed != 3 || !res.Truncated {
		t.Fatalf("limited force-complete: %+v, %v; want 3 completed, truncated", res, err)
	}
	res, err = e.b.ForceCompleteGroup(ctx, ForceCompleteParams{Topic: "orders", Group: "g", OlderThan: time.Hour})
	if err != nil || res.Completed != 1 || res.Truncated {
		t.Fatalf("force-complete: %+v, %v; want the 4th old message completed", res, err)
	}
	if st := e.groupStats("orders", "g"); st.Pending != 2 {
		t.Errorf("group g after force-complete: pending %d, want the 2 new messages", st.Pending)
	}
	if st := e.groupStats("orders", "other"); st.Pending != 6 {
		t.Errorf("group other: pending %d, want 6 (untouched)", st.Pending)
	}
	ack(t, m, ds...) // the fenced leases answer already done
	if st := e.groupStats("orders", "g"); st.Pending != 0 {
		t.Errorf("group g after the member's acks: pending %d, want 0", st.Pending)
	}
	// A PAUSED group is force-completed too (it holds retention until then).
	if _, err := e.b.PauseGroup(ctx, "orders", "other"); err != nil {
		t.Fatal(err)
	}
	if res, err := e.b.ForceCompleteGroup(ctx, ForceCompleteParams{Topic: "orders", Group: "other", OlderThan: time.Hour}); err != nil || res.Completed != 4 {
		t.Fatalf("force-complete of a PAUSED group: %+v, %v", res, err)
	}
	if forced["orders/g"] != 4 || forced["orders/other"] != 4 || len(forced) != 2 {
		t.Errorf("OnForceComplete counted %v, want orders/g and orders/other: 4", forced)
	}
}

// Force-complete of a topic completes the old messages of every group holding them (PAUSED and
// DEAD ones too, not a CANCELLED one) with one cutoff, answers per group, skips an ORDERED group
// saying why (ForceCompleteGroup refuses it the same way), and its limit spans the groups.
func TestForceCompleteTopic(t *testing.T) {
	forced := map[string]int{}
	e := newEnv(t, func(c *Config) {
		c.OnForceComplete = func(topic, group string, n int) { forced[topic+"/"+group] += n }
	})
	ctx := e.ctx()
	e.createTopic("orders", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2})
	from := storage.StartPosition{Kind: storage.FromBeginning}
	for _, g := range []string{"a", "paused", "gone"} {
		if _, err := e.b.CreateGroup(ctx, CreateGroupParams{Topic: "orders", Group: g, Start: from}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.engine.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "orders", Group: "ord", Start: from, Mode: storage.ModeOrdered}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.PauseGroup(ctx, "orders", "paused"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.CancelGroup(ctx, "orders", "gone"); err != nil {
		t.Fatal(err)
	}
	e.publishN("orders", "old", 4)
	e.clock.Advance(2 * time.Hour)
	e.publishN("orders", "new", 2)

	if _, err := e.b.ForceCompleteTopic(ctx, ForceCompleteTopicParams{Topic: "orders", OlderThan: time.Millisecond}); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Errorf("older_than 1ms: %v, want ErrInvalidArgument", err)
	}
	if _, err := e.b.ForceCompleteTopic(ctx, ForceCompleteTopicParams{Topic: "nope", OlderThan: time.Hour}); !errors.Is(err, storage.ErrTopicNotFound) {
		t.Errorf("unknown topic: %v, want ErrTopicNotFound", err)
	}
	_, err := e.b.ForceCompleteGroup(ctx, ForceCompleteParams{Topic: "orders", Group: "ord", OlderThan: time.Hour})
	if !errors.Is(err, storage.ErrInvalidArgument) || !strings.Contains(err.Error(), "fenced by partition ownership") {
		t.Errorf("force-complete of an ORDERED group: %v, want ErrInvalidArgument saying why", err)
	}

	// A limit of 6 completes a's 4 and 2 of paused's, and stops there.
	res, err := e.b.ForceCompleteTopic(ctx, ForceCompleteTopicParams{Topic: "orders", OlderThan: time.Hour, Limit: 6})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]GroupForceComplete{}
	for _, g := range res.Groups {
		got[g.Group] = g
	}
	if res.Completed != 6 || !res.Truncated || len(res.Groups) != 3 || got["a"].Completed != 4 || got["a"].Truncated ||
		got["paused"].Completed != 2 || !got["paused"].Truncated || !strings.Contains(got["ord"].Skipped, "ORDERED") {
		t.Fatalf("limited topic force-complete: %+v", res)
	}
	if _, ok := got["gone"]; ok {
		t.Errorf("the CANCELLED group was listed: %+v", got["gone"])
	}
	res, err = e.b.ForceCompleteTopic(ctx, ForceCompleteTopicParams{Topic: "orders", OlderThan: time.Hour})
	if err != nil || res.Completed != 2 || res.Truncated {
		t.Fatalf("topic force-complete: %+v, %v; want paused's 2 left", res, err)
	}
	for g, want := range map[string]int64{"a": 2, "paused": 2, "ord": 6} {
		if st := e.groupStats("orders", g); st.Pending != want {
			t.Errorf("group %s after force-complete: pending %d, want %d", g, st.Pending, want)
		}
	}
	if forced["orders/a"] != 4 || forced["orders/paused"] != 4 || len(forced) != 2 {
		t.Errorf("OnForceComplete counted %v, want orders/a and orders/paused: 4", forced)
	}
}

// Resurrect makes a DEAD group ACTIVE and refuses other states, changing nothing. With backfill
// the group gets what it missed while DEAD, bounded to its newest max_backfill_messages; without,
// it gives that up; both are counted.
func TestResurrectGroup(t *testing.T) {
	e := newEnv(t, nil)
	ctx := e.ctx()
	e.createTopic("orders", storage.TopicConfig{Semantics: storage.PubSub})
	sub, err := e.b.CreateGroup(ctx, CreateGroupParams{Topic: "orders", Group: "g", MaxBackfillMessages: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.ResurrectGroup(ctx, "orders", "g", false); !errors.Is(err, storage.ErrInvalidTransition) {
		t.Errorf("resurrect of an ACTIVE group: %v, want ErrInvalidTransition", err)
	}
	if _, err := e.b.PauseGroup(ctx, "orders", "g"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.ResurrectGroup(ctx, "orders", "g", false); !errors.Is(err, storage.ErrInvalidTransition) {
		t.Errorf("resurrect of a PAUSED group: %v, want ErrInvalidTransition", err)
	}
	if g, _ := e.b.Group(ctx, "orders", "g"); g.State != storage.Paused {
		t.Fatalf("refused resurrect changed the state to %s", g.State)
	}
	if _, err := e.b.ResumeGroup(ctx, "orders", "g"); err != nil {
		t.Fatal(err)
	}
	dead := func() {
		t.Helper()
		if _, err := e.engine.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: sub.ID, State: storage.Dead}); err != nil {
			t.Fatal(err)
		}
	}
	dead()
	e.publishN("orders", "a", 5)
	s, err := e.b.ResurrectGroup(ctx, "orders", "g", true)
	if err != nil || s.State != storage.Active {
		t.Fatalf("resurrect with backfill: %+v, %v", s, err)
	}
	g, err := e.b.Group(ctx, "orders", "g")
	if err != nil {
		t.Fatal(err)
	}
	if bf := g.Backfill; bf.State != storage.BackfillInProgress || bf.Total != 3 || bf.Skipped != 2 || bf.Processed != 0 {
		t.Errorf("backfill after resurrect: %+v, want IN_PROGRESS 0/3 skipped 2", bf)
	}
	if st := e.groupStats("orders", "g"); st.Pending != 3 {
		t.Errorf("pending after a bounded resurrect: %d, want 3", st.Pending)
	}
	dead()
	e.publishN("orders", "b", 4)
	if _, err := e.b.ResurrectGroup(ctx, "orders", "g", false); err != nil {
		t.Fatal(err)
	}
	if st := e.groupStats("orders", "g"); st.Pending != 0 {
		t.Errorf("pending after a resurrect without backfill: %d, want 0", st.Pending)
	}
	if c := e.b.BackfillCounters(); c.MissedBound != 2+4 || c.MissedSkipped != 3 {
		t.Errorf("missed counters %+v, want bound 6 (2, then 4 cut of 7), skipped 3", c)
	}
	// Resuming a DEAD group resurrects it as a consumer attaching does: with the bounded backfill.
	dead()
	e.publishN("orders", "c", 2)
	if s, err := e.b.ResumeGroup(ctx, "orders", "g"); err != nil || s.State != storage.Active ||
		s.Backfill == nil || s.Backfill.State != storage.BackfillInProgress || s.Backfill.Total != 2 {
		t.Fatalf("resume of a DEAD group: %+v, %v; want ACTIVE with a backfill of 2", s, err)
	}
	if st := e.groupStats("orders", "g"); st.Pending != 2 {
		t.Errorf("pending after resuming a DEAD group: %d, want 2", st.Pending)
	}
}

// Remove cancels a group (detaching its members) and deletes it at once; the queue subscription is
// refused.
func TestRemoveGroup(t *testing.T) {
	e := newEnv(t, nil)
	ctx := e.ctx()
	e.createTopic("orders", storage.TopicConfig{Semantics: storage.PubSub})
	e.createTopic("jobs", storage.TopicConfig{})
	m := e.subscribe(SubscribeParams{Pattern: "orders", Group: "g"})
	sub, err := e.b.RemoveGroup(ctx, "orders", "g")
	if err != nil || sub.State != storage.Deleted {
		t.Fatalf("RemoveGroup: %+v, %v", sub, err)
	}
	if _, err := e.engine.SubscriptionGet(ctx, sub.ID); !errors.Is(err, storage.ErrSubscriptionNotFound) {
		t.Errorf("removed subscription still in the engine: %v", err)
	}
	if ended := m.TakeEnded(); len(ended) != 1 {
		t.Errorf("member told of %d ended subscriptions, want 1", len(ended))
	}
	if _, err := e.b.RemoveGroup(ctx, "orders", "g"); !errors.Is(err, storage.ErrSubscriptionNotFound) {
		t.Errorf("second remove: %v, want ErrSubscriptionNotFound", err)
	}
	if _, err := e.b.RemoveGroup(ctx, "jobs", ""); !errors.Is(err, storage.ErrInvalidTransition) {
		t.Errorf("remove of the queue subscription: %v, want ErrInvalidTransition", err)
	}
}

// The health verdict: OK with a member and nothing old; WARN without a member, with a DLQ entry,
// or an unacked message older than StaleUnackedAge (oldest_unacked_at is its publish time); FAIL
// when DEAD or PAUSED.
func TestGroupHealth(t *testing.T) {
	e := newEnv(t, nil)
	ctx := e.ctx()
	e.createTopic("orders", storage.TopicConfig{Semantics: storage.PubSub})
	health := func(want string, reason string) *GroupInfo {
		t.Helper()
		g, err := e.b.Group(ctx, "orders", "g")
		if err != nil {
			t.Fatal(err)
		}
		if g.Health != want || (reason == "") != (len(g.Reasons) == 0) || !strings.Contains(strings.Join(g.Reasons, "; "), reason) {
			t.Fatalf("health %s %q, want %s with %q", g.Health, g.Reasons, want, reason)
		}
		return g
	}
	m := e.subscribe(SubscribeParams{Pattern: "orders", Group: "g"})
	health(HealthOK, "")
	pos := e.publishN("orders", "a", 2)
	ds := recv(t, m, 2)
	if g := health(HealthOK, ""); !g.OldestUnackedAt.Equal(e.clock.Now()) {
		t.Errorf("oldest_unacked_at %s, want the publish time %s (%v)", g.OldestUnackedAt, e.clock.Now(), pos)
	}
	if err := m.Nack(ctx, ds[0].SubscriptionID, []storage.DeliveryRef{ds[0].Ref()}, NackOptions{ToDLQ: true}); err != nil {
		t.Fatal(err)
	}
	health(HealthWarn, "1 messages dead-lettered")
	if _, err := e.b.PurgeDLQ(ctx, "orders", "g", nil); err != nil {
		t.Fatal(err)
	}
	health(HealthOK, "")
	e.clock.Advance(StaleUnackedAge + time.Second)
	health(HealthWarn, "oldest unacked message is 1h0m1s old")
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	health(HealthWarn, "no consumer attached")
	if _, err := e.b.PauseGroup(ctx, "orders", "g"); err != nil {
		t.Fatal(err)
	}
	health(HealthFail, "PAUSED")
	g, _ := e.b.ResumeGroup(ctx, "orders", "g")
	if _, err := e.engine.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: g.ID, State: storage.Dead}); err != nil {
		t.Fatal(err)
	}
	health(HealthFail, "DEAD: no live consumer")
}
