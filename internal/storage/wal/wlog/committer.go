package wlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// SyncMode is the committer's durability.
type SyncMode int

const (
	// SyncAlways fsyncs (fdatasync) before any commit completes. The default.
	SyncAlways SyncMode = iota
	// SyncNone never fsyncs; records are durable only as far as the OS page cache is. Named
	// UnsafeNoSync in the engine configuration.
	SyncNone
)

// CommitterOptions configures a Committer.
type CommitterOptions struct {
	// Sync is the durability. Defaults to SyncAlways.
	Sync SyncMode
	// OnSync, if set, is called from the committer goroutine after every round with its duration
	// (write and sync) and the number of records and distinct logs it made durable (metrics,
	// benchmarks). It must not block.
	OnSync func(took time.Duration, records int, logs int)
	// Logger receives slow-sync and slow-round warnings (the caller names the component). Nil
	// discards.
	Logger *slog.Logger
	// SlowSync is the duration of an fdatasync, and of a whole round, above which a warning is
	// logged ("wal sync slow" with the file, "wal commit round slow" with the round's phases).
	// Defaults to 1 s.
	SlowSync time.Duration
}

// Committer is group commit: one goroutine takes all queued appends (over any number of logs),
// writes each log's share with one write call (two when it crosses into a new segment), fdatasyncs
// each touched log once (in parallel when there are several), then completes every waiter.
// Appends that arrive during a sync are queued for the next round, so concurrent callers share
// fsyncs. A write or sync error is sticky for the log it hit: every later append to that log fails
// with it, and the sync is never retried.
//
// A log must be appended to through one committer only. All methods are safe for concurrent use.
type Committer struct {
	opts CommitterOptions
	log  *slog.Logger

	mu     sync.Mutex
	queue  []*request
	closed bool

	wake chan struct{} // capacity 1: a round is wanted
	wg   sync.WaitGroup

	// gatherable counts the queued requests with AppendOptions.Prompt, read without the lock
	// while gathering; want is, while gathering, the count that ends the wait (0 otherwise);
	// arrived (capacity 1) is signalled when it is reached.
	gatherable atomic.Int64
	want       atomic.Int64
	arrived    chan struct{}

	// Owned by the committer goroutine.
	spare  []*request
	logs   []*Log
	own    []*Log // the logs of a round that sync themselves (commit)
	buf    []byte
	expect int64         // requests expected in the next round (see gather)
	missed uint          // gathers in a row that ended before the expected requests came
	syncT  time.Duration // moving average of the sync phase
}

// logRound is the committer's per-log state during one round.
type logRound struct {
	reqs     []*request
	firstSeg *segment // active segment when the round started
	start    int64    // where the round's records start in firstSeg
	wrote    bool
	err      error
	// rides: the round is written back without a flush and made durable by another log's
	// fdatasync (Committer.shareFlush).
	rides bool
	// undone: the round cleared records it had written (undoLocked), possibly past the blocks
	// an fdatasync made durable: it syncs itself, never rides.
	undone bool
	// pins are the segments whose files the round pinned (Files), released by completeRound.
	pins []*segment
	// victims are the files of idle handles that pinning and releasing evicted (over the bound
	// of Files): completeRound closes them once Log.wmu is released and the requests completed,
	// so that no close(2) runs under the log's writer lock.
	victims []File
	// Set by Committer.finish.
	records  int           // records made durable
	gathered int64         // prompt requests
	syncT    time.Duration // the fdatasync's duration
}

// request states: the committer takes a queued request, or its waiter gives up on it first.
const (
	reqQueued int32 = iota
	reqTaken
	reqAbandoned
)

type request struct {
	l     *Log
	recs  []Record
	done  func(first int64, err error) // AppendAsync; nil for Append
	ch    chan struct{}                // Append: signalled once first and err are set
	state atomic.Int32
	// preset marks an AppendAsync whose outcome (first, err) was known when it was queued: it is
	// queued only so that done runs where the dones of its log run (AppendAsync).
	preset bool
	prompt bool // AppendOptions.Prompt
	first  int64
	err    error
	// noRoom is set by the round when the request needed a segment the log could not make
	// (ErrNoSegment): it fails alone, the round's other requests complete as usual.
	noRoom error
}

