package admin_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/auth"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage/wal"
	"github.com/spoolmq/spool/internal/testutil"
)

// waitTimeout bounds every request and the shutdown of a test broker.
const waitTimeout = 15 * time.Second

// TestMain fails the package when goroutines outlive the tests (every broker is stopped, idle
// connections of the default transport are closed).
func TestMain(m *testing.M) {
	os.Exit(testutil.RunLeakChecked(m, 5*time.Second, http.DefaultClient.CloseIdleConnections))
}

// testBroker is a real broker on the embedded engine in a temporary directory with its admin API
// (internal/admin) served by httptest on 127.0.0.1: what spool serve runs, without the TCP port.
type testBroker struct {
	URL    string
	Engine *wal.Engine
	stop   func() error
}

// startBroker starts a test broker in dir; authz, when not nil, turns authentication on.
func startBroker(dir string, authz *auth.Authorizer) (*testBroker, error) {
	eng, err := wal.Open(dir, wal.Config{})
	if err != nil {
		return nil, err
	}
	br, err := broker.New(broker.Config{Engine: eng, RetentionInterval: -1})
	if err != nil {
		eng.Close()
		return nil, err
	}
	if err := br.Start(context.Background()); err != nil {
		eng.Close()
		return nil, err
	}
	h, err := admin.New(admin.Config{Broker: br, Auth: authz})
	if err != nil {
		return nil, fmt.Errorf("admin.New: %w (broker left running)", err)
	}
	hs := httptest.NewServer(h)
	stop := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		hs.Close()
		if err := h.Close(ctx); err != nil {
			return err
		}
		if err := br.Stop(ctx); err != nil {
			return err
		}
		return eng.Close()
	}
	return &testBroker{URL: hs.URL, Engine: eng, stop: stop}, nil
}

// newBroker starts a test broker stopped by t's cleanup.
func newBroker(t *testing.T, authz *auth.Authorizer) *testBroker {
	t.Helper()
	b, err := startBroker(t.TempDir(), authz)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.stop(); err != nil {
			t.Errorf("stop broker: %v", err)
		}
	})
	return b
}

// exampleBroker is startBroker for the examples, which have no *testing.T.
func exampleBroker() (url string, stop func()) {
	dir, err := os.MkdirTemp("", "spool-admin-example-")
	if err != nil {
		panic(err)
	}
	b, err := startBroker(dir, nil)
	if err != nil {
		panic(err)
	}
	return b.URL, func() {
		if err := b.stop(); err != nil {
			panic(err)
		}
		os.RemoveAll(dir)
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}
