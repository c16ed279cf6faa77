package bench

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Fan-out write amplification (seed 000, "Fan-out write amplification", LT-1..LT-7): for each group
// count, an e2e run on the PostgreSQL engine (Rate msg/s, one consumer per group) with its
// statistics (pgstats.go): WAL bytes per message, dead tuples and the bloat of each table, and the
// cleanup (retention) rate against the production rate over the second half of the measured
// time. The seed's thresholds: bloat < 20% per table, cleanup rate > production rate, fetch p95
// < 10 ms (here: the consumers kept up); WAL < 50% of the disk's capacity is reported, not judged
// (it needs the disk's capacity; compare with spool bench floor).

// Defaults of FanoutConfig.
var DefaultFanoutGroups = []int{4, 8, 16, 32, 64}

const (
	DefaultFanoutRate      = 10_000
	DefaultFanoutDuration  = 5 * time.Minute
	DefaultFanoutWarmup    = 30 * time.Second
	DefaultFanoutRetention = time.Minute
	// maxBloat is the seed's bound on table bloat, judged as the growth of a table over the
	// second half of the measured window: a table whose dead rows autovacuum reclaims reuses
	// their space and stays flat once it reached its steady size, whatever share of dead tuples a
	// snapshot shows (a table of hot rows, partitions or deliveries, is mostly dead tuples between
	// two passes); one it does not keep up with grows. The first half lets a table reach that size
	// (a fresh one grows until autovacuum's first passes). The partitions of messages are left
	// out (retention drops whole ones).
	maxBloat = 0.20
	// bloatMinHalf is the shortest second half that can show a table flat: autovacuum visits a
	// table about once per autovacuum_naptime (60 s by default), two visits at least.
	bloatMinHalf = 2 * time.Minute
	// bloatSlackBytes: growth below it is not judged (a table of a few pages doubles by one).
	bloatSlackBytes = 1 << 20
	// cleanupTolerance: retention drops whole buckets, so over a half window the cleanup rate
	// may trail production by a bucket; it keeps pace at this share of production or more.
	cleanupTolerance = 0.9
	// fanoutPoll is the interval of the retained-messages series.
	fanoutPoll = 2 * time.Second
)

// FanoutConfig configures the fan-out scenario.
type FanoutConfig struct {
	Addr, Admin string
	TLS         *tls.Config
	Token       string
	Logger      *slog.Logger
	// PGURL and PGSchema: the broker's database (required).
	PGURL, PGSchema string
	// Groups are the group counts, one run each.
	Groups []int
	Rate   float64
	// Completion is the topics' completion_tracking ("": the broker's default, watermark).
	Completion       string
	Size             int
	Publishers       int
	Duration, Warmup time.Duration
	MessageRetention time.Duration
	PGSample         time.Duration
}

// FanoutRow is one group count.
type FanoutRow struct {
	Groups     int     `json:"groups"`
	Completion string  `json:"completion_tracking"`
	Result     *Result `json:"result"`
	// WAL per message published and per second of the window.
	WALBytesPerMessage float64 `json:"wal_bytes_per_message"`
	WALMBps            float64 `json:"wal_mb_per_s"`
	DeadTuples         int64   `json:"dead_tuples"`
	// MaxBloat is the largest growth over the second half of the measured window of a table (not
	// messages) that grew by bloatSlackBytes or more, as a share of its size in the middle of the
	// window; BloatTable its name ("" when none grew that much), BloatFrom and BloatTo its sizes. MaxDeadShare is the
	// largest n_dead_tup/(n_live_tup+n_dead_tup) at the end, DeadTable its table (reported).
	MaxBloat     float64 `json:"max_bloat"`
	BloatTable   string  `json:"bloat_table"`
	BloatFrom    int64   `json:"bloat_from_bytes"`
	BloatTo      int64   `json:"bloat_to_bytes"`
	MaxDeadShare float64 `json:"max_dead_share"`
	DeadTable    string  `json:"dead_table"`
	// Judged is false when the table sizes in the middle and at the end of the window were not
	// measured.
	Judged bool `json:"bloat_judged"`
	// CleanupRate and ProductionRate (msg/s) over the second half of the measured time: retention
	// removals (GET /api/v1/cleanup) and removals plus the growth of the retained messages.
	CleanupRate    float64   `json:"cleanup_rate"`
	ProductionRate float64   `json:"production_rate"`
	CleanupSpan    float64   `json:"cleanup_span_s"`
	Verdicts       []Verdict `json:"verdicts"`
}

// FanoutResult is the outcome of the matrix.
type FanoutResult struct {
	Rows    []FanoutRow `json:"rows"`
	Outcome string      `json:"outcome"`
}

// fanoutPoint is one reading of the retained messages and the retention removals.
type fanoutPoint struct {
	at       time.Time
	retained int64
	removed  int64
}

