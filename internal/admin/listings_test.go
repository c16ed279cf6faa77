package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	api "github.com/spoolmq/spool/client/admin"
	"github.com/spoolmq/spool/internal/broker"
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
	if g.State != api.Active || len(g.Members) != 1 || len(g.Members[0].Subscriptions) != n {
		t.Fatalf("group tap on wide.t03: %+v", g)
	}
}

// groupPages reads the group listing at path page by page, limit groups a page, following
// next_after_id, and fails the test past maxPages pages or on a page larger than limit. It returns
// the groups as topic/group and their subscription IDs, in the order read.
func groupPages(t *testing.T, e *env, path string, limit, maxPages int) (names []string, ids []int64) {
	t.Helper()
	url := fmt.Sprintf("%s?limit=%d", path, limit)
	for pages := 0; ; pages++ {
		if pages == maxPages {
			t.Fatalf("%s: more than %d pages of %d: %v", path, maxPages, limit, names)
		}
		var gl GroupList
		e.do("GET", url, nil).ok(200, &gl)
		if len(gl.Groups) > limit {
			t.Fatalf("%s: page of %d groups, limit %d", path, len(gl.Groups), limit)
		}
		for _, g := range gl.Groups {
			names = append(names, g.Topic+"/"+g.Group)
			ids = append(ids, g.SubscriptionID)
		}
		if gl.NextAfterID == nil {
			return names, ids
		}
		url = fmt.Sprintf("%s?limit=%d&after_id=%d", path, limit, *gl.NextAfterID)
	}
}

// TestGroupListPages: GET /api/v1/groups answers pages of limit groups in subscription ID order,
// with next_after_id until the last page, filters before paging, and refuses a bad limit or
// cursor.
func TestGroupListPages(t *testing.T) {
	e := newEnv(t, nil)
	for _, tp := range []string{"pa", "pb"} {
		e.do("POST", "/api/v1/topics", map[string]any{"name": tp, "semantics": "PUB_SUB"}).ok(201, nil)
		for i := range 3 {
			e.do("POST", "/api/v1/topics/"+tp+"/groups", map[string]any{"group": fmt.Sprintf("g%d", i)}).ok(201, nil)
		}
	}
	got, ids := groupPages(t, e, "/api/v1/groups", 2, 3)
	want := []string{"pa/g0", "pa/g1", "pa/g2", "pb/g0", "pb/g1", "pb/g2"}
	if !slices.Equal(got, want) || !slices.IsSorted(ids) {
		t.Fatalf("pages gave %v (ids %v), want %v in ID order", got, ids, want)
	}
	var gl GroupList
	e.do("GET", "/api/v1/groups?group=g1&limit=1", nil).ok(200, &gl)
	if len(gl.Groups) != 1 || gl.Groups[0].Topic != "pa" || gl.NextAfterID == nil {
		t.Fatalf("first page of group g1: %+v", gl)
	}
	var last GroupList
	e.do("GET", fmt.Sprintf("/api/v1/groups?group=g1&limit=1&after_id=%d", *gl.NextAfterID), nil).ok(200, &last)
	if len(last.Groups) != 1 || last.Groups[0].Topic != "pb" || last.NextAfterID != nil {
		t.Fatalf("last page of group g1: %+v", last)
	}
	e.do("GET", "/api/v1/groups?limit=1001", nil).fails(400, "INVALID_ARGUMENT")
	e.do("GET", "/api/v1/groups?after_id=-1", nil).fails(400, "INVALID_ARGUMENT")
}

// TestTopicGroupListPages: GET /api/v1/topics/{topic}/groups answers at most limit groups of the
// topic (1000 by default), with next_after_id until the last page, and refuses a bad limit; an
// unknown topic is TOPIC_NOT_FOUND on its first page only. The Go admin client reads every page.
func TestTopicGroupListPages(t *testing.T) {
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "tg", "semantics": "PUB_SUB"}).ok(201, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "other", "semantics": "PUB_SUB"}).ok(201, nil)
	e.do("POST", "/api/v1/topics/other/groups", map[string]any{"group": "x"}).ok(201, nil)
	for i := range 5 {
		e.do("POST", "/api/v1/topics/tg/groups", map[string]any{"group": fmt.Sprintf("g%d", i)}).ok(201, nil)
	}
	got, ids := groupPages(t, e, "/api/v1/topics/tg/groups", 2, 3)
	want := []string{"tg/g0", "tg/g1", "tg/g2", "tg/g3", "tg/g4"}
	if !slices.Equal(got, want) || !slices.IsSorted(ids) {
		t.Fatalf("pages gave %v (ids %v), want %v in ID order", got, ids, want)
	}
	var all GroupList
	e.do("GET", "/api/v1/topics/tg/groups", nil).ok(200, &all)
	if len(all.Groups) != 5 || all.NextAfterID != nil {
		t.Fatalf("default page: %d groups, next %v", len(all.Groups), all.NextAfterID)
	}
	e.do("GET", "/api/v1/topics/tg/groups?limit=1001", nil).fails(400, "INVALID_ARGUMENT")
	e.do("GET", "/api/v1/topics/missing/groups", nil).fails(404, "TOPIC_NOT_FOUND")

	// The filters of GET /api/v1/groups, group and state, apply here too (they used to be ignored).
	e.do("POST", "/api/v1/topics/tg/groups/g1/pause", nil).ok(200, nil)
	for q, want := range map[string][]string{"state=PAUSED": {"tg/g1"}, "state=DEAD": nil, "group=g3": {"tg/g3"},
		"group=g1&state=ACTIVE": nil, "state=ACTIVE&limit=2": {"tg/g0", "tg/g2"}} {
		var l GroupList
		e.do("GET", "/api/v1/topics/tg/groups?"+q, nil).ok(200, &l)
		var got []string
		for _, g := range l.Groups {
			got = append(got, g.Topic+"/"+g.Group)
		}
		if !slices.Equal(got, want) {
			t.Errorf("?%s: %v, want %v", q, got, want)
		}
	}
	e.do("GET", "/api/v1/topics/tg/groups?state=paused", nil).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics/tg/groups/g1/resume", nil).ok(200, nil)

	// Past one page of 1000, the client reads the next.
	for i := range 1000 {
		if _, err := e.b.CreateGroup(t.Context(), broker.CreateGroupParams{Topic: "tg", Group: fmt.Sprintf("h%04d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	e.do("GET", "/api/v1/topics/tg/groups", nil).ok(200, &all)
	if len(all.Groups) != 1000 || all.NextAfterID == nil {
		t.Fatalf("first page of 1005 groups: %d groups, next %v", len(all.Groups), all.NextAfterID)
	}
	c, err := api.NewClient(e.srv.URL, e.srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	gs, err := c.TopicGroups(t.Context(), "tg")
	if err != nil || len(gs) != 1005 {
		t.Fatalf("client TopicGroups: %d groups, %v; want 1005", len(gs), err)
	}
}
