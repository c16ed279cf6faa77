package admin

import (
	"testing"
	"time"

	api "github.com/spoolmq/spool/client/admin"
)

// POST /api/v1/topics/{topic}/groups creates a group ahead of its consumers (201, Location);
// PUT .../groups/{group}/config changes its start and timeout; bad input is refused and changes
// nothing.
func TestCreateAndUpdateGroupAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "ev", "semantics": "PUB_SUB"}).ok(201, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "jobs"}).ok(201, nil)
	var g Group
	r := e.do("POST", "/api/v1/topics/ev/groups", map[string]any{"group": "billing", "start": map[string]any{"kind": "FROM_BEGINNING"},
		"heartbeat_timeout": "90s"}).ok(201, &g)
	if loc := r.header.Get("Location"); loc != "/api/v1/topics/ev/groups/billing" {
		t.Errorf("Location %q", loc)
	}
	if g.Group != "billing" || g.State != api.Active || g.Start.Kind != api.FromBeginning || time.Duration(g.HeartbeatTimeout) != 90*time.Second || g.LastHeartbeatAt.IsZero() {
		t.Fatalf("created group: %+v", g)
	}
	for _, c := range []struct {
		path   string
		body   any
		status int
	}{
		{"/api/v1/topics/ev/groups", map[string]any{"group": "billing"}, 409},
		{"/api/v1/topics/ev/groups", map[string]any{}, 400},
		{"/api/v1/topics/ev/groups", map[string]any{"group": "x", "max_backfill_messages": -2}, 400},
		{"/api/v1/topics/ev/groups", map[string]any{"group": "x", "heartbeat_timeout": "100ms"}, 400},
		{"/api/v1/topics/jobs/groups", map[string]any{"group": "x"}, 400},
		{"/api/v1/topics/nope/groups", map[string]any{"group": "x"}, 404},
		{"/api/v1/topics/ev/groups", map[string]any{"group": "x", "mode": "fifo"}, 400},
		{"/api/v1/topics/ev/groups", map[string]any{"group": "x", "strategy": "sticky"}, 400},
		{"/api/v1/topics/ev/groups", map[string]any{"group": "x", "mode": "ordered", "max_in_flight_per_partition": 1001}, 400},
	} {
		if got := e.do("POST", c.path, c.body); got.status != c.status {
			t.Errorf("POST %s %v: status %d, want %d; body %s", c.path, c.body, got.status, c.status, got.body)
		}
	}
	e.do("GET", "/api/v1/topics/ev/groups/x", nil).ok(404, nil)

	e.do("POST", "/api/v1/topics/ev/groups", map[string]any{"group": "ledger", "mode": "ordered", "strategy": "sticky",
		"max_in_flight_per_partition": 4}).ok(201, &g)
	if g.Mode != "ordered" || g.Strategy != "sticky" || g.MaxInFlightPerPartition != 4 {
		t.Fatalf("created ordered group: mode %q strategy %q max_in_flight_per_partition %d", g.Mode, g.Strategy, g.MaxInFlightPerPartition)
	}

	e.do("PUT", "/api/v1/topics/ev/groups/billing/config", map[string]any{"start": map[string]any{"kind": "FROM_NOW"}, "heartbeat_timeout": "2m"}).ok(200, &g)
	if g.Start.Kind != api.FromNow || time.Duration(g.HeartbeatTimeout) != 2*time.Minute {
		t.Fatalf("updated group: %+v", g)
	}
	if got := e.do("PUT", "/api/v1/topics/ev/groups/billing/config", map[string]any{}); got.status != 400 {
		t.Errorf("PUT with nothing to change: status %d", got.status)
	}
}