var requestPool = sync.Pool{New: func() any { return &request{ch: make(chan struct{}, 1)} }}

func getRequest(l *Log, recs []Record) *request {
	r := requestPool.Get().(*request)
	r.l, r.recs = l, recs
	r.state.Store(reqQueued)
	return r
}

func putRequest(r *request) {
	r.l, r.recs, r.done, r.first, r.err, r.preset, r.prompt, r.noRoom = nil, nil, nil, 0, nil, false, false, nil
	requestPool.Put(r)
}

// zeroAhead is how far a round writes zeros after its records into a segment that was not
// zero-filled whole (the first segment of a log, or a spare whose zeroing a roll stopped, see
// zeroSpare): writing into fallocated (unwritten) blocks makes every fdatasync commit an extent
// change to the journal, while converting them a chunk at a time costs one larger sync per chunk
// (~850 us instead of ~185 on the development VM).
const zeroAhead = 1 << 20

// ErrFailed marks an append refused because an earlier write or sync of its log failed: it wraps
// that sticky error, and nothing of the refused append was written (unlike the appends of the
// round that failed, which get the bare error and may or may not be on disk).
var ErrFailed = errors.New("wlog: log failed earlier")

// ErrNotOpened marks an append refused because the file of its log's active segment, closed while
// the log was idle (Files), could not be opened again (too many open files): it wraps the cause,
// nothing of the append was written, and the log goes on (the next append tries again).
var ErrNotOpened = errors.New("wlog: could not open the active segment, nothing written")

// ErrNoSegment marks an append that needed a new segment the log could not make (no space left,
// no file handle): it wraps the cause, nothing of the append was written, and the log goes on (the
// next round tries again, so appends resume once space is freed). The appends of the same round
// that fit before it are written and synced as usual.
var ErrNoSegment = errors.New("wlog: could not make the next segment, nothing written")

// maxKeptBuf is the largest write buffer the committer keeps between rounds.
const maxKeptBuf = 16 << 20

// NewCommitter starts a committer goroutine; Close stops it.
func NewCommitter(opts CommitterOptions) *Committer {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.SlowSync <= 0 {
		opts.SlowSync = time.Second
	}
	c := &Committer{opts: opts, log: opts.Logger, wake: make(chan struct{}, 1), arrived: make(chan struct{}, 1)}
	c.wg.Go(c.run)
	return c
}

// check validates an append; it changes nothing.
func (c *Committer) check(l *Log, recs []Record) error {
	if l.closed.Load() {
		return storage.ErrClosed
	}
	if err := l.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrFailed, err)
	}
	if cur := l.committer.Load(); cur != c && (cur != nil || !l.committer.CompareAndSwap(nil, c)) {
		return fmt.Errorf("%w: wlog: log %s is appended to by another committer", storage.ErrInvalidArgument, l.dir)
	}
	for i := range recs {
		if n := len(recs[i].Body); n > l.opts.MaxRecordBytes {
			return fmt.Errorf("%w: wlog: record of %d bytes exceeds MaxRecordBytes %d", storage.ErrMessageTooLarge, n, l.opts.MaxRecordBytes)
		}
	}
	return nil
}

