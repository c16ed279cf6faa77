package bench

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/client"
	"github.com/spoolmq/spool/internal/storage"
)

// Backfill against OLTP (seed 000, "Backfill against OLTP"): on the PostgreSQL engine, pgbench
// runs its TPC-B-like transactions at a fixed rate (seed: 500 TPS) on its own tables in the
// broker's database, first alone (the baseline), then beside the backfill of a group created
// FROM_BEGINNING on a topic seeded with Messages messages (seed: 5,000,000). The seed's
// criteria: pgbench's p95 latency stays under 100 ms while the backfill runs, and the backfill
// throttles itself (the broker's pacer halves its rate while the p95 of its range claims, which
// on PostgreSQL are database transactions, is above 10 ms). A database that pgbench at 500 TPS
// leaves idle never slows those claims, so the run can add a load spike: a second pgbench
// without a rate limit (Spike long, SpikeClients connections) from oltpSpikeAfter into the
// backfill, which the pacer must answer by lowering its rate. pgbench's p95 verdict is judged
// outside the spike (inside it pgbench competes with itself); the spike's figures are reported.
// The run reports the backfill's rate and rate limit over time. pgbench's tables live in a
// schema of their own, dropped at the end with the scenario's topic.

// Defaults of OLTPConfig.
const (
	DefaultOLTPMessages = 1_000_000
	DefaultOLTPSize     = 100
	DefaultOLTPTPS      = 500
	DefaultOLTPScale    = 10
	DefaultOLTPClients  = 16
	DefaultOLTPDuration = 2 * time.Minute
	DefaultOLTPBaseline = time.Minute
	DefaultOLTPTimeout  = time.Hour
	DefaultOLTPSample   = time.Second
	DefaultOLTPSpike    = 10 * time.Second
	// oltpP95Target is the seed's bound on pgbench's p95 latency.
	oltpP95Target = 100 * time.Millisecond
	// oltpMinTx is the fewest pgbench transactions a window needs to judge its p95.
	oltpMinTx = 100
	// oltpRateHeld is the share of its fixed rate pgbench must make beside the backfill (its -R
	// schedule is a Poisson process: short runs vary by a few percent).
	oltpRateHeld = 0.9
	// oltpSeedBatch is the messages of one publish of the seeding.
	oltpSeedBatch = 500
	// oltpSpikeAfter is when the load spike starts, after the backfill's group is created.
	oltpSpikeAfter = 2 * time.Second
)

// ScenarioOLTP is backfill against OLTP.
const ScenarioOLTP = "backfill-oltp"

// OLTPConfig configures the backfill-against-OLTP scenario.
type OLTPConfig struct {
	Addr, Admin string
	TLS         *tls.Config
	Token       string
	Logger      *slog.Logger
	// PGURL is the broker's database (required): pgbench runs there, in a schema of its own.
	PGURL string
	// PGBench is the pgbench binary ("": pgbench on PATH, else the newest
	// /usr/lib/postgresql/*/bin/pgbench).
	PGBench string
	// Messages seed the topic (each Size bytes); the group's backfill is all of them.
	Messages int64
	Size     int
	// Partitions of the topic (default 4), Consumers of the backfilling group (default 2).
	Partitions, Consumers int
	// TPS is pgbench's fixed rate (-R), Clients its connections (-c), Scale its -s.
	TPS     float64
	Clients int
	Scale   int
	// Baseline is pgbench's run alone, Duration its run beside the backfill.
	Baseline, Duration time.Duration
	// Timeout bounds the wait for the backfill's end after pgbench's run.
	Timeout time.Duration
	// Sample is the interval of the backfill's progress series.
	Sample time.Duration
	// Spike is the length of the load spike (0: none), SpikeClients its connections (default
	// Clients).
	Spike        time.Duration
	SpikeClients int
}

