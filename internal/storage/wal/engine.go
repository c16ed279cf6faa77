package wal

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/substate"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

var _ storage.Engine = (*Engine)(nil)

// SyncMode is the engine's durability.
type SyncMode int

const (
	// SyncAlways makes every publish, ack and metadata change durable (fdatasync, shared by
	// concurrent callers through group commit) before the call returns. The default.
	SyncAlways SyncMode = iota
	// UnsafeNoSync never fsyncs: a call returns once the OS has the data. A machine crash (not a
	// process crash) loses what the page cache had not written back, including acknowledged
	// publishes and acks.
	UnsafeNoSync
)

// Config configures an Engine. Zero fields get the documented defaults.
type Config struct {
	// Clock is the time source of every time-dependent decision. Defaults to storage.SystemClock.
	Clock storage.Clock
	// Logger receives the engine's logs. Nil discards them.
	Logger *slog.Logger
	// Sync is the durability mode. Defaults to SyncAlways.
	Sync SyncMode
	// SegmentBytes is the largest size partition and state log segments are preallocated to.
	// Defaults to 64 MiB. A new log's first segment is FirstSegmentBytes; each segment that fills
	// is followed by one four times as large, up to SegmentBytes (wlog.Options).
	SegmentBytes int64
	// MaxProducerIDs bounds the producer ids the engine remembers for de-duplication, all topics
	// together (each is kept in memory until its dedup_window ends: ~110 bytes whatever its
	// length, BenchmarkDedupMemory). An
	// append that would remember more fails with storage.ErrRateLimited (RATE_LIMITED, retryable;
	// the ids it repeats are still answered as duplicates) until older ids expire. Defaults to
	// DefaultMaxProducerIDs.
	MaxProducerIDs int
	// FirstSegmentBytes is the size of a new log's first segment (wlog.Options.FirstSegmentBytes):
	// what an empty topic partition reserves on disk. Defaults to 64 KiB; at most SegmentBytes.
	FirstSegmentBytes int64
	// StateLogSnapshotBytes is the number of state log bytes written since the last snapshot that
	// triggers a new snapshot (and the compaction of the state log). Defaults to 64 MiB.
	StateLogSnapshotBytes int64
	// FS is the filesystem seam. Defaults to the OS. The directory lock (flock) is only taken with
	// the OS filesystem.
	FS wlog.FS
	// OnSync, if set, is called after every group-commit round with its duration and the number of
	// records and logs it made durable (metrics, benchmarks). It must not block.
	OnSync func(took time.Duration, records, logs int)
	// NoSharedFlush makes every log fdatasync itself in every round (wlog.Options.NoSharedFlush):
	// no log of a round rides on another's cache flush.
	NoSharedFlush bool
	// SlowSync is the duration of an fdatasync or of a whole group-commit round above which a
	// warning is logged (wlog.CommitterOptions.SlowSync). 0 means its default, 1 s.
	SlowSync time.Duration
	// MaxOpenFiles bounds the segment files the engine keeps open (wlog.Files): the segments of
	// partitions that were not read or written for the longest are closed past it and opened
	// again on use, so that thousands of idle topics do not take a file descriptor each. Files
	// in use at the same moment (a busy partition's active segment during its group-commit
	// round, segments being read, the state log's active segment) are never closed, so the
	// bound is exceeded only while more than that are in use at once. At most the process's
	// soft RLIMIT_NOFILE; 0 means DefaultMaxOpenFiles (half of it).
	MaxOpenFiles int

	// claimHorizon is how far ahead of the cursor claims record the claim horizon (horizonAhead;
	// tests make it small).
	claimHorizon int64
	// dlqIDsPerRecord bounds the DLQ IDs of one DLQ replay, purge or retention record
	// (defaultDLQIDsPerRecord; tests make it small).
	dlqIDsPerRecord int
}