// Append queues records for l and blocks until they are durable. It returns the index of the
// first record; the records of one call get contiguous indexes, and appends to one log are ordered
// by the time they were queued. An empty recs returns l.NextIndex() at once.
//
// If ctx is done before the committer took the records, Append returns ctx's error and nothing is
// written. Once the committer has taken them, Append waits for the outcome (one sync at most), so
// when Append returns recs is no longer referenced and the result is the truth.
//
// Errors: storage.ErrClosed (log or committer closed), storage.ErrMessageTooLarge (a body exceeds
// MaxRecordBytes; nothing is appended), the write or sync error of the round that wrote recs (the
// records may or may not be on disk), or ErrFailed wrapping the sticky error of an earlier round
// (nothing of recs was written).
func (c *Committer) Append(ctx context.Context, l *Log, recs []Record) (first int64, err error) {
	if err := c.check(l, recs); err != nil {
		return 0, err
	}
	if len(recs) == 0 {
		return l.NextIndex(), nil
	}
	if ctx.Err() != nil {
		return 0, fmt.Errorf("wlog: append: %w", context.Cause(ctx))
	}
	r := getRequest(l, recs)
	if !c.enqueue(r) {
		putRequest(r)
		return 0, storage.ErrClosed
	}
	select {
	case <-r.ch:
	case <-ctx.Done():
		if r.state.CompareAndSwap(reqQueued, reqAbandoned) {
			// The committer drops it; it is not reused.
			return 0, fmt.Errorf("wlog: append abandoned before it was written: %w", context.Cause(ctx))
		}
		<-r.ch
	}
	first, err = r.first, r.err
	putRequest(r)
	return first, err
}

// AppendAsync queues records and calls done once they are durable (or failed), from the committer
// goroutine or the goroutine that synced l in that round (Committer.finish: the dones of one log
// run one after the other, in queue order; those of different logs may run at the same time), also
// for an invalid append (see Append for the errors); done must not block. Only when the committer
// is closed is done called at once, from the caller's goroutine, with storage.ErrClosed, before
// AppendAsync returns.
func (c *Committer) AppendAsync(l *Log, recs []Record, done func(first int64, err error)) {
	c.AppendAsyncWith(l, recs, AppendOptions{}, done)
}

// AppendOptions are the hints of AppendAsyncWith.
type AppendOptions struct {
	// Prompt says that the caller appends again as soon as this append completes (a synchronous
	// publisher): the committer waits a little for such callers after a round (see gather).
	Prompt bool
}

// AppendAsyncWith is AppendAsync with hints.
func (c *Committer) AppendAsyncWith(l *Log, recs []Record, opts AppendOptions, done func(first int64, err error)) {
	r := getRequest(l, recs)
	r.done, r.prompt = done, opts.Prompt
	if err := c.check(l, recs); err != nil {
		r.preset, r.err, r.recs = true, err, nil
	} else if len(recs) == 0 {
		r.preset, r.first = true, l.NextIndex()
	}
	if !c.enqueue(r) {
		putRequest(r)
		done(0, storage.ErrClosed)
	}
}

func (c *Committer) enqueue(r *request) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	c.queue = append(c.queue, r)
	var n int64
	if r.prompt {
		n = c.gatherable.Add(1)
	}
	signal := len(c.queue) == 1
	c.mu.Unlock()
	if signal {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	if w := c.want.Load(); n > 0 && w > 0 && n >= w {
		select {
		case c.arrived <- struct{}{}:
		default:
		}
	}
	return true
}

// Close completes the queued appends and stops the goroutine. Later appends fail with
// storage.ErrClosed. Safe to call twice.
func (c *Committer) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	c.wg.Wait()
	return nil
}

func (c *Committer) run() {
	for range c.wake {
		c.gather()
		c.mu.Lock()
		batch, closed := c.queue, c.closed
		c.queue = c.spare[:0]
		c.gatherable.Store(0)
		c.mu.Unlock()
		if len(batch) > 0 {
			c.commit(batch)
		}
		// The taken queue becomes the spare even when it is empty (a stale wake-up, see gather):
		// else the new queue and the spare would share an array, and the next pass would take a
		// queue that enqueue goes on writing into.
		clear(batch)
		c.spare = batch[:0]
		if closed {
			// Nothing can be queued once closed is set, and the queue was taken with it.
			return
		}
	}
}

// maxGather bounds how long gather waits; each gather in a row that waited in vain halves the
// bound, down to 1/2^maxMissed of it.
const (
	maxGather = 500 * time.Microsecond
	maxMissed = 4
)

