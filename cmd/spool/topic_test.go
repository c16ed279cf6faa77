package main

import (
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/admin"
)

// TestCLITopicUpdateQueueToGroup: --queue-to-group without a change from QUEUE to PUB_SUB fails
// with the server's error instead of being ignored.
func TestCLITopicUpdateQueueToGroup(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	const want = "queue_to_group is only for a change from QUEUE to PUB_SUB"
	s.ok(t, "", "topic", "create", "jobs")
	s.fails(t, 1, want, "topic", "update", "jobs", "--max-deliveries", "4", "--queue-to-group", "workers")
	s.ok(t, "", "topic", "update", "jobs", "--semantics", "PUB_SUB", "--queue-to-group", "workers")
	s.fails(t, 1, want, "topic", "update", "jobs", "--semantics", "PUB_SUB", "--queue-to-group", "workers")
}

// TestCLITopicMaxRetentionBelowDefault: --max-retention below message_retention's 24 h default
// (create, or update of a topic created with the defaults) lowers the defaulted
// message_retention with it; an explicit --message-retention above --max-retention is refused.
func TestCLITopicMaxRetentionBelowDefault(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	retention := func(topic string) (msg, maxR admin.Duration) {
		t.Helper()
		var tp admin.Topic
		cliDecodeJSON(t, s.ok(t, "", "topic", "describe", "--json", topic).stdout, &tp)
		return tp.Config.MessageRetention, tp.Config.MaxRetention
	}
	s.ok(t, "", "topic", "create", "short", "--max-retention", "12h")
	if m, mx := retention("short"); time.Duration(m) != 12*time.Hour || time.Duration(mx) != 12*time.Hour {
		t.Fatalf("topic create --max-retention 12h: message_retention %s, max_retention %s, want 12h both", time.Duration(m), time.Duration(mx))
	}
	s.ok(t, "", "topic", "create", "later")
	s.ok(t, "", "topic", "update", "later", "--max-retention", "6h")
	if m, _ := retention("later"); time.Duration(m) != 6*time.Hour {
		t.Fatalf("topic update --max-retention 6h: message_retention %s, want 6h", time.Duration(m))
	}
	s.fails(t, 1, "message_retention (13h0m0s) must not exceed max_retention (12h0m0s)",
		"topic", "create", "explicit", "--message-retention", "13h", "--max-retention", "12h")
	s.fails(t, 1, "must not exceed max_retention", "topic", "update", "later", "--message-retention", "7h")
}
