package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/bench"
	"github.com/spoolmq/spool/internal/storage"
)

// TestBenchArguments: the mode is required, -h is help, bad settings are refused before anything
// connects. (internal/bench runs real benches against an in-process broker.)
func TestBenchArguments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var out, errOut bytes.Buffer
	if err := benchMain(ctx, nil, &out, &errOut); err == nil || !strings.Contains(errOut.String(), "Usage: spool bench <mode>") {
		t.Fatalf("no mode: %v, usage %q", err, errOut.String())
	}
	if err := benchMain(ctx, []string{"-h"}, &out, &errOut); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	if err := benchMain(ctx, []string{"e2e", "-h"}, &out, &errOut); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("e2e -h: %v", err)
	}
	if err := benchMain(ctx, []string{"e2e", "extra"}, &out, &errOut); err == nil {
		t.Fatal("extra argument accepted")
	}
	if err := benchMain(ctx, []string{"e2e", "--size", "10"}, &out, &errOut); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("e2e --size 10: %v", err)
	}
	if err := benchMain(ctx, []string{"publish", "--rate", "5"}, &out, &errOut); err == nil {
		t.Fatal("publish accepted --rate, an e2e flag")
	}
	for _, args := range [][]string{
		{"e2e", "--semantics", "QUEUE", "--groups", "2"},
		{"e2e", "--semantics", "fifo"},
		{"publish", "--message-retention", "2h", "--max-retention", "1h"},
		{"e2e", "--max-retention", "-1s"},
		{"e2e", "--no-admin", "--message-retention", "1m"},
		{"e2e", "--pg", "postgres://x", "--pg-sample", "10ms"},
	} {
		errOut.Reset()
		if err := benchMain(ctx, args, &out, &errOut); !errors.Is(err, storage.ErrInvalidArgument) {
			t.Fatalf("%q: %v", args, err)
		}
	}
	errOut.Reset()
	_ = benchMain(ctx, []string{"e2e", "-h"}, &out, &errOut)
	for _, want := range []string{"--semantics", "--message-retention", "--max-retention", "--pg-schema", "--pg-sample", "QUEUE topic (--semantics QUEUE)"} {
		if !strings.Contains(errOut.String(), strings.TrimPrefix(want, "-")) {
			t.Fatalf("usage lacks %q:\n%s", want, errOut.String())
		}
	}
}

