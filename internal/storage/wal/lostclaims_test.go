package wal

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

// errLostPower is what the syncs of a lossyFS return once it crashed.
var errLostPower = errors.New("lossyfs: power lost")

// lossyFS is the OS filesystem seen through a page cache that a test can lose. It remembers the
// byte ranges written to each file since the file's last successful sync. Stall makes syncs block;
// Crash makes every blocked and later sync fail (nothing written after the last successful sync
// reaches the disk); once the engine is closed, Lose overwrites those ranges with zeros, which is
// what the zero-filled log segments held before, and resets the FS for the next Open. A sync that
// returns nil completed before Crash, so whatever the engine saw as durable stays.
type lossyFS struct {
	wlog.FS
	mu      sync.Mutex
	files   map[string]*lossyNode // by current path
	stalled chan struct{}         // closed by Crash; nil when not stalled
	crashed bool
}

// lossyNode is a file (it keeps its identity across renames) and the byte ranges [offset, end)
// written to it and not synced.
type lossyNode struct {
	path  string
	dirty [][2]int64
}

// lossyHarness is a harness over a lossyFS. When the test ends, stalled syncs are released
// before the engine is closed, so that a failing test does not hang in Close.
func lossyHarness(t testing.TB, mods ...func(*Config)) (*harness, *lossyFS) {
	l := &lossyFS{FS: wlog.OSFS(), files: map[string]*lossyNode{}}
	h := newHarness(t, append([]func(*Config){func(c *Config) { c.FS = l }}, mods...)...)
	t.Cleanup(l.Crash) // cleanups run last-registered first: before the harness's Close
	return h, l
}

// Stall makes every sync from now on block until Crash.
func (l *lossyFS) Stall() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stalled = make(chan struct{})
}

// Crash makes every blocked and later sync fail: what was not synced is lost.
func (l *lossyFS) Crash() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.crashed = true
	if l.stalled != nil {
		close(l.stalled)
		l.stalled = nil
	}
}

// Lose zeroes every byte range written after its file's last successful sync (call it once the
// engine is closed) and makes the FS ready for the next Open. It returns how many bytes it lost.
// (Renames and removals are kept: the engine syncs the directory right after them.)
func (l *lossyFS) Lose(t testing.TB) int64 {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var lost int64
	for _, n := range l.files {
		if len(n.dirty) == 0 {
			continue
		}
		f, err := os.OpenFile(n.path, os.O_WRONLY, 0)
		if err != nil {
			t.Fatalf("lossyfs: %v", err)
		}
		for _, r := range n.dirty {
			if _, err := f.WriteAt(make([]byte, r[1]-r[0]), r[0]); err != nil {
				t.Fatalf("lossyfs: %v", err)
			}
			lost += r[1] - r[0]
		}
		f.Close()
	}
	clear(l.files)
	l.crashed = false
	return lost
}

func (l *lossyFS) OpenFile(name string, flag int, perm fs.FileMode) (wlog.File, error) {
	f, err := l.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.files[name]
	if n == nil {
		n = &lossyNode{path: name}
		l.files[name] = n
	}
	return &lossyFile{File: f, l: l, n: n}, nil
}

func (l *lossyFS) Rename(oldpath, newpath string) error {
	if err := l.FS.Rename(oldpath, newpath); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.files[oldpath]; n != nil {
		delete(l.files, oldpath)
		n.path = newpath
		l.files[newpath] = n
	}
	return nil
}

func (l *lossyFS) Remove(name string) error {
	if err := l.FS.Remove(name); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.files[name]; n != nil {
		n.dirty = nil
		delete(l.files, name)
	}
	return nil
}

type lossyFile struct {
	wlog.File
	l *lossyFS
	n *lossyNode
}

func (f *lossyFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.File.WriteAt(p, off)
	f.l.mu.Lock()
	f.n.dirty = append(f.n.dirty, [2]int64{off, off + int64(n)})
	f.l.mu.Unlock()
	return n, err
}

func (f *lossyFile) Sync() error     { return f.sync(f.File.Sync) }
func (f *lossyFile) Datasync() error { return f.sync(f.File.Datasync) }

