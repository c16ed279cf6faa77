package pgstore

import (
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
)

// TestZombieWatchesForgetDeletedTopics: the instance's view of a topic's floors (zombie_ttl)
// goes with the topic, so deleted topics leave nothing behind in memory.
func TestZombieWatchesForgetDeletedTopics(t *testing.T) {
	t.Parallel()
	clock := storagetest.NewFakeClock(time.Date(2031, 3, 14, 9, 26, 53, 0, time.UTC))
	e, err := Open(t.Context(), testConfig(t, clock))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := t.Context()
	for _, name := range []string{"w.keep", "w.gone"} {
		if _, err := e.TopicCreate(ctx, &storage.TopicCreateParams{Name: name, Config: storage.TopicConfig{}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.RetentionApply(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(e.watches.topics); n != 2 {
		t.Fatalf("%d topics watched, want 2 (each has its queue subscription)", n)
	}
	if err := e.TopicDelete(ctx, &storage.TopicDeleteParams{Name: "w.gone", Force: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.RetentionApply(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(e.watches.topics); n != 1 {
		t.Fatalf("%d topics watched after a delete, want 1", n)
	}
}