// Defaults of Config.
const (
	DefaultSegmentBytes = 64 << 20
	// DefaultMaxProducerIDs is the default Config.MaxProducerIDs: ~220 MB, room for a window of
	// 2 minutes at 16,000 messages/s with ids.
	DefaultMaxProducerIDs        = 2_000_000
	DefaultStateLogSnapshotBytes = 64 << 20
	minSegmentBytes              = 4 << 10
	maxSegmentBytes              = 1 << 30
	// maxRecordBytes bounds one record of any log: the largest message (MaxMessageBytesLimit) with
	// its framing and headers fits.
	maxRecordBytes = 16 << 20
)

// DefaultMaxOpenFiles is the default Config.MaxOpenFiles: half of the process's soft limit of open
// files (RLIMIT_NOFILE, which Go raises to the hard limit at start), leaving the other half to
// connections and everything else; 512 when the limit cannot be read.
func DefaultMaxOpenFiles() int {
	soft, ok := OpenFileLimit()
	if !ok {
		return 512
	}
	return max(int(min(soft/2, 1<<30)), 1)
}

// OpenFileLimit returns the process's soft RLIMIT_NOFILE, the most Config.MaxOpenFiles may be;
// false when it cannot be read or is unlimited.
func OpenFileLimit() (uint64, bool) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == ^uint64(0) {
		return 0, false
	}
	return rl.Cur, true
}

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.Clock == nil {
		c.Clock = storage.SystemClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.SegmentBytes == 0 {
		c.SegmentBytes = DefaultSegmentBytes
	}
	if c.StateLogSnapshotBytes == 0 {
		c.StateLogSnapshotBytes = DefaultStateLogSnapshotBytes
	}
	if c.MaxProducerIDs == 0 {
		c.MaxProducerIDs = DefaultMaxProducerIDs
	}
	if c.MaxOpenFiles == 0 {
		c.MaxOpenFiles = DefaultMaxOpenFiles()
	}
	if c.claimHorizon <= 0 {
		c.claimHorizon = horizonAhead
	}
	if c.dlqIDsPerRecord <= 0 {
		c.dlqIDsPerRecord = defaultDLQIDsPerRecord
	}
	return c
}

// Validate reports the first invalid field of c (after defaults). The error wraps
// storage.ErrInvalidArgument and names the field.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: wal config: %s %s", storage.ErrInvalidArgument, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Sync != SyncAlways && c.Sync != UnsafeNoSync:
		return bad("Sync", "must be SyncAlways or UnsafeNoSync, got %d", c.Sync)
	case c.SegmentBytes < minSegmentBytes || c.SegmentBytes > maxSegmentBytes:
		return bad("SegmentBytes", "must be between %d and %d, got %d", minSegmentBytes, maxSegmentBytes, c.SegmentBytes)
	case c.FirstSegmentBytes != 0 && (c.FirstSegmentBytes < minSegmentBytes || c.FirstSegmentBytes > c.SegmentBytes):
		return bad("FirstSegmentBytes", "must be between %d and SegmentBytes (%d), got %d", minSegmentBytes, c.SegmentBytes, c.FirstSegmentBytes)
	case c.MaxProducerIDs < 0:
		return bad("MaxProducerIDs", "must not be negative, got %d", c.MaxProducerIDs)
	case c.StateLogSnapshotBytes < 1:
		return bad("StateLogSnapshotBytes", "must be positive, got %d", c.StateLogSnapshotBytes)
	case c.SlowSync < 0:
		return bad("SlowSync", "must not be negative, got %s", c.SlowSync)
	case c.MaxOpenFiles < 0:
		return bad("MaxOpenFiles", "must not be negative, got %d", c.MaxOpenFiles)
	}
	if soft, ok := OpenFileLimit(); ok && uint64(c.MaxOpenFiles) > soft {
		return bad("MaxOpenFiles", "must be at most the process's limit of open files (RLIMIT_NOFILE %d), got %d", soft, c.MaxOpenFiles)
	}
	return nil
}