func (f *lossyFile) sync(do func() error) error {
	l := f.l
	l.mu.Lock()
	stalled := l.stalled
	l.mu.Unlock()
	if stalled != nil {
		<-stalled
	}
	l.mu.Lock()
	if l.crashed {
		l.mu.Unlock()
		return errLostPower
	}
	n := len(f.n.dirty)
	l.mu.Unlock()
	err := do()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.crashed {
		return errLostPower
	}
	if err == nil {
		// Writes to a log and its syncs are serialized, so the ranges counted before the sync are
		// the ones it made durable (a later one stays dirty: lost, the safe direction).
		f.n.dirty = f.n.dirty[n:]
	}
	return err
}

// powerLoss crashes the engine of h the way a power loss would (everything not synced is lost,
// including claim records whose deliveries were handed out) and opens it again.
func (h *harness) powerLoss(l *lossyFS, seen *attempts) int64 {
	h.t.Helper()
	seen.crashed()
	l.Crash()
	h.e.crashForTest()
	lost := l.Lose(h.t)
	h.open()
	return lost
}

// noWait runs a claim that must not wait for an fsync: while the disk is stalled it returns at
// once, so the timeout only catches a claim that blocks on the stalled sync.
func noWait(t *testing.T, h *harness, p storage.DeliveriesClaimParams) []*storage.Delivery {
	t.Helper()
	type result struct {
		res *storage.DeliveriesClaimResult
		err error
	}
	ch := make(chan result, 1)
	go func() {
		res, err := h.e.DeliveriesClaim(h.ctx, &p)
		ch <- result{res, err}
	}()
	select {
	case r := <-ch:
		h.must(r.err, "claim")
		return r.res.Deliveries
	case <-time.After(20 * time.Second):
		t.Fatalf("claim %+v blocked on the stalled disk: it waited for an fsync", p)
		return nil
	}
}

type msgKey struct {
	p int32
	o int64
}

// attempts records the attempt numbers handed out per message and checks BRIEF.md invariant 3:
// a message never gets an attempt number twice, and after a crash every delivery carries a higher
// attempt than every delivery before the crash. With ordered (one goroutine claims), every
// delivery must also carry a higher attempt than the one before it; concurrent claimers cannot
// check that (a lease may expire and be claimed again before its first claimer records it).
type attempts struct {
	ordered bool
	mu      sync.Mutex
	before  map[msgKey]int          // highest attempt handed out before the last crash
	got     map[msgKey]map[int]bool // every attempt handed out
	last    map[msgKey]int          // last attempt recorded (ordered)
}

func newAttempts(ordered bool) *attempts {
	return &attempts{ordered: ordered, before: map[msgKey]int{}, got: map[msgKey]map[int]bool{}, last: map[msgKey]int{}}
}

func (a *attempts) saw(t testing.TB, ds []*storage.Delivery, when string) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, d := range ds {
		k := msgKey{d.Partition, d.Offset}
		if prev, ok := a.before[k]; ok && d.Attempt <= prev {
			t.Errorf("%s: message %d:%d delivered with attempt %d, after a delivery with attempt %d before the crash", when, d.Partition, d.Offset, d.Attempt, prev)
		}
		if a.got[k][d.Attempt] {
			t.Errorf("%s: message %d:%d delivered twice with attempt %d", when, d.Partition, d.Offset, d.Attempt)
		}
		if prev, ok := a.last[k]; a.ordered && ok && d.Attempt <= prev {
			t.Errorf("%s: message %d:%d delivered with attempt %d, after a delivery with attempt %d", when, d.Partition, d.Offset, d.Attempt, prev)
		}
		if a.got[k] == nil {
			a.got[k] = map[int]bool{}
		}
		a.got[k][d.Attempt] = true
		a.last[k] = d.Attempt
	}
}

// crashed marks a crash: every later delivery must carry a higher attempt than all before it.
func (a *attempts) crashed() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, set := range a.got {
		for n := range set {
			a.before[k] = max(a.before[k], n)
		}
	}
}

