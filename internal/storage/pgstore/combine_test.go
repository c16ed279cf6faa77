package pgstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
)

// laneSubs creates PUB_SUB subscriptions of topic until n of them share a lane, and returns those.
func laneSubs(t *testing.T, e *Engine, topic string, n int) []*storage.Subscription {
	t.Helper()
	var out []*storage.Subscription
	for i := 0; len(out) < n; i++ {
		s := logSub(t, e, topic, fmt.Sprintf("g%d", i))
		if s.ID%deliveryLanes == 0 {
			out = append(out, s)
		}
	}
	return out
}

// awaitPending polls until n operations queue on lane.
func awaitPending(t *testing.T, lane *opLane, n int) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, fmt.Sprintf("%d operations queued on the lane", n), func() error {
		lane.mu.Lock()
		defer lane.mu.Unlock()
		if len(lane.pending) != n {
			return fmt.Errorf("%d queued", len(lane.pending))
		}
		return nil
	})
}

type claimOut struct {
	res *storage.DeliveriesClaimResult
	err error
}

// TestDeliveriesCombinedAcrossSubscriptions: claims and acks of different subscriptions that
// queue while their lane's transaction waits run together in the next transaction, each with the
// answer it would have got alone: a claim of a cancelled subscription fails alone, and a
// subscription whose state cannot be read (a corrupt topic configuration fails the whole
// transaction) fails alone too, the others running again one by one.
func TestDeliveriesCombinedAcrossSubscriptions(t *testing.T) {
	t.Parallel()
	e := openConns(t, 8)
	ctx := t.Context()
	logTopic(t, e, "fan.t", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2})
	logTopic(t, e, "bad.t", storage.TopicConfig{Semantics: storage.PubSub})
	subs := laneSubs(t, e, "fan.t", 4)
	blocked, claimed, acked, cancelled := subs[0], subs[1], subs[2], subs[3]
	var corrupt *storage.Subscription
	for i := 0; corrupt == nil; i++ {
		if s := logSub(t, e, "bad.t", fmt.Sprintf("b%d", i)); s.ID%deliveryLanes == 0 {
			corrupt = s
		}
	}
	logPublish(t, e, "fan.t", 0, "a", "b", "c")
	logPublish(t, e, "fan.t", 1, "d")
	logPublish(t, e, "bad.t", 0, "x")
	// The acked subscription holds two leases to ack.
	pre := must(e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: acked.ID, Member: "m", Max: 2}))(t)
	if len(pre.Deliveries) != 2 {
		t.Fatalf("claimed %d, want 2", len(pre.Deliveries))
	}
	must(e.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: cancelled.ID, State: storage.Paused}))(t)

	run := func(block bool) {
		// Hold the blocked subscription's rows from outside, so that the lane's transaction waits.
		tx := must(e.pool.Begin(ctx))(t)
		defer func() { _ = tx.Rollback(context.Background()) }()
		must(tx.Exec(ctx, e.sql(`SELECT 1 FROM spool.sub_partitions WHERE sub_id = $1 FOR UPDATE`), blocked.ID))(t)
		first := make(chan claimOut, 1)
		go func() {
			res, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: blocked.ID, Member: "m", Max: 10})
			first <- claimOut{res, err}
		}()
		awaitBlockedBy(t, e, backendPID(t, tx))
		lane := &e.lanes[0]
		txs0 := e.laneTxs.Load()

		outs := make([]chan claimOut, 3)
		for i, s := range []*storage.Subscription{claimed, cancelled, corrupt} {
			outs[i] = make(chan claimOut, 1)
			go func() {
				res, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: s.ID, Member: "m", Max: 10})
				outs[i] <- claimOut{res, err}
			}()
			awaitPending(t, lane, i+1)
		}
		ackOut := make(chan error, 1)
		go func() {
			res, err := e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: acked.ID, Member: "m",
				Refs: []storage.DeliveryRef{pre.Deliveries[0].Ref(), pre.Deliveries[1].Ref(), {Partition: 7, Offset: 0}}})
			if err == nil && (res.Acked != 2 || len(res.Unknown) != 1) {
				err = fmt.Errorf("ack result %+v, want 2 acked and partition 7 unknown", *res)
			}
			ackOut <- err
		}()
		awaitPending(t, lane, 4)
		if block {
			// Corrupt the configuration of bad.t now: the combined transaction fails on it.
			must(e.pool.Exec(ctx, e.sql(`UPDATE spool.topics SET config = '{"partitions": "two"}' WHERE name = 'bad.t'`)))(t)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}

		if o := <-first; o.err != nil || len(o.res.Deliveries) != 4 {
			t.Errorf("blocked claim: %v, %v", o.res, o.err)
		}
		if o := <-outs[0]; o.err != nil || len(o.res.Deliveries) != 4 {
			t.Errorf("claim of %d: %+v, %v; want 4 deliveries", claimed.ID, o.res, o.err)
		}
		if o := <-outs[1]; !errors.Is(o.err, storage.ErrSubscriptionNotActive) {
			t.Errorf("claim of the paused subscription: %+v, %v; want ErrSubscriptionNotActive", o.res, o.err)
		}
		o := <-outs[2]
		if block {
			if !errors.Is(o.err, storage.ErrCorrupt) {
				t.Errorf("claim of the corrupt subscription: %+v, %v; want ErrCorrupt", o.res, o.err)
			}
		} else if o.err != nil || len(o.res.Deliveries) != 1 {
			t.Errorf("claim of %d: %+v, %v; want 1 delivery", corrupt.ID, o.res, o.err)
		}
		if err := <-ackOut; err != nil {
			t.Error(err)
		}
		// The four queued operations shared one transaction (the blocked claim had its own).
		if n := e.laneTxs.Load() - txs0; n != 1 {
			t.Errorf("the queued operations ran in %d lane transactions, want 1", n)
		}
	}
	run(false)
	// Again from the start, with bad.t's configuration corrupt: the others still get their answers.
	for _, s := range []*storage.Subscription{blocked, claimed} {
		must(e.DeliveriesRelease(ctx, &storage.DeliveriesReleaseParams{SubscriptionID: s.ID, Member: "m"}))(t)
	}
	pre = must(e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: acked.ID, Member: "m", Max: 2}))(t)
	if len(pre.Deliveries) != 2 {
		t.Fatalf("second claim of the acked subscription: %d deliveries, want the 2 left", len(pre.Deliveries))
	}
	run(true)
}
