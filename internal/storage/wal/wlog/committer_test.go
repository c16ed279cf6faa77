package wlog_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
	"github.com/spoolmq/spool/internal/storage/wal/wlog/wlogtest"
	"github.com/spoolmq/spool/internal/testutil"
)

// TestConcurrentAppenders checks under -race that concurrent Append calls get dense, unique
// indexes, contiguous per call, with the right content, while readers, Cut and DeleteBefore run.
func TestConcurrentAppenders(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := wlog.Options{SegmentBytes: 4096}
	c := newCommitter(t, wlog.CommitterOptions{})
	l := openLog(t, dir, opts)

	const writers, calls = 8, 60
	type call struct{ first, n int64 }
	results := make([][]call, writers)
	// Record bodies say who wrote them: writer, call, position in the call.
	mkBody := func(w, k, j int) []byte {
		b := make([]byte, 12+w)
		binary.LittleEndian.PutUint32(b[0:], uint32(w))
		binary.LittleEndian.PutUint32(b[4:], uint32(k))
		binary.LittleEndian.PutUint32(b[8:], uint32(j))
		return b
	}
	var stop atomic.Bool
	var bg sync.WaitGroup
	// Readers: whatever NextIndex says is there must be readable.
	for range 2 {
		bg.Go(func() {
			for !stop.Load() {
				next := l.NextIndex()
				if next == 0 {
					continue
				}
				recs, err := l.Read(next-1, 1, 0)
				if errors.Is(err, storage.ErrOffsetOutOfRange) {
					continue // deleted by DeleteBefore meanwhile
				}
				if err != nil || len(recs) != 1 {
					t.Errorf("Read(NextIndex-1 = %d) = %d records, %v", next-1, len(recs), err)
					return
				}
				if _, err := l.SearchTime(int64(next)); err != nil {
					t.Errorf("SearchTime: %v", err)
					return
				}
				_ = l.Segments()
			}
		})
	}
	// Maintenance: Cut and retention while appending.
	bg.Go(func() {
		for !stop.Load() {
			if err := l.Cut(); err != nil {
				t.Errorf("Cut: %v", err)
				return
			}
			if _, _, err := l.DeleteBefore(l.NextIndex() / 2); err != nil {
				t.Errorf("DeleteBefore: %v", err)
				return
			}
		}
	})

	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for k := range calls {
				n := 1 + rng.IntN(5)
				recs := make([]wlog.Record, n)
				for j := range recs {
					recs[j] = wlog.Record{Timestamp: time.Now().UnixNano(), Body: mkBody(w, k, j)}
				}
				first, err := c.Append(context.Background(), l, recs)
				if err != nil {
					t.Errorf("writer %d: Append: %v", w, err)
					return
				}
				results[w] = append(results[w], call{first, int64(n)})
				// Our own records are readable once Append returned, unless retention took them.
				got, err := l.Read(first, n, 0)
				if errors.Is(err, storage.ErrOffsetOutOfRange) {
					continue
				}
				if err != nil || len(got) != n {
					t.Errorf("writer %d: Read own records at %d: %d, %v", w, first, len(got), err)
					return
				}
				for j, r := range got {
					if string(r.Body) != string(mkBody(w, k, j)) {
						t.Errorf("writer %d call %d: record %d has someone else's body", w, k, j)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	stop.Store(true)
	bg.Wait()
	if t.Failed() {
		return
	}

	// Dense and unique: the calls tile [0, NextIndex) exactly.
	var all []call
	for _, r := range results {
		all = append(all, r...)
	}
	slices.SortFunc(all, func(a, b call) int { return int(a.first - b.first) })
	next := int64(0)
	for _, cl := range all {
		if cl.first != next {
			t.Fatalf("call at index %d, want %d: indexes not dense or not unique", cl.first, next)
		}
		next += cl.n
	}
	if l.NextIndex() != next {
		t.Fatalf("NextIndex = %d, calls cover %d", l.NextIndex(), next)
	}

	// Everything still retained survives a reopen.
	first := l.FirstIndex()
	want, err := l.Read(first, int(next-first), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2 := openLog(t, dir, opts)
	got, err := l2.Read(first, int(next-first), 0)
	if err != nil || len(got) != len(want) || l2.NextIndex() != next {
		t.Fatalf("after reopen: %d records (want %d), NextIndex %d, %v", len(got), len(want), l2.NextIndex(), err)
	}
	for i := range got {
		if got[i].Timestamp != want[i].Timestamp || string(got[i].Body) != string(want[i].Body) {
			t.Fatalf("record %d differs after reopen", first+int64(i))
		}
	}
}

func TestOneCommitterManyLogs(t *testing.T) {
	t.Parallel()
	var rounds, maxLogs atomic.Int64
	c := newCommitter(t, wlog.CommitterOptions{OnSync: func(_ time.Duration, _ int, logs int) {
		rounds.Add(1)
		if int64(logs) > maxLogs.Load() {
			maxLogs.Store(int64(logs))
		}
	}})
	logs := make([]*wlog.Log, 4)
	for i := range logs {
		logs[i] = openLog(t, t.TempDir(), wlog.Options{SegmentBytes: 2048})
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			l := logs[g%len(logs)]
			for i := range 40 {
				if _, err := c.Append(context.Background(), l, []wlog.Record{{Timestamp: int64(i), Body: []byte(fmt.Sprintf("g%d-%d", g, i))}}); err != nil {
					t.Errorf("Append: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	for i, l := range logs {
		if l.NextIndex() != 80 {
			t.Errorf("log %d NextIndex = %d, want 80", i, l.NextIndex())
		}
		if err := l.Verify(); err != nil {
			t.Errorf("log %d: %v", i, err)
		}
	}
	if rounds.Load() == 0 {
		t.Fatal("OnSync never called")
	}
}

// TestGroupCommit holds the first sync until nine more appends are queued: they must all be
// written and synced in the next round, with one fdatasync.
func TestGroupCommit(t *testing.T) {
	t.Parallel()
	blocked := make(chan struct{})
	release := make(chan struct{})
	var syncs atomic.Int64
	efs := wlogtest.NewErrorFS(nil, nil)
	l := openLog(t, t.TempDir(), wlog.Options{FS: efs})
	efs.SetInjector(func(op wlogtest.Op, _ string) error {
		if op == wlogtest.OpSync && syncs.Add(1) == 1 {
			close(blocked)
			<-release
		}
		return nil
	})
	type round struct{ records, logs int }
	roundsCh := make(chan round, 10)
	c := newCommitter(t, wlog.CommitterOptions{OnSync: func(_ time.Duration, records, logs int) {
		roundsCh <- round{records, logs}
	}})
	results := make(chan error, 10)
	done := func(_ int64, err error) { results <- err }
	c.AppendAsync(l, []wlog.Record{rec(0)}, done)
	<-blocked
	for i := int64(1); i < 10; i++ {
		c.AppendAsync(l, []wlog.Record{rec(i)}, done)
	}
	close(release)
	for range 10 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	if r := <-roundsCh; r != (round{1, 1}) {
		t.Fatalf("first round = %+v, want 1 record", r)
	}
	if r := <-roundsCh; r != (round{9, 1}) {
		t.Fatalf("second round = %+v, want the 9 queued records in one round", r)
	}
	if n := syncs.Load(); n != 2 {
		t.Fatalf("%d syncs for 2 rounds", n)
	}
	checkRecords(t, l, 0, 10)
}

func TestStickySyncError(t *testing.T) {
	t.Parallel()
	testSticky(t, wlogtest.OpSync)
}

func TestStickyWriteError(t *testing.T) {
	t.Parallel()
	testSticky(t, wlogtest.OpWrite)
}

// testSticky fails the 1st op after 5 good records: the append fails, and so does every later
// one with the same error although the filesystem works again (FailNth fails one call only), so
// nothing retried. Reads of earlier records keep working; a reopen keeps them.
func testSticky(t *testing.T, op wlogtest.Op) {
	dir := t.TempDir()
	efs := wlogtest.NewErrorFS(nil, nil)
	c := newCommitter(t, wlog.CommitterOptions{})
	l := openLog(t, dir, wlog.Options{FS: efs})
	appendRange(t, c, l, 0, 5)
	efs.SetInjector(wlogtest.FailNth(op, 1, wlogtest.ErrInjected))

	_, err := c.Append(context.Background(), l, []wlog.Record{rec(5)})
	if !errors.Is(err, wlogtest.ErrInjected) || errors.Is(err, wlog.ErrFailed) {
		t.Fatalf("Append with failing %s: %v, want the injected error (not ErrFailed: it was written)", op, err)
	}
	for i := range 3 {
		_, err2 := c.Append(context.Background(), l, []wlog.Record{rec(5)})
		if !errors.Is(err2, wlogtest.ErrInjected) || !errors.Is(err2, wlog.ErrFailed) || !strings.HasSuffix(err2.Error(), err.Error()) {
			t.Fatalf("Append %d after the failure: %v, want the sticky %v", i, err2, err)
		}
	}
	asyncErr := make(chan error, 1)
	c.AppendAsync(l, []wlog.Record{rec(5)}, func(_ int64, err error) { asyncErr <- err })
	if err := <-asyncErr; !errors.Is(err, wlogtest.ErrInjected) || !errors.Is(err, wlog.ErrFailed) {
		t.Fatalf("AppendAsync after the failure: %v", err)
	}
	if err := l.Cut(); !errors.Is(err, wlogtest.ErrInjected) || !errors.Is(err, wlog.ErrFailed) {
		t.Fatalf("Cut after the failure: %v", err)
	}
	if !errors.Is(l.Err(), wlogtest.ErrInjected) {
		t.Fatalf("Err() = %v", l.Err())
	}
	checkRecords(t, l, 0, 5)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	efs.SetInjector(nil)
	l2 := openLog(t, dir, wlog.Options{})
	// Record 5 may or may not have reached the disk; the first five must be there.
	if n := l2.NextIndex(); n != 5 && n != 6 {
		t.Fatalf("NextIndex after reopen = %d", n)
	}
	checkRecords(t, l2, 0, l2.NextIndex())
	appendRange(t, c, l2, l2.NextIndex(), l2.NextIndex()+3)
}

// TestStickyErrorOnNewSegment fails the creation of the next segment during a round.
func TestStickyErrorOnNewSegment(t *testing.T) {
	t.Parallel()
	efs := wlogtest.NewErrorFS(nil, nil)
	c := newCommitter(t, wlog.CommitterOptions{})
	l := openLog(t, t.TempDir(), wlog.Options{FS: efs, SegmentBytes: 1024})
	efs.SetInjector(wlogtest.FailFrom(wlogtest.OpRename, 1, wlogtest.ErrInjected))
	var err error
	for i := int64(0); i < 100 && err == nil; i++ {
		_, err = c.Append(context.Background(), l, []wlog.Record{rec(i)})
	}
	if !errors.Is(err, wlogtest.ErrInjected) {
		t.Fatalf("appends past the first segment: %v, want the injected rename error", err)
	}
	if _, err := c.Append(context.Background(), l, []wlog.Record{rec(0)}); !errors.Is(err, wlogtest.ErrInjected) {
		t.Fatalf("later Append: %v, want the sticky error", err)
	}
}

func TestAppendValidation(t *testing.T) {
	t.Parallel()
	c := newCommitter(t, wlog.CommitterOptions{})
	l := openLog(t, t.TempDir(), wlog.Options{MaxRecordBytes: 100})
	appendRange(t, c, l, 0, 2)
	_, err := c.Append(context.Background(), l, []wlog.Record{rec(2), {Body: make([]byte, 101)}})
	if !errors.Is(err, storage.ErrMessageTooLarge) {
		t.Fatalf("oversize record: %v, want ErrMessageTooLarge", err)
	}
	if first, err := c.Append(context.Background(), l, nil); err != nil || first != 2 {
		t.Fatalf("empty Append = %d, %v; want NextIndex 2", first, err)
	}
	type result struct {
		first int64
		err   error
	}
	res := make(chan result, 1)
	c.AppendAsync(l, nil, func(first int64, err error) { res <- result{first, err} })
	if r := <-res; r.err != nil || r.first != 2 {
		t.Fatalf("empty AppendAsync = %+v; want NextIndex 2", r)
	}
	c.AppendAsync(l, []wlog.Record{{Body: make([]byte, 101)}}, func(first int64, err error) { res <- result{first, err} })
	if r := <-res; !errors.Is(r.err, storage.ErrMessageTooLarge) {
		t.Fatalf("oversize AppendAsync = %+v; want ErrMessageTooLarge", r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Append(ctx, l, []wlog.Record{rec(2)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Append with a done context: %v", err)
	}
	other := newCommitter(t, wlog.CommitterOptions{})
	if _, err := other.Append(context.Background(), l, []wlog.Record{rec(2)}); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("Append through a second committer: %v, want ErrInvalidArgument", err)
	}
	checkRecords(t, l, 0, 2)
	appendRange(t, c, l, 2, 3)
}

func TestCommitterClose(t *testing.T) {
	t.Parallel()
	c := wlog.NewCommitter(wlog.CommitterOptions{})
	l := openLog(t, t.TempDir(), wlog.Options{})
	results := make(chan error, 50)
	for i := range int64(50) {
		c.AppendAsync(l, []wlog.Record{rec(i)}, func(_ int64, err error) { results <- err })
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for range 50 {
		if err := <-results; err != nil {
			t.Fatalf("queued append failed on Close: %v", err)
		}
	}
	checkRecords(t, l, 0, 50)
	if _, err := c.Append(context.Background(), l, []wlog.Record{rec(50)}); !errors.Is(err, storage.ErrClosed) {
		t.Fatalf("Append after committer Close: %v, want ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestSyncNone(t *testing.T) {
	t.Parallel()
	efs := wlogtest.NewErrorFS(nil, nil)
	dir := t.TempDir()
	c := newCommitter(t, wlog.CommitterOptions{Sync: wlog.SyncNone})
	l := openLog(t, dir, wlog.Options{FS: efs})
	before := efs.Count(wlogtest.OpSync)
	appendRange(t, c, l, 0, 20)
	if n := efs.Count(wlogtest.OpSync) - before; n != 0 {
		t.Fatalf("SyncNone made %d syncs", n)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	checkRecords(t, openLog(t, dir, wlog.Options{}), 0, 20)
}

// TestGatherKeepsSynchronousAppendersTogether: prompt appenders (each waits for its append before
// queueing the next) share every round. Without the gather they split into alternating rounds
// (those completed by a round come back while the next one, started with whoever was queued,
// syncs), and a round carries about half of them.
func TestGatherKeepsSynchronousAppendersTogether(t *testing.T) {
	t.Parallel()
	efs := wlogtest.NewErrorFS(nil, nil)
	l := openLog(t, t.TempDir(), wlog.Options{FS: efs})
	efs.SetInjector(func(op wlogtest.Op, _ string) error {
		if op == wlogtest.OpSync {
			time.Sleep(2 * time.Millisecond) // a slow disk: the appenders come back well within a sync
		}
		return nil
	})
	var rounds, records atomic.Int64
	c := newCommitter(t, wlog.CommitterOptions{OnSync: func(_ time.Duration, n, _ int) {
		rounds.Add(1)
		records.Add(int64(n))
	}})
	const appenders, calls = 8, 40
	var wg sync.WaitGroup
	for a := range appenders {
		wg.Go(func() {
			done := make(chan error, 1)
			for k := range calls {
				c.AppendAsyncWith(l, []wlog.Record{rec(int64(a*calls + k))}, wlog.AppendOptions{Prompt: true},
					func(_ int64, err error) { done <- err })
				if err := <-done; err != nil {
					t.Errorf("append: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	// OnSync runs after a round's requests complete: stop the committer so the last one counted.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := records.Load(); got != appenders*calls {
		t.Fatalf("%d records in the rounds, want %d", got, appenders*calls)
	}
	// The first rounds form the group; a late appender now and then makes an extra round.
	if mean := float64(records.Load()) / float64(rounds.Load()); mean < 0.75*appenders {
		t.Fatalf("%d rounds for %d records: %.1f records per round, want most of the %d appenders in each",
			rounds.Load(), records.Load(), mean, appenders)
	}
}

// TestLogsOfARoundCompleteAlone: a round that carries two logs completes each log's appends when
// that log's own sync returns. Log b's syncs are held at the filesystem seam; an append to log a
// that shares b's round completes (and is readable) while b's sync is still held.
func TestLogsOfARoundCompleteAlone(t *testing.T) {
	t.Parallel()
	dirA, dirB := t.TempDir(), t.TempDir()
	efs := wlogtest.NewErrorFS(nil, nil)
	a := openLog(t, dirA, wlog.Options{FS: efs})
	b := openLog(t, dirB, wlog.Options{FS: efs})
	tokens := make(chan struct{}) // one per sync of b let through
	held := make(chan struct{}, 16)
	stop := make(chan struct{})
	var stopOnce sync.Once
	efs.SetInjector(func(op wlogtest.Op, path string) error {
		if op == wlogtest.OpSync && strings.HasPrefix(path, dirB) {
			held <- struct{}{}
			select {
			case <-tokens:
			case <-stop:
			}
		}
		return nil
	})
	type round struct{ records, logs int }
	rounds := make(chan round, 10)
	c := newCommitter(t, wlog.CommitterOptions{OnSync: func(_ time.Duration, records, logs int) {
		rounds <- round{records, logs}
	}})
	t.Cleanup(func() { stopOnce.Do(func() { close(stop) }) }) // runs before the committer closes
	resA, resB := make(chan error, 1), make(chan error, 2)
	c.AppendAsync(b, []wlog.Record{rec(0)}, func(_ int64, err error) { resB <- err })
	<-held // round 1 (b alone) is syncing b: the next appends queue together
	c.AppendAsync(a, []wlog.Record{rec(0)}, func(_ int64, err error) { resA <- err })
	c.AppendAsync(b, []wlog.Record{rec(1)}, func(_ int64, err error) { resB <- err })
	tokens <- struct{}{} // round 1 ends
	if err := <-resB; err != nil {
		t.Fatal(err)
	}
	<-held // round 2 (a and b) is syncing b
	select {
	case err := <-resA:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second): // b's sync is held: only a's own sync may release a
		t.Fatal("the append to a waited for the sync of b")
	}
	if a.NextIndex() != 1 || b.NextIndex() != 1 {
		t.Fatalf("NextIndex a = %d, b = %d while b's second sync is held; want 1 and 1", a.NextIndex(), b.NextIndex())
	}
	select {
	case err := <-resB:
		t.Fatalf("the append to b completed before its sync: %v", err)
	default:
	}
	tokens <- struct{}{}
	if err := <-resB; err != nil {
		t.Fatal(err)
	}
	if b.NextIndex() != 2 {
		t.Fatalf("b NextIndex = %d, want 2", b.NextIndex())
	}
	if r1, r2 := <-rounds, <-rounds; r1 != (round{1, 1}) || r2 != (round{2, 2}) {
		t.Fatalf("rounds %+v, %+v; want one record of one log, then two records of two logs", r1, r2)
	}
	stopOnce.Do(func() { close(stop) })
}

// TestSlowRoundIsLogged: a round over CommitterOptions.SlowSync is logged with its phases, so that
// a latency tail can be traced to the disk (sync) or to the process (other: completing the
// requests, waiting for a CPU); a quick round is not.
func TestSlowRoundIsLogged(t *testing.T) {
	t.Parallel()
	const slow = 40 * time.Millisecond
	var slowSync atomic.Bool
	efs := wlogtest.NewErrorFS(nil, func(op wlogtest.Op, _ string) error {
		if op == wlogtest.OpSync && slowSync.Load() {
			time.Sleep(2 * slow)
		}
		return nil
	})
	var out testutil.SyncBuffer
	logger := slog.New(slog.NewJSONHandler(&out, nil))
	l := openLog(t, t.TempDir(), wlog.Options{FS: efs, Logger: logger})
	c := newCommitter(t, wlog.CommitterOptions{SlowSync: slow, Logger: logger})
	rounds := func() []map[string]any {
		var got []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var m map[string]any
			if line != "" && json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "wal commit round slow" {
				got = append(got, m)
			}
		}
		return got
	}
	phase := func(m map[string]any, key string) time.Duration {
		v, ok := m[key].(float64) // slog's JSON handler writes durations in nanoseconds
		if !ok {
			t.Fatalf("no %q in %v", key, m)
		}
		return time.Duration(v)
	}

	if _, err := c.Append(context.Background(), l, []wlog.Record{rec(0)}); err != nil {
		t.Fatal(err)
	}
	if got := rounds(); len(got) != 0 {
		t.Fatalf("a quick round logged %v", got)
	}

	// A slow fdatasync: the sync phase.
	slowSync.Store(true)
	if _, err := c.Append(context.Background(), l, []wlog.Record{rec(1)}); err != nil {
		t.Fatal(err)
	}
	slowSync.Store(false)
	// The round logs after it completed its requests.
	testutil.Eventually(t, 10*time.Second, "the slow round logged", func() error {
		if n := len(rounds()); n != 1 {
			return fmt.Errorf("%d slow rounds logged", n)
		}
		return nil
	})
	got := rounds()
	if len(got) != 1 || phase(got[0], "sync") < 2*slow || phase(got[0], "took") < phase(got[0], "sync") || phase(got[0], "other") > slow {
		t.Fatalf("slow sync logged %v, want one round with its time in sync", got)
	}
	if !strings.Contains(out.String(), `"msg":"wal sync slow"`) {
		t.Fatalf("no sync warning in %s", out.String())
	}

	// A slow completion: the other phase.
	done := make(chan error, 1)
	c.AppendAsync(l, []wlog.Record{rec(2)}, func(_ int64, err error) {
		time.Sleep(2 * slow)
		done <- err
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the second slow round logged", func() error {
		if n := len(rounds()); n != 2 {
			return fmt.Errorf("%d slow rounds logged", n)
		}
		return nil
	})
	if m := rounds()[1]; phase(m, "other") < 2*slow || phase(m, "sync") > slow {
		t.Fatalf("slow completion logged %v, want its time in other", m)
	}
}
