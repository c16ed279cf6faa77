package client

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/testutil"
)

// TestMain fails the package when goroutines outlive the tests: every client a test dials is
// closed by its cleanup, and every in-process broker is stopped, so the count must come back to
// what it was before.
func TestMain(m *testing.M) {
	os.Exit(testutil.RunLeakChecked(m, 10*time.Second))
}

// waitTimeout bounds every wait of these tests; nothing is timed, a test fails only when an
// expected event never happens.
const waitTimeout = 20 * time.Second

// checkFor polls f until it returns nil or the timeout passes (then the test fails with f's last
// error).
func checkFor(t testing.TB, timeout time.Duration, f func() error) {
	t.Helper()
	testutil.Eventually(t, timeout, "condition", f)
}

// recv receives from ch or fails the test after waitTimeout.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitTimeout):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// testLogger routes logs to t.Log at INFO (DEBUG with SPOOL_DEBUG=1), dropping lines once the test
// has finished (a late log from a closing goroutine would panic).
func testLogger(t testing.TB) *slog.Logger {
	level := slog.LevelInfo
	if os.Getenv("SPOOL_DEBUG") == "1" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(&tWriter{t: t, done: testDone(t)}, &slog.HandlerOptions{Level: level}))
}

func testDone(t testing.TB) <-chan struct{} {
	ch := make(chan struct{})
	t.Cleanup(func() { close(ch) })
	return ch
}

type tWriter struct {
	t    testing.TB
	done <-chan struct{}
}

func (w *tWriter) Write(p []byte) (int, error) {
	select {
	case <-w.done:
	default:
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// closeClient closes c at the end of the test and fails it if Close fails.
func closeClient(t testing.TB, c *Client) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}
