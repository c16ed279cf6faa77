package main

import "testing"

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