// gather waits for the appenders the last round completed to queue their next records, so that
// they share the next sync instead of splitting into alternating rounds: with 10 synchronous
// appenders, half of them would otherwise queue while the other half syncs, and every round would
// carry 5 records. Only prompt appends (AppendOptions.Prompt) count: other callers (producers
// on a schedule, consumers whose acks wait for more deliveries) come back when they are ready,
// not when their last round ended.
// It waits until as many of them are queued as the last round carried plus those queued when it
// ended, for at most three average syncs (and maxGather). It blocks meanwhile: enqueue wakes it
// when the last expected request arrives. On a small machine the appenders' way back (answer,
// network, next request: 60-250 us for 10 over loopback TCP on 2 cores) takes longer than a sync,
// and the processors are theirs while gather waits: a wait that spins takes the CPU they need, and
// a shorter bound lets the last of them miss the round. When they do not come back soon after all
// (they are done, or slowed down), waiting only delays the round: every wait that ends without
// them halves the next bound (down to 1/16), and one that ends with them restores it. It never
// waits with SyncNone or when the last round carried at most one prompt append.
func (c *Committer) gather() {
	if c.opts.Sync != SyncAlways || c.expect <= 1 || c.gatherable.Load() >= c.expect {
		return
	}
	c.want.Store(c.expect)
	if c.gatherable.Load() < c.expect { // enqueue may have missed want
		t := time.NewTimer(min(3*c.syncT, maxGather) >> c.missed)
		select {
		case <-c.arrived:
			c.missed = 0
		case <-c.wake: // Close, or a first request after a stale wake-up: run takes the queue next
		case <-t.C:
			c.missed = min(c.missed+1, maxMissed)
		}
		t.Stop()
	}
	c.want.Store(0)
	select {
	case <-c.arrived:
	default:
	}
}

// commit runs one round: write every log's records, sync the logs, complete the requests.
func (c *Committer) commit(batch []*request) {
	start := time.Now()
	logs := c.logs[:0]
	for _, r := range batch {
		if !r.state.CompareAndSwap(reqQueued, reqTaken) {
			continue // abandoned by its waiter
		}
		if r.preset {
			complete(r, r.err)
			continue
		}
		rd := &r.l.round
		if len(rd.reqs) == 0 {
			logs = append(logs, r.l)
		}
		rd.reqs = append(rd.reqs, r)
	}

	// Write: sequential, into the page cache. Each log's wmu is held until its records are
	// published, so Cut and Close never see a half-done round.
	for _, l := range logs {
		l.wmu.Lock()
		c.buf = l.writeRoundLocked(c.buf)
	}
	if cap(c.buf) > maxKeptBuf {
		c.buf = nil
	}
	wrote := time.Now()

	// Sync, then complete: the logs that may share a cache flush ride on one fdatasync
	// (shareFlush); every other log has its own, in parallel, and its requests complete as soon as
	// its own sync returns (nothing orders two logs' durability; a request spanning logs waits for
	// all its parts). The riders complete once their anchor's sync returned.
	anchor := c.shareFlush(logs)
	flushed := time.Now()
	own := c.own[:0]
	for _, l := range logs {
		if !l.round.rides {
			own = append(own, l)
		}
	}
	var wg sync.WaitGroup
	for i, l := range own {
		if i == len(own)-1 {
			c.finish(l)
		} else {
			wg.Go(func() { c.finish(l) })
		}
	}
	wg.Wait()
	for _, l := range logs {
		if l.round.rides {
			c.finishRider(l, anchor)
		}
	}
	clear(own)
	c.own = own[:0]
	records := 0
	var gathered int64
	var syncT time.Duration
	for _, l := range logs {
		rd := &l.round
		records += rd.records
		gathered += rd.gathered
		syncT = max(syncT, rd.syncT)
		clear(rd.reqs)
		rd.reqs, rd.firstSeg, rd.start, rd.wrote, rd.err, rd.rides, rd.undone = rd.reqs[:0], nil, 0, false, nil, false, false
		rd.records, rd.gathered, rd.syncT = 0, 0, 0
	}
	if c.opts.Sync == SyncAlways {
		c.syncT = (3*c.syncT + syncT) / 4
	}
	c.expect = gathered + c.gatherable.Load()
	took := time.Since(start)
	if took > c.opts.SlowSync {
		// Which phase: the writes into the page cache, the riders' write-back (shareFlush), the
		// longest fdatasync, or the rest (completing the requests, waiting for a CPU).
		c.log.Warn("wal commit round slow", slog.Duration("took", took), slog.Duration("write", wrote.Sub(start)),
			slog.Duration("write_back", flushed.Sub(wrote)), slog.Duration("sync", syncT),
			slog.Duration("other", took-flushed.Sub(start)-syncT), slog.Int("records", records), slog.Int("logs", len(logs)))
	}
	clear(logs)
	c.logs = logs[:0]
	if c.opts.OnSync != nil {
		c.opts.OnSync(took, records, len(logs))
	}
}

