package pgstore

import (
	"bytes"
	"context"
	"slices"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// TestMessagesReadBoundedInBytes: a read stops before the message that would take it past
// readBatchBytes of message sizes, whatever Limit asks, but returns at least one message (one
// larger than the bound alone); reading on after the last message returned continues.
func TestMessagesReadBoundedInBytes(t *testing.T) {
	t.Parallel()
	e, err := Open(context.Background(), testConfig(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	ctx := t.Context()
	if _, err := e.TopicCreate(ctx, &storage.TopicCreateParams{Name: "big", Config: storage.TopicConfig{MaxMessageBytes: storage.MaxMessageBytesLimit}}); err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	sizes := []int{mib, mib, mib, mib, mib, 5 * mib, 10, 10}
	msgs := make([]storage.AppendMessage, len(sizes))
	for i, n := range sizes {
		msgs[i] = storage.AppendMessage{Partition: 0, Payload: bytes.Repeat([]byte{'x'}, n)}
	}
	if _, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "big", Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	// From 0: four 1 MiB messages make readBatchBytes; from 5 the 5 MiB one alone; then the rest.
	for _, c := range []struct {
		from  int64
		limit int
		want  []int64
	}{{0, 1000, []int64{0, 1, 2, 3}}, {4, 1000, []int64{4}}, {5, 1000, []int64{5}}, {6, 1000, []int64{6, 7}}, {0, 2, []int64{0, 1}}} {
		got, err := e.MessagesRead(ctx, &storage.MessagesReadParams{Topic: "big", Partition: 0, Offset: c.from, Limit: c.limit})
		if err != nil {
			t.Fatal(err)
		}
		var offsets []int64
		for _, m := range got {
			offsets = append(offsets, m.Offset)
			if len(m.Payload) != sizes[m.Offset] {
				t.Errorf("offset %d: payload of %d bytes, want %d", m.Offset, len(m.Payload), sizes[m.Offset])
			}
		}
		if !slices.Equal(offsets, c.want) {
			t.Errorf("read from %d, limit %d: offsets %v, want %v", c.from, c.limit, offsets, c.want)
		}
	}
}
