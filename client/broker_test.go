package client

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/server"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal"
	"github.com/spoolmq/spool/internal/testutil"
)

// testBroker is a real broker in-process: the wal engine in a temporary directory, the broker and
// the TCP server on 127.0.0.1. It can be stopped and started again on the same directory and port
// (a broker restart).
type testBroker struct {
	tb     testing.TB
	dir    string
	addr   string
	walCfg wal.Config
	// srvMod, when set, changes the server config (every start).
	srvMod  func(*server.Config)
	engine  *wal.Engine
	broker  *broker.Broker
	srv     *server.Server
	running bool
}

// startBroker starts a broker and stops it at the end of the test. mod may change the wal config.
func startBroker(tb testing.TB, mod func(*wal.Config)) *testBroker {
	tb.Helper()
	b := &testBroker{tb: tb, dir: tb.TempDir(), addr: "127.0.0.1:0"}
	if mod != nil {
		mod(&b.walCfg)
	}
	b.start()
	tb.Cleanup(b.stop)
	return b
}

// startBrokerServer is startBroker with a change to the server config.
func startBrokerServer(tb testing.TB, mod func(*server.Config)) *testBroker {
	tb.Helper()
	b := &testBroker{tb: tb, dir: tb.TempDir(), addr: "127.0.0.1:0", srvMod: mod}
	b.start()
	tb.Cleanup(b.stop)
	return b
}

// start opens the engine, starts the broker and serves on b.addr (the same port after a restart).
func (b *testBroker) start() {
	b.tb.Helper()
	eng, err := wal.Open(b.dir, b.walCfg)
	if err != nil {
		b.tb.Fatalf("wal.Open: %v", err)
	}
	br, err := broker.New(broker.Config{Engine: eng, RetentionInterval: -1})
	if err != nil {
		b.tb.Fatalf("broker.New: %v", err)
	}
	if err := br.Start(context.Background()); err != nil {
		b.tb.Fatalf("broker.Start: %v", err)
	}
	cfg := server.Config{Name: "test", GoodbyeGrace: 2 * time.Second}
	if b.srvMod != nil {
		b.srvMod(&cfg)
	}
	srv, err := server.New(cfg, br)
	if err != nil {
		b.tb.Fatalf("server.New: %v", err)
	}
	var ln net.Listener
	// After a restart the port may still be held for a moment by the old listener's teardown.
	testutil.Eventually(b.tb, waitTimeout, "listen "+b.addr, func() (err error) {
		ln, err = net.Listen("tcp", b.addr)
		return err
	})
	if err := srv.Start(context.Background(), ln); err != nil {
		b.tb.Fatalf("server.Start: %v", err)
	}
	b.addr = ln.Addr().String()
	b.engine, b.broker, b.srv, b.running = eng, br, srv, true
}

// stop stops the server (Goodbye to every client), the broker, and closes the engine.
func (b *testBroker) stop() {
	b.tb.Helper()
	if !b.running {
		return
	}
	b.running = false
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := b.srv.Stop(ctx); err != nil {
		b.tb.Errorf("server.Stop: %v", err)
	}
	if err := b.broker.Stop(ctx); err != nil {
		b.tb.Errorf("broker.Stop: %v", err)
	}
	if err := b.engine.Close(); err != nil {
		b.tb.Errorf("engine.Close: %v", err)
	}
}

// restart stops everything and starts again on the same directory and port.
func (b *testBroker) restart() {
	b.tb.Helper()
	b.stop()
	b.start()
}

// createTopic creates a topic with cfg.
func (b *testBroker) createTopic(name string, cfg storage.TopicConfig) {
	b.tb.Helper()
	if _, err := b.broker.CreateTopic(context.Background(), name, cfg); err != nil {
		b.tb.Fatalf("CreateTopic %s: %v", name, err)
	}
}

// dial connects a client to b, closed at the end of the test.
func (b *testBroker) dial(tb testing.TB, opts ...Opt) *Client {
	tb.Helper()
	opts = append([]Opt{Logger(testLogger(tb)), ReconnectBackoff(5*time.Millisecond, 50*time.Millisecond, 0.2)}, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	c, err := Dial(ctx, b.addr, opts...)
	if err != nil {
		tb.Fatalf("Dial: %v", err)
	}
	closeClient(tb, c)
	return c
}