func (c OLTPConfig) withDefaults() OLTPConfig {
	c.Messages = cmp.Or(c.Messages, DefaultOLTPMessages)
	c.Size = cmp.Or(c.Size, DefaultOLTPSize)
	c.Partitions = cmp.Or(c.Partitions, 4)
	c.Consumers = cmp.Or(c.Consumers, 2)
	c.TPS = cmp.Or(c.TPS, DefaultOLTPTPS)
	c.Clients = cmp.Or(c.Clients, DefaultOLTPClients)
	c.Scale = cmp.Or(c.Scale, DefaultOLTPScale)
	c.Baseline = cmp.Or(c.Baseline, DefaultOLTPBaseline)
	c.Duration = cmp.Or(c.Duration, DefaultOLTPDuration)
	c.Timeout = cmp.Or(c.Timeout, DefaultOLTPTimeout)
	c.Sample = cmp.Or(c.Sample, DefaultOLTPSample)
	c.SpikeClients = cmp.Or(c.SpikeClients, c.Clients)
	c.Admin = cmp.Or(c.Admin, DefaultAdmin)
	c.Addr = cmp.Or(c.Addr, DefaultAddr)
	return c
}

func (c OLTPConfig) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("bench: %w: %s", storage.ErrInvalidArgument, fmt.Sprintf(format, args...))
	}
	switch {
	case c.PGURL == "":
		return bad("the backfill-oltp scenario runs pgbench in the broker's PostgreSQL database: give it (--pg)")
	case c.Messages < 1 || c.Messages > 100_000_000:
		return bad("messages must be 1 to 100,000,000, got %d", c.Messages)
	case c.Size < 1 || c.Size > 1<<20:
		return bad("size must be 1 to 1 MiB, got %d", c.Size)
	case c.Partitions < 1 || c.Partitions > 256 || c.Consumers < 1 || c.Consumers > 64:
		return bad("partitions must be 1 to 256 and consumers 1 to 64, got %d and %d", c.Partitions, c.Consumers)
	case c.TPS <= 0 || c.TPS > 100_000 || c.Clients < 1 || c.Clients > 1000 || c.Scale < 1 || c.Scale > 10_000:
		return bad("tps must be in (0, 100000], clients 1 to 1000, scale 1 to 10000")
	case c.Baseline < time.Second || c.Duration < time.Second || c.Sample <= 0:
		return bad("baseline and duration must be at least 1s, sample positive")
	case c.Spike < 0 || (c.Spike > 0 && c.Spike < time.Second) || c.SpikeClients < 1 || c.SpikeClients > 1000:
		return bad("spike must be 0 (none) or at least 1s, spike clients 1 to 1000")
	case c.Spike > 0 && oltpSpikeAfter+c.Spike > c.Duration:
		return bad("the spike (from %s into the backfill, %s long) must end within duration %s", oltpSpikeAfter, c.Spike, c.Duration)
	}
	return nil
}

// OLTPLatency is pgbench's latency over a window (milliseconds, from the scheduled start: with
// -R it includes the wait for a free connection).
type OLTPLatency struct {
	Transactions int64   `json:"transactions"`
	TPS          float64 `json:"tps"`
	P50          float64 `json:"p50_ms"`
	P95          float64 `json:"p95_ms"`
	P99          float64 `json:"p99_ms"`
	Max          float64 `json:"max_ms"`
}

// OLTPSample is one reading of the backfill (GET .../groups/{group}/backfill).
type OLTPSample struct {
	At        float64 `json:"at_s"` // since the group's creation
	State     string  `json:"state"`
	Processed int64   `json:"processed"`
	// Rate is the processed messages per second since the previous sample; RateLimit the
	// broker's pacer limit then.
	Rate      float64 `json:"rate"`
	RateLimit float64 `json:"rate_limit"`
}

