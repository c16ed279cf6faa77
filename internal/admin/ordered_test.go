package admin

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
)

// GET .../groups/{group} shows an ordered group's mode, strategy, generation and assignment;
// POST .../rebalance changes the strategy and increments the generation; a shared group shows
// mode shared and refuses a rebalance.
func TestOrderedGroupAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "ev", "semantics": "PUB_SUB", "partitions": 4}).ok(201, nil)
	for _, id := range []string{"a", "b"} {
		m, err := e.b.Subscribe(context.Background(), broker.SubscribeParams{Pattern: "ev", Group: "g", MemberID: id, Mode: storage.ModeOrdered})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close(context.Background()) })
	}
	var g Group
	testutil.Eventually(t, waitTimeout, "both members assigned", func() error {
		g = Group{}
		e.do("GET", "/api/v1/topics/ev/groups/g", nil).ok(200, &g)
		if len(g.Assignment["a"]) != 2 || len(g.Assignment["b"]) != 2 {
			return fmt.Errorf("group %+v", g)
		}
		return nil
	})
	if g.Mode != "ordered" || g.Strategy != storage.StrategyRoundRobin || g.Generation < 1 || g.MaxInFlightPerPartition != 1 || len(g.Partitions) != 4 {
		t.Fatalf("ordered group: %+v", g)
	}
	before := g
	var after Group
	e.do("POST", "/api/v1/topics/ev/groups/g/rebalance", map[string]any{"strategy": "sticky"}).ok(200, &after)
	if after.Generation != before.Generation+1 {
		t.Fatalf("generation %d after a rebalance, was %d", after.Generation, before.Generation)
	}
	after = Group{}
	e.do("GET", "/api/v1/topics/ev/groups/g", nil).ok(200, &after)
	if after.Strategy != storage.StrategySticky || after.Generation != before.Generation+1 ||
		!slices.Equal(after.Assignment["a"], before.Assignment["a"]) {
		t.Fatalf("after the rebalance: %+v, before %+v", after, before)
	}
	after = Group{}
	e.do("POST", "/api/v1/topics/ev/groups/g/rebalance", nil).ok(200, &after)
	if after.Generation != before.Generation+2 {
		t.Fatalf("a rebalance without a body: generation %d, want %d", after.Generation, before.Generation+2)
	}
	if got := e.do("POST", "/api/v1/topics/ev/groups/g/rebalance", map[string]any{"strategy": "random"}); got.status != 400 {
		t.Errorf("unknown strategy: status %d", got.status)
	}
	var sg Group
	e.do("POST", "/api/v1/topics/ev/groups", map[string]any{"group": "s"}).ok(201, &sg)
	if sg.Mode != "shared" || sg.Assignment != nil || sg.Generation != 0 {
		t.Fatalf("shared group: %+v", sg)
	}
	if got := e.do("POST", "/api/v1/topics/ev/groups/s/rebalance", nil); got.status != 400 {
		t.Errorf("rebalance of a shared group: status %d", got.status)
	}
}
