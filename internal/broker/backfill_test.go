package broker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync/atomic"
	"syscall"
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
	if p.rate != defaultBackfillMinRate {
		t.Errorf("rate after many slow claims: %v, want the minimum %d", p.rate, defaultBackfillMinRate)
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

// claimSizes wraps the engine at the broker boundary and records the largest claim (its
// deliveries) of one subscription.
type claimSizes struct {
	storage.Engine
	sub     atomic.Int64
	largest atomic.Int64
}

func (c *claimSizes) DeliveriesClaim(ctx context.Context, p *storage.DeliveriesClaimParams) (*storage.DeliveriesClaimResult, error) {
	res, err := c.Engine.DeliveriesClaim(ctx, p)
	if err == nil && p.SubscriptionID == c.sub.Load() {
		for n := int64(len(res.Deliveries)); ; {
			cur := c.largest.Load()
			if n <= cur || c.largest.CompareAndSwap(cur, n) {
				break
			}
		}
	}
	return res, err
}

// An ORDERED group's backfill range goes through the pacer like a shared group's: no claim takes
// more than the pacer's batch of range messages, and the range is all delivered, in order.
func TestBackfillPacesOrderedGroups(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Backfill = BackfillConfig{Batch: 10} })
	cs := &claimSizes{Engine: e.b.engine}
	cs.sub.Store(-1)
	e.b.engine = cs // before any member exists: nothing else reads it yet
	e.createTopic("ord", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2})
	e.publishN("ord", "old", 60)
	m := e.subscribe(SubscribeParams{Pattern: "ord", Group: "g", MemberID: "m1", Mode: storage.ModeOrdered,
		MaxInFlight: 100, MaxInFlightPerPartition: 100, Start: storage.StartPosition{Kind: storage.FromBeginning}})
	cs.sub.Store(m.Subscriptions()[0].SubscriptionID)
	ds := recv(t, m, 60)
	next := map[int32]int64{}
	for _, d := range ds {
		if d.Offset != next[d.Partition] {
			t.Fatalf("partition %d: offset %d delivered, want %d (in order)", d.Partition, d.Offset, next[d.Partition])
		}
		next[d.Partition]++
	}
	if n := cs.largest.Load(); n > 10 {
		t.Errorf("a claim of the ordered group's range took %d messages, want at most the pacer's batch 10", n)
	}
	if c := e.b.BackfillCounters(); c.Claimed != 60 {
		t.Errorf("range messages claimed: %d, want 60", c.Claimed)
	}
	ack(t, m, ds...)
	if info, err := e.b.GroupBackfill(e.ctx(), "ord", "g"); err != nil || info.State != storage.BackfillCompleted {
		t.Errorf("backfill after the acks: %+v, %v", info, err)
	}
}

// failingClaims wraps the engine at the broker boundary: while fail is set, the range claims
// (those that name partitions) of subscription sub (0: any) fail with it, counted.
type failingClaims struct {
	storage.Engine
	sub    atomic.Int64
	fail   atomic.Pointer[error]
	failed atomic.Int64
}

func (f *failingClaims) DeliveriesClaim(ctx context.Context, p *storage.DeliveriesClaimParams) (*storage.DeliveriesClaimResult, error) {
	if err := f.fail.Load(); err != nil && (f.sub.Load() == 0 || p.SubscriptionID == f.sub.Load()) && p.Partitions != nil {
		f.failed.Add(1)
		return nil, *err
	}
	return f.Engine.DeliveriesClaim(ctx, p)
}

// Range claims that keep failing make the backfill FAILED: after backfillMaxFailures tries for an
// error that does not pass by itself (a read error of the disk), backfillMaxRetries for a
// transient one (the storage unavailable), each try after a backoff on the broker's clock; the
// reason is kept (no path), the failure counted. Resume, once claims work again, delivers the
// whole range. The fake clock only moves when the test says so: without the backoff's end no
// retry happens, so the counts are exact.
func TestBackfillFailedAndResumed(t *testing.T) {
	readErr := &storage.IOError{Reason: "input/output error", Err: &fs.PathError{Op: "read", Path: "/data/secret.seg", Err: syscall.EIO}}
	for _, c := range []struct {
		name    string
		err     error
		tries   int
		ordered bool
	}{
		{"read error", readErr, backfillMaxFailures, false},
		{"unavailable", &storage.IOError{Kind: storage.ErrUnavailable, Reason: "database unreachable", Err: errors.New("dial tcp /data/secret")}, backfillMaxRetries, false},
		{"ordered", readErr, backfillMaxFailures, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, nil)
			b, ctx := e.b, e.ctx()
			fc := &failingClaims{Engine: b.engine}
			b.engine = fc // before any member exists: nothing else reads it yet
			e.createTopic("bf", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 1})
			e.publishN("bf", "old", 5)
			fc.fail.Store(&c.err) // the group is the only subscription
			p := SubscribeParams{Pattern: "bf", Group: "g", MemberID: "m1", Start: storage.StartPosition{Kind: storage.FromBeginning}}
			if c.ordered {
				p.Mode, p.MaxInFlightPerPartition = storage.ModeOrdered, 10
			}
			m := e.subscribe(p)
			eventually(t, "backfill FAILED", func() error {
				e.clock.Advance(backfillRetryMax) // past any backoff
				b.wakeAll()
				info, err := b.GroupBackfill(ctx, "bf", "g")
				if err != nil {
					return err
				}
				// Counted right after it was recorded.
				if n := b.BackfillCounters().Failed; info.State != storage.BackfillFailed || n != 1 {
					return fmt.Errorf("backfill %s after %d failed claims, %d failures counted", info.State, fc.failed.Load(), n)
				}
				if want := fmt.Sprintf("%d range claims failed in a row", c.tries); !strings.Contains(info.Error, want) || strings.Contains(info.Error, "secret") {
					t.Errorf("FAILED backfill's error %q does not say %q, or shows a path", info.Error, want)
				}
				return nil
			})
			if n := fc.failed.Load(); n != int64(c.tries) {
				t.Errorf("range claims tried: %d, want %d", n, c.tries)
			}
			if ds, _ := m.Take(nil); len(ds) != 0 {
				t.Fatalf("a FAILED backfill delivered %d messages", len(ds))
			}
			fc.fail.Store(nil)
			if _, err := b.BackfillAction(ctx, "bf", "g", storage.BackfillResume); err != nil {
				t.Fatal(err)
			}
			ds := recv(t, m, 5)
			ack(t, m, ds...)
			info, err := b.GroupBackfill(ctx, "bf", "g")
			if err != nil || info.State != storage.BackfillCompleted || info.Processed != 5 || info.Error != "" {
				t.Fatalf("backfill after resume and acks: %+v, %v", info, err)
			}
		})
	}
}

// The rule of what passes by itself: an unavailable or full storage, rate limiting; not a
// damaged partition (unavailable until repaired), nor a plain error.
func TestTransientClaimError(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&storage.IOError{Kind: storage.ErrUnavailable, Reason: "database unreachable", Err: errors.New("x")}, true},
		{&storage.IOError{Kind: storage.ErrFull, Reason: "disk full", Err: errors.New("x")}, true},
		{fmt.Errorf("wrapped: %w", storage.ErrRateLimited), true},
		{&storage.IOError{Kind: storage.ErrUnavailable, Reason: "damaged", Err: storage.ErrPartitionDamaged}, false},
		{syscall.EIO, false},
		{storage.ErrCorrupt, false},
	} {
		if got := transientClaimError(c.err); got != c.want {
			t.Errorf("transientClaimError(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