// OLTPResult is the outcome of the scenario.
type OLTPResult struct {
	Topic    string  `json:"topic"`
	PGSchema string  `json:"pgbench_schema"`
	Messages int64   `json:"messages"`
	Size     int     `json:"size"`
	SeedRate float64 `json:"seed_rate"` // msg/s
	TPS      float64 `json:"pgbench_tps_target"`
	// Baseline is pgbench alone, During beside the backfill (transactions that ended while it
	// was IN_PROGRESS, outside the spike), Whole pgbench's whole second run.
	Baseline OLTPLatency `json:"baseline"`
	During   OLTPLatency `json:"during_backfill"`
	Whole    OLTPLatency `json:"whole_second_run"`
	// The load spike: its window (seconds since the group's creation; zero: none), the fixed-rate
	// pgbench's latency inside it, and the spike's own throughput (pgbench's tps line).
	SpikeFrom   float64     `json:"spike_from_s,omitempty"`
	SpikeTo     float64     `json:"spike_to_s,omitempty"`
	InSpike     OLTPLatency `json:"in_spike"`
	SpikeTPS    float64     `json:"spike_tps,omitempty"`
	SpikeMinLim float64     `json:"spike_min_rate_limit,omitempty"`
	// BackfillTotal and BackfillState as the broker reports them at the end; BackfillSeconds
	// from the group's creation to COMPLETED (0: not completed), BackfillRate the mean.
	BackfillTotal   int64        `json:"backfill_total"`
	BackfillState   string       `json:"backfill_state"`
	BackfillSeconds float64      `json:"backfill_seconds"`
	BackfillRate    float64      `json:"backfill_rate"`
	MinRateLimit    float64      `json:"min_rate_limit"`
	MaxRateLimit    float64      `json:"max_rate_limit"`
	Throttled       bool         `json:"throttled"`
	Samples         []OLTPSample `json:"samples"`
	Verdicts        []Verdict    `json:"verdicts"`
	Outcome         string       `json:"outcome"`
	// Cleanup says what was removed at the end, or what could not be.
	Cleanup string `json:"cleanup"`
}

// pgTx is one pgbench transaction: its end (Unix µs) and its latency (µs).
type pgTx struct{ end, lat int64 }

