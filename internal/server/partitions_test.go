package server

import (
	"fmt"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// TestPartitionCountsBounded: the cache of topic partition counts for message ids holds at most
// partitionsMax topics (deleted topics' names would stay in it for good): past the bound it starts
// over, and every count it answers stays right.
func TestPartitionCountsBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	e.srv.partitionsMax = 4
	for i := range 10 {
		name := fmt.Sprintf("pc.%d", i)
		if _, err := e.b.CreateTopic(t.Context(), name, storage.TopicConfig{Partitions: 1 + i%3}); err != nil {
			t.Fatal(err)
		}
		if n := e.srv.partitionCount(t.Context(), name, 0); n != 1+i%3 {
			t.Fatalf("topic %s: %d partitions, want %d", name, n, 1+i%3)
		}
		cached := 0
		e.srv.partitions.Range(func(any, any) bool { cached++; return true })
		if cached > 4 {
			t.Fatalf("after %d topics: %d partition counts cached, want at most 4", i+1, cached)
		}
	}
}
