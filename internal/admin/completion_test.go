package admin

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

// TestMessageCompletion: GET .../messages/{id}/completion returns a refcount message's groups
// with their states (acked with its time, pending), refuses a watermark topic and a message id
// that is not retained; completion_tracking cannot change on a topic with messages.
func TestMessageCompletion(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "rc", "semantics": "PUB_SUB", "completion_tracking": "refcount"}).ok(201, nil)
	for _, g := range []string{"billing", "audit"} {
		e.do("POST", "/api/v1/topics/rc/groups", map[string]any{"group": g}).ok(201, nil)
	}
	e.do("POST", "/api/v1/topics/rc/messages", map[string]any{"payload": "m"}).ok(201, nil)
	msgs := e.pullN("rc", "billing", 1, nil)
	e.do("POST", "/api/v1/topics/rc/groups/billing/ack", map[string]any{"ids": []string{msgs[0].ID}}).ok(200, nil)

	var mc MessageCompletion
	e.do("GET", "/api/v1/topics/rc/messages/0/completion", nil).ok(200, &mc)
	if mc.ID != "0" || mc.Complete || len(mc.Groups) != 2 {
		t.Fatalf("completion: %+v", mc)
	}
	if g := mc.Groups[0]; g.Group != "billing" || g.State != "acked" || g.At.IsZero() {
		t.Errorf("billing: %+v", g)
	}
	if g := mc.Groups[1]; g.Group != "audit" || g.State != "pending" || !g.At.IsZero() {
		t.Errorf("audit: %+v", g)
	}
	// The JSON keys (the API's contract): "at" only once the group is done.
	var raw map[string]any
	e.do("GET", "/api/v1/topics/rc/messages/0/completion", nil).ok(200, &raw)
	if got, want := slices.Sorted(maps.Keys(raw)), []string{"complete", "groups", "id", "offset", "partition", "published_at", "topic"}; !slices.Equal(got, want) {
		t.Errorf("keys %v, want %v", got, want)
	}
	for i, want := range [][]string{{"at", "group", "state", "subscription_id"}, {"group", "state", "subscription_id"}} {
		if got := slices.Sorted(maps.Keys(raw["groups"].([]any)[i].(map[string]any))); !slices.Equal(got, want) {
			t.Errorf("group %d keys %v, want %v", i, got, want)
		}
	}
	e.do("GET", "/api/v1/topics/rc/messages/1/completion", nil).fails(400, "OFFSET_OUT_OF_RANGE")
	e.do("GET", "/api/v1/topics/rc/messages/x/completion", nil).fails(400, "INVALID_ARGUMENT")
	e.do("GET", "/api/v1/topics/missing/messages/0/completion", nil).fails(404, "TOPIC_NOT_FOUND")
	d := e.do("PUT", "/api/v1/topics/rc/config", map[string]any{"completion_tracking": "watermark"}).fails(400, "INVALID_ARGUMENT")
	if !strings.Contains(d.Message, "cannot change while the topic holds messages") {
		t.Errorf("mode switch: %q", d.Message)
	}

	e.do("POST", "/api/v1/topics", map[string]any{"name": "wm"}).ok(201, nil)
	e.do("POST", "/api/v1/topics/wm/messages", map[string]any{"payload": "m"}).ok(201, nil)
	d = e.do("GET", "/api/v1/topics/wm/messages/0/completion", nil).fails(400, "INVALID_ARGUMENT")
	if !strings.Contains(d.Message, "watermark") {
		t.Errorf("watermark topic: %q", d.Message)
	}
}