func TestBenchFlagsConfig(t *testing.T) {
	t.Parallel()
	bf := newBenchFlags(bench.ModeE2E, &bytes.Buffer{})
	if err := bf.fs.Parse([]string{"--rate", "2000", "--groups", "16", "--consumers", "1", "--warmup", "0"}); err != nil {
		t.Fatal(err)
	}
	c := bf.config().WithDefaults()
	if c.Rate != 2000 || c.Groups != 16 || c.Consumers != 1 || c.Warmup != 0 || !c.Async || c.Duration != 30*time.Second || c.Size != 1024 {
		t.Fatalf("e2e config %+v", c)
	}
	if c.Semantics != bench.SemanticsPubSub || c.PGURL != "" || c.PGSchema != "spool" || c.PGSample != 30*time.Second ||
		c.MessageRetention != 0 || c.MaxRetention != 0 {
		t.Fatalf("e2e defaults %+v", c)
	}
	bf = newBenchFlags(bench.ModeE2E, &bytes.Buffer{})
	if err := bf.fs.Parse([]string{"--semantics", "queue", "--rate", "20000", "--consumers", "4",
		"--message-retention", "1m", "--max-retention", "2m", "--pg", "postgres://spool@127.0.0.1/spool",
		"--pg-schema", "s2", "--pg-sample", "5s"}); err != nil {
		t.Fatal(err)
	}
	c = bf.config().WithDefaults()
	if c.Semantics != bench.SemanticsQueue || c.Groups != 1 || c.Consumers != 4 || c.MessageRetention != time.Minute ||
		c.MaxRetention != 2*time.Minute || c.PGURL != "postgres://spool@127.0.0.1/spool" || c.PGSchema != "s2" ||
		c.PGSample != 5*time.Second {
		t.Fatalf("e2e QUEUE config %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	bf = newBenchFlags(bench.ModePublish, &bytes.Buffer{})
	if err := bf.fs.Parse([]string{"--publishers", "10", "--clients", "1", "--semantics", "QUEUE"}); err != nil {
		t.Fatal(err)
	}
	c = bf.config().WithDefaults()
	if c.Publishers != 10 || c.Clients != 1 || c.Async || c.Duration != 10*time.Second || c.Warmup != 2*time.Second ||
		c.Semantics != bench.SemanticsQueue {
		t.Fatalf("publish config %+v", c)
	}
}

// TestBenchQueueJSON runs `spool bench e2e --semantics QUEUE --json` against an in-process broker:
// the consumers share the QUEUE topic's subscription (every measured message delivered once),
// the JSON carries the consumed-while-publishing figures, and the topic is deleted afterwards.
func TestBenchQueueJSON(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	err := benchMain(ctx, []string{"e2e", "--addr", s.addr, "--admin", s.httpURL, "--semantics", "QUEUE",
		"--rate", "200", "--duration", "1s", "--warmup", "200ms", "--consumers", "2", "--size", "100",
		"--message-retention", "30s", "--json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, errOut.String())
	}
	var res bench.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	d, c := res.Delivery, res.Conditions
	if res.Publish.Messages != 200 || d == nil || d.Delivered != 200 || d.Missing != 0 || d.ConsumedRate <= 0 {
		t.Fatalf("publish %+v, delivery %+v", res.Publish, d)
	}
	if c.Semantics != bench.SemanticsQueue || c.Topic.Semantics != bench.SemanticsQueue || !c.Topic.Deleted ||
		c.Topic.MessageRetention != "30s" || c.Consumers != 2 {
		t.Fatalf("conditions %+v", c)
	}
	if _, err := s.broker.Topic(ctx, c.Topic.Name); !errors.Is(err, storage.ErrTopicNotFound) {
		t.Fatalf("topic after the run: %v", err)
	}
}

// TestBenchScenarioArguments: spool bench scenario needs a known scenario name, -h prints the
// scenarios, bad settings are refused before anything connects, and the fan-out matrix and
// backfill-oltp need the database.
func TestBenchScenarioArguments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var out, errOut bytes.Buffer
	if err := benchMain(ctx, []string{"scenario"}, &out, &errOut); err == nil || !strings.Contains(errOut.String(), "Usage: spool bench scenario <name>") {
		t.Fatalf("no scenario: %v, usage %q", err, errOut.String())
	}
	for _, want := range []string{"kill-resurrect", "isolation", "fanout", "backfill-oltp"} {
		if !strings.Contains(errOut.String(), want) {
			t.Fatalf("usage lacks %q", want)
		}
	}
	if err := benchMain(ctx, []string{"scenario", "chaos"}, &out, &errOut); err == nil || !strings.Contains(err.Error(), `unknown scenario "chaos"`) {
		t.Fatalf("unknown scenario: %v", err)
	}
	for _, name := range []string{"kill-resurrect", "isolation", "backfill-oltp", "fanout"} {
		errOut.Reset()
		if err := benchMain(ctx, []string{"scenario", name, "-h"}, &out, &errOut); !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%s -h: %v", name, err)
		}
	}
	if !strings.Contains(errOut.String(), "-completion") || !strings.Contains(errOut.String(), "-groups") {
		t.Fatalf("fanout -h lacks --completion or --groups:\n%s", errOut.String())
	}
	for _, args := range [][]string{
		{"scenario", "kill-resurrect", "--rate", "-1"},
		{"scenario", "kill-resurrect", "--size", "10"},
		{"scenario", "kill-resurrect", "--live", "24h", "--sample", "10ms"},
		{"scenario", "isolation", "--big-rate", "-5"},
		{"scenario", "fanout"},
		{"scenario", "fanout", "--pg", "postgres://x", "--completion", "bitmap"},
		{"scenario", "backfill-oltp"},
		{"scenario", "backfill-oltp", "--pg", "postgres://x", "--messages", "-5"},
		{"scenario", "backfill-oltp", "--pg", "postgres://x", "--tps", "-1"},
		{"e2e", "--completion", "bitmap"},
		{"e2e", "--no-admin", "--completion", "watermark"},
	} {
		if err := benchMain(ctx, args, &out, &errOut); !errors.Is(err, storage.ErrInvalidArgument) {
			t.Fatalf("%q: %v", args, err)
		}
	}
	if err := benchMain(ctx, []string{"scenario", "fanout", "--pg", "postgres://x", "--groups", "4,0"}, &out, &errOut); err == nil ||
		!strings.Contains(err.Error(), "--groups") {
		t.Fatalf("--groups 4,0: %v", err)
	}
	if err := benchMain(ctx, []string{"scenario", "isolation", "extra"}, &out, &errOut); err == nil {
		t.Fatal("extra argument accepted")
	}
}

// TestBenchHelpPerMode: spool bench -h lists no mode's flags (their defaults differ) but says where
// they are; each mode's -h shows its own defaults (publish: synchronous, 10 s after 2 s of
// warm-up; e2e: --async, 30 s after 5 s).
func TestBenchHelpPerMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	help := func(args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		if err := benchMain(ctx, args, &out, &errOut); !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%q: %v", args, err)
		}
		return errOut.String()
	}
	general := help("-h")
	if strings.Contains(general, "\n  -duration") || !strings.Contains(general, "spool bench publish -h") {
		t.Fatalf("spool bench -h shows one mode's flags or does not point to the modes' help:\n%s", general)
	}
	pub := help("publish", "-h")
	if !strings.Contains(pub, "Flags of spool bench publish:") || !strings.Contains(pub, "(default 10s)") ||
		!strings.Contains(pub, "(default 2s)") || strings.Contains(pub, "-async\n\tpublish with PublishAsync instead of waiting for each acknowledgement (default true)") {
		t.Fatalf("spool bench publish -h:\n%s", pub)
	}
	e2e := help("e2e", "-h")
	if !strings.Contains(e2e, "Flags of spool bench e2e:") || !strings.Contains(e2e, "(default 30s)") || !strings.Contains(e2e, "(default 5s)") {
		t.Fatalf("spool bench e2e -h:\n%s", e2e)
	}
}