// Engine is the embedded log engine: a storage.Engine over segmented log files in one directory.
// Every method is safe for concurrent use. See the package documentation for the design.
type Engine struct {
	// replayAt is the timestamp of the state record being replayed at Open (unix ns).
	replayAt  int64
	dir       string
	cfg       Config
	clock     storage.Clock
	logger    *slog.Logger
	fs        wlog.FS
	lockFile  *os.File
	committer *wlog.Committer
	state     *wlog.Log   // the state log
	files     *wlog.Files // bounds the open segment files of every log (Config.MaxOpenFiles)

	// mu guards the maps below and every topic's and subscription's metadata. Every change of
	// delivery state (subscription mutex) is made with mu held at least for reading, and its state
	// record is queued before mu is released: holding mu exclusively therefore stops the state
	// log and memory at one consistent point (snapshot).
	mu        sync.RWMutex
	closed    bool
	topics    map[string]*topic
	subs      map[int64]*sub // every known subscription, DELETED ones included (no state)
	bindings  map[bindingKey]*storage.Binding
	nextSubID int64
	// busy holds topic names whose directories are being created, grown or removed outside mu;
	// a second operation on the name waits for the channel to close.
	busy map[string]chan struct{}
	// creating counts the TopicCreate calls past their MaxTopics check and not yet returned.
	creating int

	notifyMu  sync.Mutex
	notifyFns map[uint64]func(storage.Notification)
	notifySeq uint64

	// failed is the sticky write failure: a state or message write failed (atomic, because
	// committer callbacks may run on a goroutine that holds mu).
	failed atomic.Pointer[error]
	// dedupIDs counts the producer ids every topic's table remembers (queued entries), bounded by
	// Config.MaxProducerIDs.
	dedupIDs    atomic.Int64
	stateBytes  atomic.Int64 // state log bytes queued since the last snapshot
	snapPending atomic.Bool  // a snapshot request is queued
	snapReq     chan struct{}
	snapMu      sync.Mutex // serializes snapshots
	retentionMu sync.Mutex // serializes RetentionApply
	quit        chan struct{}
	wg          sync.WaitGroup
	// trashKick (capacity 1) wakes the trash loop: a directory was moved into trash/; trashSeq
	// numbers the moved directories.
	trashKick chan struct{}
	trashSeq  atomic.Int64

	// Claims that could not read a partition, warned at most once per fdWarnEvery: for lack of
	// file descriptors (warnOutOfFiles) and for another read error (warnClaimRead).
	fdWarn, readWarn claimWarn

	// DLQ logs (dlqlog.go). dlqDoomed holds the logs of cancelled and deleted subscriptions until
	// the trash loop removes them (guarded by dlqMu). Recovery only: dlqFound lists the DLQ log
	// directories not opened yet, dlqPend the entries to append to them, dlqMigrate the replayed
	// copies of an old snapshot; dlqMigrated asks for a snapshot once Open is done.
	dlqMu       sync.Mutex
	reapMu      sync.Mutex // serializes reapDLQs
	dlqDoomed   []*dlqLog
	dlqFound    map[int64]struct{}
	dlqPend     map[int64][]*storage.DLQEntry
	dlqMigrate  []dlqMigrateCopy
	dlqMigrated bool
	// dlqHeld counts the bytes of DLQ records not in their logs yet, dlqStalled the logs whose
	// records wait for room, dlqWarnAt the engine clock of the last warning (dlqLog).
	dlqHeld    atomic.Int64
	dlqStalled atomic.Int64
	dlqWarnAt  atomic.Int64

	// openDead counts, per subscription, the messages recover dead-lettered at Open (leases lost
	// in the restart on their max_deliveries-th delivery), until DLQRecovered takes them.
	// Guarded by mu.
	openDead []storage.DeadLetterCount

	// snapshotEncodeHook, if set (tests, before any snapshot can run), is called on the snapshot
	// goroutine right before a snapshot is encoded.
	snapshotEncodeHook func()
}

