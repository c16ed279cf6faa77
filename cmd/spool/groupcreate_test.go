package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	api "github.com/spoolmq/spool/client/admin"
	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/storage"
)

// spool group create makes a group ahead of its consumers, with --from as spool sub takes it and
// --heartbeat-timeout; spool group update moves its start until it delivered something.
func TestGroupCreateAndUpdate(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	const topic = "cli.ahead"
	s.ok(t, "", "topic", "create", topic, "--semantics", "PUB_SUB")
	s.ok(t, "", "pub", topic, "early-1")
	s.ok(t, "", "pub", topic, "early-2")
	r := s.ok(t, "", "group", "create", "--heartbeat-timeout", "10m", topic, "billing")
	if want := "created group billing on topic cli.ahead: ACTIVE, start FROM_NOW, heartbeat timeout 10m\n"; r.stdout != want {
		t.Fatalf("group create printed %q, want %q", r.stdout, want)
	}
	r = s.ok(t, "", "group", "create", "--from", "1", "--json", topic, "audit")
	var g admin.Group
	if err := json.Unmarshal([]byte(r.stdout), &g); err != nil {
		t.Fatal(err)
	}
	if g.Start.Kind != api.FromMessageID || g.Start.Offset != 1 || time.Duration(g.HeartbeatTimeout) != storage.DefaultHeartbeatTimeout || g.Lag != 1 {
		t.Fatalf("group created from message 1: %+v", g)
	}
	// The seed's names, any case.
	r = s.ok(t, "", "group", "create", "--from", "from_message_id=0:1", "--json", topic, "audit2")
	if g = (admin.Group{}); json.Unmarshal([]byte(r.stdout), &g) != nil || g.Start.Kind != api.FromMessageID || g.Start.Offset != 1 {
		t.Fatalf("group created from FROM_MESSAGE_ID=0:1: %s", r.stdout)
	}
	r = s.ok(t, "", "group", "create", "--ordered", "--strategy", "sticky", "--max-in-flight-per-partition", "8", "--json", topic, "ledger")
	if g = (admin.Group{}); json.Unmarshal([]byte(r.stdout), &g) != nil || g.Mode != "ordered" || g.Strategy != "sticky" || g.MaxInFlightPerPartition != 8 {
		t.Fatalf("ordered group created: %s", r.stdout)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"group", "create", topic, "billing"}, "SUBSCRIPTION_EXISTS"},
		{[]string{"group", "create", "--strategy", "sticky", topic, "x"}, "for ordered groups only"},
		{[]string{"group", "create", "--ordered", "--max-in-flight-per-partition", "5000", topic, "x"}, "max_in_flight_per_partition must be between 1 and 1000"},
		{[]string{"group", "create", "--from", "yesterday", topic, "x"}, `--from "yesterday": want beginning, now`},
		{[]string{"group", "create", "--from", "FROM_TIMESTAMP=soon", topic, "x"}, "want FROM_TIMESTAMP=<RFC 3339 time>"},
		{[]string{"group", "create", "--heartbeat-timeout", "10ms", topic, "x"}, "heartbeat_timeout must be between"},
		{[]string{"group", "create", "nope", "x"}, "TOPIC_NOT_FOUND"},
		{[]string{"group", "update", topic, "billing"}, "nothing to change"},
	} {
		if r := s.run(t, "", c.args...); r.code == 0 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("spool %s: exit %d, stderr %q, want %q", strings.Join(c.args, " "), r.code, r.stderr, c.want)
		}
	}

	// No progress: the start moves to the beginning and a consumer gets everything.
	r = s.ok(t, "", "group", "update", "--from", "beginning", topic, "billing")
	if !strings.Contains(r.stdout, "start FROM_BEGINNING") {
		t.Fatalf("group update printed %q", r.stdout)
	}
	r = s.ok(t, "", "sub", "--group", "billing", "--max", "2", topic)
	if !strings.Contains(r.stdout, "early-1") || !strings.Contains(r.stdout, "early-2") {
		t.Fatalf("sub after the start moved to the beginning: %q", r.stdout)
	}
	if r := s.run(t, "", "group", "update", "--from", "now", topic, "billing"); r.code == 0 || !strings.Contains(r.stderr, "INVALID_TRANSITION") {
		t.Fatalf("group update --from after progress: exit %d, stderr %q", r.code, r.stderr)
	}
	r = s.ok(t, "", "group", "update", "--heartbeat-timeout", "1h", topic, "billing")
	if !strings.Contains(r.stdout, "heartbeat timeout 1h") {
		t.Fatalf("group update --heartbeat-timeout printed %q", r.stdout)
	}
	r = s.ok(t, "", "group", "describe", topic, "billing")
	if !strings.Contains(r.stdout, "Dead after:     1h without a member") {
		t.Fatalf("group describe shows no heartbeat timeout:\n%s", r.stdout)
	}
}