// finish syncs l's round (SyncAlways), publishes its records and completes its requests, so
// that a returning Append sees its records. Log.wmu is held on entry and released. It runs on the
// committer goroutine or, for all logs of a round but one, on a goroutine of its own.
func (c *Committer) finish(l *Log) {
	rd := &l.round
	if c.opts.Sync == SyncAlways && rd.err == nil && rd.wrote {
		t0 := time.Now()
		rd.err = l.syncLocked(c.opts.SlowSync)
		rd.syncT = time.Since(t0)
	}
	c.completeRound(l)
}

// shareFlush lets the logs of a round share one cache flush where that is safe, which saves
// the second of two fdatasyncs (on the development VM two concurrent fdatasyncs of a publish and
// an ack log take 181-214 us a round; both logs written back at once and one fdatasync, 117-131
// us, about as long as a single-log round). A log rides on the anchor's flush when its files
// may share a cache flush on the anchor's device (FlushSharer) and its round writes only into
// blocks that were written before and whose metadata an fdatasync already made durable
// (segment.durable: not into zeros written by this round, not across a roll): then its records
// need no metadata to be read back, and once they are written back to the device
// (File.SyncRange, which waits for the writes), the cache flush of the anchor's fdatasync, which
// starts after that, makes them durable. The anchor is a log of the round that has to fdatasync
// anyway, else the first that may. shareFlush starts the write-back of the riders and of the
// anchor together (File.StartWriteback), waits for the riders', marks them (logRound.rides) and
// returns the anchor (nil: no log rides).
func (c *Committer) shareFlush(logs []*Log) *Log {
	if c.opts.Sync != SyncAlways || len(logs) < 2 {
		return nil
	}
	var anchor *Log
	for _, l := range logs {
		if rd := &l.round; !l.flushShare || rd.err != nil || !rd.wrote {
			continue
		}
		if !l.mayRideLocked() { // it syncs anyway: the best anchor
			anchor = l
			break
		}
		if anchor == nil {
			anchor = l
		}
	}
	if anchor == nil {
		return nil
	}
	// Start every rider's write-back and the anchor's, so that their writes are in flight
	// together (one round trip to the disk instead of one per log), then wait for the riders'.
	// The anchor's fdatasync waits for its own and reports its errors.
	riders := 0
	for _, l := range logs {
		if l == anchor || l.flushDev != anchor.flushDev || !l.mayRideLocked() {
			continue
		}
		rd := &l.round
		rd.rides = true
		riders++
		a := l.active()
		if err := a.file().StartWriteback(rd.start, a.wend-rd.start); err != nil {
			rd.err = l.setErrLocked(fmt.Errorf("wlog: write back %s: %w", a.path, err))
		}
	}
	if riders == 0 {
		return anchor
	}
	if rd := &anchor.round; rd.firstSeg == anchor.active() {
		_ = anchor.active().file().StartWriteback(rd.start, 0) // an error shows in its fdatasync
	}
	for _, l := range logs {
		rd := &l.round
		if !rd.rides || rd.err != nil {
			continue
		}
		a := l.active()
		if err := a.file().SyncRange(rd.start, a.wend-rd.start); err != nil {
			rd.err = l.setErrLocked(fmt.Errorf("wlog: write back %s: %w", a.path, err))
		}
	}
	return anchor
}

