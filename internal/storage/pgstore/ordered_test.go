package pgstore

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

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
	res, err = a.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: "other", Max: 10, Generation: next.Assignment.Generation})
	if err != nil || len(res.Deliveries) != 4 || res.Deliveries[0].Attempt != 2 {
		t.Fatalf("new owner's claim: %v %v", res, err)
	}
}

// TestMembersRenewTwoInstances: two engines on one schema (two broker instances) renew their own
// members of one ordered group at the same time, each round after every record expired, so each
// renewal also deletes the other's expired rows while the other upserts them. No renewal fails
// and after each round both instances' members are live.
func TestMembersRenewTwoInstances(t *testing.T) {
	clock := storagetest.NewFakeClock(logBase)
	cfg := testConfig(t, clock)
	ctx := t.Context()
	var engines [2]*Engine
	for i := range engines {
		e, err := Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		engines[i] = e
	}
	if _, err := engines[0].TopicCreate(ctx, &storage.TopicCreateParams{Name: "t", Config: storage.TopicConfig{Semantics: storage.PubSub, Partitions: 4}}); err != nil {
		t.Fatal(err)
	}
	sub, err := engines[0].SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "t", Group: "g", Mode: storage.ModeOrdered})
	if err != nil {
		t.Fatal(err)
	}
	const perInstance, ttl = 50, 10 * time.Second
	refs := func(i int) []storage.MemberRef {
		var out []storage.MemberRef
		for k := range perInstance {
			out = append(out, storage.MemberRef{SubscriptionID: sub.ID, Member: fmt.Sprintf("i%d-m%02d", i, k)})
		}
		return out
	}
	for round := range 20 {
		clock.Advance(ttl)
		var wg sync.WaitGroup
		errs := make([]error, len(engines))
		for i, e := range engines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = e.SubscriptionMembersRenew(ctx, &storage.SubscriptionMembersRenewParams{Members: refs(i), TTL: ttl})
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		res, err := engines[0].SubscriptionMembersRenew(ctx, &storage.SubscriptionMembersRenewParams{Subscriptions: []int64{sub.ID}, TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		if n := len(res.Live[sub.ID]); n != 2*perInstance {
			t.Fatalf("round %d: %d live members, want %d: %v", round, n, 2*perInstance, res.Live[sub.ID])
		}
	}
}
