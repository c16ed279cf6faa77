package admin

import (
	"fmt"
	"strings"
	"testing"
	"time"

	api "github.com/spoolmq/spool/client/admin"
	"github.com/spoolmq/spool/internal/metrics"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
	"github.com/spoolmq/spool/internal/storage/wal"
)

// The group admin routes: force-complete completes the old messages and answers the count,
// resurrect makes a DEAD group ACTIVE (with its backfill), DELETE removes the group; the group
// carries its health and oldest unacked message; bad input is refused and changes nothing.
func TestGroupAdminAPI(t *testing.T) {
	t.Parallel()
	// The engine's clock is two days behind the broker's: what it publishes is 48 h old.
	published := time.Now().Add(-48 * time.Hour).Truncate(time.Second)
	e := newEnvWith(t, wal.Config{Clock: storagetest.NewFakeClock(published)}, metrics.CollectorOptions{}, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "ev", "semantics": "PUB_SUB"}).ok(201, nil)
	e.do("POST", "/api/v1/topics/ev/groups", map[string]any{"group": "billing", "start": map[string]any{"kind": "FROM_BEGINNING"}}).ok(201, nil)
	e.do("POST", "/api/v1/topics/ev/messages", map[string]any{"messages": []any{map[string]any{"payload": "a"}, map[string]any{"payload": "b"}}}).ok(201, nil)

	var g Group
	e.do("GET", "/api/v1/topics/ev/groups/billing", nil).ok(200, &g)
	if g.Health != "WARN" || g.OldestUnackedAt == nil || !g.OldestUnackedAt.Equal(published) || time.Duration(*g.OldestUnackedAge) < 47*time.Hour ||
		!strings.Contains(strings.Join(g.Reasons, ";"), "no consumer attached") || !strings.Contains(strings.Join(g.Reasons, ";"), "oldest unacked message") {
		t.Fatalf("group health: %s %q, oldest %v", g.Health, g.Reasons, g.OldestUnackedAt)
	}
	var l GroupList
	e.do("GET", "/api/v1/topics/ev/groups", nil).ok(200, &l)
	if len(l.Groups) != 1 || l.Groups[0].OldestUnackedAt == nil || l.Groups[0].Health != "WARN" {
		t.Fatalf("topic group listing: %+v", l.Groups)
	}

	for _, c := range []struct {
		body   any
		status int
	}{
		{map[string]any{}, 400},
		{map[string]any{"older_than": "0s"}, 400},
		{map[string]any{"older_than": "1h", "limit": 2_000_000}, 400},
		{map[string]any{"older_than": "1h", "nope": 1}, 400},
	} {
		if got := e.do("POST", "/api/v1/topics/ev/groups/billing/force-complete", c.body); got.status != c.status {
			t.Errorf("force-complete %v: status %d, want %d; body %s", c.body, got.status, c.status, got.body)
		}
	}
	e.do("POST", "/api/v1/topics/ev/groups/nope/force-complete", map[string]any{"older_than": "1h"}).fails(404, "SUBSCRIPTION_NOT_FOUND")
	var fc ForceCompleteResult
	e.do("POST", "/api/v1/topics/ev/groups/billing/force-complete", map[string]any{"older_than": "24h"}).ok(200, &fc)
	if fc.Completed != 2 || fc.Truncated || fc.Group != "billing" {
		t.Fatalf("force-complete: %+v", fc)
	}
	g = Group{}
	e.do("GET", "/api/v1/topics/ev/groups/billing", nil).ok(200, &g)
	if g.Pending != 0 || g.OldestUnackedAt != nil {
		t.Fatalf("after force-complete: pending %d, oldest %v", g.Pending, g.OldestUnackedAt)
	}

	e.do("POST", "/api/v1/topics/ev/groups/billing/resurrect", nil).fails(409, "INVALID_TRANSITION")
	if _, err := e.eng.SubscriptionUpdate(t.Context(), &storage.SubscriptionUpdateParams{ID: g.SubscriptionID, State: storage.Dead}); err != nil {
		t.Fatal(err)
	}
	e.do("POST", "/api/v1/topics/ev/groups/billing/resurrect", map[string]any{"backfill": true}).ok(200, &g)
	if g.State != api.Active || g.Backfill == nil {
		t.Fatalf("resurrected group: %s, backfill %+v", g.State, g.Backfill)
	}
	var bf BackfillInfo
	e.do("GET", "/api/v1/topics/ev/groups/billing/backfill", nil).ok(200, &bf)
	if bf.State != g.Backfill.State || bf.Total != g.Backfill.Total {
		t.Errorf("GET backfill %+v, group's %+v", bf, *g.Backfill)
	}
	e.do("POST", "/api/v1/topics/ev/groups/billing/backfill/resume", nil).fails(409, "INVALID_TRANSITION")
	e.do("POST", "/api/v1/topics/ev/groups/billing/backfill/cancel", map[string]any{"bogus": 1}).fails(400, "INVALID_ARGUMENT")

	e.do("DELETE", "/api/v1/topics/ev/groups/billing", nil).ok(204, nil)
	e.do("GET", "/api/v1/topics/ev/groups/billing", nil).fails(404, "SUBSCRIPTION_NOT_FOUND")
	e.do("DELETE", "/api/v1/topics/ev/groups/billing", nil).fails(404, "SUBSCRIPTION_NOT_FOUND")
}

