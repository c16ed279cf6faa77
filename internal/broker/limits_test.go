package broker

import (
	"errors"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// TestTopicAndPartitionLimits: a client cannot make the broker keep unbounded topics or
// partitions (issue 16: five text PUBLISHes to new topics reserved 320 MiB): past MaxTopics an
// explicit creation and an auto-creating publish fail with ErrLimitExceeded and create nothing,
// past MaxPartitions a creation and a growth fail the same way, and a deleted topic makes room.
func TestTopicAndPartitionLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.MaxTopics, c.MaxPartitions = 2, 4 })
	ctx := e.ctx()
	e.createTopic("lim.one", storage.TopicConfig{Partitions: 4})
	if _, err := e.b.CreateTopic(ctx, "lim.wide", storage.TopicConfig{Partitions: 5}); !errors.Is(err, storage.ErrLimitExceeded) {
		t.Fatalf("CreateTopic with 5 partitions: %v, want ErrLimitExceeded", err)
	}
	if _, err := e.b.UpdateTopic(ctx, UpdateTopicParams{Name: "lim.one", Config: storage.TopicConfig{Partitions: 5}}); !errors.Is(err, storage.ErrLimitExceeded) {
		t.Fatalf("UpdateTopic to 5 partitions: %v, want ErrLimitExceeded", err)
	}
	e.publishN("lim.auto", "m", 1) // auto-created: the second topic
	_, err := e.b.Publish(ctx, "lim.three", []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("x")}})
	if !errors.Is(err, storage.ErrLimitExceeded) {
		t.Fatalf("publish auto-creating a third topic: %v, want ErrLimitExceeded", err)
	}
	if _, err := e.b.CreateTopic(ctx, "lim.three", storage.TopicConfig{}); !errors.Is(err, storage.ErrLimitExceeded) {
		t.Fatalf("CreateTopic of a third topic: %v, want ErrLimitExceeded", err)
	}
	topics, err := e.engine.TopicList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(topics) != 2 {
		t.Fatalf("%d topics, want 2", len(topics))
	}
	if st, err := e.engine.TopicStats(ctx, "lim.one"); err != nil || len(st.Partitions) != 4 {
		t.Fatalf("lim.one after the refused growth: %+v, %v", st, err)
	}
	if err := e.b.DeleteTopic(ctx, "lim.auto", true); err != nil {
		t.Fatal(err)
	}
	e.publishN("lim.three", "m", 1)
}
