package admin

import (
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
