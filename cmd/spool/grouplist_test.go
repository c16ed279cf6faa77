package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
	"github.com/spoolmq/spool/internal/storage/wal"
)

// TestCLIGroupListPages: the group listings answer at most 1,000 groups a page; group list and
// topic describe read every page (group list in the table and in --json).
func TestCLIGroupListPages(t *testing.T) {
	s := startCLIStack(t, func(c *wal.Config, _ *broker.Config) { c.Sync = wal.UnsafeNoSync })
	ctx := context.Background()
	if _, err := s.engine.TopicCreate(ctx, &storage.TopicCreateParams{Name: "many",
		Config: storage.TopicConfig{Semantics: storage.PubSub}}); err != nil {
		t.Fatal(err)
	}
	const n = 1001
	for i := range n {
		if _, err := s.engine.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "many", Group: fmt.Sprintf("g%04d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	rows := cliTableRows(t, s.ok(t, "", "group", "list").stdout)
	if len(rows) != n || rows[0]["GROUP"] != "g0000" || rows[n-1]["GROUP"] != fmt.Sprintf("g%04d", n-1) {
		t.Fatalf("group list printed %d rows, want %d (g0000 to g%04d)", len(rows), n, n-1)
	}
	var list admin.GroupList
	cliDecodeJSON(t, s.ok(t, "", "group", "list", "--json").stdout, &list)
	if len(list.Groups) != n || list.NextAfterID != nil {
		t.Fatalf("group list --json: %d groups (next %v), want %d", len(list.Groups), list.NextAfterID, n)
	}
	out := s.ok(t, "", "topic", "describe", "many").stdout
	rows = cliTableRows(t, out[strings.Index(out, "Groups:\n")+len("Groups:\n"):])
	if len(rows) != n || rows[n-1]["GROUP"] != fmt.Sprintf("g%04d", n-1) {
		t.Fatalf("topic describe printed %d groups, want %d", len(rows), n)
	}
}

// group list shows each group's last heartbeat, backfill state and, with a topic (and in topic
// describe), the age of its oldest unacked message; the all-topics listing, which does not read
// it, has no such column. The engine's clock is two days behind: what it records is 48 h old.
func TestCLIGroupListColumns(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t, func(c *wal.Config, _ *broker.Config) {
		c.Clock = storagetest.NewFakeClock(time.Now().Add(-48 * time.Hour))
	})
	const topic = "cols"
	s.ok(t, "", "topic", "create", topic, "--semantics", "PUB_SUB")
	s.ok(t, "", "pub", topic, "a", "b", "c", "d")
	s.ok(t, "", "group", "create", "--from", "FROM_BEGINNING", topic, "late")
	s.ok(t, "", "group", "create", topic, "fresh")
	for _, args := range [][]string{{"group", "list", topic}, {"topic", "describe", topic}} {
		out := s.ok(t, "", args...).stdout
		if args[0] == "topic" {
			out = out[strings.Index(out, "Groups:\n")+len("Groups:\n"):]
		}
		rows := cliTableRows(t, out)
		late, fresh := cliFindRow(t, rows, "GROUP", "late"), cliFindRow(t, rows, "GROUP", "fresh")
		if late["HEARTBEAT"] != "2d ago" || late["OLDEST"] != "2d" || late["BACKFILL"] != "IN_PROGRESS:0%" ||
			fresh["HEARTBEAT"] != "2d ago" || fresh["OLDEST"] != "-" || fresh["BACKFILL"] != "-" {
			t.Errorf("spool %s: rows %v, %v", strings.Join(args, " "), late, fresh)
		}
	}
	rows := cliTableRows(t, s.ok(t, "", "group", "list").stdout)
	late := cliFindRow(t, rows, "GROUP", "late")
	if _, ok := late["OLDEST"]; ok || late["HEARTBEAT"] != "2d ago" || late["BACKFILL"] != "IN_PROGRESS:0%" {
		t.Errorf("group list (all topics): row %v, want HEARTBEAT and BACKFILL, no OLDEST", late)
	}
}

// TestCLIGroupListState: --state (any case) and --group filter both listings; another state is a
// usage error.
func TestCLIGroupListState(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	const topic = "states"
	s.ok(t, "", "topic", "create", topic, "--semantics", "PUB_SUB")
	s.ok(t, "", "group", "create", topic, "a")
	s.ok(t, "", "group", "create", topic, "b")
	s.ok(t, "", "group", "pause", topic, "b")
	for _, args := range [][]string{
		{"group", "list", "--state", "paused", topic}, {"group", "list", "--state", "PAUSED"},
		{"group", "list", "--group", "b", topic}, {"group", "list", "--state", "Paused", "--group", "b"},
	} {
		rows := cliTableRows(t, s.ok(t, "", args...).stdout)
		if len(rows) != 1 || rows[0]["GROUP"] != "b" || rows[0]["STATE"] != "PAUSED" {
			t.Errorf("spool %s: %v, want b alone", strings.Join(args, " "), rows)
		}
	}
	var list admin.GroupList
	cliDecodeJSON(t, s.ok(t, "", "group", "list", "--json", "--state", "active", topic).stdout, &list)
	if len(list.Groups) != 1 || list.Groups[0].Group != "a" {
		t.Errorf("group list --json --state active %s: %+v", topic, list.Groups)
	}
	if r := s.ok(t, "", "group", "list", "--state", "dead", topic); r.stdout != "" || r.stderr != "no groups\n" {
		t.Errorf("group list --state dead: %v", r)
	}
	for _, args := range [][]string{{"group", "list", "--state", "gone", topic}, {"group", "list", "--state", "DELETED"}} {
		s.fails(t, 2, `--state must be ACTIVE, PAUSED, DEAD or CANCELLED, got`, args...)
	}
}

func TestShortAge(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		-time.Second: "0s", 0: "0s", 59 * time.Second: "59s", 90 * time.Second: "1m", 59 * time.Minute: "59m",
		time.Hour: "1h", 47 * time.Hour: "47h", 48 * time.Hour: "2d", 10 * 24 * time.Hour: "10d",
	} {
		if got := shortAge(d); got != want {
			t.Errorf("shortAge(%s) = %q, want %q", d, got, want)
		}
	}
}