// RunOLTP runs backfill against OLTP.
func RunOLTP(ctx context.Context, cfg OLTPConfig) (*OLTPResult, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	bin, err := findPGBench(cfg.PGBench)
	if err != nil {
		return nil, err
	}
	r := &runner{cfg: Config{Addr: cfg.Addr, Admin: cfg.Admin, TLS: cfg.TLS, Token: cfg.Token, Logger: cfg.Logger,
		Semantics: SemanticsPubSub}, runID: newRunID()}
	r.adm = newAdmin(cfg.Admin, cfg.TLS, cfg.Token)
	res := &OLTPResult{Messages: cfg.Messages, Size: cfg.Size, TPS: cfg.TPS}
	pb := &pgbench{bin: bin, url: cfg.PGURL, schema: fmt.Sprintf("spool_oltp_%08x", uint32(r.runID))}
	dir, err := os.MkdirTemp("", "spool-oltp-")
	if err != nil {
		return nil, err
	}
	pb.dir, res.PGSchema = dir, pb.schema
	defer func() {
		// Clients first (the topic's deletion waits for no one), then the topic, the schema.
		var notes []string
		if err := r.cleanup(); err != nil {
			notes = append(notes, "topic: "+err.Error())
		} else if r.topic.Deleted {
			notes = append(notes, "topic "+r.topic.Name+" deleted")
		}
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := pb.dropSchema(cctx); err != nil {
			notes = append(notes, "schema: "+err.Error())
		} else {
			notes = append(notes, "schema "+pb.schema+" dropped")
		}
		os.RemoveAll(dir)
		res.Cleanup = strings.Join(notes, "; ")
	}()

	// 1. pgbench's tables, the topic and its seed (a group holds the messages meanwhile).
	if err := pb.init(ctx, cfg.Scale); err != nil {
		return nil, err
	}
	topic := scenarioTopic(ScenarioOLTP, "history", r.runID)
	res.Topic = topic
	if _, err := r.adm.createTopic(ctx, topic, topicSpec{semantics: SemanticsPubSub, partitions: cfg.Partitions,
		messageRetention: 24 * time.Hour}); err != nil {
		return nil, err
	}
	r.topic = TopicInfo{Name: topic, Semantics: SemanticsPubSub, Created: true}
	if err := r.adm.createGroup(ctx, topic, "holder", groupSpec{}); err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := r.seed(ctx, topic, cfg.Messages, cfg.Size); err != nil {
		return nil, err
	}
	res.SeedRate = float64(cfg.Messages) / time.Since(t0).Seconds()

	// 2. pgbench alone.
	txs, err := pb.run(ctx, "baseline", cfg.TPS, cfg.Clients, cfg.Baseline)
	if err != nil {
		return nil, err
	}
	res.Baseline = latencyOf(txs, 0, 1<<62, cfg.Baseline)

	// 3. pgbench beside the backfill: the group, its consumers, the sampler.
	const group = "backfill"
	if err := r.adm.createGroup(ctx, topic, group, groupSpec{start: &storage.StartPosition{Kind: storage.FromBeginning}, maxBackfill: cfg.Messages}); err != nil {
		return nil, err
	}
	bfStart := time.Now()
	var consumed atomic.Int64
	for range cfg.Consumers {
		if err := r.consume(ctx, topic, group, func([]byte, int64) { consumed.Add(1) }, bfStart); err != nil {
			return nil, err
		}
	}
	sctx, stopSampler := context.WithCancel(ctx)
	var (
		smu     sync.Mutex
		samples []OLTPSample
		doneAt  time.Time
		last    backfillView
	)
	done := make(chan struct{})
	completed := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(cfg.Sample)
		defer t.Stop()
		prev := OLTPSample{}
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
			v, err := r.adm.backfill(sctx, topic, group)
			if err != nil {
				continue
			}
			now := time.Now()
			s := OLTPSample{At: now.Sub(bfStart).Seconds(), State: v.State, Processed: v.Processed, RateLimit: v.RateLimit}
			if dt := s.At - prev.At; dt > 0 {
				s.Rate = float64(s.Processed-prev.Processed) / dt
			}
			prev = s
			smu.Lock()
			samples, last = append(samples, s), v
			if v.State == string(storage.BackfillCompleted) {
				doneAt = now
			}
			smu.Unlock()
			if v.State == string(storage.BackfillCompleted) {
				close(completed) // the series ends with the backfill
				return
			}
		}
	}()
	// The load spike, beside the fixed-rate run.
	var spikeFrom, spikeTo time.Time
	var spikeErr error
	spikeDone := make(chan struct{})
	go func() {
		defer close(spikeDone)
		if cfg.Spike <= 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(bfStart.Add(oltpSpikeAfter))):
		}
		spikeFrom = time.Now()
		var out []byte
		out, spikeErr = pb.exec(ctx, "-n", "-T", strconv.Itoa(max(1, int(cfg.Spike.Round(time.Second).Seconds()))),
			"-c", strconv.Itoa(cfg.SpikeClients), "-j", "2")
		spikeTo = time.Now()
		res.SpikeTPS = pgbenchTPS(out)
	}()
	txs, err = pb.run(ctx, "backfill", cfg.TPS, cfg.Clients, cfg.Duration)
	pbEnd := time.Now()
	<-spikeDone
	if err == nil {
		err = spikeErr
	}
	if err != nil {
		stopSampler()
		<-done
		return nil, err
	}
	select {
	case <-completed:
	case <-ctx.Done():
	case <-time.After(cfg.Timeout):
	}
	stopSampler()
	<-done

	end := doneAt
	if end.IsZero() {
		end = time.Now()
	} else {
		res.BackfillSeconds = doneAt.Sub(bfStart).Seconds()
	}
	res.BackfillTotal, res.BackfillState = last.Total, last.State
	if s := end.Sub(bfStart).Seconds(); s > 0 {
		res.BackfillRate = float64(last.Processed) / s
	}
	res.Whole = latencyOf(txs, 0, 1<<62, cfg.Duration)
	window := func() time.Duration {
		if end.Before(pbEnd) {
			return end.Sub(bfStart)
		}
		return pbEnd.Sub(bfStart)
	}()
	res.During = latencyOf(txs, bfStart.UnixMicro(), end.UnixMicro(), window)
	if !spikeFrom.IsZero() {
		from, to := spikeFrom.UnixMicro(), spikeTo.UnixMicro()
		res.SpikeFrom, res.SpikeTo = spikeFrom.Sub(bfStart).Seconds(), spikeTo.Sub(bfStart).Seconds()
		res.InSpike = latencyOf(txs, from, to, spikeTo.Sub(spikeFrom))
		// During leaves the spike out: pgbench's latency there is its own load's.
		var outside []pgTx
		for _, t := range txs {
			if t.end < from || t.end >= to {
				outside = append(outside, t)
			}
		}
		overlap := spikeTo.Sub(spikeFrom)
		if end.Before(spikeTo) {
			overlap = end.Sub(spikeFrom)
		}
		inBackfill := window - min(window, max(0, overlap))
		res.During = latencyOf(outside, bfStart.UnixMicro(), end.UnixMicro(), inBackfill)
	}
	res.Samples = samples
	for _, s := range samples {
		if s.RateLimit <= 0 {
			continue
		}
		if res.MinRateLimit == 0 || s.RateLimit < res.MinRateLimit {
			res.MinRateLimit = s.RateLimit
		}
		res.MaxRateLimit = max(res.MaxRateLimit, s.RateLimit)
	}
	for i := 1; i < len(samples); i++ {
		a, b := samples[i-1].RateLimit, samples[i].RateLimit
		if a > 0 && b > 0 && b < a {
			res.Throttled = true // the pacer halved its rate at least once
		}
		if b > 0 && res.SpikeTo > 0 && samples[i].At >= res.SpikeFrom && samples[i].At <= res.SpikeTo+cfg.Sample.Seconds() &&
			(res.SpikeMinLim == 0 || b < res.SpikeMinLim) {
			res.SpikeMinLim = b
		}
	}
	res.Verdicts = oltpVerdicts(res, cfg)
	res.Outcome = overall(res.Verdicts)
	return res, nil
}