type bindingKey struct{ group, pattern string }

// topic is a topic's metadata (guarded by Engine.mu) and its partition logs.
type topic struct {
	meta  storage.Topic
	parts []*partition   // len == meta.Config.Partitions once open
	subs  map[int64]*sub // subscriptions that are not DELETED
	rr    atomic.Uint32  // round-robin partition of keyless appends
	// inflight counts appends queued to the partition logs and not completed; TopicDelete waits
	// for it before closing the logs.
	inflight sync.WaitGroup
	// dedup holds the producer ids of the last dedup_window (dedup.go).
	dedup dedupTable
}

// partition is one partition log.
type partition struct {
	index int32
	dir   string
	log   *wlog.Log // nil when the log failed to open (damage is then set)
	// damage is the cause (with file and offset) when the partition's log is damaged: set at
	// Open, or by the first read that met corruption (markDamaged). Never cleared.
	damage atomic.Pointer[error]
	// mu serializes appends so frame timestamps (PublishedAt) never decrease.
	mu     sync.Mutex
	lastTS int64
}

// sub is a subscription. meta is guarded by Engine.mu; st and rr by mu (always taken with
// Engine.mu held, see lock order in doc.go).
type sub struct {
	meta  storage.Subscription
	topic *topic // nil once DELETED
	mu    sync.Mutex
	st    *substate.Sub // nil once CANCELLED or DELETED
	rr    int           // first partition the next claim reads new messages from
	dlq   *dlqLog       // the DLQ log (dlqlog.go); nil until the first dead-lettering
	// asg is the assignment of an ORDERED subscription (ordered.go), nil before the first one.
	// Guarded by Engine.mu (replaced with it held exclusively).
	asg *storage.Assignment
	// rc are the completion records of a refcount topic's subscription (completion.go); nil
	// until its first completion. Guarded by mu.
	rc completions
	// lastBeat is the last heartbeat (lifecycle.go), in memory only: Open sets it to the Open
	// time, so a restart gives every subscription a fresh heartbeat timeout. Guarded by e.mu.
	lastBeat time.Time
	// live maps the members renewed by SubscriptionMembersRenew to their records (ordered.go),
	// in memory only. Guarded by e.mu held exclusively.
	live map[liveKey]liveRec
	// watch is, per partition, the ack floor retention last saw and since when (zombie_ttl,
	// retention.go), in memory only. Guarded by mu.
	watch []floorWatch

	// Claim durability (see "Attempt numbers after a crash" in doc.go). claimSeq numbers the
	// claims that deliver (guarded by mu); durableClaim is the highest of them whose records are
	// durable (claims of one subscription are queued in order, so every lower one is too).
	claimSeq     int64
	durableClaim atomic.Int64
	// hz holds, per partition, the highest claim horizon that is durable. Grown under mu by
	// durableHorizon; the committer raises the values (the pointers never change).
	hz []*atomic.Int64
}

// durableHorizon returns the durable claim horizon of partition p. The first call for a partition
// takes the horizon of the delivery state, which is durable then: recovered at Open, or the start
// offset of a new subscription or partition (no horizon record is queued before this call). s.mu
// must be held.
func (s *sub) durableHorizon(p int32) *atomic.Int64 {
	for len(s.hz) <= int(p) {
		a := new(atomic.Int64)
		a.Store(s.st.Horizon(int32(len(s.hz))))
		s.hz = append(s.hz, a)
	}
	return s.hz[p]
}

