package testutil

import (
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// AcceptBackoff is the shared test of an accept loop's back-off (the TCP server's and the HTTP
// listener's, issue 16): its Listener fails its first accepts with EMFILE, as a process out of
// file descriptors does, then accepts for real; Pause is the loop's pause hook and records
// instead of sleeping (nothing is timed); Logs collects the loop's log lines. Check then says
// whether each failure was followed by the expected pause and the streak logged once.
type AcceptBackoff struct {
	// Listener fails the first Fails accepts with EMFILE.
	Listener *EMFILEListener
	// Logs is for the loop's text logger.
	Logs *SyncBuffer
	// Fails is how many accepts fail.
	Fails int

	mu     sync.Mutex
	pauses []time.Duration
}

// NewAcceptBackoff listens on a loopback port (closed with the test) behind an EMFILEListener
// that fails the first fails accepts.
func NewAcceptBackoff(t testing.TB, fails int) *AcceptBackoff {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	em := &EMFILEListener{Listener: ln}
	em.fails.Store(int32(fails))
	return &AcceptBackoff{Listener: em, Logs: &SyncBuffer{}, Fails: fails}
}

// Addr is the address clients dial.
func (a *AcceptBackoff) Addr() string { return a.Listener.Addr().String() }

// Pause records a pause of the accept loop; it is the loop's pause hook.
func (a *AcceptBackoff) Pause(d time.Duration) {
	a.mu.Lock()
	a.pauses = append(a.pauses, d)
	a.mu.Unlock()
}

// Check fails the test unless each failed accept was followed by a pause of 5 ms doubling to
// 1 s, and the logs hold one WARN line "... accept failed ..." naming the cause and one INFO line
// "... accept recovered" with the streak's failures. Call it once a connection was served after
// the streak.
func (a *AcceptBackoff) Check(t testing.TB) {
	t.Helper()
	a.mu.Lock()
	got := append([]time.Duration(nil), a.pauses...)
	a.mu.Unlock()
	if len(got) != a.Fails {
		t.Fatalf("%d pauses for %d failed accepts: %v", len(got), a.Fails, got)
	}
	want := 5 * time.Millisecond
	for i, d := range got {
		if d != want {
			t.Fatalf("pause %d after a failed accept = %v, want %v (all: %v)", i+1, d, want, got)
		}
		want = min(2*want, time.Second)
	}
	out := a.Logs.String()
	if n := strings.Count(out, "accept failed"); n != 1 {
		t.Fatalf("%d WARN lines for one streak of %d failures, want 1:\n%s", n, a.Fails, out)
	}
	recovered := false
	for l := range strings.Lines(out) {
		if strings.Contains(l, `accept recovered"`) && strings.Contains(l, fmt.Sprintf(" failures=%d ", a.Fails)) {
			recovered = true
		}
	}
	if !strings.Contains(out, "too many open files") || !recovered {
		t.Fatalf("logs do not name the cause and the streak's end with its %d failures:\n%s", a.Fails, out)
	}
}

// EMFILEListener fails its next accepts with EMFILE, then accepts from the real listener.
type EMFILEListener struct {
	net.Listener
	fails atomic.Int32
}

// Accept fails with EMFILE while failures are left.
func (l *EMFILEListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}
