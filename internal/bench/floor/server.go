package floor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
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

// server is the minimal group-commit server: see the package comment.
type server struct {
	f        *os.File
	fileSize int64
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

// newServer creates (or truncates) file, zero-fills fileSize bytes of it and syncs it, so that
// rounds overwrite allocated blocks, and starts the committer.
func newServer(file string, fileSize int64, gather bool) (*server, error) {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	zero := make([]byte, 1<<20)
	for off := int64(0); off < fileSize; off += int64(len(zero)) {
		if _, err := f.WriteAt(zero[:min(int64(len(zero)), fileSize-off)], off); err != nil {
			f.Close()
			return nil, err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	s := &server{f: f, fileSize: fileSize, gather: gather, arrived: make(chan struct{}, 1), closed: make(chan struct{})}
	s.wg.Add(1)
	go s.commitLoop()
	return s, nil
}

// close stops the committer (requests still queued fail) and closes the file.
func (s *server) close() error {
	close(s.closed)
	s.wg.Wait()
	return s.f.Close()
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

// serveConn reads frames (4-byte big-endian length, payload), has each committed and answers it
// with its offset and length, one at a time.
func (s *server) serveConn(c net.Conn) {
	defer c.Close()
	var hdr [4]byte
	var ack [ackSize]byte
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n == 0 || int64(n)+4 > s.fileSize {
			return
		}
		frame := make([]byte, 4+n)
		copy(frame, hdr[:])
		if _, err := io.ReadFull(c, frame[4:]); err != nil {
			return
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

// commitLoop runs rounds until close: gather, take the queue, write it at the next offset
// (wrapping to 0 when the file is full), fdatasync, release the requests.
func (s *server) commitLoop() {
	defer s.wg.Done()
	var off int64
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
		if off+int64(len(buf)) > s.fileSize {
			off = 0
		}
		err := s.write(buf, off)
		pos := off
		for _, r := range batch {
			r.off, r.err = pos, err
			pos += int64(len(r.frame))
			close(r.done)
		}
		off = pos
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

// write writes b at off and syncs the file's data.
func (s *server) write(b []byte, off int64) error {
	if int64(len(b)) > s.fileSize {
		return fmt.Errorf("round of %d bytes exceeds the file", len(b))
	}
	if _, err := s.f.WriteAt(b, off); err != nil {
		return err
	}
	return unix.Fdatasync(int(s.f.Fd()))
}

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