// raise sets a to v if v is higher.
func raise(a *atomic.Int64, v int64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// Open opens or creates an engine in dir, recovering its state: the latest snapshot, then the
// state log after it. Leases do not survive: every message that was not completed is delivered
// again, with its attempt count kept (raised by one, and never-delivered messages below the claim
// horizon counted as delivered once, when the engine was not closed cleanly: see doc.go, "Attempt
// numbers after a crash"). Two engines cannot open one directory at once.
func Open(dir string, cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	e := &Engine{
		dir:       dir,
		cfg:       cfg,
		clock:     cfg.Clock,
		logger:    cfg.Logger.With("component", "wal"),
		fs:        cfg.FS,
		topics:    make(map[string]*topic),
		subs:      make(map[int64]*sub),
		bindings:  make(map[bindingKey]*storage.Binding),
		nextSubID: 1,
		busy:      make(map[string]chan struct{}),
		notifyFns: make(map[uint64]func(storage.Notification)),
		snapReq:   make(chan struct{}, 1),
		trashKick: make(chan struct{}, 1),
		quit:      make(chan struct{}),
		files:     wlog.NewFiles(cfg.MaxOpenFiles),
	}
	if e.fs == nil {
		e.fs = wlog.OSFS()
	}
	if err := e.fs.MkdirAll(filepath.Join(dir, topicsDir), 0o755); err != nil {
		return nil, fmt.Errorf("wal: create %s: %w", dir, err)
	}
	if cfg.FS == nil {
		if err := e.lockDir(); err != nil {
			return nil, err
		}
	}
	start := e.clock.Now()
	mode := wlog.SyncAlways
	if cfg.Sync == UnsafeNoSync {
		mode = wlog.SyncNone
	}
	e.committer = wlog.NewCommitter(wlog.CommitterOptions{Sync: mode, OnSync: cfg.OnSync, Logger: e.logger, SlowSync: cfg.SlowSync})
	if err := e.recover(); err != nil {
		e.closeFiles()
		return nil, err
	}
	e.startHeartbeats()
	e.wg.Add(3)
	go e.snapshotLoop()
	go e.trashLoop() // empties what a deletion before a crash or Close left in trash/
	go e.dlqRetryLoop()
	e.logger.Info("wal engine open", slog.String("dir", dir), slog.Int("topics", len(e.topics)),
		slog.Int("subscriptions", len(e.subs)), slog.Duration("took", e.clock.Now().Sub(start)))
	return e, nil
}

const (
	topicsDir = "topics"
	stateDir  = "state"
	lockName  = "LOCK"
	// trashDir holds the directories of deleted topics until the trash loop has removed them.
	trashDir = "trash"
)

func (e *Engine) logOptions() wlog.Options {
	return wlog.Options{FS: e.fs, SegmentBytes: e.cfg.SegmentBytes, FirstSegmentBytes: e.cfg.FirstSegmentBytes, MaxRecordBytes: maxRecordBytes, Logger: e.logger, Clock: e.clock,
		NoSharedFlush: e.cfg.NoSharedFlush, Files: e.files}
}

// OpenFiles describes the segment files the engine holds open and its bound
// (Config.MaxOpenFiles).
func (e *Engine) OpenFiles() wlog.FilesStats { return e.files.Stats() }

// lockDir takes an exclusive flock on dir/LOCK.
func (e *Engine) lockDir() error {
	f, err := lockDir(e.dir)
	if err != nil {
		return err
	}
	e.lockFile = f
	return nil
}

// ErrDirInUse reports a data directory whose LOCK another engine (or offline tool) holds.
var ErrDirInUse = errors.New("data directory in use")

// lockDir takes an exclusive flock on dir/LOCK, held until the returned file is closed: by an
// engine, or by the offline tools (repair.go) so that they never run beside one.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("wal: open lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: wal: directory %s is in use by another engine (lock %s held)", ErrDirInUse, dir, path)
		}
		return nil, fmt.Errorf("wal: lock %s: %w", path, err)
	}
	return f, nil
}