// oltpVerdicts judges the run.
func oltpVerdicts(res *OLTPResult, cfg OLTPConfig) []Verdict {
	target := "< " + oltpP95Target.String()
	var vs []Verdict
	during := verdict("pgbench p95 during the backfill", target, res.During.P95 < ms(int64(oltpP95Target)),
		"%s over %d transactions (alone: %s)", fmtMS(res.During.P95), res.During.Transactions, fmtMS(res.Baseline.P95))
	if res.During.Transactions < oltpMinTx {
		during.Outcome = Inconclusive
		during.Note = fmt.Sprintf("fewer than %d pgbench transactions ended while the backfill ran: seed more messages (--messages)", oltpMinTx)
	}
	vs = append(vs, during)
	rateHeld := res.Whole.TPS >= oltpRateHeld*cfg.TPS
	vs = append(vs, verdict("pgbench held its rate beside the backfill", fmt.Sprintf("%.0f TPS", cfg.TPS), rateHeld,
		"%.1f TPS", res.Whole.TPS))
	done := verdict("backfill completed", fmt.Sprintf("%d messages", res.Messages),
		res.BackfillState == string(storage.BackfillCompleted) && res.BackfillTotal == res.Messages,
		"%s, %d of %d in %.1f s (%.0f msg/s)", res.BackfillState, res.BackfillTotal, res.Messages, res.BackfillSeconds, res.BackfillRate)
	vs = append(vs, done)
	th := verdict("backfill throttles itself", "rate limit lowered while the database is slow", res.Throttled,
		"rate limit %.0f to %.0f msg/s", res.MinRateLimit, res.MaxRateLimit)
	switch {
	case res.SpikeTo > 0 && res.SpikeMinLim == 0:
		th.Outcome = Inconclusive
		th.Note = "the backfill was not IN_PROGRESS during the load spike: seed more messages (--messages)"
	case res.SpikeTo > 0:
		th.Measured += fmt.Sprintf("; %.0f msg/s at its lowest in the load spike (%.0f TPS unthrottled)", res.SpikeMinLim, res.SpikeTPS)
		if !res.Throttled {
			th.Note = "the load spike did not raise the range claims' p95 above 10 ms, or the pacer did not answer it"
		}
	case !res.Throttled:
		th.Outcome = Inconclusive
		th.Note = "the pacer never lowered its rate: its range claims' p95 stayed under 10 ms (the database was not slowed down; add a load spike: --spike)"
	}
	vs = append(vs, th)
	return vs
}

