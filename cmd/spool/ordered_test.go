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

// spool sub --ordered --batch N takes per-key batches: a delivery line names its batch (first
// offset + size); --batch needs --ordered, at most 1000, and automatic acks.
func TestCLISubBatch(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	const topic = "cli.batch"
	s.ok(t, "", "topic", "create", topic, "--semantics", "PUB_SUB", "--partitions", "1")
	s.fails(t, 2, "--batch needs --ordered", "sub", "--group", "g", "--batch", "2", topic)
	s.fails(t, 2, "--batch must be between 1 and 1000", "sub", "--group", "g", "--ordered", "--batch", "1001", topic)
	s.fails(t, 2, "--batch does not go with --ack=false", "sub", "--group", "g", "--ordered", "--batch", "2", "--ack=false", topic)
	s.ok(t, "", "pub", topic, "x")
	r := s.ok(t, "", "sub", "--group", "g", "--ordered", "--batch", "2", "--from", "beginning", "--max", "1", topic)
	if !strings.Contains(r.stdout, "attempt=1 batch=0+1 x\n") {
		t.Fatalf("sub --batch printed %q, want the delivery with its batch", r.stdout)
	}
}
