package admin

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// TestPoisonRulesAPI: a topic's poison_rules are set, shown, merged by an update and turned off
// with null; a poison DLQ entry shows its rule and failures.
func TestPoisonRulesAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	var tp Topic
	e.do("POST", "/api/v1/topics", map[string]any{"name": "jobs"}).ok(201, &tp)
	if tp.Config.PoisonRules != nil {
		t.Fatalf("poison rules of a new topic: %+v", tp.Config.PoisonRules)
	}
	e.do("PUT", "/api/v1/topics/jobs/config", map[string]any{"poison_rules": map[string]any{"distinct_members": true}}).ok(200, &tp)
	e.do("PUT", "/api/v1/topics/jobs/config", map[string]any{"poison_rules": map[string]any{"max_failures": 1}}).ok(200, &tp)
	if r := tp.Config.PoisonRules; r == nil || !r.DistinctMembers || r.MaxFailures != 1 || time.Duration(r.Window) != storage.DefaultPoisonWindow {
		t.Fatalf("poison rules after two updates: %+v", r)
	}
	e.do("PUT", "/api/v1/topics/jobs/config", map[string]any{"poison_rules": map[string]any{"max_failures": 6}}).fails(400, "INVALID_ARGUMENT")

	e.do("POST", "/api/v1/topics/jobs/messages", map[string]any{"payload": "p"}).ok(201, nil)
	msgs := e.pullN("jobs", "$queue", 1, nil)
	e.do("POST", "/api/v1/topics/jobs/groups/$queue/nack", map[string]any{"ids": []string{msgs[0].ID}, "reason": "bad json"}).ok(200, nil)
	var dlq DLQList
	e.do("GET", "/api/v1/topics/jobs/groups/$queue/dlq", nil).ok(200, &dlq)
	if len(dlq.Entries) != 1 {
		t.Fatalf("DLQ: %+v", dlq)
	}
	en := dlq.Entries[0]
	if en.Reason != storage.DLQPoison || en.Rule != storage.RuleFailuresInWindow || len(en.Failures) != 1 || en.Failures[0].Reason != "bad json" || en.Failures[0].Member == "" {
		t.Fatalf("poison DLQ entry: %+v", en)
	}
	var one DLQEntry
	e.do("GET", fmt.Sprintf("/api/v1/topics/jobs/groups/$queue/dlq/%d", en.ID), nil).ok(200, &one)
	if one.Rule != en.Rule || len(one.Failures) != 1 {
		t.Fatalf("DLQ entry: %+v", one)
	}

	var off Topic
	e.do("PUT", "/api/v1/topics/jobs/config", map[string]any{"poison_rules": nil}).ok(200, &off)
	if off.Config.PoisonRules != nil {
		t.Fatalf("poison rules after null: %+v", off.Config.PoisonRules)
	}
}

// TestPoisonWindowNeedsMaxFailures: a window given without max_failures is refused, on create and
// on update, as the engine refuses it; an update that turns max_failures off drops the window it
// did not give.
func TestPoisonWindowNeedsMaxFailures(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	const want = "poison_rules.window needs poison_rules.max_failures"
	window := map[string]any{"window": "1m"}
	if d := e.do("POST", "/api/v1/topics", map[string]any{"name": "jobs", "poison_rules": window}).fails(400, "INVALID_ARGUMENT"); !strings.Contains(d.Message, want) {
		t.Fatalf("create with a window alone: %q, want %q", d.Message, want)
	}
	e.do("POST", "/api/v1/topics", map[string]any{"name": "jobs"}).ok(201, nil)
	if d := e.do("PUT", "/api/v1/topics/jobs/config", map[string]any{"poison_rules": window}).fails(400, "INVALID_ARGUMENT"); !strings.Contains(d.Message, want) {
		t.Fatalf("update with a window alone: %q, want %q", d.Message, want)
	}
	var tp Topic
	e.do("PUT", "/api/v1/topics/jobs/config", map[string]any{"poison_rules": map[string]any{"distinct_members": true, "max_failures": 3, "window": "1m"}}).ok(200, &tp)
	if d := e.do("PUT", "/api/v1/topics/jobs/config", map[string]any{"poison_rules": map[string]any{"max_failures": 0, "window": "2m"}}).fails(400, "INVALID_ARGUMENT"); !strings.Contains(d.Message, want) {
		t.Fatalf("update turning max_failures off with a window: %q, want %q", d.Message, want)
	}
	var off Topic
	e.do("PUT", "/api/v1/topics/jobs/config", map[string]any{"poison_rules": map[string]any{"max_failures": 0}}).ok(200, &off)
	if r := off.Config.PoisonRules; r == nil || !r.DistinctMembers || r.MaxFailures != 0 || r.Window != 0 {
		t.Fatalf("poison rules after max_failures 0: %+v", r)
	}
}
