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
)

// Multi-tenant isolation (seed 000, "Multi-tenant isolation"): a big topic (BigRate msg/s, BigGroups
// groups) and a small one (SmallRate msg/s, SmallGroups groups) on one broker, two e2e runs at
// once. The small topic's end-to-end p95 must stay under 50 ms and its lag (its largest latency)
// under 10 s whatever the big topic does; the big topic's figures say whether it kept up (on a
// small machine the seed's 10 x 10,000 deliveries/s may not be sustainable).

// Defaults of IsolationConfig (the seed's values).
const (
	DefaultIsolationBigRate     = 10_000
	DefaultIsolationBigGroups   = 10
	DefaultIsolationSmallRate   = 10
	DefaultIsolationSmallGroups = 2
	// smallP95Target and smallLagTarget are the seed's targets for the small topic.
	smallP95Target = 50 * time.Millisecond
	smallLagTarget = 10 * time.Second
)

// IsolationConfig configures the isolation scenario. Zero fields take the defaults.
type IsolationConfig struct {
	Addr, Admin string
	TLS         *tls.Config
	Token       string
	Logger      *slog.Logger
	// BigRate and BigGroups are the busy topic's, SmallRate and SmallGroups the small one's;
	// BigConsumers the consumers of each big group (1 each by default).
	BigRate, SmallRate          float64
	BigGroups, SmallGroups      int
	BigConsumers, BigPublishers int
	Size                        int
	Duration, Warmup            time.Duration
}

// IsolationResult is the outcome: both runs' results and the verdicts.
type IsolationResult struct {
	Big      *Result   `json:"big"`
	Small    *Result   `json:"small"`
	Verdicts []Verdict `json:"verdicts"`
	Outcome  string    `json:"outcome"`
}

// RunIsolation runs the isolation scenario.
func RunIsolation(ctx context.Context, cfg IsolationConfig) (*IsolationResult, error) {
	run := newRunID()
	base := Config{Mode: ModeE2E, Addr: cfg.Addr, Admin: cfg.Admin, TLS: cfg.TLS, Token: cfg.Token, Logger: cfg.Logger,
		Size: cfg.Size, Duration: cfg.Duration, Warmup: cfg.Warmup, Async: true}
	big, small := base, base
	big.Topic = scenarioTopic(ScenarioIsolation, "big", run)
	big.Rate = cmp.Or(cfg.BigRate, DefaultIsolationBigRate)
	big.Groups = cmp.Or(cfg.BigGroups, DefaultIsolationBigGroups)
	big.Consumers = cmp.Or(cfg.BigConsumers, 1)
	big.Publishers = cmp.Or(cfg.BigPublishers, 1)
	small.Topic = scenarioTopic(ScenarioIsolation, "small", run)
	small.Rate = cmp.Or(cfg.SmallRate, DefaultIsolationSmallRate)
	small.Groups = cmp.Or(cfg.SmallGroups, DefaultIsolationSmallGroups)
	small.Consumers = 1
	for _, c := range []Config{big, small} {
		if err := c.WithDefaults().Validate(); err != nil {
			return nil, err
		}
	}
	res := &IsolationResult{}
	var wg sync.WaitGroup
	var bigErr, smallErr error
	wg.Go(func() { res.Big, bigErr = Run(ctx, big) })
	wg.Go(func() { res.Small, smallErr = Run(ctx, small) })
	wg.Wait()
	if bigErr != nil || smallErr != nil {
		if bigErr != nil {
			return nil, fmt.Errorf("bench: big topic: %w", bigErr)
		}
		return nil, fmt.Errorf("bench: small topic: %w", smallErr)
	}
	res.Verdicts = isolationVerdicts(res)
	res.Outcome = overall(res.Verdicts)
	return res, nil
}

// isolationVerdicts judges the small topic against the seed's targets; the big topic keeping up is
// reported, not judged (it measures the machine).
func isolationVerdicts(res *IsolationResult) []Verdict {
	s, b := res.Small.Delivery, res.Big.Delivery
	vs := []Verdict{
		verdict("small topic p95", "< 50 ms", s.Latency.P95 < float64(smallP95Target.Milliseconds()),
			"p95 %s, p99 %s", fmtMS(s.Latency.P95), fmtMS(s.Latency.P99)),
		verdict("small topic lag", "< 10 s", s.Latency.Max < float64(smallLagTarget.Milliseconds()) && s.Missing == 0,
			"max latency %s, %d missing", fmtMS(s.Latency.Max), s.Missing),
	}
	held := b.KeptUp && b.Missing == 0 && res.Big.Publish.Held != nil && *res.Big.Publish.Held
	kept := verdict("big topic kept up", fmt.Sprintf("%.0f msg/s to %d groups", res.Big.Conditions.Rate, res.Big.Conditions.Groups),
		held, "published %.0f msg/s, %.0f deliveries/s, backlog at the end %d, p99 %s",
		res.Big.Publish.Rate, b.Rate, b.BacklogAtPublishEnd, fmtMS(b.Latency.P99))
	if !held {
		kept.Outcome = Inconclusive
		kept.Note = "the big topic did not keep up: isolation was measured under overload (lower --big-rate or --big-groups to find this machine's sustainable load)"
	}
	return append(vs, kept)
}

// WriteSummary prints both runs and the verdicts.
func (res *IsolationResult) WriteSummary(w io.Writer) error {
	for _, part := range []struct {
		name string
		r    *Result
	}{{"big topic", res.Big}, {"small topic", res.Small}} {
		fmt.Fprintf(w, "--- %s ---\n", part.name)
		if err := part.r.WriteSummary(w); err != nil {
			return err
		}
		d := part.r.Delivery
		fmt.Fprintf(w, "  p95 %s\n", fmtMS(d.Latency.P95))
	}
	fmt.Fprintln(w, strings.Repeat("-", 3))
	writeVerdicts(w, ScenarioIsolation, res.Verdicts)
	return nil
}