// closeFiles closes every log, the committer and the lock, ignoring state (failed Open, Close).
func (e *Engine) closeFiles() error {
	var errs []error
	if e.committer != nil {
		errs = append(errs, e.committer.Close())
	}
	for _, t := range e.topics {
		for _, p := range t.parts {
			if p.log != nil {
				errs = append(errs, p.log.Close())
			}
		}
	}
	if e.state != nil {
		errs = append(errs, e.state.Close())
	}
	for _, s := range e.subs {
		if s.dlq != nil {
			errs = append(errs, s.dlq.log.Close())
		}
	}
	e.dlqMu.Lock()
	for _, dl := range e.dlqDoomed {
		errs = append(errs, dl.log.Close())
	}
	e.dlqMu.Unlock()
	if e.lockFile != nil {
		errs = append(errs, e.lockFile.Close())
	}
	return errors.Join(errs...)
}

// Close takes a final snapshot (so the next Open replays nothing), records a clean close (so the
// next Open knows no claim record was lost), completes pending writes, stops the engine's
// goroutine and closes its files. Later calls of any method return
// storage.ErrClosed. Close is safe to call twice.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	topics := make([]*topic, 0, len(e.topics))
	for _, t := range e.topics {
		topics = append(topics, t)
	}
	e.mu.Unlock()

	close(e.quit)
	e.wg.Wait()
	for _, t := range topics {
		t.inflight.Wait()
	}
	var errs []error
	if e.failedErr() == nil {
		e.retryDLQs() // once more: records that waited for room go in if there is some now
		err := e.snapshot(true)
		if errors.Is(err, errDLQHeld) {
			// An append in flight when Close began may have found no room just before it was made.
			e.retryDLQs()
			err = e.snapshot(true)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("wal: final snapshot: %w", err))
		} else if _, err := e.committer.Append(context.Background(), e.state,
			[]wlog.Record{{Timestamp: e.clock.Now().UnixNano(), Body: []byte{recCleanClose}}}); err != nil {
			// Without it the next Open assumes a crash: safe, attempt numbers only skip.
			errs = append(errs, fmt.Errorf("wal: record clean close: %w", err))
		}
	}
	errs = append(errs, e.closeFiles())
	err := errors.Join(errs...)
	if err != nil {
		e.logger.Error("wal engine close", slog.Any("error", err))
	}
	return err
}

// check returns ErrClosed or the sticky write failure. e.mu must be held.
func (e *Engine) checkLocked() error {
	if e.closed {
		return storage.ErrClosed
	}
	if err := e.failedErr(); err != nil {
		return refusedAfterFailure(fmt.Errorf("wal: engine failed after a write error, reopen it: %w", err))
	}
	return nil
}

