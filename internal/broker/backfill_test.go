package broker

import (
	"errors"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// The pacer halves its rate while the claim latency p95 is above the target, grows it
// additively below, stays within its bounds, and hands out at most a batch of tokens.
func TestPacerAIMD(t *testing.T) {
	cfg := BackfillConfig{Batch: 1000, TargetP95: 10 * time.Millisecond, MaxRate: 50_000}.withDefaults()
	now := time.Unix(1000, 0)
	p := newPacer(cfg, now)
	if p.rate != 5000 || p.allow(now) != 500 {
		t.Fatalf("initial rate %v tokens %v, want 5000 and 500", p.rate, p.tokens)
	}
	if n := p.allow(now.Add(10 * time.Second)); n != 1000 {
		t.Errorf("tokens after 10 s: %d, want the batch 1000", n)
	}
	slow := func() {
		for range backfillAdjustEvery {
			p.took(0, 50*time.Millisecond)
		}
	}
	fast := func() {
		for range backfillAdjustEvery {
			p.took(0, time.Millisecond)
		}
	}
	slow()
	if p.rate != 2500 {
		t.Errorf("rate after slow claims: %v, want 2500", p.rate)
	}
	for range 20 {
		slow()
	}
	if p.rate != backfillMinRate {
		t.Errorf("rate after many slow claims: %v, want the minimum %d", p.rate, backfillMinRate)
	}
	// The window still holds slow samples: fast claims raise the rate once the p95 is fast.
	for range backfillWindow / backfillAdjustEvery {
		fast()
	}
	r := p.rate
	fast()
	if p.rate != r+cfg.MaxRate/20 {
		t.Errorf("rate after fast claims: %v, want %v", p.rate, r+cfg.MaxRate/20)
	}
	for range 100 {
		fast()
	}
	if p.rate != cfg.MaxRate {
		t.Errorf("rate capped at %v, want %v", p.rate, cfg.MaxRate)
	}
	p.tokens = 0
	p.took(3, time.Millisecond)
	if w := p.wait(); w <= 0 {
		t.Errorf("wait with negative tokens: %v", w)
	}
}

// A group created from the beginning gets its newest max_backfill_messages (the cut counted);
// a CANCELLED backfill holds its range back (nothing delivered), resume delivers it, and the
// group's backfill is COMPLETED once acked.
func TestBackfillCancelResume(t *testing.T) {
	e := newEnv(t, nil)
	ctx := e.ctx()
	e.createTopic("orders", storage.TopicConfig{Semantics: storage.PubSub})
	e.publishN("orders", "old", 5)
	if _, err := e.b.CreateGroup(ctx, CreateGroupParams{Topic: "orders", Group: "g",
		Start: storage.StartPosition{Kind: storage.FromBeginning}, MaxBackfillMessages: 4}); err != nil {
		t.Fatal(err)
	}
	if c := e.b.BackfillCounters(); c.MissedBound != 1 {
		t.Errorf("missed by the bound: %d, want 1", c.MissedBound)
	}
	info, err := e.b.BackfillAction(ctx, "orders", "g", storage.BackfillCancel)
	if err != nil || info.State != storage.BackfillCancelled {
		t.Fatalf("cancel: %+v, %v", info, err)
	}
	if _, err := e.b.BackfillAction(ctx, "orders", "g", "rewind"); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Errorf("unknown action: %v", err)
	}
	m := e.subscribe(SubscribeParams{Pattern: "orders", Group: "g"})
	e.waitIdle()
	if ds, _ := m.Take(nil); len(ds) != 0 {
		t.Fatalf("CANCELLED backfill delivered %d messages", len(ds))
	}
	if _, err := e.b.BackfillAction(ctx, "orders", "g", storage.BackfillResume); err != nil {
		t.Fatal(err)
	}
	ds := recv(t, m, 4)
	if ds[0].Offset != 1 {
		t.Errorf("first backfill offset %d, want 1 (the newest 4 of 5)", ds[0].Offset)
	}
	ack(t, m, ds...)
	info, err = e.b.GroupBackfill(ctx, "orders", "g")
	if err != nil || info.State != storage.BackfillCompleted || info.Processed != 4 || info.Total != 4 || info.Skipped != 1 {
		t.Fatalf("backfill after the acks: %+v, %v", info, err)
	}
	if _, err := e.b.BackfillAction(ctx, "orders", "g", storage.BackfillCancel); !errors.Is(err, storage.ErrInvalidTransition) {
		t.Errorf("cancel of a COMPLETED backfill: %v, want ErrInvalidTransition", err)
	}
	if c := e.b.BackfillCounters(); c.Claimed != 4 {
		t.Errorf("range messages claimed: %d, want 4", c.Claimed)
	}
}
