package wal

import (
	"context"
	"fmt"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// BenchmarkRefcountJoin: the cost of a group joining a refcount topic from the beginning while a
// live group has not acked the window (pending messages), by the size of that window. The join
// holds the engine lock; it used to read every offset of the window (linear in it), it now works
// on the other groups' runs (flat). Each iteration is one SubscriptionCreate and its delete.
//
//	go test -run '^$' -bench RefcountJoin -benchtime 20x ./internal/storage/wal/
func BenchmarkRefcountJoin(b *testing.B) {
	for _, window := range []int{10_000, 1_000_000} {
		b.Run(fmt.Sprintf("window=%d", window), func(b *testing.B) { benchRefcountJoin(b, window) })
	}
}

func benchRefcountJoin(b *testing.B, window int) {
	e := openBench(b, b.TempDir(), nil, func(c *Config) { c.Sync = UnsafeNoSync })
	defer e.Close()
	ctx := context.Background()
	if _, err := e.TopicCreate(ctx, &storage.TopicCreateParams{Name: "rc",
		Config: storage.TopicConfig{Semantics: storage.PubSub, CompletionTracking: storage.Refcount}}); err != nil {
		b.Fatal(err)
	}
	if _, err := e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "rc", Group: "live"}); err != nil {
		b.Fatal(err)
	}
	msgs := make([]storage.AppendMessage, 1000)
	for i := range msgs {
		msgs[i] = storage.AppendMessage{Partition: 0, Payload: []byte("m")}
	}
	for n := 0; n < window; n += len(msgs) {
		if _, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "rc", Messages: msgs}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		s, err := e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "rc", Group: fmt.Sprintf("j%d", i),
			Start: storage.StartPosition{Kind: storage.FromBeginning}})
		if err != nil {
			b.Fatal(err)
		}
		if err := e.SubscriptionDelete(ctx, s.ID); err != nil {
			b.Fatal(err)
		}
	}
}
