package admin

import (
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/spoolmq/spool/internal/testutil"
)

// TestLimitListenerBacksOffWhenOutOfFiles: HTTP accepts that fail with EMFILE are each followed
// by a pause of 5 ms doubling to 1 s (net/http would log a line per failure, issue 16): one WARN
// for the streak, one INFO at its end, and the request that waited in the backlog is served.
func TestLimitListenerBacksOffWhenOutOfFiles(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ab := testutil.NewAcceptBackoff(t, 12)
	ll := LimitListener(ab.Listener, 4, nil, slog.New(slog.NewTextHandler(ab.Logs, nil))).(*limitListener)
	ll.pause = ab.Pause
	httpLogs := &testutil.SyncBuffer{}
	srv := NewServer(e.h, slog.New(slog.NewTextHandler(httpLogs, nil)))
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ll) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	res, nc := rawRequest(t, ab.Addr(), "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
	res.Body.Close()
	nc.Close()
	if res.StatusCode != 200 {
		t.Fatalf("request after the failed accepts: %d", res.StatusCode)
	}
	ab.Check(t)
	if strings.Contains(httpLogs.String(), "Accept error") {
		t.Fatalf("net/http saw the failures and logged them:\n%s", httpLogs.String())
	}
}
