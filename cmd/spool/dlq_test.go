package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/testutil"
)

// TestDLQInspect: dlq inspect prints one entry whole (the message's key, headers and payload,
// which dlq list leaves out, and the consumer's last error), or with --json the API's entry;
// an unknown entry and a malformed id are errors.
func TestDLQInspect(t *testing.T) {
	s := startCLIStack(t)
	topic := "cli.inspect"
	s.ok(t, "", "topic", "create", topic, "--semantics", "PUB_SUB")
	s.ok(t, "", "group", "create", "--from", "beginning", topic, "g")
	msgID := strings.TrimSpace(s.ok(t, "", "pub", "--key", "user-7", "--header", "trace=abc", "--header", "a=1",
		topic, "the payload").stdout)
	nackToDLQ(t, s, topic, "g", "bad payload")
	var id string
	testutil.Eventually(t, cliWaitTimeout, "the DLQ entry", func() error {
		r := s.ok(t, "", "dlq", "list", topic, "g")
		if r.stdout == "" {
			return errors.New("DLQ empty")
		}
		rows := cliTableRows(t, r.stdout)
		id = rows[0]["ID"]
		return nil
	})

	out := s.ok(t, "", "dlq", "inspect", topic, "g", id).stdout
	for _, want := range []string{"Entry:       " + id + "\n", "Group:       g\n", "Message:     " + msgID + "\n",
		"Reason:      rejected\n", "Attempts:    1\n", "Last error:  bad payload\n", "Key:         user-7\n",
		"Header:      a=1\nHeader:      trace=abc\n", "Payload:     the payload\n"} {
		if !strings.Contains(out, want) {
			t.Fatalf("dlq inspect printed\n%s\nwithout %q", out, want)
		}
	}
	var d admin.DLQEntry
	if err := json.Unmarshal([]byte(s.ok(t, "", "dlq", "inspect", "--json", topic, "g", "dlq-"+id).stdout), &d); err != nil {
		t.Fatal(err)
	}
	if d.Message.ID != msgID || d.Message.Payload == nil || *d.Message.Payload != "the payload" ||
		d.Message.Headers["trace"] != "abc" || d.LastError != "bad payload" {
		t.Fatalf("dlq inspect --json: %+v", d)
	}
	s.fails(t, 1, "NOT_FOUND", "dlq", "inspect", topic, "g", "999")
	s.fails(t, 2, `entry id "x" is not a positive integer`, "dlq", "inspect", topic, "g", "x")
	s.fails(t, 2, "", "dlq", "inspect", topic, "g")
}
