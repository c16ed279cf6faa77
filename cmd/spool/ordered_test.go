package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/testutil"
)

// spool sub --group g --ordered joins an ordered group; group describe shows its mode, strategy,
// generation, assignment and partition owners; POST rebalance (through the API) increments it.
func TestCLISubOrdered(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	const topic = "cli.ordered"
	s.ok(t, "", "topic", "create", topic, "--semantics", "PUB_SUB", "--partitions", "3")
	s.fails(t, 2, "--ordered needs --group", "sub", "--ordered", topic)
	ctx, cancel := context.WithCancel(t.Context())
	var out, errb testutil.SyncBuffer
	code := make(chan int, 1)
	go func() {
		code <- runCLI(ctx, s.env("", &out, &errb), runSub, []string{"--group", "g", "--ordered", "--from", "beginning", topic})
	}()
	defer func() {
		cancel()
		select {
		case c := <-code:
			if c != 0 {
				t.Errorf("sub exit %d: %s", c, errb.String())
			}
		case <-time.After(cliWaitTimeout):
			t.Error("sub still runs after its context ended")
		}
	}()
	var g admin.Group
	testutil.Eventually(t, cliWaitTimeout, "sub owns the partitions", func() error {
		r := s.run(t, "", "group", "describe", topic, "g", "--json")
		g = admin.Group{}
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &g) != nil || len(g.Assignment) != 1 {
			return fmt.Errorf("group g not assigned yet: %v", r)
		}
		return nil
	})
	r := s.ok(t, "", "group", "describe", topic, "g")
	for _, want := range []string{"Mode:           ordered\n", "Strategy:       round-robin\n",
		fmt.Sprintf("Generation:     %d\n", g.Generation), "0,1,2", "\nPartition owners:\nPARTITION  OWNER"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("group describe lacks %q:\n%s", want, r.stdout)
		}
	}
	s.ok(t, "", "pub", topic, "x")
	testutil.Eventually(t, cliWaitTimeout, "sub prints the message", func() error {
		if !strings.Contains(out.String(), " x\n") {
			return fmt.Errorf("sub printed %q", out.String())
		}
		return nil
	})
}
