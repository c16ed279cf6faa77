package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
)

// spool group create --max-backfill-messages bounds the backfill (the newest kept); spool group
// backfill status, cancel (held back), resume and cancel --skip steer it; --watch ends once the
// backfill is no longer IN_PROGRESS; bad input is refused.
func TestGroupBackfill(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	const topic = "cli.backfill"
	s.ok(t, "", "topic", "create", topic, "--semantics", "PUB_SUB")
	s.ok(t, "", "pub", "--count", "5", topic, "m{{n}}")
	s.ok(t, "", "group", "create", "--from", "beginning", "--max-backfill-messages", "3", topic, "g")
	r := s.ok(t, "", "group", "backfill", "status", topic, "g")
	if want := "group g on topic cli.backfill: backfill IN_PROGRESS 0/3, 2 skipped\n"; r.stdout != want {
		t.Fatalf("status printed %q, want %q", r.stdout, want)
	}
	r = s.ok(t, "", "group", "backfill", "cancel", topic, "g")
	if !strings.Contains(r.stdout, "backfill CANCELLED 0/3") {
		t.Fatalf("cancel printed %q", r.stdout)
	}
	s.fails(t, 1, "INVALID_TRANSITION", "group", "backfill", "cancel", topic, "g")
	r = s.ok(t, "", "group", "backfill", "resume", "--json", topic, "g")
	var info broker.BackfillInfo
	if err := json.Unmarshal([]byte(r.stdout), &info); err != nil || info.State != storage.BackfillInProgress {
		t.Fatalf("resume --json: %q, %v", r.stdout, err)
	}
	r = s.ok(t, "", "group", "backfill", "cancel", "--skip", topic, "g")
	if !strings.Contains(r.stdout, "backfill CANCELLED 3/3, 5 skipped") {
		t.Fatalf("cancel --skip printed %q", r.stdout)
	}
	r = s.ok(t, "", "group", "backfill", "status", "--watch", topic, "g")
	if !strings.Contains(r.stdout, "[##############################] 100% CANCELLED 3/3") || !strings.HasSuffix(r.stdout, "\n") {
		t.Fatalf("status --watch printed %q", r.stdout)
	}
	s.fails(t, 2, "want status, cancel or resume", "group", "backfill", "rewind", topic, "g")
	// A flag of another action is a usage error, not ignored.
	for _, c := range []struct{ args, want string }{
		{"status --skip", "--skip does not apply to backfill status (cancel only)"},
		{"resume --skip", "--skip does not apply to backfill resume (cancel only)"},
		{"cancel --watch", "--watch does not apply to backfill cancel (status only)"},
		{"resume --watch", "--watch does not apply to backfill resume (status only)"},
		{"cancel --interval 2s", "--interval does not apply to backfill cancel (status --watch only)"},
		{"status --interval 2s", "--interval does not apply to backfill status (status --watch only)"},
		{"status --watch --json", "--json does not apply to backfill status --watch (not with --watch)"},
	} {
		s.fails(t, 2, c.want, append(append([]string{"group", "backfill"}, strings.Fields(c.args)...), topic, "g")...)
	}
	s.fails(t, 1, "max_backfill_messages must be", "group", "create", "--max-backfill-messages", "-2", topic, "x")
}
