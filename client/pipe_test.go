package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/spoolmq/spool/protocol"
)

// This file is the harness of the framing and reconnect tests: the client dials through
// net.Pipe (the OS seam) and the test plays the broker's side of the wire with a scripted peer.
// Tests that need the real broker are in integration_test.go.

// pipeNet hands out in-memory connections: every dial blocks until the test accepts it, so the
// test decides when a (re)connection happens.
type pipeNet struct {
	accept chan net.Conn
	done   chan struct{}
	// last is the peer acceptPeer returned last (the test's goroutine only).
	last *peer
}

func newPipeNet(t *testing.T) *pipeNet {
	n := &pipeNet{accept: make(chan net.Conn), done: make(chan struct{})}
	t.Cleanup(func() { close(n.done) })
	return n
}

func (n *pipeNet) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	c, s := net.Pipe()
	select {
	case n.accept <- s:
		return c, nil
	case <-n.done:
		return nil, errors.New("pipe network closed")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// acceptPeer waits for the client's next connection.
func (n *pipeNet) acceptPeer(t *testing.T) *peer {
	t.Helper()
	nc := recv(t, n.accept, "a connection from the client")
	p := &peer{t: t, nc: nc, r: protocol.NewReader(nc, 0), w: protocol.NewWriter(nc, 0)}
	t.Cleanup(func() { _ = nc.Close() })
	n.last = p
	return p
}

// peer is the broker's side of one connection, driven by the test.
type peer struct {
	t  *testing.T
	nc net.Conn
	r  *protocol.Reader
	w  *protocol.Writer
}

// handshake reads the preamble and Hello and answers with a HelloOK (defaults: heartbeat 10 s,
// session timeout 30 s, 10 MiB frames), changed by mod.
func (p *peer) handshake(mod func(*protocol.HelloOK)) *protocol.Hello {
	p.t.Helper()
	_ = p.nc.SetReadDeadline(time.Now().Add(waitTimeout))
	if err := p.r.ReadPreamble(); err != nil {
		p.t.Fatalf("peer: read preamble: %v", err)
	}
	corr, m, err := p.r.ReadClientMessage()
	if err != nil {
		p.t.Fatalf("peer: read hello: %v", err)
	}
	hello, ok := m.(*protocol.Hello)
	if !ok || corr == 0 {
		p.t.Fatalf("peer: got %T corr %d, want Hello", m, corr)
	}
	resp := &protocol.HelloOK{
		Version: protocol.MaxVersion, ServerName: "peer", SessionID: "s1",
		HeartbeatInterval: 10 * time.Second, SessionTimeout: 30 * time.Second,
		MaxFrameSize: protocol.DefaultMaxFrameSize, MaxMessageSize: protocol.DefaultMaxMessageSize,
	}
	if mod != nil {
		mod(resp)
	}
	if err := p.w.WritePreamble(); err != nil {
		p.t.Fatalf("peer: %v", err)
	}
	p.write(corr, resp)
	// Like a broker, the peer speaks the version its HelloOK chose from then on (a mod choosing
	// an earlier one plays an older broker).
	p.r.SetVersion(resp.Version)
	p.w.SetVersion(resp.Version)
	return hello
}

// write sends one frame.
func (p *peer) write(corr uint32, m protocol.Message) {
	p.t.Helper()
	if err := p.tryWrite(corr, m); err != nil {
		p.t.Fatalf("peer: %v", err)
	}
}

// tryWrite writes m and returns the error: for a peer goroutine that the client's close may
// interrupt.
func (p *peer) tryWrite(corr uint32, m protocol.Message) error {
	_ = p.nc.SetWriteDeadline(time.Now().Add(waitTimeout))
	if err := p.w.WriteMessage(corr, m); err != nil {
		return fmt.Errorf("write %s: %w", m.Opcode(), err)
	}
	if err := p.w.Flush(); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	return nil
}

// read returns the client's next frame, answering heartbeats on the way.
func (p *peer) read() (uint32, protocol.ClientMessage) {
	p.t.Helper()
	for {
		_ = p.nc.SetReadDeadline(time.Now().Add(waitTimeout))
		corr, m, err := p.r.ReadClientMessage()
		if err != nil {
			p.t.Fatalf("peer: read: %v", err)
		}
		if hb, ok := m.(*protocol.Heartbeat); ok {
			p.write(corr, &protocol.HeartbeatOK{Echo: hb.Time, Time: time.Now()})
			continue
		}
		return corr, m
	}
}

// expect reads the next frame and checks its type.
func expect[T protocol.ClientMessage](p *peer) (uint32, T) {
	p.t.Helper()
	corr, m := p.read()
	v, ok := m.(T)
	if !ok {
		var zero T
		p.t.Fatalf("peer: got %T, want %T", m, zero)
	}
	return corr, v
}

// serveClose answers the client's Goodbye (acks before it are answered too) and closes.
func (p *peer) serveClose() {
	for {
		_ = p.nc.SetReadDeadline(time.Now().Add(waitTimeout))
		corr, m, err := p.r.ReadClientMessage()
		if err != nil {
			return
		}
		switch m := m.(type) {
		case *protocol.Goodbye:
			p.write(corr, &protocol.GoodbyeOK{})
			_ = p.nc.Close()
			return
		case *protocol.Ack:
			p.write(corr, &protocol.AckOK{Acked: uint32(len(m.Refs))})
		case *protocol.Unsubscribe:
			p.write(corr, &protocol.UnsubscribeOK{})
		case *protocol.Heartbeat:
			p.write(corr, &protocol.HeartbeatOK{Echo: m.Time, Time: time.Now()})
		}
	}
}

// dialPipe dials a client over n and completes the handshake with mod.
func dialPipe(t *testing.T, n *pipeNet, mod func(*protocol.HelloOK), opts ...Opt) (*Client, *peer) {
	t.Helper()
	opts = append([]Opt{Dialer(n.dial), Logger(testLogger(t)), ReconnectBackoff(time.Millisecond, 5*time.Millisecond, 0.2)}, opts...)
	type result struct {
		c   *Client
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := Dial(context.Background(), "pipe:1", opts...)
		ch <- result{c, err}
	}()
	p := n.acceptPeer(t)
	p.handshake(mod)
	r := recv(t, ch, "Dial")
	if r.err != nil {
		t.Fatalf("Dial: %v", r.err)
	}
	return r.c, p
}

// pipeClient dials a client over a new pipeNet with dialPipe and closes it at the end of the test
// (closePipeClient) while the peer the test accepted last answers the Goodbye.
func pipeClient(t *testing.T, mod func(*protocol.HelloOK), opts ...Opt) (*pipeNet, *Client, *peer) {
	t.Helper()
	n := newPipeNet(t)
	c, p := dialPipe(t, n, mod, opts...)
	closePipeClient(t, c, &n.last)
	return n, c, p
}

// closePipeClient closes c at the end of the test while p answers the Goodbye.
func closePipeClient(t *testing.T, c *Client, p **peer) {
	t.Cleanup(func() {
		done := make(chan struct{})
		go func() {
			defer close(done)
			(*p).serveClose()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		_ = (*p).nc.Close()
		<-done
	})
}
