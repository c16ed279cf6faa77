package broker

import (
	"fmt"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// The group counters: acks count processed and nacks failed per subscription; RemoveGroup drops
// a group's counters, and the map is pruned of subscriptions deleted behind the broker's back
// once it reaches its prune size, keeping the live ones.
func TestGroupCountsPruned(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := e.ctx()
	e.createTopic("ev", storage.TopicConfig{Semantics: storage.PubSub})
	subs := map[string]*storage.Subscription{}
	for _, g := range []string{"a", "b", "c", "d"} {
		s, err := e.b.CreateGroup(ctx, CreateGroupParams{Topic: "ev", Group: g, Start: storage.StartPosition{Kind: storage.FromBeginning}})
		if err != nil {
			t.Fatal(err)
		}
		subs[g] = s
	}
	e.publishN("ev", "m", 2)
	e.b.counts.mu.Lock()
	e.b.counts.pruneAt = 100
	e.b.counts.mu.Unlock()
	settle := func(g string) {
		t.Helper()
		m := e.subscribe(SubscribeParams{Pattern: "ev", Group: g})
		ds := recv(t, m, 2)
		ack(t, m, ds[0])
		if err := m.Nack(ctx, ds[1].SubscriptionID, []storage.DeliveryRef{ds[1].Ref()}, NackOptions{ToDLQ: true}); err != nil {
			t.Fatal(err)
		}
		if err := m.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	settle("a")
	settle("b")
	settle("c")
	if c := e.b.groupCounts(subs["a"].ID); c != (GroupCounts{Processed: 1, Failed: 1}) {
		t.Fatalf("group a counts %+v, want 1 processed, 1 failed", c)
	}
	if _, err := e.b.RemoveGroup(ctx, "ev", "c"); err != nil {
		t.Fatal(err)
	}
	if c := e.b.groupCounts(subs["c"].ID); c != (GroupCounts{}) {
		t.Errorf("removed group c kept its counts %+v", c)
	}
	// b is deleted without the broker (as retention or another instance does).
	if err := e.engine.SubscriptionDelete(ctx, subs["b"].ID); err != nil {
		t.Fatal(err)
	}
	e.b.counts.mu.Lock()
	e.b.counts.pruneAt = 3 // a, b, and d's new entry
	e.b.counts.mu.Unlock()
	settle("d")
	eventually(t, "counters of the deleted group pruned", func() error {
		e.b.counts.mu.RLock()
		defer e.b.counts.mu.RUnlock()
		_, hasB := e.b.counts.bySub[subs["b"].ID]
		if hasB || len(e.b.counts.bySub) != 2 || e.b.counts.pruning {
			return fmt.Errorf("%d counters (b kept: %v, pruning %v)", len(e.b.counts.bySub), hasB, e.b.counts.pruning)
		}
		return nil
	})
	for _, g := range []string{"a", "d"} {
		if c := e.b.groupCounts(subs[g].ID); c != (GroupCounts{Processed: 1, Failed: 1}) {
			t.Errorf("group %s counts after the prune %+v, want 1 processed, 1 failed", g, c)
		}
	}
	e.b.counts.mu.RLock()
	next := e.b.counts.pruneAt
	e.b.counts.mu.RUnlock()
	if next != minCountsPrune {
		t.Errorf("next prune at %d, want %d", next, minCountsPrune)
	}
}
