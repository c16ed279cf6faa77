//go:build unix

package client

import (
	"bytes"
	"context"
	"fmt"
	"github.com/spoolmq/spool/internal/netwrite"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spoolmq/spool/protocol"
)

// These tests check the direct write of a caller that waits for its answer (conn.writeDirect):
// they need a socket with a raw connection, so the client dials loopback TCP instead of
// net.Pipe, and the test still plays the broker with a peer.

// peerReadBuffer is the peer's receive buffer with tcpDial's small buffers: fixed (whatever the
// system's defaults), and not smaller, as below two loopback MSS (64 KiB each) the window
// updates stop and the transfer crawls.
const peerReadBuffer = 128 << 10

// tcpDial returns a dialer for n that connects over loopback TCP; with bufSize > 0 the client's
// send buffer is shrunk to about bufSize and the peer's receive buffer set to peerReadBuffer, so
// that a frame of a few times peerReadBuffer does not fit in the socket while the peer does not
// read.
func tcpDial(t *testing.T, n *pipeNet, bufSize int) func(ctx context.Context, network, addr string) (net.Conn, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
		if err != nil {
			return nil, err
		}
		s, err := ln.Accept()
		if err != nil {
			_ = c.Close()
			return nil, err
		}
		if bufSize > 0 {
			if err := c.(*net.TCPConn).SetWriteBuffer(bufSize); err != nil {
				return nil, err
			}
			if err := s.(*net.TCPConn).SetReadBuffer(peerReadBuffer); err != nil {
				return nil, err
			}
		}
		select {
		case n.accept <- s:
			return c, nil
		case <-n.done:
			return nil, fmt.Errorf("test network closed")
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// tcpClient is pipeClient over loopback TCP (tcpDial), with heartbeats far apart so that the
// writer has nothing of its own to send.
func tcpClient(t *testing.T, bufSize int) (*Client, *peer, *conn) {
	t.Helper()
	n := newPipeNet(t)
	c, p := dialPipe(t, n, func(h *protocol.HelloOK) {
		h.HeartbeatInterval, h.SessionTimeout = time.Hour, 3*time.Hour
	}, Dialer(tcpDial(t, n, bufSize)))
	closePipeClient(t, c, &n.last)
	cn := c.current()
	if cn == nil || !cn.nw.HasRaw() {
		t.Fatalf("connection %v has no raw connection", cn)
	}
	return c, p, cn
}

// TestSyncPublishWrittenByCaller: on an idle connection, a Publish that waits for its answer is
// written by the calling goroutine itself, not handed to the writer.
func TestSyncPublishWrittenByCaller(t *testing.T) {
	t.Parallel()
	c, p, cn := tcpClient(t, 0)
	const n = 20
	for i := range n {
		ch := make(chan error, 1)
		go func() {
			_, err := c.Publish(context.Background(), "t", Message{Payload: fmt.Appendf(nil, "m%d", i)})
			ch <- err
		}()
		corr, pub := expect[*protocol.Publish](p)
		if got := string(pub.Messages[0].Payload); got != fmt.Sprintf("m%d", i) {
			t.Fatalf("publish %d carries %q", i, got)
		}
		p.write(corr, &protocol.PublishOK{Positions: []protocol.Position{{Offset: int64(i)}}})
		if err := recv(t, ch, "publish"); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	// The writer is never woken here (no acks, no async publishes, heartbeats an hour apart), so
	// every request was written directly.
	if d, s := cn.nw.Counts(); d != n || s != 0 {
		t.Fatalf("direct writes %d (short %d), want %d (0)", d, s, n)
	}
}

// pausingRawConn is the socket's raw connection with a pause after its first Write: the caller
// writing directly still holds conn.smu, so the test can queue frames behind its write.
type pausingRawConn struct {
	syscall.RawConn
	once   sync.Once
	paused chan struct{} // closed after the first Write
	resume chan struct{} // closed by the test to end the pause
}

func (p *pausingRawConn) Write(f func(fd uintptr) bool) error {
	err := p.RawConn.Write(f)
	p.once.Do(func() {
		close(p.paused)
		<-p.resume
	})
	return err
}

// TestShortDirectWriteThenQueuedFrames: a request too large for the socket is written in part by
// its caller; the rest goes to the writer, and the frames queued meanwhile (synchronous publishes
// queued during the direct write, so that the writer takes them in the round that writes the
// rest; async publishes after it) follow it: the peer reads every frame whole and in order.
func TestShortDirectWriteThenQueuedFrames(t *testing.T) {
	t.Parallel()
	c, p, cn := tcpClient(t, 4096)
	pause := &pausingRawConn{RawConn: netwrite.Raw(cn.nc), paused: make(chan struct{}), resume: make(chan struct{})}
	cn.nw = netwrite.NewRaw(cn.nc, pause) // before any request: the callers read it after this

	big := bytes.Repeat([]byte("0123456789abcdef"), 48<<10) // 768 KiB, more than the socket holds
	done := make(chan error, 4)
	go func() {
		_, err := c.Publish(context.Background(), "big", Message{Payload: big})
		done <- err
	}()
	recv(t, pause.paused, "the direct write")
	// The peer does not read: the write stopped short. While its caller still holds the socket,
	// three more requests are queued for the writer, one after the other.
	queued := func() int {
		cn.wmu.Lock()
		defer cn.wmu.Unlock()
		return len(cn.wbuf)
	}
	for i := range 3 {
		before := queued()
		go func() {
			_, err := c.Publish(context.Background(), "small", Message{Payload: fmt.Appendf(nil, "s%d", i)})
			done <- err
		}()
		checkFor(t, waitTimeout, func() error {
			if queued() == before {
				return fmt.Errorf("publish s%d not queued yet", i)
			}
			return nil
		})
	}
	close(pause.resume)
	checkFor(t, waitTimeout, func() error {
		if _, short := cn.nw.Counts(); short == 0 {
			return fmt.Errorf("no short direct write")
		}
		return nil
	})
	const k = 50
	asyncDone := make(chan error, k)
	for i := range k {
		c.PublishAsync("async", Message{Payload: fmt.Appendf(nil, "a%d", i)}, func(_ Position, err error) { asyncDone <- err })
	}

	// The big frame whole, the three small ones in order, then the async messages in
	// PublishAsync order, however they were coalesced.
	corr, pub := expect[*protocol.Publish](p)
	if pub.Topic != "big" || len(pub.Messages) != 1 || !bytes.Equal(pub.Messages[0].Payload, big) {
		t.Fatalf("first frame: topic %q, %d messages", pub.Topic, len(pub.Messages))
	}
	p.write(corr, &protocol.PublishOK{Positions: []protocol.Position{{Offset: 0}}})
	for i := range 3 {
		corr, pub := expect[*protocol.Publish](p)
		if want := fmt.Sprintf("s%d", i); pub.Topic != "small" || len(pub.Messages) != 1 || string(pub.Messages[0].Payload) != want {
			t.Fatalf("frame %d: %q %+v, want small %s", i+2, pub.Topic, pub.Messages, want)
		}
		p.write(corr, &protocol.PublishOK{Positions: []protocol.Position{{Offset: int64(i)}}})
	}
	for next := 0; next < k; {
		corr, pub := expect[*protocol.Publish](p)
		if pub.Topic != "async" {
			t.Fatalf("unexpected publish to %q", pub.Topic)
		}
		for _, m := range pub.Messages {
			if want := fmt.Sprintf("a%d", next); string(m.Payload) != want {
				t.Fatalf("async message %q, want %q", m.Payload, want)
			}
			next++
		}
		p.write(corr, &protocol.PublishOK{Positions: make([]protocol.Position, len(pub.Messages))})
	}
	for range 4 {
		if err := recv(t, done, "publish"); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	for range k {
		if err := recv(t, asyncDone, "async publish"); err != nil {
			t.Fatalf("async publish: %v", err)
		}
	}
}
