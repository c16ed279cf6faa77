package wlog

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/spoolmq/spool/internal/storage"
)

// Files bounds the segment files the logs sharing it keep open (Options.Files), so that an
// engine with thousands of idle partitions does not hold a file descriptor per segment. Every
// segment has a handle, opened on use and pinned for the duration of each read, write or sync;
// an unpinned open handle is idle, and when more than Max files are open the idle ones unused the
// longest are closed (least recently used first). A busy log's active segment is pinned or at the
// recently used end, so it stays open: its fdatasyncs and its preallocated, zero-filled blocks do
// not change (closing a file keeps both its data and its allocation). A pinned handle is never
// closed: the bound is exceeded only while more than Max files are in use at the same moment
// (each is then closed as soon as it is released). A spare segment being prepared counts as an
// open file too.
//
// All methods are safe for concurrent use. Files.mu is taken after any Log lock and is never held
// across I/O: files are opened and closed outside it.
type Files struct {
	max int // 0: no bound

	mu   sync.Mutex
	open int    // files open: handles with a file, opening handles, reserved slots
	idle handle // sentinel of the idle list: open, unpinned handles, least recently used first

	opens atomic.Int64 // files opened through the pool (tests, statistics)
}

// NewFiles returns a pool that keeps at most n segment files open while they are idle; n <= 0
// means no bound.
func NewFiles(n int) *Files {
	p := &Files{max: max(n, 0)}
	p.idle.prev, p.idle.next = &p.idle, &p.idle
	return p
}

// FilesStats describes a pool.
type FilesStats struct {
	Max   int   // the bound (0: none)
	Open  int   // files open now
	Opens int64 // files opened since the pool was made (reopens of closed idle handles included)
}

// Stats returns the pool's figures.
func (p *Files) Stats() FilesStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return FilesStats{Max: p.max, Open: p.open, Opens: p.opens.Load()}
}

// handle is the file of one segment, opened on demand (acquire) and closed when idle and over
// the pool's bound, or when retired.
type handle struct {
	p    *Files
	fs   FS
	path string

	// Guarded by p.mu.
	flag    int  // open flags of a reopen
	f       File // nil while closed
	pins    int
	gone    bool          // retired: never opened again, closed at the last release
	opening chan struct{} // closed once the open in progress ended
	// Links of the idle list; nil while not in it.
	prev, next *handle
}

// errRetired is returned by acquire on a retired handle; readers translate it like a read of a
// closed file (Log.readErr).
var errRetired = fmt.Errorf("%w: wlog: segment file closed", storage.ErrClosed)

// newHandle returns a closed handle of the file at path, opened with flag on first use.
func (p *Files) newHandle(fsys FS, path string, flag int) *handle {
	return &handle{p: p, fs: fsys, path: path, flag: flag}
}

// adopt returns a handle of f, whose slot the caller reserved (reserve), pinned once for the
// caller.
func (p *Files) adopt(fsys FS, path string, flag int, f File) *handle {
	return &handle{p: p, fs: fsys, path: path, flag: flag, f: f, pins: 1}
}

// reserve counts a file the caller is about to open outside a handle (a new segment, a spare),
// closing idle files to make room. Give the slot back with unreserve, or to a handle with adopt.
func (p *Files) reserve() {
	p.mu.Lock()
	p.open++
	victims := p.evictLocked()
	p.mu.Unlock()
	closeAll(victims)
}

// unreserve gives back a slot of reserve whose file was closed (or never opened).
func (p *Files) unreserve() {
	p.mu.Lock()
	p.open--
	p.mu.Unlock()
}

// evictLocked takes idle handles off, least recently used first, while more files than the bound
// are open, and returns their files for the caller to close once p.mu is released. p.mu must be
// held.
func (p *Files) evictLocked() []File {
	if p.max == 0 {
		return nil
	}
	var victims []File
	for p.open > p.max && p.idle.next != &p.idle {
		h := p.idle.next
		p.unlinkLocked(h)
		victims = append(victims, h.f)
		h.f = nil
		p.open--
	}
	return victims
}

func closeAll(fs []File) {
	for _, f := range fs {
		_ = f.Close() // idle: nothing of it awaits a write or a sync
	}
}

func (p *Files) pushIdleLocked(h *handle) {
	h.prev, h.next = p.idle.prev, &p.idle
	h.prev.next, p.idle.prev = h, h
}

func (p *Files) unlinkLocked(h *handle) {
	h.prev.next, h.next.prev = h.next, h.prev
	h.prev, h.next = nil, nil
}

// acquire pins h and returns its file, opening it if needed (which may close idle files of other
// handles). Every successful acquire must be followed by one release; the file is valid until
// then. It fails with errRetired once h was retired, or with the open's error.
func (h *handle) acquire() (File, error) {
	p := h.p
	p.mu.Lock()
	for {
		switch {
		case h.gone:
			p.mu.Unlock()
			return nil, errRetired
		case h.f != nil:
			if h.pins == 0 {
				p.unlinkLocked(h)
			}
			h.pins++
			f := h.f
			p.mu.Unlock()
			return f, nil
		case h.opening != nil:
			ch := h.opening
			p.mu.Unlock()
			<-ch
			p.mu.Lock()
			continue
		}
		break
	}
	ch := make(chan struct{})
	h.opening = ch
	flag := h.flag
	p.open++
	victims := p.evictLocked()
	p.mu.Unlock()
	closeAll(victims)

	f, err := h.fs.OpenFile(h.path, flag, 0)
	p.opens.Add(1)

	p.mu.Lock()
	h.opening = nil
	close(ch)
	switch {
	case err != nil:
		p.open--
		p.mu.Unlock()
		return nil, fmt.Errorf("wlog: open %s: %w", h.path, err)
	case h.gone:
		p.open--
		p.mu.Unlock()
		_ = f.Close()
		return nil, errRetired
	}
	h.f = f
	h.pins++
	p.mu.Unlock()
	return f, nil
}

// file returns h's file; the caller must hold a pin (acquire), which keeps it open and unchanged.
func (h *handle) file() File { return h.f }

// release unpins h. The last release of a retired handle closes its file; an open handle becomes
// idle (most recently used), and idle files over the bound are closed.
func (h *handle) release() {
	p := h.p
	p.mu.Lock()
	h.pins--
	if h.pins > 0 {
		p.mu.Unlock()
		return
	}
	if h.gone {
		f := h.f
		h.f = nil
		p.open--
		p.mu.Unlock()
		_ = f.Close()
		return
	}
	p.pushIdleLocked(h)
	victims := p.evictLocked()
	p.mu.Unlock()
	closeAll(victims)
}

// setFlag changes the flags of h's next open (a sealed segment is reopened read-only).
func (h *handle) setFlag(flag int) {
	h.p.mu.Lock()
	h.flag = flag
	h.p.mu.Unlock()
}

// retire closes h for good: at once when it is not pinned (returning the close's error), else at
// its last release. Later acquires fail with errRetired.
func (h *handle) retire() error {
	p := h.p
	p.mu.Lock()
	if h.gone {
		p.mu.Unlock()
		return nil
	}
	h.gone = true
	if h.f == nil || h.pins > 0 {
		p.mu.Unlock()
		return nil // closed, opening (acquire closes it) or pinned (release closes it)
	}
	p.unlinkLocked(h)
	f := h.f
	h.f = nil
	p.open--
	p.mu.Unlock()
	return f.Close()
}
