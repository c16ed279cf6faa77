package wlog

import (
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"sync/atomic"
	"syscall"

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
// The bound is the pool's share of the process's descriptors; the rest (connections) can run out
// while the pool is under its bound. An open that fails for lack of descriptors (EMFILE, ENFILE)
// then closes half of the idle files and is tried once more (openFile).
//
// All methods are safe for concurrent use. Files.mu is taken after any Log lock and is never held
// across I/O: files are opened and closed outside it.
type Files struct {
	max int // 0: no bound

	mu    sync.Mutex
	open  int    // files open: handles with a file, opening handles, reserved slots
	idle  handle // sentinel of the idle list: open, unpinned handles, least recently used first
	nidle int    // handles in the idle list

	opens atomic.Int64 // files opened through the pool (tests, statistics)
	shed  atomic.Int64 // idle files closed because an open lacked descriptors
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
	Shed  int64 // idle files closed under the bound because an open failed with EMFILE or ENFILE
}

// Stats returns the pool's figures.
func (p *Files) Stats() FilesStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return FilesStats{Max: p.max, Open: p.open, Opens: p.opens.Load(), Shed: p.shed.Load()}
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
	victims := p.evictLocked(nil)
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
// are open, and appends their files to victims for the caller to close once p.mu is released.
// p.mu must be held.
func (p *Files) evictLocked(victims []File) []File {
	if p.max == 0 {
		return victims
	}
	for p.open > p.max && p.nidle > 0 {
		victims = p.takeIdleLocked(victims)
	}
	return victims
}

// takeIdleLocked takes the least recently used idle handle off (its file is closed, it opens again
// on its next use) and appends its file to victims. p.mu must be held, and the idle list must not be
// empty.
func (p *Files) takeIdleLocked(victims []File) []File {
	h := p.idle.next
	p.unlinkLocked(h)
	victims = append(victims, h.f)
	h.f = nil
	p.open--
	return victims
}

// closeAll closes the files of evicted idle handles and clears fs.
func closeAll(fs []File) {
	for i, f := range fs {
		_ = f.Close() // idle: nothing of it awaits a write or a sync
		fs[i] = nil
	}
}

// outOfFiles reports whether err says the process (EMFILE) or the system (ENFILE) ran out of file
// descriptors.
func outOfFiles(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// openFile opens path with fsys for the pool (a handle, a new segment, a spare). When the open
// fails for lack of descriptors it closes the files in pending (evicted, not yet closed: the
// caller's deferred closes, then emptied) and half of the idle files, least recently used first
// (at least one), and tries once more if that closed anything: the pool may be under its bound
// while connections took the rest of the process's limit, and its idle files are the descriptors
// that can be given back. Half, not one: the next opens then find room without shedding again,
// and the files used most recently stay open.
func (p *Files) openFile(fsys FS, path string, flag int, perm fs.FileMode, pending *[]File) (File, error) {
	f, err := fsys.OpenFile(path, flag, perm)
	if err == nil || !outOfFiles(err) {
		return f, err
	}
	closed := 0
	if pending != nil {
		closed = len(*pending)
		closeAll(*pending)
		*pending = (*pending)[:0]
	}
	p.mu.Lock()
	var victims []File
	for range (p.nidle + 1) / 2 {
		victims = p.takeIdleLocked(victims)
	}
	p.mu.Unlock()
	closeAll(victims)
	p.shed.Add(int64(len(victims)))
	if closed+len(victims) == 0 {
		return nil, err
	}
	return fsys.OpenFile(path, flag, perm)
}

func (p *Files) pushIdleLocked(h *handle) {
	h.prev, h.next = p.idle.prev, &p.idle
	h.prev.next, p.idle.prev = h, h
	p.nidle++
}

func (p *Files) unlinkLocked(h *handle) {
	h.prev.next, h.next.prev = h.next, h.prev
	h.prev, h.next = nil, nil
	p.nidle--
}

// acquire pins h and returns its file, opening it if needed (which may close idle files of other
// handles). Every successful acquire must be followed by one release; the file is valid until
// then. It fails with errRetired once h was retired, or with the open's error.
func (h *handle) acquire() (File, error) {
	var victims []File
	f, err := h.acquireDefer(&victims)
	closeAll(victims)
	return f, err
}

// acquireDefer is acquire, but appends the files of the idle handles it evicts to *victims for
// the caller to close later (closeAll): the committer closes them once it released Log.wmu.
func (h *handle) acquireDefer(victims *[]File) (File, error) {
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
	*victims = p.evictLocked(*victims)
	p.mu.Unlock()

	f, err := p.openFile(h.fs, h.path, flag, 0, victims)
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
	var victims []File
	h.releaseDefer(&victims)
	closeAll(victims)
}

// releaseDefer is release, but appends the files of the idle handles it evicts to *victims for
// the caller to close later (closeAll).
func (h *handle) releaseDefer(victims *[]File) {
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
	*victims = p.evictLocked(*victims)
	p.mu.Unlock()
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
