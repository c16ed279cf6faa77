package admin

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// TestResponseBytesBounded: reads, DLQ lists and pulls asking for far more 1 MiB messages than
// maxResponseBytes holds answer at most that much (at least one message) and page on, on the
// embedded engine.
func TestResponseBytesBounded(t *testing.T) {
	t.Parallel()
	testResponseBytes(t, newEnv(t, nil))
}

// TestResponseBytesBoundedPG is TestResponseBytesBounded on PostgreSQL, whose reads were bounded
// by row count only.
func TestResponseBytesBoundedPG(t *testing.T) {
	t.Parallel()
	testResponseBytes(t, newEnvPG(t, nil))
}

func testResponseBytes(t *testing.T, e *env) {
	const count = 10
	payload := bytes.Repeat([]byte("x"), 1<<20-64) // within the default max_message_bytes
	e.do("POST", "/api/v1/topics", map[string]any{"name": "big", "semantics": "QUEUE"}).ok(http.StatusCreated, nil)
	msgs := make([]storage.AppendMessage, count)
	for i := range msgs {
		msgs[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: payload}
	}
	if _, err := e.b.Publish(t.Context(), "big", msgs); err != nil {
		t.Fatal(err)
	}
	// bounded checks one response: at least one message, at most maxResponseBytes of them.
	bounded := func(what string, sizes []int) {
		t.Helper()
		sum := 0
		for _, s := range sizes {
			sum += s
		}
		if len(sizes) == 0 || sum > maxResponseBytes {
			t.Fatalf("%s: %d messages of %d bytes, want 1 to %d bytes", what, len(sizes), sum, maxResponseBytes)
		}
	}
	size := func(m Message) int {
		if m.Payload == nil {
			return 0
		}
		return len(*m.Payload)
	}

	// Reads: pages of at most maxResponseBytes, next_offset after the last message.
	var from int64
	for pages := 1; from < count; pages++ {
		var page MessageList
		e.do("GET", fmt.Sprintf("/api/v1/topics/big/messages?limit=1000&from=%d", from), nil).ok(http.StatusOK, &page)
		var sizes []int
		for i, m := range page.Messages {
			if m.Offset != from+int64(i) {
				t.Fatalf("read page %d: offset %d at %d, want %d", pages, m.Offset, i, from+int64(i))
			}
			sizes = append(sizes, size(m))
		}
		bounded(fmt.Sprintf("read page %d", pages), sizes)
		from = page.NextOffset
		if want := page.Messages[len(page.Messages)-1].Offset + 1; from != want {
			t.Fatalf("read page %d: next_offset %d, want %d", pages, from, want)
		}
	}

	// Pulls: at most maxResponseBytes each; what a pull leaves is for the next.
	var ids []string
	for pulls := 1; len(ids) < count; pulls++ {
		if pulls > 2*count {
			t.Fatalf("%d pulls got %d of %d messages", pulls, len(ids), count)
		}
		var res PullResult
		e.do("POST", "/api/v1/topics/big/groups/$queue/pull", map[string]any{"max": 100, "wait": "5s"}).ok(http.StatusOK, &res)
		var sizes []int
		for _, m := range res.Messages {
			sizes = append(sizes, size(m.Message))
			ids = append(ids, m.ID)
		}
		bounded(fmt.Sprintf("pull %d", pulls), sizes)
	}

	// DLQ: pages of at most maxResponseBytes with next_after_id until the last.
	e.do("POST", "/api/v1/topics/big/groups/$queue/nack", map[string]any{"ids": ids, "to_dlq": true}).ok(http.StatusOK, nil)
	var after int64
	entries := 0
	for pages := 1; ; pages++ {
		var page DLQList
		e.do("GET", fmt.Sprintf("/api/v1/topics/big/groups/$queue/dlq?limit=1000&after_id=%d", after), nil).ok(http.StatusOK, &page)
		var sizes []int
		for _, en := range page.Entries {
			sizes = append(sizes, size(en.Message))
		}
		bounded(fmt.Sprintf("dlq page %d", pages), sizes)
		entries += len(page.Entries)
		if page.NextAfterID == nil {
			break
		}
		if *page.NextAfterID != page.Entries[len(page.Entries)-1].ID {
			t.Fatalf("dlq page %d: next_after_id %d, last id %d", pages, *page.NextAfterID, page.Entries[len(page.Entries)-1].ID)
		}
		after = *page.NextAfterID
	}
	if entries != count {
		t.Fatalf("dlq pages listed %d entries, want %d", entries, count)
	}
	// Without payloads the engine's own bound (storage.ReadBatchBytes of whole messages) still
	// pages; every entry is listed once, the last page without next_after_id.
	after, entries = 0, 0
	for pages := 1; ; pages++ {
		if pages > count {
			t.Fatalf("dlq without payloads: %d pages for %d entries", pages, count)
		}
		var page DLQList
		e.do("GET", fmt.Sprintf("/api/v1/topics/big/groups/$queue/dlq?limit=1000&payload=false&after_id=%d", after), nil).ok(http.StatusOK, &page)
		entries += len(page.Entries)
		if page.NextAfterID == nil {
			break
		}
		after = *page.NextAfterID
	}
	if entries != count {
		t.Fatalf("dlq pages without payloads listed %d entries, want %d", entries, count)
	}
}
