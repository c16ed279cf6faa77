package main

import (
	"strings"
	"testing"
)

// TestCLITopicCompletion: spool topic create --completion-tracking refcount makes a refcount
// topic, and spool topic completion prints a message's groups with their states; a watermark
// topic's message has no record (the broker's INVALID_ARGUMENT).
func TestCLITopicCompletion(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	s.ok(t, "", "topic", "create", "cli.rc", "--semantics", "PUB_SUB", "--completion-tracking", "refcount")
	s.ok(t, "", "group", "create", "cli.rc", "billing")
	s.ok(t, "", "pub", "cli.rc", "m")
	r := s.ok(t, "", "topic", "completion", "cli.rc", "0")
	if !strings.Contains(r.stdout, "Complete") || !strings.Contains(r.stdout, "false") ||
		!lineWith(r.stdout, "billing", "pending") {
		t.Errorf("topic completion:\n%s", r.stdout)
	}
	r = s.ok(t, "", "topic", "completion", "--json", "cli.rc", "0")
	if !strings.Contains(r.stdout, `"state":"pending"`) {
		t.Errorf("topic completion --json: %s", r.stdout)
	}
	s.ok(t, "", "topic", "create", "cli.wm")
	s.ok(t, "", "pub", "cli.wm", "m")
	r = s.run(t, "", "topic", "completion", "cli.wm", "0")
	if r.code != 1 || !strings.Contains(r.stderr, "INVALID_ARGUMENT") {
		t.Errorf("topic completion of a watermark topic: exit %d, %q", r.code, r.stderr)
	}
}

// lineWith reports whether a line of out holds every word.
func lineWith(out string, words ...string) bool {
	for _, l := range strings.Split(out, "\n") {
		all := true
		for _, w := range words {
			all = all && strings.Contains(l, w)
		}
		if all {
			return true
		}
	}
	return false
}