// mayRideLocked reports whether l's round may ride on another log's cache flush (shareFlush).
// Log.wmu must be held.
func (l *Log) mayRideLocked() bool {
	rd := &l.round
	a := l.active()
	return l.flushShare && rd.err == nil && rd.wrote && !rd.undone && rd.firstSeg == a && a.wend <= a.durable
}

// finishRider completes the round of a log that rode on anchor's flush: durable if its
// write-back and the anchor's sync succeeded; else the log fails as on a failed sync of its own
// (what reached the disk is unknown). Log.wmu is held on entry and released.
func (c *Committer) finishRider(l, anchor *Log) {
	rd := &l.round
	if rd.err == nil && anchor.round.err != nil {
		rd.err = l.setErrLocked(fmt.Errorf("wlog: sync %s: the flush it shared with %s failed: %w",
			l.active().path, anchor.dir, anchor.round.err))
	}
	rd.syncT = anchor.round.syncT
	c.completeRound(l)
}

// completeRound publishes l's round if it succeeded, releases Log.wmu, completes the round's
// requests and then closes the files the round's pins evicted.
func (c *Committer) completeRound(l *Log) {
	rd := &l.round
	if rd.err == nil {
		l.publishRoundLocked()
	}
	for i, s := range rd.pins {
		s.h.releaseDefer(&rd.victims)
		rd.pins[i] = nil
	}
	rd.pins = rd.pins[:0]
	l.wmu.Unlock()
	for _, r := range rd.reqs {
		err := rd.err
		if err == nil {
			err = r.noRoom
		}
		if err == nil {
			rd.records += len(r.recs)
		}
		if r.prompt {
			rd.gathered++
		}
		complete(r, err)
	}
	closeAll(rd.victims)
	rd.victims = rd.victims[:0]
}

func complete(r *request, err error) {
	if err != nil {
		r.first = 0
	}
	r.err = err
	if done := r.done; done != nil {
		first := r.first
		putRequest(r)
		done(first, err)
		return
	}
	r.ch <- struct{}{}
}

// writeRoundLocked encodes the records of this round's requests into buf and writes them to the
// active segment with one WriteAt (one more per segment it fills). Log.wmu must be held. The
// outcome is in l.round.
func (l *Log) writeRoundLocked(buf []byte) []byte {
	rd := &l.round
	if l.closed.Load() {
		rd.err = storage.ErrClosed
		return buf
	}
	if l.werr != nil {
		rd.err = fmt.Errorf("%w: %w", ErrFailed, l.werr)
		return buf
	}
	a := l.active()
	if l.staleIdx {
		// The index a clean Close left is about to become false: remove it durably first.
		p := l.idxPath(a.base)
		if err := l.fs.Remove(p); err != nil && !isNotExist(err) {
			rd.err = l.setErrLocked(fmt.Errorf("wlog: remove %s: %w", p, err))
			return buf
		}
		if err := l.fs.SyncDir(l.dir); err != nil {
			rd.err = l.setErrLocked(fmt.Errorf("wlog: sync dir %s: %w", l.dir, err))
			return buf
		}
		l.staleIdx, l.idxValid = false, false
	}
	// The round's segments stay open until it completes (Files); an idle log's file is opened
	// again here.
	if _, err := a.h.acquireDefer(&rd.victims); err != nil {
		rd.err = fmt.Errorf("%w: %w", ErrNotOpened, err)
		return buf
	}
	rd.pins = append(rd.pins, a)
	rd.firstSeg = a
	start := a.wend
	rd.start = start
	buf = buf[:0]
	write := func() error {
		if len(buf) == 0 {
			return nil
		}
		if _, err := a.file().WriteAt(buf, start); err != nil {
			return l.setErrLocked(fmt.Errorf("wlog: write %s at %d: %w", a.path, start, err))
		}
		return nil
	}
requests:
	for ri, r := range rd.reqs {
		r.first = l.next
		cp := l.checkpoint(a)
		for i := range r.recs {
			rec := &r.recs[i]
			fb := FrameBytes(len(rec.Body))
			if a.wend+fb > a.size && len(a.wpos) > 0 {
				if err := write(); err != nil {
					rd.err = err
					return buf
				}
				if err := l.rollLocked(); err != nil {
					if !errors.Is(err, ErrNoSegment) || cp.seg != a {
						rd.err = l.setErrLocked(err)
						return buf
					}
					// No room for the next segment: r and the requests after it fail alone;
					// r's records written into a are cleared, the ones before r are kept.
					if err := l.undoLocked(cp); err != nil {
						rd.err = err
						return buf
					}
					rd.undone = true
					for _, q := range rd.reqs[ri:] {
						q.noRoom = err
					}
					buf = buf[:0]
					break requests
				}
				a = l.active()
				rd.pins = append(rd.pins, a) // rollLocked pinned it for us
				start, buf = a.wend, buf[:0]
			}
			off := a.wend
			buf = appendFrame(buf, rec.Timestamp, rec.Body)
			a.noteWrite(off, rec.Timestamp, fb)
			l.next++
		}
	}
	if a.wend > a.zeroed && a.zeroed < a.size {
		// Zero-fill ahead of the records (see zeroAhead): the zeros are what the data region
		// holds anyway.
		target := min(a.size, (a.wend/zeroAhead+1)*zeroAhead)
		if target > a.wend {
			buf = append(buf, zeros[:target-a.wend]...)
		}
		a.zeroed = target
	}
	if err := write(); err != nil {
		rd.err = err
		return buf
	}
	rd.wrote = true
	if a.wend > a.size/2 || l.opts.KeepSpare {
		l.startSpareLocked()
	}
	return buf
}