// Seed 000's group counters: processed counts the messages acks completed (an ack repeated is not
// counted again), failed the deliveries nacked (for redelivery or to the DLQ); they show in the
// group, in the topic's listing and in GET /api/v1/groups, and another group's stay at zero.
func TestGroupCounters(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "ev", "semantics": "PUB_SUB"}).ok(201, nil)
	for _, g := range []string{"billing", "audit"} {
		e.do("POST", "/api/v1/topics/ev/groups", map[string]any{"group": g, "start": map[string]any{"kind": "FROM_BEGINNING"}}).ok(201, nil)
	}
	for i := range 5 {
		e.do("POST", "/api/v1/topics/ev/messages", map[string]any{"payload": fmt.Sprintf("m%d", i)}).ok(201, nil)
	}
	msgs := e.pullN("ev", "billing", 5, nil)
	e.do("POST", "/api/v1/topics/ev/groups/billing/ack", map[string]any{"ids": []string{msgs[0].ID, msgs[1].ID}}).ok(200, nil)
	e.do("POST", "/api/v1/topics/ev/groups/billing/ack", map[string]any{"ids": []string{msgs[0].ID}}).ok(200, nil) // already done
	e.do("POST", "/api/v1/topics/ev/groups/billing/nack", map[string]any{"ids": []string{msgs[2].ID}}).ok(200, nil)
	e.do("POST", "/api/v1/topics/ev/groups/billing/nack", map[string]any{"ids": []string{msgs[3].ID}, "to_dlq": true}).ok(200, nil)

	check := func(where string, g Group) {
		t.Helper()
		want := map[string][2]int64{"billing": {2, 2}, "audit": {0, 0}}[g.Group]
		if g.Processed != want[0] || g.Failed != want[1] || g.Filtered != 0 {
			t.Errorf("%s: group %s processed %d, failed %d, filtered %d; want %d, %d, 0",
				where, g.Group, g.Processed, g.Failed, g.Filtered, want[0], want[1])
		}
	}
	var g Group
	e.do("GET", "/api/v1/topics/ev/groups/billing", nil).ok(200, &g)
	check("GET group", g)
	for _, path := range []string{"/api/v1/topics/ev/groups", "/api/v1/groups"} {
		var l GroupList
		e.do("GET", path, nil).ok(200, &l)
		if len(l.Groups) != 2 {
			t.Fatalf("%s: %d groups, want 2", path, len(l.Groups))
		}
		for _, g := range l.Groups {
			check(path, g)
		}
	}
	raw := e.do("GET", "/api/v1/topics/ev/groups/billing", nil)
	if !strings.Contains(string(raw.body), `"processed":2`) || !strings.Contains(string(raw.body), `"failed":2`) {
		t.Errorf("group JSON lacks processed/failed: %s", raw.body)
	}
}

// POST /api/v1/topics/{topic}/force-complete completes the old messages of every group of the
// topic and answers per group; an ORDERED group is skipped with the reason (and refused by the
// group route, saying why); bad input and unknown topics are refused.
func TestForceCompleteTopicAPI(t *testing.T) {
	t.Parallel()
	// The engine's clock is two days behind the broker's: what it publishes is 48 h old.
	published := time.Now().Add(-48 * time.Hour).Truncate(time.Second)
	e := newEnvWith(t, wal.Config{Clock: storagetest.NewFakeClock(published)}, metrics.CollectorOptions{}, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "ev", "semantics": "PUB_SUB"}).ok(201, nil)
	for _, g := range []string{"billing", "audit"} {
		e.do("POST", "/api/v1/topics/ev/groups", map[string]any{"group": g, "start": map[string]any{"kind": "FROM_BEGINNING"}}).ok(201, nil)
	}
	if _, err := e.eng.SubscriptionCreate(t.Context(), &storage.SubscriptionCreateParams{Topic: "ev", Group: "ord",
		Start: storage.StartPosition{Kind: storage.FromBeginning}, Mode: storage.ModeOrdered}); err != nil {
		t.Fatal(err)
	}
	e.do("POST", "/api/v1/topics/ev/messages", map[string]any{"messages": []any{map[string]any{"payload": "a"}, map[string]any{"payload": "b"}}}).ok(201, nil)

	e.do("POST", "/api/v1/topics/ev/force-complete", map[string]any{}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics/ev/force-complete", map[string]any{"older_than": "1h", "limit": -1}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics/nope/force-complete", map[string]any{"older_than": "1h"}).fails(404, "TOPIC_NOT_FOUND")
	if got := e.do("POST", "/api/v1/topics/ev/groups/ord/force-complete", map[string]any{"older_than": "1h"}); got.status != 400 ||
		!strings.Contains(string(got.body), "fenced by partition ownership") {
		t.Errorf("force-complete of an ORDERED group: %d %s, want 400 saying why", got.status, got.body)
	}

	var res ForceCompleteTopicResult
	e.do("POST", "/api/v1/topics/ev/force-complete", map[string]any{"older_than": "24h"}).ok(200, &res)
	got := map[string]api.GroupForceComplete{}
	for _, g := range res.Groups {
		got[g.Group] = g
	}
	if res.Topic != "ev" || res.Completed != 4 || res.Truncated || len(res.Groups) != 3 || got["billing"].Completed != 2 ||
		got["audit"].Completed != 2 || got["ord"].Completed != 0 || !strings.Contains(got["ord"].Skipped, "ORDERED") {
		t.Fatalf("topic force-complete: %+v", res)
	}
	var l GroupList
	e.do("GET", "/api/v1/topics/ev/groups", nil).ok(200, &l)
	for _, g := range l.Groups {
		if want := map[string]int64{"billing": 0, "audit": 0, "ord": 2}[g.Group]; g.Pending != want {
			t.Errorf("group %s after topic force-complete: pending %d, want %d", g.Group, g.Pending, want)
		}
	}
}
