package main

import (
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

// doctorAnswer returns the lines of question n (1 to 4) in spool doctor's output.
func doctorAnswer(t *testing.T, out string, n int) string {
	t.Helper()
	start := strings.Index(out, fmt.Sprintf("\n%d. %s\n", n, doctorQuestions[n-1]))
	if start < 0 {
		t.Fatalf("no answer %d in:\n%s", n, out)
	}
	rest := out[start+1:]
	if end := strings.Index(rest, "\n\n"); end >= 0 {
		rest = rest[:end]
	}
	return rest
}

// wantAnswer runs spool doctor and checks that answer n contains every want.
func wantAnswer(t *testing.T, s *cliStack, args []string, n int, want ...string) string {
	t.Helper()
	out := s.ok(t, "", append([]string{"doctor"}, args...)...).stdout
	a := doctorAnswer(t, out, n)
	for _, w := range want {
		if !strings.Contains(a, w) {
			t.Fatalf("spool doctor %s: answer %d lacks %q:\n%s", strings.Join(args, " "), n, w, out)
		}
	}
	return out
}

// spool doctor answers each of seed 004's troubleshooting questions in its main case: a group
// without a consumer, a PAUSED group, a DEAD group (not receiving, and why DEAD), a group holding
// retention (not cleaned up), a topic blocking writes without an ACTIVE group; and says OK when
// all is well.
func TestDoctorAnswersSeed004(t *testing.T) {
	t.Parallel()
	// A retention job that never runs within the test (its first run is an hour away).
	s := startCLIStack(t, func(_ *wal.Config, b *broker.Config) { b.RetentionInterval = time.Hour })
	ctx := t.Context()
	const topic = "d.orders"
	s.ok(t, "", "topic", "create", topic, "--semantics", "PUB_SUB")
	if _, err := s.broker.CreateGroup(ctx, broker.CreateGroupParams{Topic: topic, Group: "g", Start: storage.StartPosition{Kind: storage.FromBeginning}}); err != nil {
		t.Fatal(err)
	}
	args := []string{topic, "g"}

	// 1: no consumer attached.
	wantAnswer(t, s, args, 1, "[FAIL] group g: no consumer is attached", "fix: start a consumer of the group")
	// 1: receiving once a consumer is attached and messages wait.
	m, err := s.broker.Subscribe(ctx, broker.SubscribeParams{Pattern: topic, Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	s.ok(t, "", "pub", topic, "a", "b")
	out := wantAnswer(t, s, args, 1, "[OK] group g: the group receives", "members on this broker: 1")
	// 2: the group holds its two messages; 3: not DEAD; 4: writes pass.
	for n, want := range map[int]string{
		2: "[WARN] topic d.orders: 1 group(s) have not completed messages; the slowest, g, holds them",
		3: "[OK] group g: not DEAD (state ACTIVE)",
		4: "[OK] topic d.orders: writes are not blocked",
	} {
		if a := doctorAnswer(t, out, n); !strings.Contains(a, want) {
			t.Fatalf("answer %d lacks %q:\n%s", n, want, out)
		}
	}
	// 1: PAUSED.
	s.ok(t, "", "group", "pause", topic, "g")
	wantAnswer(t, s, args, 1, "[FAIL] group g: the group is PAUSED", "fix: spool group resume d.orders g")
	s.ok(t, "", "group", "resume", topic, "g")

	// 3: DEAD (and 1 says so too); the consumer left, the heartbeat timed out.
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	wantAnswer(t, s, args, 3, "[WARN] group g: not DEAD yet, but no consumer is attached here")
	g, err := s.broker.Group(ctx, topic, "g")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.engine.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: g.Subscription.ID, State: storage.Dead}); err != nil {
		t.Fatal(err)
	}
	out = wantAnswer(t, s, args, 3, "[FAIL] group g: no consumer of the group was attached to any broker for its heartbeat timeout (5m",
		"fix: restart the consumers", "spool group resurrect d.orders g", "last heartbeat ")
	if a := doctorAnswer(t, out, 1); !strings.Contains(a, "[FAIL] group g: the group is DEAD") {
		t.Fatalf("answer 1 for a DEAD group:\n%s", out)
	}
	// 2: a DEAD group holds no retention.
	if a := doctorAnswer(t, out, 2); !strings.Contains(a, "[OK] topic d.orders: no group holds retention") {
		t.Fatalf("answer 2 with only a DEAD group:\n%s", out)
	}

	// 4: a topic that blocks writes without an ACTIVE group.
	s.ok(t, "", "topic", "create", "d.blocked", "--semantics", "PUB_SUB", "--block-writes-on-zero-subscriptions")
	s.fails(t, 1, "NO_SUBSCRIPTIONS", "pub", "d.blocked", "x")
	wantAnswer(t, s, []string{"d.blocked"}, 4, "[FAIL] topic d.blocked: the topic blocks writes without an ACTIVE group",
		"block_writes_on_zero_subscriptions true, ACTIVE groups 0 of 0")
	wantAnswer(t, s, []string{"d.blocked"}, 1, "[WARN] topic d.blocked: the topic has no consumer group")

	// 2: no retention job at all.
	s2 := startCLIStack(t)
	s2.ok(t, "", "topic", "create", topic, "--semantics", "PUB_SUB")
	wantAnswer(t, s2, []string{topic}, 2, "[FAIL] topic d.orders: the broker runs no retention job")

	// Bad input.
	s.fails(t, 1, "SUBSCRIPTION_NOT_FOUND", "doctor", topic, "nope")
	s.fails(t, 1, "TOPIC_NOT_FOUND", "doctor", "d.nope")
	s.fails(t, 2, "--sample must be 0 to 1m", "doctor", topic, "--sample", "2m")
}

// spool group force-complete, resurrect and remove, with doctor's view of the retention before
// and after: the engine's clock is two days behind, so what is published is 48 h old.
func TestGroupAdminCommands(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t, func(c *wal.Config, b *broker.Config) {
		c.Clock = storagetest.NewFakeClock(time.Now().Add(-48 * time.Hour))
		b.RetentionInterval = time.Hour
	})
	ctx := t.Context()
	const topic = "d.old"
	s.ok(t, "", "topic", "create", topic, "--semantics", "PUB_SUB")
	if _, err := s.broker.CreateGroup(ctx, broker.CreateGroupParams{Topic: topic, Group: "g", Start: storage.StartPosition{Kind: storage.FromBeginning}}); err != nil {
		t.Fatal(err)
	}
	s.ok(t, "", "pub", topic, "a", "b", "c")
	wantAnswer(t, s, []string{topic}, 2, "the slowest, g, holds them, oldest unacked 2d old", "spool group force-complete d.old g")

	s.fails(t, 2, "--older-than is required", "group", "force-complete", topic, "g")
	r := s.ok(t, "", "group", "force-complete", topic, "g", "--older-than", "24h")
	if !strings.HasPrefix(r.stdout, "group g on topic d.old: 3 messages published before ") || !strings.HasSuffix(r.stdout, " completed (0 already done)\n") {
		t.Fatalf("force-complete printed %q", r.stdout)
	}
	wantAnswer(t, s, []string{topic}, 2, "[OK] topic d.old: every group completed its messages")

	// --all: every group of the topic, per group; an ORDERED group is skipped, saying why.
	for _, g := range []string{"a", "b"} {
		if _, err := s.broker.CreateGroup(ctx, broker.CreateGroupParams{Topic: topic, Group: g, Start: storage.StartPosition{Kind: storage.FromBeginning}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.engine.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: topic, Group: "ord",
		Start: storage.StartPosition{Kind: storage.FromBeginning}, Mode: storage.ModeOrdered}); err != nil {
		t.Fatal(err)
	}
	s.fails(t, 2, "--all takes the topic only", "group", "force-complete", "--all", topic, "a", "--older-than", "24h")
	s.fails(t, 2, "give <topic> <group>, or --all <topic>", "group", "force-complete", topic, "--older-than", "24h")
	r = s.ok(t, "", "group", "force-complete", "--all", topic, "--older-than", "24h")
	rows := cliTableRows(t, r.stdout[:strings.Index(r.stdout, "topic d.old:")])
	got := map[string]string{}
	for _, row := range rows {
		got[row["GROUP"]] = row["COMPLETED"] + " " + row["NOTE"]
	}
	if len(rows) != 4 || got["g"] != "0 -" || got["a"] != "3 -" || got["b"] != "3 -" || got["ord"] != "0 skipped: ORDERED" ||
		!strings.Contains(r.stdout, "topic d.old: 6 messages published before ") || !strings.Contains(r.stderr, "fenced by partition ownership") {
		t.Fatalf("force-complete --all printed %q (rows %v), stderr %q", r.stdout, got, r.stderr)
	}
	// The ORDERED group holds the rest: doctor does not suggest force-complete for it.
	out := wantAnswer(t, s, []string{topic}, 2, "the slowest, ord, holds them", "spool group remove / cancel d.old ord")
	if a := doctorAnswer(t, out, 2); strings.Contains(a, "force-complete") {
		t.Errorf("doctor suggests force-complete for an ORDERED group:\n%s", a)
	}

	s.fails(t, 1, "INVALID_TRANSITION", "group", "resurrect", topic, "g")
	g, err := s.broker.Group(ctx, topic, "g")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.engine.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: g.Subscription.ID, State: storage.Dead}); err != nil {
		t.Fatal(err)
	}
	if r := s.ok(t, "", "group", "resurrect", topic, "g", "--backfill"); r.stdout != "group g on topic d.old: ACTIVE\n" {
		t.Fatalf("resurrect printed %q", r.stdout)
	}
	if r := s.ok(t, "", "group", "remove", topic, "g"); r.stdout != "group g on topic d.old: removed\n" {
		t.Fatalf("remove printed %q", r.stdout)
	}
	s.fails(t, 1, "SUBSCRIPTION_NOT_FOUND", "group", "describe", topic, "g")
}

// A retention job whose backlog is past seed 000's WARNING threshold makes question 2 a WARN that
// says so, with the backlog in the evidence; the CRITICAL rule (behind) a FAIL.
func TestDoctorCleanupBacklog(t *testing.T) {
	job := admin.CleanupJob{Job: broker.JobRetention, Runs: 9, Backlog: 1_200_000, Warning: true,
		Reason: "backlog 1200000 messages exceeds 1000000"}
	f := &doctorFacts{topic: &admin.Topic{Name: "t"}, cleanup: &admin.CleanupList{Jobs: []admin.CleanupJob{job}}, now: time.Now()}
	a := f.notCleaned()
	if a.verdict != "WARN" || !strings.Contains(a.why, "backlog is high: backlog 1200000") || !strings.Contains(strings.Join(a.evidence, "\n"), "backlog 1200000") {
		t.Errorf("warning: %+v", a)
	}
	f.cleanup.Jobs[0].Behind = true
	if a := f.notCleaned(); a.verdict != "FAIL" || !strings.Contains(a.why, "falls behind") {
		t.Errorf("behind: %+v", a)
	}
}
