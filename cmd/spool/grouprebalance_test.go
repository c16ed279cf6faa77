package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/spoolmq/spool/internal/admin"
)

// TestGroupRebalance: group rebalance reassigns an ordered group now (a new generation each time),
// --strategy changes its strategy, a shared group is refused by the broker and a bad strategy is
// a usage error.
func TestGroupRebalance(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	const topic = "cli.rebalance"
	s.ok(t, "", "topic", "create", topic, "--semantics", "PUB_SUB", "--partitions", "3")
	s.ok(t, "", "group", "create", "--ordered", topic, "ledger")
	s.ok(t, "", "group", "create", topic, "shared")
	var before admin.Group
	if err := json.Unmarshal([]byte(s.ok(t, "", "group", "describe", "--json", topic, "ledger").stdout), &before); err != nil {
		t.Fatal(err)
	}

	r := s.ok(t, "", "group", "rebalance", topic, "ledger")
	want := fmt.Sprintf("group ledger on topic %s: rebalanced, generation %d (round-robin)\n", topic, before.Generation+1)
	if !strings.HasPrefix(r.stdout, want) || !strings.Contains(r.stdout, "\nAssignment (every broker instance):\n") {
		t.Fatalf("group rebalance printed %q, want it to start with %q and show the assignment", r.stdout, want)
	}
	var g admin.Group
	if err := json.Unmarshal([]byte(s.ok(t, "", "group", "rebalance", "--json", "--strategy", "sticky", topic, "ledger").stdout), &g); err != nil {
		t.Fatal(err)
	}
	if g.Strategy != "sticky" || g.Generation != before.Generation+2 {
		t.Fatalf("group rebalance --strategy sticky: strategy %q generation %d, want sticky and %d", g.Strategy, g.Generation, before.Generation+2)
	}
	s.ok(t, "", "group", "rebalance", "--drop-foreign", topic, "ledger")

	s.fails(t, 1, "INVALID_ARGUMENT", "group", "rebalance", topic, "shared")
	s.fails(t, 2, `--strategy must be round-robin or sticky, got "random"`, "group", "rebalance", "--strategy", "random", topic, "ledger")
	s.fails(t, 2, "", "group", "rebalance", topic)
}
