package pgstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
)

// Several instances run SubscriptionsMaintain at the same moment: every ACTIVE subscription past
// its heartbeat timeout becomes DEAD, and every CANCELLED one past the retention DELETED, exactly
// once in all (no instance reports a transition another one made).
func TestLifecycleSeveralInstancesEachTransitionOnce(t *testing.T) {
	t.Parallel()
	clock := storagetest.NewFakeClock(catalogBase)
	cfg := testConfig(t, clock)
	const instances, active, cancelled = 3, 30, 20
	es := make([]*Engine, instances)
	for i := range es {
		e, err := Open(t.Context(), cfg)
		if err != nil {
			t.Fatalf("Open %d: %v", i, err)
		}
		t.Cleanup(func() { _ = e.Close() })
		es[i] = e
	}
	ctx := t.Context()
	if _, err := es[0].TopicCreate(ctx, &storage.TopicCreateParams{Name: "fan", Config: storage.TopicConfig{Semantics: storage.PubSub}}); err != nil {
		t.Fatal(err)
	}
	for round := range 4 {
		wantDead, wantDeleted := map[int64]bool{}, map[int64]bool{}
		for i := range active + cancelled {
			s, err := es[i%instances].SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{
				Topic: "fan", Group: fmt.Sprintf("r%d-g%d", round, i), HeartbeatTimeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if i < active {
				wantDead[s.ID] = true
				continue
			}
			if _, err := es[0].SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: s.ID, State: storage.Cancelled}); err != nil {
				t.Fatal(err)
			}
			wantDeleted[s.ID] = true
		}
		clock.Advance(time.Hour + time.Second)
		results := make([]*storage.SubscriptionsMaintainResult, instances)
		errs := make([]error, instances)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, e := range es {
			wg.Go(func() {
				<-start
				results[i], errs[i] = e.SubscriptionsMaintain(ctx, &storage.SubscriptionsMaintainParams{CancelledRetention: time.Hour})
			})
		}
		close(start)
		wg.Wait()
		gotDead, gotDeleted := map[int64]int{}, map[int64]int{}
		for i, res := range results {
			if errs[i] != nil {
				t.Fatalf("round %d: instance %d: %v", round, i, errs[i])
			}
			for _, s := range res.Dead {
				gotDead[s.ID]++
			}
			for _, s := range res.Deleted {
				gotDeleted[s.ID]++
			}
		}
		for what, c := range map[string]struct {
			got  map[int64]int
			want map[int64]bool
		}{"DEAD": {gotDead, wantDead}, "DELETED": {gotDeleted, wantDeleted}} {
			if len(c.got) != len(c.want) {
				t.Errorf("round %d: %d subscriptions became %s, want %d", round, len(c.got), what, len(c.want))
			}
			for id, n := range c.got {
				if n != 1 || !c.want[id] {
					t.Errorf("round %d: subscription %d reported %s %d times (expected: %v)", round, id, what, n, c.want[id])
				}
			}
		}
	}
}

// Without a Config.Clock the database's clock decides: last_heartbeat_at is compared with now().
func TestLifecycleDatabaseClock(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, nil)
	e, err := Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	ctx := t.Context()
	if _, err := e.TopicCreate(ctx, &storage.TopicCreateParams{Name: "clk", Config: storage.TopicConfig{Semantics: storage.PubSub}}); err != nil {
		t.Fatal(err)
	}
	s, err := e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "clk", Group: "g", HeartbeatTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	setBeat := func(ago string) {
		t.Helper()
		if _, err := e.pool.Exec(ctx, e.sql("UPDATE spool.subscriptions SET last_heartbeat_at = now() - $2::interval WHERE id = $1"), s.ID, ago); err != nil {
			t.Fatal(err)
		}
	}
	maintain := func() []*storage.Subscription {
		t.Helper()
		res, err := e.SubscriptionsMaintain(ctx, &storage.SubscriptionsMaintainParams{})
		if err != nil {
			t.Fatal(err)
		}
		return res.Dead
	}
	setBeat("59 minutes")
	if dead := maintain(); len(dead) != 0 {
		t.Fatalf("DEAD 59 minutes after the last heartbeat (database clock): %v", dead)
	}
	setBeat("61 minutes")
	if _, err := e.SubscriptionsHeartbeat(ctx, &storage.SubscriptionsHeartbeatParams{IDs: []int64{s.ID}}); err != nil {
		t.Fatal(err)
	}
	if dead := maintain(); len(dead) != 0 {
		t.Fatalf("DEAD right after a heartbeat: %v", dead)
	}
	setBeat("61 minutes")
	if dead := maintain(); len(dead) != 1 || dead[0].ID != s.ID {
		t.Fatalf("61 minutes after the last heartbeat (database clock): DEAD %v, want subscription %d", dead, s.ID)
	}
	var n int
	if err := e.pool.QueryRow(context.Background(), e.sql("SELECT count(*) FROM spool.subscriptions WHERE id = $1 AND state = 'DEAD'"), s.ID).Scan(&n); err != nil || n != 1 {
		t.Fatalf("subscription %d DEAD rows: %d (%v)", s.ID, n, err)
	}
}
