package server

import (
	"os"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/testutil"
)

// TestMain fails the package when goroutines outlive the tests: every server, broker and engine a
// test starts is stopped by its cleanup, so the count must come back to what it was before.
func TestMain(m *testing.M) {
	os.Exit(testutil.RunLeakChecked(m, 5*time.Second))
}
