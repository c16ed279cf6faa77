package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/server"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal"
)

// waitTimeout bounds the shutdown of the in-process broker.
const waitTimeout = 20 * time.Second

// testBroker is a real broker in-process: the wal engine (fsync on) in a temporary directory, the
// broker, the TCP server on 127.0.0.1 and the HTTP admin API.
type testBroker struct {
	addr, admin string
	b           *broker.Broker
}

func startBroker(t *testing.T) *testBroker {
	t.Helper()
	eng, err := wal.Open(t.TempDir(), wal.Config{})
	if err != nil {
		t.Fatalf("wal.Open: %v", err)
	}
	br, err := broker.New(broker.Config{Engine: eng, RetentionInterval: -1})
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	if err := br.Start(context.Background()); err != nil {
		t.Fatalf("broker.Start: %v", err)
	}
	srv, err := server.New(server.Config{Name: "bench-test"}, br)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background(), ln); err != nil {
		t.Fatalf("server.Start: %v", err)
	}
	h, err := admin.New(admin.Config{Broker: br})
	if err != nil {
		t.Fatalf("admin.New: %v", err)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		hs.Close()
		if err := h.Close(ctx); err != nil {
			t.Errorf("admin close: %v", err)
		}
		if err := srv.Stop(ctx); err != nil {
			t.Errorf("server.Stop: %v", err)
		}
		if err := br.Stop(ctx); err != nil {
			t.Errorf("broker.Stop: %v", err)
		}
		if err := eng.Close(); err != nil {
			t.Errorf("engine.Close: %v", err)
		}
	})
	return &testBroker{addr: ln.Addr().String(), admin: hs.URL, b: br}
}

func testLogger(t *testing.T) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("SPOOL_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: level}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestE2ESmall runs a tiny open-loop bench (200 msg/s for 1 s after a 0.3 s warm-up, 2 groups x 2
// consumers) against the in-process broker: every measured message is acknowledged and reaches
// both groups once, the latencies are counted once per delivery, and the topic the run created
// is deleted.
func TestE2ESmall(t *testing.T) {
	t.Parallel()
	tb := startBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{
		Mode: ModeE2E, Addr: tb.addr, Admin: tb.admin, Rate: 200, Duration: time.Second,
		Warmup: 300 * time.Millisecond, Groups: 2, Consumers: 2, Async: true, Size: 100, Logger: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := res.WriteSummary(&buf); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + buf.String())
	const measured = 200 // 260 messages in all, 60 of them in the warm-up
	p, d := res.Publish, res.Delivery
	if p.Messages != measured || p.Errors != 0 || p.Latency.Count != measured || p.SenderLag.Count != 260 {
		t.Fatalf("publish: %+v", p)
	}
	if d == nil || d.Expected != 2*measured || d.Delivered != 2*measured || d.Missing != 0 || d.Latency.Count != 2*measured {
		t.Fatalf("delivery: %+v", d)
	}
	if d.Latency.P50 <= 0 || d.Latency.P50 > d.Latency.P99 || d.Latency.P99 > d.Latency.Max {
		t.Fatalf("latency percentiles out of order: %+v", d.Latency)
	}
	c := res.Conditions
	if !c.Topic.Created || !c.Topic.Deleted || c.Topic.Semantics != "PUB_SUB" || c.Groups != 2 || c.Consumers != 2 || c.Rate != 200 {
		t.Fatalf("conditions: %+v", c)
	}
	if _, err := tb.b.Topic(ctx, c.Topic.Name); !errors.Is(err, storage.ErrTopicNotFound) {
		t.Fatalf("topic %s after the run: %v", c.Topic.Name, err)
	}
	for _, want := range []string{"open loop at 200 msg/s", "2 group(s) x 2 consumer(s)", "end-to-end latency", "p99.9"} {
		if !strings.Contains(buf.String(), want) {
			t.Fatalf("summary lacks %q", want)
		}
	}
	if _, err := json.Marshal(res); err != nil {
		t.Fatal(err)
	}
}

// TestPublishSmall runs publish mode for a fixed count, synchronous on one shared client and async,
// against the in-process broker; every message is stored.
func TestPublishSmall(t *testing.T) {
	t.Parallel()
	tb := startBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, async := range []bool{false, true} {
		res, err := Run(ctx, Config{
			Mode: ModePublish, Addr: tb.addr, Admin: tb.admin, Publishers: 4, Clients: 1, Async: async,
			Count: 400, Warmup: -1, Keep: true, Logger: testLogger(t),
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.Publish.Messages != 400 || res.Publish.Errors != 0 || res.Publish.Latency.Count == 0 || res.Publish.Rate <= 0 {
			t.Fatalf("async %v: %+v", async, res.Publish)
		}
		info, err := tb.b.Topic(ctx, res.Conditions.Topic.Name)
		if err != nil {
			t.Fatal(err)
		}
		if info.Stats.Messages != 400 || info.Topic.Config.Semantics != storage.PubSub {
			t.Fatalf("topic holds %d messages, semantics %s", info.Stats.Messages, info.Topic.Config.Semantics)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]Config{
		"mode":               {Mode: "x"},
		"e2e size":           {Mode: ModeE2E, Size: 10},
		"clients>publishers": {Mode: ModePublish, Publishers: 2, Clients: 3},
		"e2e count":          {Mode: ModeE2E, Count: 5},
		"groups without api": {Mode: ModeE2E, NoAdmin: true, Groups: 2},
		"e2e batch":          {Mode: ModeE2E, Batch: 10},
	} {
		if err := c.WithDefaults().Validate(); !errors.Is(err, storage.ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := (Config{Mode: ModeE2E}).WithDefaults().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
}
