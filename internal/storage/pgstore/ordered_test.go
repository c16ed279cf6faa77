package pgstore

import (
	"errors"
	"sync"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
)

// TestOrderedTwoInstances: two engines on one schema (two broker instances) assign an ordered
// group with compare-and-set in the database (of concurrent assignments from one generation
// exactly one wins), and a member fenced by one instance's assignment is fenced on the other.
func TestOrderedTwoInstances(t *testing.T) {
	clock := storagetest.NewFakeClock(logBase)
	cfg := testConfig(t, clock)
	ctx := t.Context()
	a, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := a.TopicCreate(ctx, &storage.TopicCreateParams{Name: "t", Config: storage.TopicConfig{Semantics: storage.PubSub, Partitions: 4}}); err != nil {
		t.Fatal(err)
	}
	sub, err := a.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "t", Group: "g", Mode: storage.ModeOrdered,
		Start: storage.StartPosition{Kind: storage.FromBeginning}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "t", Group: "g"}); !errors.Is(err, storage.ErrModeConflict) {
		t.Fatalf("shared subscription over the ordered one on the other instance: %v", err)
	}
	for p := range int32(4) {
		if _, err := a.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "t", Messages: []storage.AppendMessage{{Partition: p, Payload: []byte("x")}}}); err != nil {
			t.Fatal(err)
		}
	}

	// Concurrent rebalances from generation 0 on both instances: one wins.
	for round := int64(0); round < 10; round++ {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, e := range []*Engine{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = e.SubscriptionAssign(ctx, &storage.SubscriptionAssignParams{SubscriptionID: sub.ID, Generation: round,
					Members: map[string][]int32{"m" + string(rune('a'+i)): {0, 1, 2, 3}}})
			}()
		}
		wg.Wait()
		won := 0
		for _, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, storage.ErrStaleGeneration):
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d assignments won, want 1 (%v)", round, won, errs)
		}
	}
	cur, err := b.SubscriptionAssignment(ctx, sub.ID)
	if err != nil || cur.Generation != 10 {
		t.Fatalf("assignment after 10 rounds: %+v %v", cur, err)
	}

	// The owner claims through instance a; instance b moves the partitions; a fences it.
	owner := cur.Owner(0)
	res, err := a.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: owner, Max: 10, Generation: cur.Generation})
	if err != nil || len(res.Deliveries) != 4 {
		t.Fatalf("claim: %v %v", res, err)
	}
	next, err := b.SubscriptionAssign(ctx, &storage.SubscriptionAssignParams{SubscriptionID: sub.ID, Generation: cur.Generation,
		Members: map[string][]int32{"other": {0, 1, 2, 3}}})
	if err != nil {
		t.Fatal(err)
	}
	refs := []storage.DeliveryRef{res.Deliveries[0].Ref()}
	if _, err := a.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: sub.ID, Member: owner, Generation: cur.Generation, Refs: refs}); !errors.Is(err, storage.ErrStaleGeneration) {
		t.Fatalf("ack by the old owner on the other instance: %v", err)
	}
	res, err = a.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: "other", Max: 10, Generation: next.Generation})
	if err != nil || len(res.Deliveries) != 4 || res.Deliveries[0].Attempt != 2 {
		t.Fatalf("new owner's claim: %v %v", res, err)
	}
}
