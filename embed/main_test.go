package embed_test

import (
	"os"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/testutil"
)

// TestMain fails the package when goroutines outlive the tests: every broker a test starts and
// every client it dials is closed by its cleanup, so Close must leave nothing running (the TCP
// forwarder, the server's and the engine's goroutines).
func TestMain(m *testing.M) {
	os.Exit(testutil.RunLeakChecked(m, 10*time.Second))
}