// TestCrashLosingClaimRecords: claims whose state records never reach the disk (the disk stalls
// after the last durable call, then the power goes) hand out new messages below the claim
// horizon, redeliveries after a nack and redeliveries after a lease expiry, without waiting for an
// fsync. After the crash every message comes back, and each one delivered before it carries a
// higher attempt number than its last delivery. A redelivery of a message whose previous delivery
// is not durably recorded yet waits instead (it never reaches the consumer here).
func TestCrashLosingClaimRecords(t *testing.T) {
	t.Parallel()
	h, lfs := lossyHarness(t)
	h.createTopic("jobs", storage.TopicConfig{Partitions: 2, MaxDeliveries: 10, AckWait: 30 * time.Second})
	q := h.queueSub("jobs")
	h.publishN("jobs", 100)
	seen := newAttempts(true)

	// Durable part: 20 deliveries (the first claim waits for the first horizon record), 5 acks,
	// 5 nacks (both durable, and with them every record queued before).
	first := h.claim(q.ID, "a", 20)
	seen.saw(t, first, "before the crash")
	h.ack(q.ID, refs(first[:5])...)
	nr, err := h.e.DeliveriesNack(h.ctx, &storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "a", Refs: refs(first[5:10])})
	h.must(err, "nack")
	equal(t, nr.Nacked, 5, "nacked")
	durable := h.stats(q.ID)

	// From here nothing reaches the disk.
	lfs.Stall()
	// The 5 nacked messages again (attempt 2) and 5 new ones (attempt 1).
	ds := noWait(t, h, storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "b", Max: 10, LeaseDuration: time.Hour})
	equal(t, len(ds), 10, "claimed while stalled")
	equal(t, len(withAttempt(ds, 2)), 5, "redeliveries after the nack")
	seen.saw(t, ds, "while stalled")
	// The leases of a's other 10 expire: redelivered after the backoff (attempt 2).
	h.clock.Advance(35 * time.Second)
	ds = noWait(t, h, storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "c", Max: 10})
	equal(t, len(withAttempt(ds, 2)), 10, "redeliveries after the lease expiry")
	seen.saw(t, ds, "while stalled")
	// More new messages: 30.
	for range 3 {
		seen.saw(t, noWait(t, h, storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "d", Max: 10}), "while stalled")
	}
	// b leaves: its leases are due again. Their deliveries are not durably recorded, so a claim
	// that takes them waits for the stalled disk, and fails when the power goes.
	_, err = h.e.DeliveriesRelease(h.ctx, &storage.DeliveriesReleaseParams{SubscriptionID: q.ID, Member: "b"})
	h.must(err, "release")
	guarded := waitingClaim(t, h, storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "e", Max: 10}, 10)

	lost := h.powerLoss(lfs, seen)
	guarded.failed(t)
	if lost == 0 {
		t.Fatal("the crash lost nothing")
	}
	// The claims made while stalled are gone from the state: the cursors are where the durable
	// calls left them.
	after := h.stats(q.ID)
	for i := range after.Partitions {
		equal(t, after.Partitions[i].Cursor, durable.Partitions[i].Cursor, fmt.Sprintf("cursor of partition %d after the crash", i))
	}

	got := h.claimAll(q.ID, "z")
	seen.saw(t, got, "after the crash")
	equal(t, len(got), 95, "every message not acked is delivered again")
	for _, d := range got {
		if d.Attempt < 2 {
			// Messages up to the horizon may have been delivered: none comes back as attempt 1.
			t.Errorf("message %d:%d: attempt %d after the crash, want >= 2", d.Partition, d.Offset, d.Attempt)
		}
	}
}

// blocked is a claim that waits for an fsync of the stalled disk.
type blocked chan error

// waitingClaim starts a claim of n messages that must wait for the stalled disk: once the engine
// has leased them (stats), the call must still be running (it cannot return before the sync it
// waits for, which is stalled).
func waitingClaim(t *testing.T, h *harness, p storage.DeliveriesClaimParams, n int64) blocked {
	t.Helper()
	ch := make(blocked, 1)
	inFlight := h.stats(p.SubscriptionID).InFlight
	go func() {
		res, err := h.e.DeliveriesClaim(h.ctx, &p)
		if err == nil {
			err = fmt.Errorf("%d deliveries handed out", len(res.Deliveries))
		}
		ch <- err
	}()
	eventually(t, "the claim to lease its messages", func() bool { return h.stats(p.SubscriptionID).InFlight == inFlight+n })
	select {
	case err := <-ch:
		t.Fatalf("claim %+v returned before its fsync: %v", p, err)
	default:
	}
	return ch
}