func (e *Engine) failedErr() error {
	if p := e.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// fail records a write failure: the engine refuses changes from now on (STYLE C9: a failed fsync
// leaves the page cache untrustworthy). It takes no lock: committer callbacks call it.
func (e *Engine) fail(err error) {
	if err == nil || errors.Is(err, storage.ErrClosed) {
		return
	}
	if e.failed.CompareAndSwap(nil, &err) {
		e.logger.Error("wal write failed, engine refuses changes until reopened", slog.Any("error", err))
	}
}

// fdWarnEvery is the shortest interval between two warnings of claims that could not reopen a
// partition's file (and between two of DLQ records waiting for room).
const fdWarnEvery = 10 * time.Second

// warnDue reports whether a warning rate-limited by *last (the engine clock of the previous one,
// unix ns) may be logged now, once per fdWarnEvery, and records it.
func (e *Engine) warnDue(last *atomic.Int64) bool {
	now := e.clock.Now().UnixNano()
	prev := last.Load()
	return (prev == 0 || now-prev >= int64(fdWarnEvery)) && last.CompareAndSwap(prev, now)
}

// claimWarn rate-limits the warning of a condition that every claim of a partition may meet:
// at is the engine clock (unix ns) of the last warning, missed the claims that met it since.
type claimWarn struct {
	at, missed atomic.Int64
}

// claimWarnDue counts a claim that met w's condition and reports whether to warn now (once per
// fdWarnEvery), with the claims to report.
func (e *Engine) claimWarnDue(w *claimWarn) (int64, bool) {
	missed := w.missed.Add(1)
	if !e.warnDue(&w.at) {
		return 0, false
	}
	w.missed.Add(-missed)
	return missed, true
}

// warnOutOfFiles logs that a claim could not read partition p of topic because its segment file
// could not be opened again (EMFILE, ENFILE): at most once per fdWarnEvery, with the number of
// such claims since the last warning, so that polling claims do not flood the log.
func (e *Engine) warnOutOfFiles(topic string, p int32, err error) {
	if missed, ok := e.claimWarnDue(&e.fdWarn); ok {
		e.logger.Warn("wal: claim skipped a partition: out of file descriptors (raise ulimit -n or lower wal.max_open_files)",
			slog.String("topic", topic), slog.Int("partition", int(p)), slog.Int64("claims", missed), slog.Any("error", err))
	}
}

// warnClaimRead logs that a claim could not read partition p of topic for another reason than
// damage or a lack of descriptors (an I/O error): its messages wait, and the next claims meet it
// again, so at most once per fdWarnEvery, with the number of such claims since the last one.
func (e *Engine) warnClaimRead(topic string, p int32, err error) {
	if missed, ok := e.claimWarnDue(&e.readWarn); ok {
		e.logger.Error("wal: claim skipped a partition it could not read; its messages wait",
			slog.String("topic", topic), slog.Int("partition", int(p)), slog.Int64("claims", missed), slog.Any("error", err))
	}
}

// now is the engine clock in UTC without a monotonic reading, so times compare and persist the
// same way before and after a restart.
func (e *Engine) now() time.Time { return time.Unix(0, e.clock.Now().UnixNano()).UTC() }

// queueState queues a state record; done (may be nil) is called once it is durable, by the
// goroutine that completes the state log's appends (wlog.Committer.AppendAsync). The caller holds
// e.mu (shared or exclusive) so that the record's place in the state log matches the order of the
// in-memory change it describes.
func (e *Engine) queueState(rec []byte, done func(error)) {
	e.committer.AppendAsync(e.state, []wlog.Record{{Timestamp: e.clock.Now().UnixNano(), Body: rec}}, func(_ int64, err error) {
		if err != nil {
			e.fail(fmt.Errorf("wal: state log append: %w", err))
		}
		if done != nil {
			done(err)
		}
	})
	if e.stateBytes.Add(int64(len(rec))+wlog.FrameHeaderBytes) >= e.cfg.StateLogSnapshotBytes && e.snapPending.CompareAndSwap(false, true) {
		select {
		case e.snapReq <- struct{}{}:
		default:
		}
	}
}

// queueStateWait queues a state record and returns a channel that receives the outcome once it is
// durable. Wait for it with e.mu released (wait).
func (e *Engine) queueStateWait(rec []byte) <-chan error {
	ch := make(chan error, 1)
	e.queueState(rec, func(err error) { ch <- err })
	return ch
}

// wait waits for a queued record. When ctx ends first the record may still become durable.
func wait(ctx context.Context, ch <-chan error) error {
	if ch == nil {
		return nil // nothing was queued, or nothing to wait for
	}
	select {
	case err := <-ch:
		if err != nil {
			return ioFailure(fmt.Errorf("wal: state log append: %w", err), writtenBefore(err))
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// snapshotLoop takes a snapshot whenever the state log grew past StateLogSnapshotBytes.
func (e *Engine) snapshotLoop() {
	defer e.wg.Done()
	for {
		select {
		case <-e.quit:
			return
		case <-e.snapReq:
			if err := e.snapshot(false); errors.Is(err, errDLQHeld) {
				// Put off while DLQ records wait for room (the next growth asks again).
				select {
				case <-e.quit:
					return
				case <-time.After(dlqRetryEvery):
				}
			} else if err != nil {
				e.logger.Error("wal snapshot failed", slog.Any("error", err))
			}
			e.snapPending.Store(false)
		}
	}
}

func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
