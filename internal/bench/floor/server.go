package floor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// maxGather bounds the committer's wait for the requests of its last round (Spool's committer
// has the same bound).
const maxGather = 500 * time.Microsecond

// ackSize is the size of an answer: the request's file offset and its length.
const ackSize = 16

// request is one frame waiting for its round.
type request struct {
	frame []byte
	off   int64 // set by the committer
	err   error
	done  chan struct{}
}

// sink makes a round durable: it sets each request's off and returns once the round is on disk.
type sink interface {
	commit(batch []*request, buf []byte) error
	close() error
}

// server is the minimal group-commit server: see the package comment.
type server struct {
	sinks    []sink // one committer each
	maxFrame int64  // largest frame accepted, length prefix included
	batch    int    // frames per request
	gather   bool

	mu    sync.Mutex
	queue []*request
	// queued counts the requests in queue; want is how many the gathering committer waits for
	// (0: it does not wait); arrived (capacity 1) wakes it.
	queued, want atomic.Int64
	arrived      chan struct{}
	closed       chan struct{}
	wg           sync.WaitGroup
}

// newServer starts a committer of rounds into each of sinks; requests are batch frames of up to
// maxFrame bytes each.
func newServer(sinks []sink, maxFrame int64, batch int, gather bool) *server {
	s := &server{sinks: sinks, maxFrame: maxFrame, batch: batch, gather: gather, arrived: make(chan struct{}, 1), closed: make(chan struct{})}
	for _, sk := range sinks {
		s.wg.Go(func() { s.commitLoop(sk) })
	}
	return s
}

// close stops the committers (requests still queued fail) and closes the sinks.
func (s *server) close() error {
	close(s.closed)
	s.wg.Wait()
	var errs []error
	for _, sk := range s.sinks {
		errs = append(errs, sk.close())
	}
	return errors.Join(errs...)
}

// accept serves every connection of ln on a goroutine until ln is closed.
func (s *server) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go s.serveConn(c)
	}
}

// serveConn reads requests (batch frames of a 4-byte big-endian length and a payload), has each
// committed and answers it with its offset and length, one at a time.
func (s *server) serveConn(c net.Conn) {
	defer c.Close()
	var hdr [4]byte
	var ack [ackSize]byte
	for {
		var frame []byte
		for range s.batch {
			if _, err := io.ReadFull(c, hdr[:]); err != nil {
				return
			}
			n := binary.BigEndian.Uint32(hdr[:])
			if n == 0 || int64(n)+4 > s.maxFrame {
				return
			}
			frame = append(slices.Grow(frame, 4+int(n)), hdr[:]...) // one allocation for a batch of 1
			frame = frame[:len(frame)+int(n)]
			if _, err := io.ReadFull(c, frame[len(frame)-int(n):]); err != nil {
				return
			}
		}
		r := &request{frame: frame, done: make(chan struct{})}
		s.enqueue(r)
		<-r.done
		if r.err != nil {
			return
		}
		binary.BigEndian.PutUint64(ack[:8], uint64(r.off))
		binary.BigEndian.PutUint64(ack[8:], uint64(len(frame)))
		if _, err := c.Write(ack[:]); err != nil {
			return
		}
	}
}

// enqueue queues r and wakes the committer unless it gathers and more are expected.
func (s *server) enqueue(r *request) {
	s.mu.Lock()
	s.queue = append(s.queue, r)
	n := s.queued.Add(1)
	s.mu.Unlock()
	if w := s.want.Load(); w == 0 || n >= w {
		select {
		case s.arrived <- struct{}{}:
		default:
		}
	}
}

// commitLoop runs rounds into sk until close: gather, take the queue, commit it, release the
// requests. Several committers take turns at the queue, each with its own rounds.
func (s *server) commitLoop(sk sink) {
	var last int
	var buf []byte
	for {
		if s.gather && last > 1 {
			s.gatherFor(int64(last))
		}
		s.mu.Lock()
		for len(s.queue) == 0 {
			s.mu.Unlock()
			select {
			case <-s.arrived:
			case <-s.closed:
				s.failQueued()
				return
			}
			s.mu.Lock()
		}
		batch := s.queue
		s.queue = nil
		s.queued.Store(0)
		s.mu.Unlock()

		buf = buf[:0]
		for _, r := range batch {
			buf = append(buf, r.frame...)
		}
		err := sk.commit(batch, buf)
		for _, r := range batch {
			r.err = err
			close(r.done)
		}
		last = len(batch)
	}
}

// gatherFor waits until n requests are queued, at most maxGather.
func (s *server) gatherFor(n int64) {
	s.want.Store(n)
	if s.queued.Load() < n {
		t := time.NewTimer(maxGather)
		select {
		case <-s.arrived:
		case <-t.C:
		case <-s.closed:
		}
		t.Stop()
	}
	s.want.Store(0)
	select {
	case <-s.arrived:
	default:
	}
}

// fileSink writes rounds into a preallocated file, one pwrite and one fdatasync per round,
// wrapping to the start when the file is full; a request's off is its frame's file offset.
type fileSink struct {
	f    *os.File
	size int64
	off  int64
}

// newFileSink creates (or truncates) file, zero-fills size bytes of it and syncs it, so that
// rounds overwrite allocated blocks.
func newFileSink(file string, size int64) (*fileSink, error) {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	zero := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(zero)) {
		if _, err := f.WriteAt(zero[:min(int64(len(zero)), size-off)], off); err != nil {
			f.Close()
			return nil, err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	return &fileSink{f: f, size: size}, nil
}

func (fs *fileSink) commit(batch []*request, buf []byte) error {
	if int64(len(buf)) > fs.size {
		return fmt.Errorf("round of %d bytes exceeds the file", len(buf))
	}
	if fs.off+int64(len(buf)) > fs.size {
		fs.off = 0
	}
	if _, err := fs.f.WriteAt(buf, fs.off); err != nil {
		return err
	}
	if err := unix.Fdatasync(int(fs.f.Fd())); err != nil {
		return err
	}
	for _, r := range batch {
		r.off = fs.off
		fs.off += int64(len(r.frame))
	}
	return nil
}

func (fs *fileSink) close() error { return fs.f.Close() }

// failQueued fails what is still queued (close).
func (s *server) failQueued() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.queue {
		r.err = errors.New("server closed")
		close(r.done)
	}
	s.queue = nil
}
