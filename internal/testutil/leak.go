// Package testutil holds what the tests of several packages share. It is imported by _test.go
// files only.
package testutil

import (
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
)

// RunLeakChecked runs the package's tests and returns the exit code for TestMain, failing the
// package when goroutines outlive the tests: every component a test starts is stopped by its
// cleanup, so the goroutine count must come back to what it was before. It waits up to grace for
// goroutines that are exiting, after calling each beforeCheck (for example to close idle HTTP
// connections), and prints every goroutine's stack on a leak.
func RunLeakChecked(m *testing.M, grace time.Duration, beforeCheck ...func()) int {
	before := runtime.NumGoroutine()
	code := m.Run()
	if code != 0 {
		return code
	}
	for _, f := range beforeCheck {
		f()
	}
	deadline := time.Now().Add(grace)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling for goroutines to finish exiting
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		fmt.Fprintf(os.Stderr, "goroutine leak: %d goroutines before the tests, %d after\n%s\n", before, n, buf)
		return 1
	}
	return 0
}
