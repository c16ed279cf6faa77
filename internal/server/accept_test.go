package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// emfileListener fails its next fails accepts with EMFILE, as a process out of file descriptors
// does, then accepts from the real listener.
type emfileListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *emfileListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// lockedBuffer collects log lines from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestAcceptBacksOffWhenOutOfFiles: accepts that fail with EMFILE (issue 16: at ulimit -n 256 the
// server logged "accept4: too many open files" in a loop) are each followed by a pause of 5 ms
// doubling to 1 s, not retried at once; the streak logs one WARN and one INFO when it ends, and the
// connection that waited in the backlog is then served.
func TestAcceptBacksOffWhenOutOfFiles(t *testing.T) {
	t.Parallel()
	base := newEnv(t, nil, nil)
	logs := &lockedBuffer{}
	srv, err := New(Config{Logger: slog.New(slog.NewTextHandler(logs, nil)), Name: "emfile"}, base.b)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var pauses []time.Duration
	srv.pause = func(d time.Duration) { // records instead of sleeping: no timing in the test
		mu.Lock()
		pauses = append(pauses, d)
		mu.Unlock()
	}
	real, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const fails = 12
	ln := &emfileListener{Listener: real}
	ln.fails.Store(fails)
	if err := srv.Start(context.Background(), ln); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := srv.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	e := &env{t: t, engine: base.engine, b: base.b, srv: srv, addr: real.Addr().String()}
	c := e.dial(nil) // served once the streak is over
	c.publish("accept.after", "x")

	mu.Lock()
	got := append([]time.Duration(nil), pauses...)
	mu.Unlock()
	want := []time.Duration{5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000, 1000}
	if len(got) != fails {
		t.Fatalf("%d pauses for %d failed accepts: %v", len(got), fails, got)
	}
	for i, d := range got {
		if d != want[i]*time.Millisecond {
			t.Fatalf("pause %d after a failed accept = %v, want %v (all: %v)", i+1, d, want[i]*time.Millisecond, got)
		}
	}
	out := logs.String()
	if n := strings.Count(out, "accept failed"); n != 1 {
		t.Fatalf("%d WARN lines for one streak of %d failures, want 1:\n%s", n, fails, out)
	}
	if !strings.Contains(out, "too many open files") || !strings.Contains(out, "accept recovered") ||
		!strings.Contains(out, fmt.Sprintf("failures=%d", fails)) {
		t.Fatalf("logs do not name the cause and the streak's end with its failures:\n%s", out)
	}
}
