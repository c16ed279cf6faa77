package netwrite

import (
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// Writer is the write side of one connection shared by its writer goroutine and the goroutines
// that write without it: Direct writes without waiting and keeps what the socket did not take,
// FlushRest (the writer) writes that first, and the time of the last write is kept for the
// heartbeats. Direct and FlushRest need the caller's lock over the socket's writes (the
// connection's write lock); Wrote, Since and Counts are safe for concurrent use.
type Writer struct {
	nc   net.Conn
	rc   syscall.RawConn
	born time.Time
	// last is when bytes were last handed to the socket, as time since born.
	last atomic.Int64
	// rest is what Direct left unwritten (guarded by the caller's write lock).
	rest []byte
	// direct counts the Direct calls that wrote, short those the socket did not take whole.
	direct, short atomic.Int64
}

// maxKeptRest is the largest rest buffer kept for reuse.
const maxKeptRest = 64 << 10

// New returns the Writer of nc; Direct is possible when nc has a raw connection (Raw).
func New(nc net.Conn) *Writer { return NewRaw(nc, Raw(nc)) }

// NewRaw is New with the raw connection given (nil: no direct writes).
func NewRaw(nc net.Conn, rc syscall.RawConn) *Writer {
	return &Writer{nc: nc, rc: rc, born: time.Now()}
}

// HasRaw reports whether the socket has a raw connection (Direct is possible at all).
func (w *Writer) HasRaw() bool { return w.rc != nil }

// CanDirect reports whether Direct may be called: the socket has a raw connection and nothing
// that Direct left waits for FlushRest (it must go first). Write lock held.
func (w *Writer) CanDirect() bool { return w.rc != nil && len(w.rest) == 0 }

// Pending reports whether bytes that Direct left wait for FlushRest. Write lock held.
func (w *Writer) Pending() bool { return len(w.rest) > 0 }

// Direct writes b without waiting (noWait); what the socket does not take is kept for FlushRest,
// and short says so: the caller must wake its writer. An error means the connection is broken.
// CanDirect must hold; write lock held.
func (w *Writer) Direct(b []byte) (short bool, err error) {
	n, err := noWait(w.rc, b)
	w.direct.Add(1)
	if err != nil {
		return false, err
	}
	if n > 0 {
		w.Wrote(time.Now())
	}
	if n < len(b) {
		w.short.Add(1)
		w.rest = append(w.rest, b[n:]...)
		return true, nil
	}
	return false, nil
}

// FlushRest writes what Direct left, waiting up to the connection's write deadline, and reports
// whether there was anything. Write lock held.
func (w *Writer) FlushRest() (bool, error) {
	if len(w.rest) == 0 {
		return false, nil
	}
	if _, err := w.nc.Write(w.rest); err != nil {
		return true, err
	}
	if cap(w.rest) > maxKeptRest {
		w.rest = nil
	}
	w.rest = w.rest[:0]
	return true, nil
}

// WriteOrStall writes b like the socket's Write (waiting up to its write deadline), but first
// without waiting: when the socket does not take b whole, stalled is called before the wait, so
// that the caller can stop what would pile up behind it meanwhile. Without a raw connection it is
// the socket's Write (stalled is never called). Write lock held.
func (w *Writer) WriteOrStall(b []byte, stalled func()) (int, error) {
	if w.rc == nil {
		return w.nc.Write(b)
	}
	n, err := noWait(w.rc, b)
	if err != nil || n == len(b) {
		return n, err
	}
	stalled()
	m, err := w.nc.Write(b[n:])
	return n + m, err
}

// Wrote records that bytes were handed to the socket at t.
func (w *Writer) Wrote(t time.Time) { w.last.Store(int64(t.Sub(w.born))) }

// Since returns the time from the last write (or from New when there was none) to now.
func (w *Writer) Since(now time.Time) time.Duration {
	return now.Sub(w.born) - time.Duration(w.last.Load())
}

// Counts returns how many Direct calls there were and how many of them the socket did not take
// whole (tests, debugging).
func (w *Writer) Counts() (direct, short int64) { return w.direct.Load(), w.short.Load() }