// writerCheckpoint is the writer state of a log before a request's records (undoLocked).
type writerCheckpoint struct {
	seg        *segment
	wend       int64
	nwpos      int
	wmin, wmax int64
	next       int64
}

// checkpoint records the writer state of active segment a. Log.wmu must be held.
func (l *Log) checkpoint(a *segment) writerCheckpoint {
	return writerCheckpoint{seg: a, wend: a.wend, nwpos: len(a.wpos), wmin: a.wmin, wmax: a.wmax, next: l.next}
}

// undoLocked takes back the records written into cp.seg since cp: it writes zeros over their
// frames (written, not yet synced; the round's sync makes the zeros durable with the records
// before cp, so a crash never recovers a part of the undone request) and restores the writer
// state. The blocks are preallocated: the zeros need no space. A write failure is sticky.
func (l *Log) undoLocked(cp writerCheckpoint) error {
	s := cp.seg
	if s.wend > cp.wend {
		if err := writeZeros(s.file(), cp.wend, s.wend); err != nil { // pinned by the round
			return l.setErrLocked(fmt.Errorf("wlog: clear %s at %d: %w", s.path, cp.wend, err))
		}
		s.zeroed = max(s.zeroed, s.wend)
	}
	s.wend, s.wpos, s.wmin, s.wmax = cp.wend, s.wpos[:cp.nwpos], cp.wmin, cp.wmax
	l.next = cp.next
	return nil
}

// syncLocked makes the active segment durable. Log.wmu must be held (by the committer goroutine
// that calls it, possibly through a helper goroutine), and the round must have pinned the segment.
func (l *Log) syncLocked(slow time.Duration) error {
	a := l.active()
	t0 := time.Now()
	err := a.file().Datasync()
	if took := time.Since(t0); took > slow {
		l.log.Warn("wal sync slow", slog.String("path", a.path), slog.Duration("took", took))
	}
	if err != nil {
		return l.setErrLocked(fmt.Errorf("wlog: sync %s: %w", a.path, err))
	}
	a.durable = a.zeroed
	return nil
}

// publishRoundLocked makes the records of this round visible. Log.wmu must be held.
func (l *Log) publishRoundLocked() {
	l.mu.Lock()
	for i := len(l.segs) - 1; i >= 0; i-- {
		s := l.segs[i]
		s.publishLocked()
		if s == l.round.firstSeg {
			break
		}
	}
	l.durable.Store(l.next)
	l.mu.Unlock()
}
