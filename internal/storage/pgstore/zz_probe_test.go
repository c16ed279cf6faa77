package pgstore

import (
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

func TestZZProbe(t *testing.T) {
	cfg := testConfig(t, nil)
	e, err := Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := t.Context()
	e.TopicCreate(ctx, &storage.TopicCreateParams{Name: "bench.q", Config: storage.TopicConfig{Partitions: 4}})
	sub, _ := e.SubscriptionGetByGroup(ctx, "bench.q", storage.QueueGroup)
	msgs := make([]storage.AppendMessage, 500)
	for i := range msgs {
		msgs[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: make([]byte, 100)}
	}
	t0 := time.Now()
	for n := 0; n < 20000; n += len(msgs) {
		if _, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "bench.q", Messages: msgs}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("publish 20000: %s", time.Since(t0))
	var tc, ta time.Duration
	for i := 0; i < 200; i++ {
		t1 := time.Now()
		res, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: "m", Max: 100})
		if err != nil {
			t.Fatal(err)
		}
		t2 := time.Now()
		refs := make([]storage.DeliveryRef, len(res.Deliveries))
		for i, d := range res.Deliveries {
			refs[i] = d.Ref()
		}
		if _, err := e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: sub.ID, Member: "m", Refs: refs}); err != nil {
			t.Fatal(err)
		}
		tc += t2.Sub(t1)
		ta += time.Since(t2)
	}
	t.Logf("claim avg %s ack avg %s", tc/200, ta/200)
}