// TestBenchEnvAndHTTPFlag: bench (a mode and a scenario) takes the broker's addresses from
// $SPOOL_ADDR and $SPOOL_HTTP as the client commands do, --addr and --http override them, --admin
// still works (--http's earlier name), and a host:port means https:// with TLS.
func TestBenchEnvAndHTTPFlag(t *testing.T) {
	t.Setenv(envAddr, "10.0.0.1:19092")
	t.Setenv(envHTTP, "10.0.0.1:18080")
	parse := func(args ...string) bench.Config {
		t.Helper()
		var out bytes.Buffer
		bf := newBenchFlags(bench.ModePublish, &out)
		if err := parseFlagsOnly(bf.fs, args); err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		return bf.config()
	}
	if c := parse(); c.Addr != "10.0.0.1:19092" || c.Admin != "10.0.0.1:18080" {
		t.Fatalf("from the environment: addr %q admin %q", c.Addr, c.Admin)
	}
	if c := parse("--addr", "h:1", "--http", "http://h:2"); c.Addr != "h:1" || c.Admin != "http://h:2" {
		t.Fatalf("--addr/--http: addr %q admin %q", c.Addr, c.Admin)
	}
	if c := parse("--admin", "h:3"); c.Admin != "h:3" {
		t.Fatalf("--admin: admin %q", c.Admin)
	}
	var out bytes.Buffer
	fs := flag.NewFlagSet("scenario", flag.ContinueOnError)
	fs.SetOutput(&out)
	sc := addScenarioCommon(fs)
	if err := parseFlagsOnly(fs, []string{"--tls-ca", "ca.pem"}); err != nil {
		t.Fatal(err)
	}
	if *sc.addr != "10.0.0.1:19092" || sc.adminURL() != "https://10.0.0.1:18080" {
		t.Fatalf("scenario from the environment with TLS: addr %q admin %q", *sc.addr, sc.adminURL())
	}
	if got := benchAdminURL("http://h:2", true); got != "http://h:2" {
		t.Fatalf("a URL is kept as given: %q", got)
	}
	var e bytes.Buffer
	err := benchMain(context.Background(), []string{"publish", "--count", "1", "--http", "127.0.0.1:1"}, &out, &e)
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") || !strings.Contains(err.Error(), "give --http") {
		t.Fatalf("publish against a closed admin port: %v", err)
	}
}
