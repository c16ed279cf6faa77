package testutil

import (
	"testing"
	"time"
)

// Eventually polls f every few milliseconds until it returns nil, and fails the test with f's last
// error once timeout has passed. It is for waiting on an outcome that has no event to wait on (a
// count in another process, a stats figure); nothing is timed: the timeout only bounds a hang.
func Eventually(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after %s: %v", what, timeout, err)
		}
		time.Sleep(5 * time.Millisecond) // polling interval of a deadline loop, not a synchronization
	}
}