// failed checks that the claim failed when the power went: it never handed out its deliveries.
func (b blocked) failed(t *testing.T) {
	t.Helper()
	if err := <-b; !errors.Is(err, errLostPower) {
		t.Fatalf("the claim waiting for the lost disk: %v, want an error wrapping %v", err, errLostPower)
	}
}

// TestClaimHorizon: new messages below the durable claim horizon are handed out without waiting;
// a claim that reaches the horizon waits for the next horizon record (which the claims before it
// queued ahead), so no message at or beyond a durable horizon is ever handed out. After a crash
// only the messages below the horizon count as possibly delivered (attempt 2).
func TestClaimHorizon(t *testing.T) {
	t.Parallel()
	h, lfs := lossyHarness(t, func(c *Config) { c.claimHorizon = 8 })
	h.createTopic("h", storage.TopicConfig{MaxDeliveries: 10})
	q := h.queueSub("h")
	h.publishN("h", 40)
	seen := newAttempts(true)
	ds := h.claim(q.ID, "a", 2) // offsets 0, 1; records horizon 2+8 and waits for it
	seen.saw(t, ds, "before the crash")
	h.ack(q.ID, refs(ds)...)
	equal(t, h.e.subs[q.ID].durableHorizon(0).Load(), int64(10), "durable horizon")

	lfs.Stall()
	for range 2 { // offsets 2..9; the second claim queues horizon 18
		ds := noWait(t, h, storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "a", Max: 4})
		equal(t, len(ds), 4, "claimed below the horizon")
		seen.saw(t, ds, "while stalled")
	}
	// Offsets 10 and 11 are at the durable horizon: the claim waits for horizon 18.
	waiting := waitingClaim(t, h, storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "a", Max: 2}, 2)
	h.powerLoss(lfs, seen)
	waiting.failed(t)

	got := h.claimAll(q.ID, "b")
	seen.saw(t, got, "after the crash")
	equal(t, len(got), 38, "redelivered")
	for _, d := range got {
		want := 1
		if d.Offset < 10 {
			want = 2
		}
		equal(t, d.Attempt, want, fmt.Sprintf("attempt of offset %d", d.Offset))
	}
}

// TestSuspectDeliveriesAreRecorded: after a crash, a message that may have been delivered before
// it (suspect: between the recovered cursor and the claim horizon) already has one unrecorded
// delivery, so its next delivery waits for its claim record: a second crash that loses the record
// must not bring it back with attempt 2 again. The same holds for a suspect message that first
// waits for its NotBefore time.
func TestSuspectDeliveriesAreRecorded(t *testing.T) {
	t.Parallel()
	h, lfs := lossyHarness(t, func(c *Config) { c.claimHorizon = 8 })
	h.createTopic("s", storage.TopicConfig{MaxDeliveries: 10})
	q := h.queueSub("s")
	h.publishN("s", 4) // offsets 0..3
	h.publish("s", storage.AppendMessage{Partition: storage.PartitionAuto, Payload: []byte("later"), NotBefore: h.clock.Now().Add(time.Minute)})
	seen := newAttempts(true)
	ds := h.claim(q.ID, "a", 2) // offsets 0 and 1; horizon 10
	seen.saw(t, ds, "before the crashes")
	h.ack(q.ID, refs(ds)...)
	seen.crashed()
	h.crash() // unclean, nothing lost: offsets 2..9 are suspect

	lfs.Stall()
	waiting := waitingClaim(t, h, storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "a", Max: 2}, 2)
	h.powerLoss(lfs, seen)
	waiting.failed(t)
	ds = h.claim(q.ID, "a", 2)
	seen.saw(t, ds, "after the second crash")
	equal(t, len(ds), 2, "suspect messages delivered")
	for _, d := range ds {
		equal(t, d.Attempt, 2, fmt.Sprintf("attempt of suspect offset %d", d.Offset))
	}
	h.ack(q.ID, refs(ds)...)

	// Offset 4 waits for its NotBefore (the claim that finds it does not wait: no delivery), then
	// its delivery waits for the record of that wait.
	lfs.Stall()
	equal(t, len(noWait(t, h, storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "a", Max: 1})), 0, "delayed")
	h.clock.Advance(2 * time.Minute)
	waiting = waitingClaim(t, h, storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "a", Max: 1}, 1)
	h.powerLoss(lfs, seen)
	waiting.failed(t)
	ds = h.claimAll(q.ID, "a")
	seen.saw(t, ds, "after the third crash")
	equal(t, len(ds), 1, "the delayed message")
	equal(t, string(ds[0].Payload), "later", "payload")
	equal(t, ds[0].Attempt, 2, "attempt of the suspect delayed message")
}