// WriteSummary prints the figures, the backfill's series and the verdicts.
func (res *OLTPResult) WriteSummary(w io.Writer) error {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("scenario backfill-oltp (PostgreSQL): topic %s, %d messages of %d B seeded at %.0f msg/s\n",
		res.Topic, res.Messages, res.Size, res.SeedRate)
	p("  pgbench at %.0f TPS     %8s %8s %8s %8s %8s %9s\n", res.TPS, "tx", "TPS", "p50", "p95", "p99", "max")
	for _, l := range []struct {
		name string
		l    OLTPLatency
	}{{"alone", res.Baseline}, {"during the backfill", res.During}, {"in the load spike", res.InSpike}, {"whole second run", res.Whole}} {
		if l.l.Transactions == 0 && l.name == "in the load spike" {
			continue
		}
		p("  %-22s %8d %8.1f %8s %8s %8s %9s\n", l.name, l.l.Transactions, l.l.TPS, fmtMS(l.l.P50), fmtMS(l.l.P95), fmtMS(l.l.P99), fmtMS(l.l.Max))
	}
	p("  backfill: %s, %d messages, %.1f s, %.0f msg/s; rate limit %.0f to %.0f msg/s\n", res.BackfillState,
		res.BackfillTotal, res.BackfillSeconds, res.BackfillRate, res.MinRateLimit, res.MaxRateLimit)
	if res.SpikeTo > 0 {
		p("  load spike: unthrottled pgbench from %.1f s to %.1f s, %.0f TPS\n", res.SpikeFrom, res.SpikeTo, res.SpikeTPS)
	}
	p("  %8s %-12s %12s %10s %12s\n", "at", "state", "processed", "msg/s", "rate limit")
	for _, s := range res.Samples {
		p("  %7.1fs %-12s %12d %10.0f %12.0f\n", s.At, s.State, s.Processed, s.Rate, s.RateLimit)
	}
	if res.Cleanup != "" {
		p("  cleanup: %s\n", res.Cleanup)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	writeVerdicts(w, ScenarioOLTP, res.Verdicts)
	return nil
}

// latencyOf summarizes the transactions that ended in [from, to) (Unix µs) over a window.
func latencyOf(txs []pgTx, from, to int64, window time.Duration) OLTPLatency {
	h := NewHistogram()
	for _, t := range txs {
		if t.end >= from && t.end < to {
			h.Record(t.lat * int64(time.Microsecond))
		}
	}
	l := OLTPLatency{Transactions: int64(h.Count())}
	if l.Transactions == 0 {
		return l
	}
	if window > 0 {
		l.TPS = float64(l.Transactions) / window.Seconds()
	}
	l.P50, l.P95, l.P99, l.Max = ms(h.Quantile(0.50)), ms(h.Quantile(0.95)), ms(h.Quantile(0.99)), ms(h.Max())
	return l
}

// seed publishes n messages of size bytes in batches, from four clients.
func (r *runner) seed(ctx context.Context, topic string, n int64, size int) error {
	const clients = 4
	var next atomic.Int64
	var errs errorLog
	var wg sync.WaitGroup
	payload := make([]byte, size)
	for i := range clients {
		c, err := r.dial(ctx, fmt.Sprintf("scenario-seed-%d", i))
		if err != nil {
			return err
		}
		wg.Go(func() {
			msgs := make([]client.Message, 0, oltpSeedBatch)
			for ctx.Err() == nil {
				k := min(int64(oltpSeedBatch), n-next.Add(oltpSeedBatch)+oltpSeedBatch)
				if k <= 0 {
					return
				}
				msgs = msgs[:0]
				for range k {
					msgs = append(msgs, client.Message{Payload: payload})
				}
				if _, err := c.PublishBatch(ctx, topic, msgs); err != nil {
					errs.add(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n, first := errs.get(); n > 0 {
		return fmt.Errorf("bench: seeding %s: %d publishes failed, the first: %s", topic, n, first)
	}
	return ctx.Err()
}

// backfillView is the part of a group's backfill the scenario reads.
type backfillView struct {
	State     string  `json:"state"`
	Processed int64   `json:"processed"`
	Total     int64   `json:"total"`
	RateLimit float64 `json:"rate_limit"`
}

// backfill reads a group's backfill.
func (a *adminAPI) backfill(ctx context.Context, topic, group string) (backfillView, error) {
	var v backfillView
	err := a.getJSON(ctx, "/api/v1/topics/"+url.PathEscape(topic)+"/groups/"+url.PathEscape(group)+"/backfill", &v)
	return v, err
}

// findPGBench returns the pgbench binary: path when given, else pgbench on PATH, else the
// newest of PostgreSQL's Debian install directories.
func findPGBench(path string) (string, error) {
	if path != "" {
		return exec.LookPath(path)
	}
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p, nil
	}
	ms, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pgbench")
	slices.SortFunc(ms, func(a, b string) int { return cmp.Compare(pgVersionOf(a), pgVersionOf(b)) })
	if len(ms) == 0 {
		return "", fmt.Errorf("bench: pgbench not found (on PATH or in /usr/lib/postgresql/*/bin; Debian: apt-get install postgresql-contrib or postgresql): give it with --pgbench")
	}
	return ms[len(ms)-1], nil
}

// pgVersionOf is the major version in /usr/lib/postgresql/<v>/bin/pgbench (0: none).
func pgVersionOf(p string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(p))))
	return v
}

// pgbench runs pgbench in a schema of its own (PGOPTIONS search_path) of the database at url.
type pgbench struct {
	bin, url, schema, dir string
}

func (p *pgbench) exec(ctx context.Context, args ...string) ([]byte, error) {
	conn, password := splitPassword(p.url)
	cmd := exec.CommandContext(ctx, p.bin, append(args, conn)...)
	cmd.Dir = p.dir
	cmd.Env = append(os.Environ(), "PGOPTIONS=-c search_path="+p.schema)
	if password != "" {
		cmd.Env = append(cmd.Env, "PGPASSWORD="+password)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("bench: %s %s: %w: %s", filepath.Base(p.bin), strings.Join(args, " "), err, lastLines(out, 5))
	}
	return out, nil
}

// splitPassword returns a postgres:// URL without its password, and the password, which pgbench
// then gets from PGPASSWORD: a child's command line is readable by every user of the machine, its
// environment only by its owner. Other connection strings are returned whole.
func splitPassword(conn string) (string, string) {
	u, err := url.Parse(conn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return conn, ""
	}
	var password string
	if u.User != nil {
		if pw, ok := u.User.Password(); ok {
			password = pw
			u.User = url.User(u.User.Username())
		}
	}
	if q := u.Query(); q.Has("password") {
		password = q.Get("password")
		q.Del("password")
		u.RawQuery = q.Encode()
	}
	return u.String(), password
}

// init creates the schema and pgbench's tables at scale.
func (p *pgbench) init(ctx context.Context, scale int) error {
	conn, err := pgx.Connect(ctx, p.url)
	if err != nil {
		return fmt.Errorf("bench: connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{p.schema}.Sanitize()); err != nil {
		return fmt.Errorf("bench: create schema %s: %w", p.schema, err)
	}
	_, err = p.exec(ctx, "-i", "-q", "-s", strconv.Itoa(scale))
	return err
}

// dropSchema removes pgbench's schema and tables.
func (p *pgbench) dropSchema(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, p.url)
	if err != nil {
		return fmt.Errorf("bench: connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{p.schema}.Sanitize()+" CASCADE")
	return err
}

// run runs pgbench at tps for d with per-transaction logs, and returns the transactions.
func (p *pgbench) run(ctx context.Context, name string, tps float64, clients int, d time.Duration) ([]pgTx, error) {
	prefix := filepath.Join(p.dir, name)
	secs := max(1, int(d.Round(time.Second).Seconds()))
	if _, err := p.exec(ctx, "-n", "-R", strconv.FormatFloat(tps, 'f', -1, 64), "-T", strconv.Itoa(secs),
		"-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, 2)), "-l", "--log-prefix", prefix); err != nil {
		return nil, err
	}
	files, err := filepath.Glob(prefix + ".*")
	if err != nil {
		return nil, err
	}
	var txs []pgTx
	for _, f := range files {
		t, err := readPGBenchLog(f)
		if err != nil {
			return nil, err
		}
		txs = append(txs, t...)
		os.Remove(f)
	}
	return txs, nil
}

// readPGBenchLog reads a per-transaction log: "client tx latency_us script epoch_s epoch_us
// [lag_us]"; with -R the latency counts from the scheduled start. Skipped transactions are left
// out (they have no latency).
func readPGBenchLog(path string) ([]pgTx, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []pgTx
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 6 {
			continue
		}
		lat, err1 := strconv.ParseInt(fs[2], 10, 64)
		sec, err2 := strconv.ParseInt(fs[4], 10, 64)
		us, err3 := strconv.ParseInt(fs[5], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		out = append(out, pgTx{end: sec*1_000_000 + us, lat: lat})
	}
	return out, sc.Err()
}

// pgbenchTPS reads the "tps = N (without initial connection time)" line of pgbench's summary (0
// when absent).
func pgbenchTPS(out []byte) float64 {
	for l := range strings.SplitSeq(string(out), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "tps = "); ok {
			if f, err := strconv.ParseFloat(strings.Fields(rest)[0], 64); err == nil {
				return f
			}
		}
	}
	return 0
}

// lastLines returns the last n lines of out.
func lastLines(out []byte, n int) string {
	ls := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.Join(ls[max(0, len(ls)-n):], " | ")
}
