package floor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// load is the publishers: each on its own connection writes a frame and waits for its answer,
// again and again until stop.
type load struct {
	acked    atomic.Int64
	stopping atomic.Bool
	conns    []net.Conn
	wg       sync.WaitGroup
	once     sync.Once
	mu       sync.Mutex
	err      error
}

// startLoad dials addr publishers times and starts the publishers, each sending batch messages
// per request. Each payload starts with the publisher's number and the message's sequence number
// (8 bytes each, big-endian), so that what the server wrote can be checked.
func startLoad(addr string, publishers, size, batch int) (*load, error) {
	l := &load{}
	for range publishers {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			l.stop()
			return nil, err
		}
		l.conns = append(l.conns, c)
	}
	for i, c := range l.conns {
		l.wg.Go(func() { l.publish(c, uint64(i), size, batch) })
	}
	return l, nil
}

// publish is one publisher: a request is batch frames (4-byte big-endian length, payload) end
// to end, answered as one.
func (l *load) publish(c net.Conn, id uint64, size, batch int) {
	frame := make([]byte, batch*(4+size))
	for m := range batch {
		binary.BigEndian.PutUint32(frame[m*(4+size):], uint32(size))
		binary.BigEndian.PutUint64(frame[m*(4+size)+4:], id)
	}
	var ack [ackSize]byte
	for seq := uint64(0); !l.stopping.Load(); {
		for m := range batch {
			binary.BigEndian.PutUint64(frame[m*(4+size)+12:], seq)
			seq++
		}
		if _, err := c.Write(frame); err != nil {
			l.fail(err)
			return
		}
		if _, err := io.ReadFull(c, ack[:]); err != nil {
			l.fail(err)
			return
		}
		if n := binary.BigEndian.Uint64(ack[8:]); n != uint64(len(frame)) {
			l.fail(fmt.Errorf("publisher %d: answer for %d bytes, sent %d", id, n, len(frame)))
			return
		}
		l.acked.Add(int64(batch))
	}
}

// fail keeps the first error of a publisher that did not stop on purpose.
func (l *load) fail(err error) {
	if l.stopping.Load() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = err
	}
}

// count returns how many messages were acknowledged so far.
func (l *load) count() int64 { return l.acked.Load() }

// stop stops the publishers (each finishes its message in flight), closes the connections and
// returns the first error a publisher met.
func (l *load) stop() error {
	l.once.Do(func() {
		l.stopping.Store(true)
		l.wg.Wait()
		for _, c := range l.conns {
			c.Close()
		}
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil && !errors.Is(l.err, net.ErrClosed) {
		return l.err
	}
	return nil
}