// withAttempt returns the deliveries of ds with attempt n.
func withAttempt(ds []*storage.Delivery, n int) []*storage.Delivery {
	var out []*storage.Delivery
	for _, d := range ds {
		if d.Attempt == n {
			out = append(out, d)
		}
	}
	return out
}

// TestCrashNeverRepeatsAnAttempt runs a random concurrent workload (claims, acks, nacks, releases,
// lease expiries, claims crossing the claim horizon) and cuts the power at random moments, losing every write not synced; across
// all crashes no message is ever delivered twice with the same attempt number, nor with a lower
// one than before.
func TestCrashNeverRepeatsAnAttempt(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 11))
			// A small claim horizon, so that claims cross it often.
			h, lfs := lossyHarness(t, func(c *Config) { c.claimHorizon = int64(4 * seed) })
			h.createTopic("w", storage.TopicConfig{Partitions: 3, MaxDeliveries: 1000, AckWait: 10 * time.Second})
			q := h.queueSub("w")
			seen := newAttempts(false)
			for epoch := range 4 {
				for range 3 { // keyless batches go to the partitions in turn
					h.publishN("w", 50)
				}
				steps := 20 + rng.IntN(100)
				var wg sync.WaitGroup
				var stop atomic.Bool
				for w := range 3 {
					wrng := rand.New(rand.NewPCG(seed*100+uint64(epoch), uint64(w)))
					member := fmt.Sprintf("m%d", w)
					wg.Go(func() { randomDeliveries(t, h, q.ID, member, wrng, seen, &stop) })
				}
				for range steps {
					// The main goroutine moves the clock (lease expiries) while the workers run.
					h.clock.Advance(time.Duration(rng.IntN(3)) * time.Second)
					time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond) // spread the crash moment
				}
				lfs.Crash()
				stop.Store(true)
				wg.Wait()
				seen.crashed()
				h.e.crashForTest()
				lfs.Lose(t)
				h.open()
			}
			seen.saw(t, h.claimAll(q.ID, "final"), "after the last crash")
		})
	}
}

// randomDeliveries claims, acks, nacks and releases for member until stop is set or the engine
// fails (the power went), recording every delivery handed out.
func randomDeliveries(t *testing.T, h *harness, sub int64, member string, rng *rand.Rand, seen *attempts, stop *atomic.Bool) {
	var held []*storage.Delivery
	for !stop.Load() {
		switch rng.IntN(8) {
		case 0, 1, 2, 3:
			res, err := h.e.DeliveriesClaim(h.ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub, Member: member, Max: 1 + rng.IntN(8), AvoidMember: rng.IntN(2) == 0})
			if err != nil {
				return
			}
			seen.saw(t, res.Deliveries, "worker claim")
			held = append(held, res.Deliveries...)
		case 4:
			if len(held) == 0 {
				continue
			}
			k := 1 + rng.IntN(len(held))
			if _, err := h.e.DeliveriesAck(h.ctx, &storage.DeliveriesAckParams{SubscriptionID: sub, Refs: refs(held[:k])}); err != nil {
				return
			}
			held = held[k:]
		case 5:
			if len(held) == 0 {
				continue
			}
			if _, err := h.e.DeliveriesNack(h.ctx, &storage.DeliveriesNackParams{SubscriptionID: sub, Member: member, Refs: refs(held[:1])}); err != nil {
				return
			}
			held = held[1:]
		case 6:
			if _, err := h.e.DeliveriesRelease(h.ctx, &storage.DeliveriesReleaseParams{SubscriptionID: sub, Member: member}); err != nil {
				return
			}
			held = nil
		case 7:
			if _, err := h.e.SubscriptionStats(h.ctx, sub); err != nil {
				return
			}
		}
	}
}