// RunFanout runs one e2e run per group count.
func RunFanout(ctx context.Context, cfg FanoutConfig) (*FanoutResult, error) {
	if cfg.PGURL == "" {
		return nil, fmt.Errorf("bench: %w: the fan-out scenario measures PostgreSQL: give the broker's database (--pg)", storage.ErrInvalidArgument)
	}
	groups := cfg.Groups
	if len(groups) == 0 {
		groups = DefaultFanoutGroups
	}
	base := Config{Mode: ModeE2E, Addr: cfg.Addr, Admin: cfg.Admin, TLS: cfg.TLS, Token: cfg.Token, Logger: cfg.Logger,
		Rate: cmp.Or(cfg.Rate, DefaultFanoutRate), Size: cfg.Size, Publishers: cfg.Publishers, Async: true, Consumers: 1,
		Duration: cmp.Or(cfg.Duration, DefaultFanoutDuration), Warmup: cmp.Or(cfg.Warmup, DefaultFanoutWarmup),
		MessageRetention: cmp.Or(cfg.MessageRetention, DefaultFanoutRetention), Completion: cfg.Completion,
		PGURL: cfg.PGURL, PGSchema: cfg.PGSchema, PGSample: cfg.PGSample}
	for _, n := range groups {
		c := base
		c.Groups = n
		if err := c.WithDefaults().Validate(); err != nil {
			return nil, err
		}
	}
	adm := newAdmin(cmp.Or(cfg.Admin, DefaultAdmin), cfg.TLS, cfg.Token)
	res := &FanoutResult{}
	run := newRunID()
	var all []Verdict
	for _, n := range groups {
		c := base
		c.Groups = n
		c.Topic = scenarioTopic(ScenarioFanout, fmt.Sprintf("g%d", n), run)
		row, err := runFanoutRow(ctx, adm, c)
		if err != nil {
			return nil, fmt.Errorf("bench: %d groups: %w", n, err)
		}
		all = append(all, row.Verdicts...)
		res.Rows = append(res.Rows, *row)
	}
	res.Outcome = overall(all)
	return res, nil
}

// runFanoutRow runs one group count, reading the retained messages and the retention removals
// every fanoutPoll meanwhile.
func runFanoutRow(ctx context.Context, adm *adminAPI, c Config) (*FanoutRow, error) {
	d := c.WithDefaults()
	started := time.Now()
	var (
		mu     sync.Mutex
		points []fanoutPoint
	)
	pollCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(fanoutPoll)
		defer t.Stop()
		for {
			select {
			case <-pollCtx.Done():
				return
			case <-t.C:
			}
			msgs, _, err := adm.topicStored(pollCtx, c.Topic)
			if err != nil {
				continue // not created yet, or deleted
			}
			jobs, err := adm.cleanupJobs(pollCtx)
			if err != nil {
				continue
			}
			mu.Lock()
			points = append(points, fanoutPoint{at: time.Now(), retained: msgs, removed: jobs["retention"].Removed})
			mu.Unlock()
		}
	}()
	r, err := Run(ctx, c)
	stop()
	<-done
	if err != nil {
		return nil, err
	}
	row := &FanoutRow{Groups: c.Groups, Completion: cmp.Or(c.Completion, string(storage.Watermark)), Result: r}
	if pg := r.PG; pg != nil {
		row.WALBytesPerMessage, row.DeadTuples = pg.WALBytesPerMessage, pg.DeadTuples
		if pg.WindowSeconds > 0 {
			row.WALMBps = float64(pg.WALBytes) / pg.WindowSeconds / 1e6
		}
		row.tableBloat(pg.Tables)
	}
	// The second half of the measured time.
	from := started.Add(d.Warmup + d.Duration/2)
	to := started.Add(d.Warmup + d.Duration)
	var first, last *fanoutPoint
	for i := range points {
		p := &points[i]
		if p.at.Before(from) || p.at.After(to.Add(fanoutPoll)) {
			continue
		}
		if first == nil {
			first = p
		}
		last = p
	}
	if first != nil && last != first {
		span := last.at.Sub(first.at).Seconds()
		removed := last.removed - first.removed
		row.CleanupSpan = span
		row.CleanupRate = float64(removed) / span
		row.ProductionRate = float64(removed+last.retained-first.retained) / span
	}
	row.Verdicts = fanoutVerdicts(row, d)
	return row, nil
}

