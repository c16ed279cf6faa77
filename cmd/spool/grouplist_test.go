package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal"
)

// TestCLIGroupListPages: GET /api/v1/groups answers at most 1,000 groups a page; group list
// reads every page, in the table and in --json.
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
}
