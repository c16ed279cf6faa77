//go:build unix

package server

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/spoolmq/spool/protocol"
)

// session returns the binary session of the server's only connection.
func (e *env) session() *binarySession {
	e.t.Helper()
	conns := e.srv.snapshot()
	if len(conns) != 1 {
		e.t.Fatalf("%d connections, want 1", len(conns))
	}
	c := conns[0]
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.sess.(*binarySession)
	if !ok {
		e.t.Fatalf("session %T, want binary", c.sess)
	}
	return b
}

// TestSyncPublishAnsweredByReader: a client that publishes one request at a time gets each answer
// written by the server goroutine that appended it (the reader), not by the writer.
func TestSyncPublishAnsweredByReader(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	// Heartbeats a minute apart: nothing wakes the writer after HelloOK.
	c := e.dial(&protocol.Hello{ClientName: "test", HeartbeatInterval: time.Minute})
	b := e.session()
	if !b.c.nw.HasRaw() {
		t.Fatal("a TCP connection has no raw connection")
	}
	const n = 30
	for i := range n {
		ok := c.publish("sync", fmt.Sprintf("m%d", i))
		if ok.Positions[0].Offset != int64(i) {
			t.Fatalf("publish %d got offset %d", i, ok.Positions[0].Offset)
		}
	}
	// Only the first answer may find the writer still finishing HelloOK's flush.
	if d, s := b.c.nw.Counts(); d < n-1 || s != 0 {
		t.Fatalf("answers written by the reader %d (short %d), want at least %d (0)", d, s, n-1)
	}
}

// TestShortDirectAnswerKeepsOrder: answers written without the writer to a client that does not
// read fill the socket; the rest of the short write and every answer queued behind it reach the
// client whole and in order once it reads.
func TestShortDirectAnswerKeepsOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	c := e.dial(&protocol.Hello{ClientName: "test", HeartbeatInterval: time.Minute})
	b := e.session()
	// A small send buffer on the server's socket: a few answers fill it.
	if err := e.srv.snapshot()[0].nc.(*net.TCPConn).SetWriteBuffer(4096); err != nil {
		t.Fatal(err)
	}

	// Pipelined publishes of many messages each: the answers (a position per message) are far
	// larger than what the socket holds while the client does not read.
	const reqs, msgs = 64, 500
	payloads := make([]string, msgs)
	for i := range payloads {
		payloads[i] = "p"
	}
	ms := make([]protocol.Message, reqs)
	for i := range ms {
		ms[i] = pub("order", payloads...)
	}
	corrs := c.pipeline(ms...)
	eventually(t, "a short direct write", func() error {
		if d, s := b.c.nw.Counts(); s == 0 {
			return fmt.Errorf("none yet (direct writes %d)", d)
		}
		return nil
	})

	for i, want := range corrs {
		corr, m := c.read()
		ok, isOK := m.(*protocol.PublishOK)
		if corr != want || !isOK {
			t.Fatalf("answer %d: corr %d %T %v, want PublishOK for %d", i, corr, m, m, want)
		}
		if len(ok.Positions) != msgs {
			t.Fatalf("answer %d: %d positions, want %d", i, len(ok.Positions), msgs)
		}
		for j, p := range ok.Positions {
			if want := int64(i*msgs + j); p.Offset != want {
				t.Fatalf("answer %d position %d: offset %d, want %d", i, j, p.Offset, want)
			}
		}
	}
	// The connection still works.
	if ok := c.publish("order", "last"); ok.Positions[0].Offset != reqs*msgs {
		t.Fatalf("last publish got offset %d", ok.Positions[0].Offset)
	}
}