// tableBloat sets the largest growth over the second half of the window among the tables (not
// messages) and the largest dead-tuple share.
func (row *FanoutRow) tableBloat(tables []PGTable) {
	for _, t := range tables {
		if n := t.LiveTuples + t.DeadTuples; n > 0 {
			if d := float64(t.DeadTuples) / float64(n); d > row.MaxDeadShare || row.DeadTable == "" {
				row.MaxDeadShare, row.DeadTable = d, t.Name
			}
		}
		if t.Name == messagesTable || t.WindowMidBytes <= 0 || t.WindowEndBytes <= 0 {
			continue
		}
		row.Judged = true
		grew := t.WindowEndBytes - t.WindowMidBytes
		if grew < bloatSlackBytes {
			continue
		}
		if g := float64(grew) / float64(t.WindowMidBytes); g > row.MaxBloat || row.BloatTable == "" {
			row.MaxBloat, row.BloatTable, row.BloatFrom, row.BloatTo = g, t.Name, t.WindowMidBytes, t.WindowEndBytes
		}
	}
}

// fanoutVerdicts judges one group count.
func fanoutVerdicts(row *FanoutRow, c Config) []Verdict {
	name := fmt.Sprintf("%d groups: ", row.Groups)
	var vs []Verdict
	const bloatTarget = "< 20% per table (growth over the second half of the measured window)"
	dead := ""
	if row.DeadTable != "" {
		dead = fmt.Sprintf("; dead tuples at the end %d, largest share %.1f%% (%s)", row.DeadTuples, 100*row.MaxDeadShare, row.DeadTable)
	}
	var bv Verdict
	switch {
	case row.Result.PG == nil || !row.Judged:
		bv = Verdict{Check: name + "bloat", Target: bloatTarget, Outcome: Inconclusive,
			Measured: "no table sizes in the middle and at the end of the window" + dead,
			Note:     "the window must be longer than twice --pg-sample; else see the run's PostgreSQL errors"}
	case row.BloatTable == "":
		bv = verdict(name+"bloat", bloatTarget, true, "no table grew by 1 MiB or more%s", dead)
	default:
		bv = verdict(name+"bloat", bloatTarget, row.MaxBloat < maxBloat,
			"largest growth %.1f%% (%s, %d to %d kB)%s", 100*row.MaxBloat, row.BloatTable, row.BloatFrom>>10, row.BloatTo>>10, dead)
	}
	if row.Judged && row.Result.PG.WindowSeconds/2 < bloatMinHalf.Seconds() {
		half := row.Result.PG.WindowSeconds / 2
		bv.Outcome = Inconclusive
		bv.Note = fmt.Sprintf("the second half of the window (%.0f s) is shorter than %s: autovacuum visits a table about once per autovacuum_naptime (60 s by default), so a table cannot show it stays flat; run --duration %s or longer",
			half, bloatMinHalf, 2*bloatMinHalf)
	}
	vs = append(vs, bv)
	cl := verdict(name+"cleanup rate", "> production rate", row.CleanupRate >= cleanupTolerance*row.ProductionRate && row.CleanupRate > 0,
		"cleanup %.0f msg/s, production %.0f msg/s over %.0f s", row.CleanupRate, row.ProductionRate, row.CleanupSpan)
	if row.CleanupSpan == 0 || (row.CleanupRate == 0 && c.Duration/2 < c.MessageRetention+time.Minute) {
		cl.Outcome = Inconclusive
		cl.Note = "retention did not run in the second half of the measured time: make --duration at least twice --message-retention plus broker.retention_interval"
	}
	vs = append(vs, cl)
	d := row.Result.Delivery
	held := d.KeptUp && d.Missing == 0 && row.Result.Publish.Held != nil && *row.Result.Publish.Held
	vs = append(vs, verdict(name+"consumers kept up", fmt.Sprintf("%.0f msg/s to every group", c.Rate), held,
		"published %.0f msg/s, backlog at the end %d, delivery p95 %s p99 %s", row.Result.Publish.Rate,
		d.BacklogAtPublishEnd, fmtMS(d.Latency.P95), fmtMS(d.Latency.P99)))
	return vs
}

// WriteSummary prints one line per group count, then the verdicts.
func (res *FanoutResult) WriteSummary(w io.Writer) error {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("scenario fanout (PostgreSQL):\n")
	p("  %6s %-10s %10s %12s %10s %10s %12s %12s %12s %10s\n", "groups", "completion", "pub msg/s", "deliveries/s",
		"WAL B/msg", "WAL MB/s", "dead tuples", "growth", "cleanup/s", "prod/s")
	for _, r := range res.Rows {
		p("  %6d %-10s %10.0f %12.0f %10.0f %10.1f %12d %11.1f%% %12.0f %10.0f\n", r.Groups, r.Completion,
			r.Result.Publish.Rate, r.Result.Delivery.Rate, r.WALBytesPerMessage, r.WALMBps, r.DeadTuples, 100*r.MaxBloat,
			r.CleanupRate, r.ProductionRate)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	var all []Verdict
	for _, r := range res.Rows {
		all = append(all, r.Verdicts...)
	}
	writeVerdicts(w, ScenarioFanout, all)
	return nil
}
