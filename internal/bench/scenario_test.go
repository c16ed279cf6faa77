package bench

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/pgstore"
	"github.com/spoolmq/spool/internal/storage/wal"
	"github.com/spoolmq/spool/internal/testutil"
)

// TestMain lets the test binary be kill-resurrect's consumer child: "kill-child --addr A --topic T
// --group G" runs RunKillChild.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "kill-child" {
		fs := flag.NewFlagSet("kill-child", flag.ExitOnError)
		c := KillChildConfig{}
		fs.StringVar(&c.Addr, "addr", "", "")
		fs.StringVar(&c.Topic, "topic", "", "")
		fs.StringVar(&c.Group, "group", "", "")
		_ = fs.Parse(os.Args[2:])
		if err := RunKillChild(context.Background(), c, os.Stdin, os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func verdictOf(t *testing.T, vs []Verdict, check string) Verdict {
	t.Helper()
	for _, v := range vs {
		if v.Check == check {
			return v
		}
	}
	t.Fatalf("no verdict %q in %+v", check, vs)
	return Verdict{}
}

// TestScenarioKillResurrect runs kill-and-resurrect small (100 msg/s, heartbeat timeout 5 s, the
// lifecycle job every second) against the in-process broker: the child consumer is SIGKILLed,
// inventory is seen DEAD within the timeout plus the detection interval, email and analytics
// miss nothing, a consumer coming back makes inventory ACTIVE and it receives every message
// published after, the backfill is cut to the groups' bound (20 messages here: the broker's range
// gives the rest up), and the storage series covers every phase.
func TestScenarioKillResurrect(t *testing.T) {
	t.Parallel()
	eng, err := wal.Open(t.TempDir(), wal.Config{})
	if err != nil {
		t.Fatalf("wal.Open: %v", err)
	}
	tb := startBrokerOn(t, eng, broker.Config{LifecycleInterval: time.Second, RetentionInterval: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := RunKill(ctx, KillConfig{Addr: tb.addr, Admin: tb.admin, Logger: testLogger(t),
		Rate: 100, Size: 100, HeartbeatTimeout: storage.MinHeartbeatTimeout,
		Live: 2 * time.Second, DeadFor: 2 * time.Second, After: 2 * time.Second, MessageRetention: time.Second,
		Stall: time.Minute, Sample: 100 * time.Millisecond, BackfillBound: 20,
		Child: []string{os.Args[0], "kill-child", "--addr", tb.addr}})
	if err != nil {
		t.Fatalf("RunKill: %v", err)
	}
	var sb strings.Builder
	if err := res.WriteSummary(&sb); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + sb.String())

	if res.DetectionInterval != "1s" || res.DeadBound != 6 {
		t.Errorf("detection interval %s, bound %.1f s: want 1s and 6 s (timeout 5 s)", res.DetectionInterval, res.DeadBound)
	}
	if res.DeadAt == 0 || res.DeadAfter <= 0 {
		t.Errorf("inventory never seen DEAD after the kill (dead at %.1f s, after %.1f s)", res.DeadAt, res.DeadAfter)
	}
	if v := verdictOf(t, res.Verdicts, "inventory DEAD"); (v.Outcome == Pass) != (res.DeadAt > 0 && res.DeadAfter <= res.DeadBound+0.1) {
		t.Errorf("DEAD verdict %+v for dead after %.2f s, bound %.1f s", v, res.DeadAfter, res.DeadBound)
	}
	for _, g := range res.Groups {
		if g.Missing != 0 || g.Delivered != res.Published {
			t.Errorf("%s: delivered %d of %d", g.Group, g.Delivered, res.Published)
		}
		if v := verdictOf(t, res.Verdicts, g.Group+" never blocked"); v.Outcome != Pass {
			t.Errorf("%s: %+v", g.Group, v)
		}
	}
	if res.StateAfterResurrection != string(storage.Active) || res.New < res.NewExpected || res.NewExpected < 100 {
		t.Errorf("after the return: state %s, %d of %d new messages", res.StateAfterResurrection, res.New, res.NewExpected)
	}
	if v := verdictOf(t, res.Verdicts, "inventory resurrected"); v.Outcome != Pass {
		t.Errorf("resurrection verdict %+v", v)
	}
	if res.ReceivedWhileDown > res.PublishedWhileDown || res.Backfilled < res.ReceivedWhileDown {
		t.Errorf("backfill figures inconsistent: backfilled %d, received %d of %d published while down",
			res.Backfilled, res.ReceivedWhileDown, res.PublishedWhileDown)
	}
	if v := verdictOf(t, res.Verdicts, "backfill bounded"); v.Outcome != Pass || res.Backfilled > res.BackfillBound {
		t.Errorf("backfill verdict %+v (%d backfilled)", v, res.Backfilled)
	}
	// About 700 messages were published while it was down, of which retention (1 s, whole
	// segments of a few seconds here) leaves more than the bound: the range is cut.
	if res.BackfillBound != 20 || res.BackfillTotal == 0 || res.BackfillTotal > 20 || res.BackfillSkipped == 0 {
		t.Errorf("backfill range %d, %d given up: want at most the bound of %d, and some given up", res.BackfillTotal, res.BackfillSkipped, res.BackfillBound)
	}
	phases := map[string]bool{}
	for _, s := range res.Samples {
		phases[s.Phase] = true
	}
	for _, p := range []string{"live", "killed", "dead", "resurrected"} {
		if !phases[p] {
			t.Errorf("no sample in phase %s", p)
		}
	}
	if v := verdictOf(t, res.Verdicts, "storage while DEAD"); !res.RetentionBeforeKill && v.Outcome != Inconclusive {
		t.Errorf("storage verdict %+v without retention before the kill", v)
	}
}

// TestScenarioKillNoLifecycle: a broker without the lifecycle job never detects DEAD; the scenario
// says so before it starts.
func TestScenarioKillNoLifecycle(t *testing.T) {
	t.Parallel()
	eng, err := wal.Open(t.TempDir(), wal.Config{})
	if err != nil {
		t.Fatalf("wal.Open: %v", err)
	}
	tb := startBrokerOn(t, eng, broker.Config{LifecycleInterval: -1, RetentionInterval: -1})
	_, err = RunKill(context.Background(), KillConfig{Addr: tb.addr, Admin: tb.admin, Child: []string{os.Args[0], "kill-child"}})
	if err == nil || !strings.Contains(err.Error(), "no subscription lifecycle job") {
		t.Fatalf("RunKill without the lifecycle job: %v", err)
	}
}

// TestScenarioIsolation runs the isolation scenario small (a 300 msg/s topic with 3 groups beside
// a 20 msg/s one with 2): both topics are reported, the small one's p95 and p99 come from its
// deliveries and its verdicts follow them.
func TestScenarioIsolation(t *testing.T) {
	t.Parallel()
	tb := startBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := RunIsolation(ctx, IsolationConfig{Addr: tb.addr, Admin: tb.admin, Logger: testLogger(t),
		BigRate: 300, BigGroups: 3, SmallRate: 20, SmallGroups: 2, Size: 100,
		Duration: 2 * time.Second, Warmup: 300 * time.Millisecond})
	if err != nil {
		t.Fatalf("RunIsolation: %v", err)
	}
	var sb strings.Builder
	if err := res.WriteSummary(&sb); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + sb.String())
	if res.Big.Conditions.Groups != 3 || res.Small.Conditions.Groups != 2 || res.Big.Conditions.Topic.Name == res.Small.Conditions.Topic.Name {
		t.Errorf("conditions: big %+v, small %+v", res.Big.Conditions, res.Small.Conditions)
	}
	s := res.Small.Delivery
	if s.Delivered < 2*30 || s.Missing != 0 || s.Latency.P95 <= 0 || s.Latency.P95 > s.Latency.P99 {
		t.Errorf("small topic deliveries %+v", s)
	}
	if res.Big.Delivery.Delivered < 3*500 {
		t.Errorf("big topic deliveries %+v", res.Big.Delivery)
	}
	if v := verdictOf(t, res.Verdicts, "small topic p95"); (v.Outcome == Pass) != (s.Latency.P95 < 50) {
		t.Errorf("p95 verdict %+v for p95 %.1f ms", v, s.Latency.P95)
	}
	verdictOf(t, res.Verdicts, "big topic kept up")
	if !strings.Contains(sb.String(), "scenario isolation: "+res.Outcome) {
		t.Errorf("summary without the outcome %s", res.Outcome)
	}
}

// TestScenarioFanout runs the fan-out matrix small (2 and 3 groups at 200 msg/s for 2 s) on the
// PostgreSQL engine: each row has WAL per message, table statistics and its verdicts; the
// cleanup verdict is INCONCLUSIVE (the runs are shorter than retention).
func TestScenarioFanout(t *testing.T) {
	t.Parallel()
	url := testutil.DatabaseURL(t)
	schema := testutil.PGSchema(t, url, "t_scen_")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	eng, err := pgstore.Open(ctx, pgstore.Config{URL: url, Schema: schema, Migrate: true, MaxConns: 8,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("pgstore.Open: %v", err)
	}
	tb := startBrokerOn(t, eng, broker.Config{RetentionInterval: time.Second})
	res, err := RunFanout(ctx, FanoutConfig{Addr: tb.addr, Admin: tb.admin, Logger: testLogger(t), PGURL: url, PGSchema: schema,
		Groups: []int{2, 3}, Rate: 200, Size: 100, Duration: 2 * time.Second, Warmup: 300 * time.Millisecond,
		MessageRetention: time.Minute, PGSample: time.Second, Completion: string(storage.Watermark)})
	if err != nil {
		t.Fatalf("RunFanout: %v", err)
	}
	var sb strings.Builder
	if err := res.WriteSummary(&sb); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + sb.String())
	if len(res.Rows) != 2 || res.Rows[0].Groups != 2 || res.Rows[1].Groups != 3 {
		t.Fatalf("rows %+v", res.Rows)
	}
	for _, r := range res.Rows {
		if r.Completion != "watermark" || r.Result.Conditions.Topic.Completion != "watermark" {
			t.Errorf("%d groups: completion %q / %q", r.Groups, r.Completion, r.Result.Conditions.Topic.Completion)
		}
		if r.Result.PG == nil || !r.Result.PG.Window || r.WALBytesPerMessage <= 0 {
			t.Errorf("%d groups: PostgreSQL figures %+v", r.Groups, r.Result.PG)
		}
		if r.Result.Delivery.Missing != 0 {
			t.Errorf("%d groups: %d missing", r.Groups, r.Result.Delivery.Missing)
		}
		if v := verdictOf(t, r.Verdicts, fmtGroups(r.Groups)+"cleanup rate"); v.Outcome != Inconclusive {
			t.Errorf("%d groups: cleanup verdict %+v in a run shorter than retention", r.Groups, v)
		}
		// The window's table sizes come from the monitor's samples (one in the middle of the
		// window): a window this short cannot judge, whatever the growth.
		if v := verdictOf(t, r.Verdicts, fmtGroups(r.Groups)+"bloat"); !r.Judged || v.Outcome != Inconclusive ||
			!strings.Contains(v.Note, "second half of the window") {
			t.Errorf("%d groups: bloat verdict %+v (judged %v) in a window of seconds", r.Groups, v, r.Judged)
		}
	}
}

func fmtGroups(n int) string { return fmt.Sprintf("%d groups: ", n) }

// The fan-out bloat verdict judges each table's growth over the second half of the measured window
// (messages left out): a table of hot rows that grew in the first half (a fresh table until
// autovacuum's first passes) and is flat in the second passes; a table that grew by more than 20%
// in the second half fails; growth under 1 MiB is not judged; without the sizes in the middle and
// at the end the verdict cannot judge, nor with a second half under 2 minutes. The dead-tuple
// share is reported.
func TestFanoutBloatVerdict(t *testing.T) {
	const mib = 1 << 20
	hot := PGTable{Name: "deliveries", SizeBytes: 9 * mib, LiveTuples: 4, DeadTuples: 996, WindowStartBytes: 3 * mib, WindowMidBytes: 9 * mib, WindowEndBytes: 9 * mib}
	tiny := PGTable{Name: "partitions", SizeBytes: 64 << 10, LiveTuples: 1, DeadTuples: 99, WindowStartBytes: 16 << 10, WindowMidBytes: 32 << 10, WindowEndBytes: 64 << 10}
	msgs := PGTable{Name: messagesTable, SizeBytes: 200 * mib, LiveTuples: 1_000_000, WindowStartBytes: 100 * mib, WindowMidBytes: 150 * mib, WindowEndBytes: 200 * mib}
	growing := PGTable{Name: "completions", SizeBytes: 50 * mib, LiveTuples: 100_000, DeadTuples: 900_000, WindowStartBytes: 20 * mib, WindowMidBytes: 30 * mib, WindowEndBytes: 50 * mib}
	for _, c := range []struct {
		name    string
		tables  []PGTable
		window  float64 // seconds
		outcome string
	}{
		{"flat hot table, tiny and messages growing", []PGTable{hot, tiny, msgs}, 300, Pass},
		{"a table that grew by two thirds in the second half", []PGTable{hot, msgs, growing}, 300, Fail},
		{"a second half too short to judge", []PGTable{hot, msgs, growing}, 200, Inconclusive},
		{"no sizes in the middle", []PGTable{{Name: "deliveries", LiveTuples: 1, DeadTuples: 9, WindowStartBytes: mib, WindowEndBytes: 3 * mib}}, 300, Inconclusive},
	} {
		row := &FanoutRow{Groups: 4, Result: &Result{PG: &PGResult{WindowSeconds: c.window}, Delivery: &DeliveryResult{}}}
		row.tableBloat(c.tables)
		v := verdictOf(t, fanoutVerdicts(row, Config{Rate: 100}), "4 groups: bloat")
		if v.Outcome != c.outcome {
			t.Errorf("%s: %+v, want %s", c.name, v, c.outcome)
		}
		if !strings.Contains(v.Measured, "largest share") {
			t.Errorf("%s: the dead-tuple share is not reported: %q", c.name, v.Measured)
		}
	}
}

// TestScenarioFanoutNeedsPG: the fan-out scenario refuses to run without the database.
func TestScenarioFanoutNeedsPG(t *testing.T) {
	_, err := RunFanout(context.Background(), FanoutConfig{})
	if err == nil || !strings.Contains(err.Error(), "--pg") {
		t.Fatalf("RunFanout without --pg: %v", err)
	}
}

// TestKillVerdicts judges made-up figures: DEAD past the bound or never seen fails; the storage
// verdict passes under 10% growth, fails above, and cannot judge a live phase that never reached a
// steady size or a dead phase not longer than message retention; a backfill over the bound fails.
func TestKillVerdicts(t *testing.T) {
	cfg := KillConfig{DeadFor: time.Minute, MessageRetention: 30 * time.Second}.withDefaults()
	base := KillResult{DeadBound: 12, KilledAt: 120, DeadAt: 130, DeadAfter: 10, ResurrectedAt: 252,
		StateAfterResurrection: "ACTIVE", New: 100, NewExpected: 100, MaxBytesLive: 100 << 20, MaxBytesDead: 105 << 20,
		StorageGrowth: 0.05, RetentionBeforeKill: true, Backfilled: 10, BackfillBound: cfg.BackfillBound,
		Groups: []KillGroupResult{{Group: "email", Latency: Percentiles{Max: 10}}}}
	for name, tc := range map[string]struct {
		edit  func(r *KillResult, c *KillConfig)
		check string
		want  string
	}{
		"dead in time":        {func(*KillResult, *KillConfig) {}, "inventory DEAD", Pass},
		"dead late":           {func(r *KillResult, _ *KillConfig) { r.DeadAfter = 13 }, "inventory DEAD", Fail},
		"never dead":          {func(r *KillResult, _ *KillConfig) { r.DeadAt, r.DeadAfter = 0, 0 }, "inventory DEAD", Fail},
		"storage flat":        {func(*KillResult, *KillConfig) {}, "storage while DEAD", Pass},
		"storage grows":       {func(r *KillResult, _ *KillConfig) { r.StorageGrowth = 0.5 }, "storage while DEAD", Fail},
		"no steady baseline":  {func(r *KillResult, _ *KillConfig) { r.RetentionBeforeKill = false }, "storage while DEAD", Inconclusive},
		"dead shorter":        {func(_ *KillResult, c *KillConfig) { c.DeadFor = 10 * time.Second }, "storage while DEAD", Inconclusive},
		"stall":               {func(r *KillResult, _ *KillConfig) { r.Groups[0].Latency.Max = 3000 }, "email never blocked", Fail},
		"missing":             {func(r *KillResult, _ *KillConfig) { r.Groups[0].Missing = 1 }, "email never blocked", Fail},
		"backfill over bound": {func(r *KillResult, _ *KillConfig) { r.Backfilled = cfg.BackfillBound + 1 }, "backfill bounded", Fail},
		"not resurrected":     {func(r *KillResult, _ *KillConfig) { r.StateAfterResurrection = "DEAD" }, "inventory resurrected", Fail},
	} {
		r, c := base, cfg
		r.Groups = slices.Clone(base.Groups)
		tc.edit(&r, &c)
		if v := verdictOf(t, killVerdicts(&r, c), tc.check); v.Outcome != tc.want {
			t.Errorf("%s: %s is %s, want %s (%s)", name, tc.check, v.Outcome, tc.want, v.Measured)
		}
	}
}

// TestScenarioBackfillOLTP runs backfill-oltp small (3,000 messages, pgbench at 50 TPS for 2 s
// alone and 4 s beside the backfill, a 1 s load spike) on the PostgreSQL engine: pgbench's latencies come from its
// logs, the backfill completes with its series, every verdict is there, and the topic and
// pgbench's schema are gone afterwards.
func TestScenarioBackfillOLTP(t *testing.T) {
	t.Parallel()
	url := testutil.DatabaseURL(t)
	if _, err := findPGBench(""); err != nil {
		if os.Getenv("SPOOL_TEST_REQUIRE_PG") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	schema := testutil.PGSchema(t, url, "t_oltp_")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	eng, err := pgstore.Open(ctx, pgstore.Config{URL: url, Schema: schema, Migrate: true, MaxConns: 8,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("pgstore.Open: %v", err)
	}
	tb := startBrokerOn(t, eng, broker.Config{RetentionInterval: -1})
	res, err := RunOLTP(ctx, OLTPConfig{Addr: tb.addr, Admin: tb.admin, Logger: testLogger(t), PGURL: url,
		Messages: 3000, Size: 100, Partitions: 2, Consumers: 1, TPS: 50, Clients: 2, Scale: 1,
		Baseline: 2 * time.Second, Duration: 4 * time.Second, Timeout: time.Minute, Sample: 200 * time.Millisecond,
		Spike: time.Second, SpikeClients: 2})
	if err != nil {
		t.Fatalf("RunOLTP: %v", err)
	}
	var sb strings.Builder
	if err := res.WriteSummary(&sb); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + sb.String())
	for name, l := range map[string]OLTPLatency{"baseline": res.Baseline, "second run": res.Whole} {
		if l.Transactions < 50 || l.P95 <= 0 || l.P50 > l.P95 || l.P95 > l.P99 || l.TPS <= 0 {
			t.Errorf("pgbench %s: %+v", name, l)
		}
	}
	if res.BackfillState != string(storage.BackfillCompleted) || res.BackfillTotal != 3000 || res.BackfillSeconds <= 0 || len(res.Samples) == 0 {
		t.Errorf("backfill: %s, %d messages in %.1f s, %d samples", res.BackfillState, res.BackfillTotal, res.BackfillSeconds, len(res.Samples))
	}
	if v := verdictOf(t, res.Verdicts, "backfill completed"); v.Outcome != Pass {
		t.Errorf("completion verdict %+v", v)
	}
	if v := verdictOf(t, res.Verdicts, "pgbench p95 during the backfill"); (res.During.Transactions < oltpMinTx && v.Outcome != Inconclusive) ||
		(res.During.Transactions >= oltpMinTx && (v.Outcome == Pass) != (res.During.P95 < 100)) {
		t.Errorf("p95 verdict %+v for %+v", v, res.During)
	}
	verdictOf(t, res.Verdicts, "pgbench held its rate beside the backfill")
	verdictOf(t, res.Verdicts, "backfill throttles itself")
	if res.SpikeTPS <= 0 || res.InSpike.Transactions == 0 || res.SpikeTo-res.SpikeFrom < 0.9 {
		t.Errorf("load spike %.1f s to %.1f s: %.0f TPS, the fixed-rate run saw %d transactions in it",
			res.SpikeFrom, res.SpikeTo, res.SpikeTPS, res.InSpike.Transactions)
	}
	if !strings.Contains(res.Cleanup, "topic "+res.Topic+" deleted") || !strings.Contains(res.Cleanup, "schema "+res.PGSchema+" dropped") {
		t.Errorf("cleanup: %q", res.Cleanup)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_namespace WHERE nspname = $1", res.PGSchema).Scan(&n); err != nil || n != 0 {
		t.Errorf("pgbench's schema %s after the run: %d, %v", res.PGSchema, n, err)
	}
	if !strings.Contains(sb.String(), "scenario backfill-oltp: "+res.Outcome) {
		t.Errorf("summary without the outcome %s", res.Outcome)
	}
}

// pgbench's per-transaction log lines give the end and the latency; short lines are skipped.
func TestReadPGBenchLog(t *testing.T) {
	f := filepath.Join(t.TempDir(), "log.1")
	if err := os.WriteFile(f, []byte("0 1 2500 0 1700000000 250000 120\n1 1 9000 0 1700000001 5\nbad line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	txs, err := readPGBenchLog(f)
	if err != nil {
		t.Fatal(err)
	}
	want := []pgTx{{end: 1700000000_250000, lat: 2500}, {end: 1700000001_000005, lat: 9000}}
	if !slices.Equal(txs, want) {
		t.Fatalf("transactions %+v, want %+v", txs, want)
	}
	l := latencyOf(txs, 1700000000_000000, 1700000001_000000, time.Second)
	if l.Transactions != 1 || l.TPS != 1 {
		t.Errorf("window of one transaction: %+v", l)
	}
}

// The throttle verdict of backfill-oltp: with a load spike it passes only when the rate limit went
// down, fails when it did not, and cannot judge a spike the backfill was not running in; without
// a spike a rate limit that never went down cannot be judged.
func TestOLTPThrottleVerdict(t *testing.T) {
	for _, c := range []struct {
		name    string
		res     OLTPResult
		outcome string
	}{
		{"lowered in the spike", OLTPResult{Throttled: true, SpikeFrom: 2, SpikeTo: 12, SpikeMinLim: 100}, Pass},
		{"not lowered in the spike", OLTPResult{SpikeFrom: 2, SpikeTo: 12, SpikeMinLim: 50000}, Fail},
		{"spike after the backfill", OLTPResult{SpikeFrom: 2, SpikeTo: 12}, Inconclusive},
		{"no spike, never lowered", OLTPResult{}, Inconclusive},
		{"no spike, lowered", OLTPResult{Throttled: true}, Pass},
	} {
		v := verdictOf(t, oltpVerdicts(&c.res, OLTPConfig{TPS: 500}), "backfill throttles itself")
		if v.Outcome != c.outcome {
			t.Errorf("%s: %+v, want %s", c.name, v, c.outcome)
		}
	}
	out := []byte("transaction type: <builtin: TPC-B (sort of)>\nlatency average = 7.1 ms\ntps = 2245.123456 (without initial connection time)\n")
	if got := pgbenchTPS(out); got != 2245.123456 {
		t.Errorf("pgbenchTPS: %v", got)
	}
	if got := pgbenchTPS([]byte("no summary")); got != 0 {
		t.Errorf("pgbenchTPS without a tps line: %v", got)
	}
}

// TestSplitPassword: pgbench gets the password through its environment, never on its command
// line; connection strings that are not URLs pass whole.
func TestSplitPassword(t *testing.T) {
	for in, want := range map[string][2]string{
		"postgres://spool:s3cret@db:5432/spool?sslmode=disable":       {"postgres://spool@db:5432/spool?sslmode=disable", "s3cret"},
		"postgresql://spool@db/spool?password=s3cret&sslmode=require": {"postgresql://spool@db/spool?sslmode=require", "s3cret"},
		"postgres://spool@db/spool":                                   {"postgres://spool@db/spool", ""},
		"host=db user=spool password=s3cret":                          {"host=db user=spool password=s3cret", ""},
	} {
		conn, pw := splitPassword(in)
		if conn != want[0] || pw != want[1] {
			t.Errorf("splitPassword(%q) = %q, %q; want %q, %q", in, conn, pw, want[0], want[1])
		}
	}
}
