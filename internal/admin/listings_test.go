package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
)

// TestGroupListingsDoNotRepeatMemberSubscriptions: a wildcard member attached to n subscriptions
// appears in n entries of the group listings; each entry gives its subscription count, not its n
// subscription IDs (n² IDs per listing: hundreds of megabytes for a consumer on "#" with 10,000
// topics). GET /api/v1/members and the single-group GET still list them.
func TestGroupListingsDoNotRepeatMemberSubscriptions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	const n = 12
	for i := range n {
		e.do("POST", "/api/v1/topics", map[string]any{"name": fmt.Sprintf("wide.t%02d", i), "semantics": "PUB_SUB"}).ok(201, nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	m, err := e.b.Subscribe(ctx, broker.SubscribeParams{Pattern: "wide.#", Group: "tap"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(ctx)

	// ids counts the subscription IDs the members of a listing carry, and checks their counts.
	ids := func(path string, members func(body []byte) [][]Member) int {
		t.Helper()
		r := e.do("GET", path, nil).ok(200, nil)
		entries := members(r.body)
		if len(entries) != n {
			t.Fatalf("%s: %d entries, want %d", path, len(entries), n)
		}
		total := 0
		for _, ms := range entries {
			if len(ms) != 1 || ms[0].ID != m.ID() || ms[0].SubscriptionCount != n {
				t.Fatalf("%s: members %+v, want %s with %d subscriptions", path, ms, m.ID(), n)
			}
			total += len(ms[0].Subscriptions)
		}
		return total
	}
	groups := func(body []byte) [][]Member {
		var gl GroupList
		if err := json.Unmarshal(body, &gl); err != nil {
			t.Fatal(err)
		}
		var out [][]Member
		for _, g := range gl.Groups {
			out = append(out, g.Members)
		}
		return out
	}
	seed := func(body []byte) [][]Member {
		var sg SeedGroups
		if err := json.Unmarshal(body, &sg); err != nil {
			t.Fatal(err)
		}
		var out [][]Member
		for _, g := range sg.Groups {
			out = append(out, g.Consumers)
		}
		return out
	}
	for path, members := range map[string]func([]byte) [][]Member{
		"/api/v1/groups": groups, "/api/v1/groups?group=tap": groups, "/admin/groups": seed,
	} {
		if got := ids(path, members); got != 0 {
			t.Errorf("%s: members carry %d subscription IDs in all, want 0 (the listing grows with n²)", path, got)
		}
	}
	for i := range n {
		var gl GroupList
		e.do("GET", fmt.Sprintf("/api/v1/topics/wide.t%02d/groups", i), nil).ok(200, &gl)
		if len(gl.Groups) != 1 || len(gl.Groups[0].Members) != 1 || len(gl.Groups[0].Members[0].Subscriptions) != 0 ||
			gl.Groups[0].Members[0].SubscriptionCount != n {
			t.Fatalf("groups of wide.t%02d: %+v", i, gl)
		}
	}

	var ml MemberList
	e.do("GET", "/api/v1/members", nil).ok(200, &ml)
	if len(ml.Members) != 1 || len(ml.Members[0].Subscriptions) != n || ml.Members[0].SubscriptionCount != n {
		t.Fatalf("members: %+v", ml)
	}
	var g Group
	e.do("GET", "/api/v1/topics/wide.t03/groups/tap", nil).ok(200, &g)
	if g.State != storage.Active || len(g.Members) != 1 || len(g.Members[0].Subscriptions) != n {
		t.Fatalf("group tap on wide.t03: %+v", g)
	}
}
