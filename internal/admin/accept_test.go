package admin

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
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

// syncBuffer collects log lines from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestLimitListenerBacksOffWhenOutOfFiles: HTTP accepts that fail with EMFILE are each followed
// by a pause of 5 ms doubling to 1 s (net/http would log a line per failure, issue 16): one WARN
// for the streak, one INFO at its end, and the request that waited in the backlog is served.
func TestLimitListenerBacksOffWhenOutOfFiles(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	real, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const fails = 12
	em := &emfileListener{Listener: real}
	em.fails.Store(fails)
	logs := &syncBuffer{}
	ll := LimitListener(em, 4, nil, slog.New(slog.NewTextHandler(logs, nil))).(*limitListener)
	var mu sync.Mutex
	var pauses []time.Duration
	ll.pause = func(d time.Duration) { // records instead of sleeping: no timing in the test
		mu.Lock()
		pauses = append(pauses, d)
		mu.Unlock()
	}
	httpLogs := &syncBuffer{}
	srv := NewServer(e.h, slog.New(slog.NewTextHandler(httpLogs, nil)))
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ll) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	res, nc := rawRequest(t, real.Addr().String(), "GET /healthz HTTP/1.1\r\nHost: spool\r\n\r\n")
	res.Body.Close()
	nc.Close()
	if res.StatusCode != 200 {
		t.Fatalf("request after the failed accepts: %d", res.StatusCode)
	}
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
	if n := strings.Count(out, "accept failed"); n != 1 || !strings.Contains(out, "too many open files") ||
		!strings.Contains(out, fmt.Sprintf("accept recovered\" failures=%d", fails)) {
		t.Fatalf("want one WARN naming the cause and one INFO with %d failures:\n%s", fails, out)
	}
	if strings.Contains(httpLogs.String(), "Accept error") {
		t.Fatalf("net/http saw the failures and logged them:\n%s", httpLogs.String())
	}
}
