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
	"slices"
	"strings"
	"sync/atomic"
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
	return startBrokerOn(t, eng, broker.Config{RetentionInterval: -1})
}

// startBrokerOn is startBroker on the engine eng with the broker configuration cfg (its Engine
// set here); the engine is closed at the end of the test.
func startBrokerOn(t *testing.T, eng storage.Engine, cfg broker.Config) *testBroker {
	t.Helper()
	cfg.Engine = eng
	br, err := broker.New(cfg)
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

// summary returns the run's human summary (WriteSummary), also logged.
func summary(t *testing.T, res *Result) string {
	t.Helper()
	var buf bytes.Buffer
	if err := res.WriteSummary(&buf); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + buf.String())
	return buf.String()
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
	sum := summary(t, res)
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
		if !strings.Contains(sum, want) {
			t.Fatalf("summary lacks %q", want)
		}
	}
	if _, err := json.Marshal(res); err != nil {
		t.Fatal(err)
	}
}

// TestE2EBackpressure: a slow first group (100 msg/s) behind 400 msg/s of publishing on a topic
// bounded at 50 messages: the broker refuses publishes (the client retries them after the
// retry-after), every acknowledged message reaches both groups, and the run reports the counts.
func TestE2EBackpressure(t *testing.T) {
	t.Parallel()
	tb := startBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{
		Mode: ModeE2E, Addr: tb.addr, Admin: tb.admin, Rate: 400, Duration: 1500 * time.Millisecond,
		Warmup: 200 * time.Millisecond, Groups: 2, Consumers: 1, Async: true, Size: 100, Logger: testLogger(t),
		MaxBacklogMessages: 50, BacklogPolicy: "reject", SlowConsumer: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	sum := summary(t, res)
	if d := res.Delivery; d == nil || d.Missing != 0 || d.Delivered != d.Expected || res.Publish.Errors != 0 {
		t.Fatalf("delivery %+v, publish errors %d: want every acknowledged message in both groups", d, res.Publish.Errors)
	}
	bp := res.Backpressure
	if bp == nil || bp.MaxBacklogMessages != 50 || bp.Policy != "reject" || bp.Rejected == 0 {
		t.Fatalf("backpressure %+v, want refusals at the bound of 50", bp)
	}
	if !strings.Contains(sum, "refused RATE_LIMITED") {
		t.Fatalf("summary lacks the backpressure line:\n%s", sum)
	}
}

// TestE2EDrainRunsOutWithBacklog: a group far slower than publishing (10 msg/s against 100
// messages) still holds most of them when the drain gives up (200 ms without progress; at most
// 10x that in all, as the group keeps delivering): the run reports them as missing and still in
// the group's backlog at the broker, not lost, and says the drain ran out.
func TestE2EDrainRunsOutWithBacklog(t *testing.T) {
	t.Parallel()
	tb := startBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{
		Mode: ModeE2E, Addr: tb.addr, Admin: tb.admin, Rate: 100, Duration: time.Second, Warmup: -1,
		Groups: 2, Consumers: 1, Async: true, Size: 100, Logger: testLogger(t),
		SlowConsumer: 100 * time.Millisecond, Drain: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	sum := summary(t, res)
	d := res.Delivery
	if d == nil || d.Drained || d.Missing == 0 || d.Lost == nil || *d.Lost != 0 || *d.InBacklog != d.Missing {
		t.Fatalf("delivery %+v: want not drained, every missing message in the backlog, none lost", d)
	}
	if d.DrainSeconds < 0.2 || d.DrainSeconds > 10*0.2+1 {
		t.Fatalf("drained for %.1fs, want between 200 ms and about 10 x 200 ms", d.DrainSeconds)
	}
	if !strings.Contains(sum, "NOT DRAINED") {
		t.Fatalf("summary does not say the drain ran out:\n%s", sum)
	}
}

// TestDeliveryAccount: acknowledged messages a group did not receive are in its backlog as far
// as the broker still holds that many for it, lost beyond; messages received without an
// acknowledgement are counted apart; the verdict names each case.
func TestDeliveryAccount(t *testing.T) {
	t.Parallel()
	const total = 130
	acked := make([]atomic.Uint64, (total+63)/64)
	for seq := range uint64(total) {
		if seq != 7 { // 7: its publish failed (timeout), yet stored
			acked[seq/64].Or(1 << (seq % 64))
		}
	}
	receive := func(g *groupRecorder, skip ...uint64) {
		for seq := range uint64(total) {
			if !slices.Contains(skip, seq) {
				p := make([]byte, StampSize)
				Stamp{Run: 1, Seq: seq}.Put(p)
				g.observe(p, 1)
			}
		}
	}
	fast, slow := newGroupRecorder("bench-0", 1, t0, 0, total), newGroupRecorder("bench-1", 1, t0, 0, total)
	receive(fast)
	receive(slow, 7, 64, 100, 129)

	cases := []struct {
		name            string
		drained         bool
		held            map[string]int64
		inBacklog, lost int64
		known           bool
		verdict         string
	}{
		{"all held", false, map[string]int64{"bench-0": 0, "bench-1": 5}, 3, 0, true, "NOT DRAINED: 3 acknowledged"},
		{"one lost", false, map[string]int64{"bench-1": 2}, 2, 1, true, "LOST 1 acknowledged"},
		{"unknown", false, nil, 0, 0, false, "not told apart"},
	}
	for _, c := range cases {
		d := &DeliveryResult{Drained: c.drained}
		d.account([]*groupRecorder{fast, slow}, acked, c.drained, c.held)
		if d.Missing != 3 || d.Unacknowledged != 1 {
			t.Fatalf("%s: missing %d, unacknowledged %d; want 3 (64, 100, 129 in the slow group) and 1 (7 in the fast one)", c.name, d.Missing, d.Unacknowledged)
		}
		if (d.Lost != nil) != c.known || c.known && (*d.InBacklog != c.inBacklog || *d.Lost != c.lost) {
			t.Fatalf("%s: %+v, want in backlog %d, lost %d", c.name, d, c.inBacklog, c.lost)
		}
		if v := d.verdict(); !strings.Contains(v, c.verdict) {
			t.Fatalf("%s: verdict %q, want %q", c.name, v, c.verdict)
		}
	}
	d := &DeliveryResult{Drained: true}
	d.account([]*groupRecorder{fast}, acked, true, nil)
	if d.Missing != 0 || *d.Lost != 0 || !strings.Contains(d.verdict(), "every acknowledged message reached every group") {
		t.Fatalf("drained: %+v, %q", d, d.verdict())
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
		"mode":                    {Mode: "x"},
		"e2e size":                {Mode: ModeE2E, Size: 10},
		"clients>publishers":      {Mode: ModePublish, Publishers: 2, Clients: 3},
		"e2e count":               {Mode: ModeE2E, Count: 5},
		"groups without api":      {Mode: ModeE2E, NoAdmin: true, Groups: 2},
		"e2e batch":               {Mode: ModeE2E, Batch: 10},
		"semantics":               {Mode: ModeE2E, Semantics: "queue"},
		"queue groups":            {Mode: ModeE2E, Semantics: SemanticsQueue, Groups: 2},
		"negative retention":      {Mode: ModePublish, MessageRetention: -time.Second},
		"negative max retention":  {Mode: ModePublish, MaxRetention: -time.Second},
		"max retention below 1s":  {Mode: ModePublish, MaxRetention: time.Millisecond},
		"retention above max":     {Mode: ModeE2E, MessageRetention: time.Hour, MaxRetention: time.Minute},
		"retention without api":   {Mode: ModeE2E, NoAdmin: true, MessageRetention: time.Minute},
		"pg sample below 1s":      {Mode: ModeE2E, PGURL: "postgres://x", PGSample: 100 * time.Millisecond},
		"bookkeeping above limit": {Mode: ModeE2E, Rate: 1_000_000, Duration: time.Hour, Groups: 16},
		"negative backlog bound":  {Mode: ModeE2E, MaxBacklogMessages: -1},
		"backlog policy":          {Mode: ModeE2E, MaxBacklogMessages: 10, BacklogPolicy: "drop"},
		"backlog without api":     {Mode: ModeE2E, NoAdmin: true, MaxBacklogMessages: 10},
		"slow consumer publish":   {Mode: ModePublish, SlowConsumer: time.Millisecond},
	} {
		if err := c.WithDefaults().Validate(); !errors.Is(err, storage.ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, c := range map[string]Config{
		"defaults":            {Mode: ModeE2E},
		"queue":               {Mode: ModeE2E, Semantics: SemanticsQueue, Consumers: 8, Rate: 20_000},
		"queue, publish mode": {Mode: ModePublish, Semantics: SemanticsQueue},
		"retention":           {Mode: ModeE2E, MessageRetention: time.Minute, MaxRetention: 2 * time.Minute},
		"pg":                  {Mode: ModeE2E, PGURL: "postgres://x", PGSample: time.Second},
		// Issue 4's long run: 16 groups x 5,000 msg/s for 10 minutes (6 MiB of bookkeeping).
		"issue 4 fan-out": {Mode: ModeE2E, Rate: 5000, Groups: 16, Consumers: 1, Duration: 10 * time.Minute},
	} {
		if err := c.WithDefaults().Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	c := Config{Mode: ModeE2E}.WithDefaults()
	if c.Semantics != SemanticsPubSub || c.PGSchema != "spool" || c.PGSample != 30*time.Second {
		t.Fatalf("defaults: %+v", c)
	}
}

// TestE2EQueue runs e2e on a QUEUE topic the run creates with retention overrides: the 3
// consumers share the topic's one subscription, so each measured message is delivered once in
// all; the figures say that consuming went on while publishing and kept up.
func TestE2EQueue(t *testing.T) {
	t.Parallel()
	tb := startBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{
		Mode: ModeE2E, Addr: tb.addr, Admin: tb.admin, Semantics: SemanticsQueue, Rate: 300, Duration: time.Second,
		Warmup: 200 * time.Millisecond, Consumers: 3, Async: true, Size: 100, Keep: true,
		MessageRetention: time.Minute, MaxRetention: 2 * time.Minute, Logger: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	sum := summary(t, res)
	const measured = 300 // 360 messages in all, 60 of them in the warm-up
	p, d := res.Publish, res.Delivery
	if p.Messages != measured || p.Errors != 0 {
		t.Fatalf("publish: %+v", p)
	}
	if d == nil || d.Expected != measured || d.Delivered != measured || d.Missing != 0 || d.Duplicates != 0 {
		t.Fatalf("delivery: %+v", d)
	}
	// Consumed while publishing: at most every message of the run, and some, since the
	// consumers consume as the messages come.
	if d.ConsumedWhilePublishing <= 0 || d.ConsumedWhilePublishing > 360 || d.ConsumedRate <= 0 ||
		d.ConsumedRatePerGroup != d.ConsumedRate || d.BacklogAtPublishEnd < 0 || d.BacklogAtPublishEnd > 360 {
		t.Fatalf("consumed while publishing: %+v", d)
	}
	if d.KeptUp != (float64(d.BacklogAtPublishEnd) <= 300) {
		t.Fatalf("kept up %v with a backlog of %d at 300 msg/s", d.KeptUp, d.BacklogAtPublishEnd)
	}
	c := res.Conditions
	if !c.Topic.Created || c.Topic.Deleted || c.Topic.Semantics != SemanticsQueue || c.Topic.MessageRetention != "1m0s" ||
		c.Topic.MaxRetention != "2m0s" || c.Semantics != SemanticsQueue || c.Groups != 1 || c.Consumers != 3 {
		t.Fatalf("conditions: %+v", c)
	}
	info, err := tb.b.Topic(ctx, c.Topic.Name)
	if err != nil {
		t.Fatal(err)
	}
	tc := info.Topic.Config
	if tc.Semantics != storage.Queue || tc.MessageRetention != time.Minute || tc.MaxRetention != 2*time.Minute {
		t.Fatalf("topic config %+v", tc)
	}
	if res.LoadGenerator == nil || res.LoadGenerator.GoSysBytes == 0 {
		t.Fatalf("load generator memory %+v", res.LoadGenerator)
	}
	for _, want := range []string{"3 consumer(s) sharing the QUEUE topic's one subscription", "consumed     while publishing", "backlog", "retention   message retention 1m0s, max retention 2m0s"} {
		if !strings.Contains(sum, want) {
			t.Fatalf("summary lacks %q", want)
		}
	}

	// The same topic, given by name: its semantics come from the admin API; a QUEUE topic
	// refuses two groups, and an existing topic refuses the retention overrides, before any
	// message is sent.
	for name, cfg := range map[string]Config{
		"two groups": {Groups: 2},
		"retention":  {MessageRetention: time.Minute},
	} {
		cfg.Mode, cfg.Addr, cfg.Admin, cfg.Topic, cfg.Logger = ModeE2E, tb.addr, tb.admin, c.Topic.Name, testLogger(t)
		if _, err := Run(ctx, cfg); !errors.Is(err, storage.ErrInvalidArgument) {
			t.Fatalf("existing QUEUE topic, %s: %v", name, err)
		}
	}
	info, err = tb.b.Topic(ctx, c.Topic.Name)
	if err != nil || info.Stats.Messages != 360 {
		t.Fatalf("topic after the refused runs: %+v, %v", info.Stats, err)
	}
}

// TestRunPGUnreachable: statistics that cannot be read are reported in the result; the run
// itself succeeds.
func TestRunPGUnreachable(t *testing.T) {
	t.Parallel()
	tb := startBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{
		Mode: ModePublish, Addr: tb.addr, Admin: tb.admin, Count: 50, Warmup: -1, Logger: testLogger(t),
		PGURL: "postgres://nobody@127.0.0.1:1/none?connect_timeout=5&sslmode=disable",
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Publish.Messages != 50 || res.PG == nil || res.PG.ErrorCount == 0 || res.PG.Window {
		t.Fatalf("publish %+v, postgres %+v", res.Publish, res.PG)
	}
	if sum := summary(t, res); !strings.Contains(sum, "error(s) reading statistics") || !strings.Contains(sum, "window     not measured") {
		t.Fatalf("summary:\n%s", sum)
	}
}

// TestE2EWithPG runs e2e against the in-process broker (embedded engine) with --pg on a fresh
// schema of TEST_DATABASE_URL shaped like the broker's: the statistics are read at the start,
// at both ends of the measured window and at the end, and are in the JSON result.
func TestE2EWithPG(t *testing.T) {
	t.Parallel()
	f := newPGFixture(t)
	tb := startBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{
		Mode: ModeE2E, Addr: tb.addr, Admin: tb.admin, Rate: 200, Duration: time.Second, Warmup: 200 * time.Millisecond,
		Groups: 2, Consumers: 1, Async: true, Size: 100, Logger: testLogger(t),
		PGURL: f.url, PGSchema: f.schema, PGSample: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	pg := res.PG
	if pg == nil || pg.ErrorCount != 0 || !pg.Window || pg.Schema != f.schema || pg.Messages != res.Publish.Messages ||
		pg.WindowSeconds <= 0 || pg.WALBytes < 0 || len(pg.Tables) != 2 || pg.TotalBytes <= 0 {
		t.Fatalf("postgres: %+v", pg)
	}
	var phases []string
	for _, s := range pg.Samples {
		phases = append(phases, s.Phase)
		if s.Partitions != 2 || s.Error != "" {
			t.Fatalf("sample %+v", s)
		}
	}
	// start, window start, window end and end in that order; samples of the 1 s ticks (warm-up,
	// measured, after) may come between.
	at := func(phase string) int { return slices.Index(phases, phase) }
	if at("start") != 0 || at("window start") < 1 || at("window end") < at("window start") || at("end") != len(phases)-1 {
		t.Fatalf("phases %v", phases)
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"postgres":`, `"wal_bytes_per_message":`, `"messages_partitions":2`, `"consumed_rate":`, `"backlog_at_publish_end":`} {
		if !bytes.Contains(b, []byte(want)) {
			t.Fatalf("JSON lacks %s: %s", want, b)
		}
	}
}
