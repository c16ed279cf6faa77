package bench

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Percentiles summarizes a latency histogram in milliseconds.
type Percentiles struct {
	Count uint64  `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P95   float64 `json:"p95_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p99_9_ms"`
	Max   float64 `json:"max_ms"`
}

func ms(ns int64) float64 { return float64(ns) / 1e6 }

// percentilesOf summarizes h.
func percentilesOf(h *Histogram) Percentiles {
	return Percentiles{
		Count: h.Count(), Mean: h.Mean() / 1e6,
		P50: ms(h.Quantile(0.5)), P90: ms(h.Quantile(0.9)), P95: ms(h.Quantile(0.95)), P99: ms(h.Quantile(0.99)),
		P999: ms(h.Quantile(0.999)), Max: ms(h.Max()),
	}
}

func (p Percentiles) String() string {
	return fmt.Sprintf("p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  (mean %s, %d samples)",
		fmtMS(p.P50), fmtMS(p.P90), fmtMS(p.P99), fmtMS(p.P999), fmtMS(p.Max), fmtMS(p.Mean), p.Count)
}

func fmtMS(v float64) string {
	switch {
	case v < 1:
		return fmt.Sprintf("%.3f ms", v)
	case v < 100:
		return fmt.Sprintf("%.2f ms", v)
	}
	return fmt.Sprintf("%.0f ms", v)
}

// Conditions are the settings and the machine a run measured.
type Conditions struct {
	Addr  string    `json:"addr"`
	Topic TopicInfo `json:"topic"`
	// Semantics is how the consumers subscribed: QUEUE (sharing the topic's one subscription)
	// or PUB_SUB (one subscription per group); the topic's own when known.
	Semantics  string `json:"semantics"`
	Size       int    `json:"size_bytes"`
	Publishers int    `json:"publishers"`
	Clients    int    `json:"publisher_clients"`
	Async      bool   `json:"async"`
	Window     int    `json:"async_window,omitempty"`
	Batch      int    `json:"batch,omitempty"`
	// Duration and Warmup in seconds.
	Duration float64 `json:"duration_s"`
	Warmup   float64 `json:"warmup_s"`
	Count    int64   `json:"count,omitempty"`
	// e2e only.
	Rate        float64 `json:"target_rate,omitempty"`
	Groups      int     `json:"groups,omitempty"`
	Consumers   int     `json:"consumers_per_group,omitempty"`
	MaxInFlight int     `json:"max_in_flight,omitempty"`
	// The machine of the load generator.
	CPUs        int    `json:"cpus"`
	LoadAverage string `json:"load_average_before"`
	GoVersion   string `json:"go_version"`
}

// PublishResult are the publishers' figures over the measured time.
type PublishResult struct {
	// Messages counts the messages acknowledged in the measured time, Errors the failed ones
	// (whole run).
	Messages int64 `json:"messages"`
	Errors   int64 `json:"errors"`
	// Refused counts the failed messages the broker refused with RATE_LIMITED (topic
	// backpressure: nothing stored, the client's retries ran out); they are among Errors and
	// not expected by any group.
	Refused int64 `json:"refused,omitempty"`
	// FirstError is the first failure, if any.
	FirstError string `json:"first_error,omitempty"`
	// Rate is Messages per second of measured time; MBps the payload bytes (10^6 bytes/s).
	Rate float64 `json:"rate"`
	MBps float64 `json:"mb_per_s"`
	// Latency: synchronous, from each request to its acknowledgement; async, from PublishAsync to
	// the callback; e2e, from the intended send time to the acknowledgement.
	Latency Percentiles `json:"latency"`
	// e2e only: whether the target rate was held, and how late the messages were sent
	// (actual minus intended send time).
	Held      *bool        `json:"held,omitempty"`
	SenderLag *Percentiles `json:"sender_lag,omitempty"`
}

// DeliveryResult are the consumers' figures (e2e).
type DeliveryResult struct {
	// Expected is the number of measured messages acknowledged to the publishers times the
	// groups; Delivered how many of them reached a consumer of each group (first receipt).
	Expected  int64 `json:"expected"`
	Delivered int64 `json:"delivered"`
	// Missing counts, over the groups, the messages of the whole run acknowledged to the
	// publishers that the group had not received when the drain ended. InBacklog are those the
	// broker still held for the group then (its pending and dead-lettered messages: the drain
	// ran out before the group got them); Lost the rest, acknowledged and neither received nor
	// held by the broker: a loss. Both are absent when the broker could not be asked (no admin
	// API, or the request failed). InBacklog may include up to one message per consumer that was being handled.
	Missing   int64  `json:"missing"`
	InBacklog *int64 `json:"in_backlog,omitempty"`
	Lost      *int64 `json:"lost,omitempty"`
	// Unacknowledged counts, over the groups, messages received whose publish failed from the
	// publisher's view (a timeout with the outcome unknown: the broker had stored them).
	Unacknowledged int64 `json:"unacknowledged,omitempty"`
	// DrainSeconds is how long the run waited for the last deliveries after publishing ended;
	// Drained: every group received every acknowledged message.
	DrainSeconds float64 `json:"drain_s"`
	Drained      bool    `json:"drained"`
	// Duplicates are deliveries after the first one of the same message in the same group
	// (redeliveries).
	Duplicates int64 `json:"duplicates"`
	// Rate is Delivered per second of measured time.
	Rate float64 `json:"rate"`
	// Latency is end to end: from the message's intended send time to its receipt by a
	// consumer's handler (no coordinated omission).
	Latency Percentiles `json:"latency"`
	// WorstGroupP99 is the highest p99 of one group.
	WorstGroupP99 float64 `json:"worst_group_p99_ms"`
	// ConsumedWhilePublishing counts the first receipts, all groups together, from the end of
	// the warm-up to the last publish acknowledgement (whichever message they were), the time
	// Publish.Rate is measured over; ConsumedRate is per second of that time and
	// ConsumedRatePerGroup its share per group (compare with Publish.Rate).
	ConsumedWhilePublishing int64   `json:"consumed_while_publishing"`
	ConsumedRate            float64 `json:"consumed_rate"`
	ConsumedRatePerGroup    float64 `json:"consumed_rate_per_group"`
	// BacklogAtWindowStart and BacklogAtPublishEnd are the messages acknowledged to the
	// publishers but not yet received by the slowest group, at the end of the warm-up and at the
	// last publish acknowledgement. KeptUp: the latter is at most one second of publishing at the
	// target rate.
	BacklogAtWindowStart int64 `json:"backlog_at_window_start"`
	BacklogAtPublishEnd  int64 `json:"backlog_at_publish_end"`
	KeptUp               bool  `json:"kept_up"`
}

// Memory is the load generator's own memory, to check that a long run stays bounded.
type Memory struct {
	// MaxRSSBytes is the process's peak resident set (VmHWM; 0 where /proc does not exist).
	MaxRSSBytes int64 `json:"max_rss_bytes"`
	// GoSysBytes is the memory the Go runtime obtained from the system (runtime.MemStats.Sys).
	GoSysBytes uint64 `json:"go_sys_bytes"`
}

// loadGeneratorMemory reads the process's memory figures.
func loadGeneratorMemory() *Memory {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m := &Memory{GoSysBytes: ms.Sys}
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return m
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) == 2 && f[1] == "kB" {
				if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					m.MaxRSSBytes = kb << 10
				}
			}
		}
	}
	return m
}

// Result is the outcome of a run.
type Result struct {
	Mode       string          `json:"mode"`
	Started    time.Time       `json:"started"`
	Conditions Conditions      `json:"conditions"`
	Publish    PublishResult   `json:"publish"`
	Delivery   *DeliveryResult `json:"delivery,omitempty"`
	// PG are the PostgreSQL statistics (Config.PGURL).
	PG *PGResult `json:"postgres,omitempty"`
	// Backpressure is the broker's account of a bounded topic at the end of the run
	// (Config.MaxBacklogMessages).
	Backpressure *Backpressure `json:"backpressure,omitempty"`
	// LoadGenerator is the bench process's own memory after the run.
	LoadGenerator *Memory `json:"load_generator,omitempty"`
}

// conditionsOf describes the run of cfg on topic.
func conditionsOf(cfg Config, topic TopicInfo) Conditions {
	c := Conditions{
		Addr: cfg.Addr, Topic: topic, Semantics: cmp.Or(topic.Semantics, cfg.Semantics), Size: cfg.Size, Publishers: cfg.Publishers, Clients: cfg.Clients,
		Async: cfg.Async, Duration: cfg.Duration.Seconds(), Warmup: cfg.Warmup.Seconds(), Count: cfg.Count,
		CPUs: runtime.NumCPU(), LoadAverage: LoadAverage(), GoVersion: runtime.Version(),
	}
	if cfg.Async {
		c.Window = cfg.Window
	}
	if cfg.Mode == ModePublish && !cfg.Async {
		c.Batch = cfg.Batch
	}
	if cfg.Mode == ModeE2E {
		c.Rate, c.Groups, c.Consumers, c.MaxInFlight = cfg.Rate, cfg.Groups, cfg.Consumers, cfg.MaxInFlight
	}
	return c
}

// LoadAverage returns the 1, 5 and 15 minute load averages of the machine ("" where
// /proc/loadavg does not exist).
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// WriteSummary writes a human summary of r with its conditions.
func (r *Result) WriteSummary(w io.Writer) error {
	c := r.Conditions
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("spool bench %s, %s\n", r.Mode, r.Started.UTC().Format(time.RFC3339))
	topic := c.Topic.Name
	switch {
	case c.Topic.Created:
		topic += fmt.Sprintf(" (%s, %d partition(s), created by the run", c.Topic.Semantics, c.Topic.Partitions)
		if c.Topic.Deleted {
			topic += ", deleted after it)"
		} else {
			topic += ", kept)"
		}
	case c.Topic.Semantics != "":
		topic += " (" + c.Topic.Semantics + ")"
	default:
		topic += " (existing or auto-created)"
	}
	p("  broker      %s, topic %s\n", c.Addr, topic)
	if c.Topic.MessageRetention != "" || c.Topic.MaxRetention != "" {
		p("  retention   message retention %s, max retention %s\n",
			orDefault(c.Topic.MessageRetention), orDefault(c.Topic.MaxRetention))
	}
	pubs := fmt.Sprintf("%d publisher(s) on %d client connection(s), ", c.Publishers, c.Clients)
	if c.Async {
		pubs += fmt.Sprintf("async (window %d per client)", c.Window)
	} else {
		pubs += "synchronous (each waits for its acknowledgement)"
		if c.Batch > 1 {
			pubs += fmt.Sprintf(", %d messages per request", c.Batch)
		}
	}
	p("  publishers  %s\n", pubs)
	if r.Mode == ModeE2E {
		p("  load        open loop at %.0f msg/s, %d-byte messages, %s measured after %s warm-up\n",
			c.Rate, c.Size, secs(c.Duration), secs(c.Warmup))
		if c.Semantics == SemanticsQueue {
			p("  consumers   %d consumer(s) sharing the QUEUE topic's one subscription, one connection each, max in flight %d\n", c.Consumers, c.MaxInFlight)
		} else {
			p("  consumers   %d group(s) x %d consumer(s), one connection each, max in flight %d\n", c.Groups, c.Consumers, c.MaxInFlight)
		}
	} else if c.Count > 0 {
		p("  load        %d messages of %d bytes in all, first %s not measured\n", c.Count, c.Size, secs(c.Warmup))
	} else {
		p("  load        %d-byte messages, %s measured after %s warm-up\n", c.Size, secs(c.Duration), secs(c.Warmup))
	}
	p("  machine     %d CPUs, load average %s before the run, %s\n", c.CPUs, orUnknown(c.LoadAverage), c.GoVersion)
	pr := r.Publish
	p("published    %d messages, %.0f msg/s, %.1f MB/s", pr.Messages, pr.Rate, pr.MBps)
	if pr.Held != nil {
		held := "held"
		if !*pr.Held {
			held = "NOT held"
		}
		p(" (target %.0f msg/s: %s)", c.Rate, held)
	}
	p("; %d errors", pr.Errors)
	if pr.Refused > 0 {
		p(" (%d refused RATE_LIMITED by the broker: not stored, not expected)", pr.Refused)
	}
	p("\n")
	if pr.FirstError != "" {
		p("  first error: %s\n", pr.FirstError)
	}
	what := "request to acknowledgement"
	switch {
	case r.Mode == ModeE2E:
		what = "intended send time to acknowledgement"
	case c.Async:
		what = "PublishAsync to callback"
	}
	p("  publish latency (%s):\n    %s\n", what, pr.Latency)
	if pr.SenderLag != nil {
		p("  sender lag (actual minus intended send time):\n    %s\n", *pr.SenderLag)
	}
	if d := r.Delivery; d != nil {
		p("delivered    %d of %d expected, %.0f deliveries/s; missing %d, duplicates %d\n",
			d.Delivered, d.Expected, d.Rate, d.Missing, d.Duplicates)
		p("  %s\n", d.verdict())
		if d.Unacknowledged > 0 {
			p("  %d received whose publish failed (outcome unknown to the publisher, stored by the broker)\n", d.Unacknowledged)
		}
		p("  end-to-end latency (intended send time to receipt by a consumer; no coordinated omission):\n    %s\n", d.Latency)
		if c.Groups > 1 {
			p("    worst group p99 %s\n", fmtMS(d.WorstGroupP99))
		}
		p("consumed     while publishing (end of warm-up to last publish acknowledgement): %.0f msg/s", d.ConsumedRate)
		if c.Groups > 1 {
			p(" over %d groups, %.0f msg/s per group", c.Groups, d.ConsumedRatePerGroup)
		}
		p(" (published %.0f msg/s)\n", pr.Rate)
		kept := "kept up"
		if !d.KeptUp {
			kept = "did NOT keep up (more than 1 s of publishing behind)"
		}
		p("  backlog (acknowledged, not yet received by the slowest group): %d at the end of the warm-up, %d when publishing ended (%s of publishing): %s\n",
			d.BacklogAtWindowStart, d.BacklogAtPublishEnd, fmtMS(float64(d.BacklogAtPublishEnd)/c.Rate*1000), kept)
	}
	if bp := r.Backpressure; bp != nil {
		p("backpressure max_backlog_messages %d, policy %s: %d publishes throttled, %d refused RATE_LIMITED (retried by the client after retry_after); at the end %s with backlog %d\n",
			bp.MaxBacklogMessages, bp.Policy, bp.Throttled, bp.Rejected, bp.State, bp.BacklogMessages)
	}
	if pg := r.PG; pg != nil {
		pg.writeSummary(p)
	}
	if m := r.LoadGenerator; m != nil {
		p("load generator peak RSS %s (Go runtime: %s from the system)\n", fmtBytes(m.MaxRSSBytes), fmtBytes(int64(m.GoSysBytes)))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeSummary writes the PostgreSQL part of a summary with p.
func (pg *PGResult) writeSummary(p func(format string, args ...any)) {
	p("postgres     schema %s, size sampled every %s\n", pg.Schema, secs(pg.SampleSeconds))
	if pg.Window {
		p("  window     %.1f s, end of warm-up to last publish acknowledgement\n", pg.WindowSeconds)
		p("  WAL        %s written in the window (whole cluster), %.0f bytes per message published (%d); %d records, %d full-page images\n",
			fmtBytes(pg.WALBytes), pg.WALBytesPerMessage, pg.Messages, pg.WALRecords, pg.WALFullPageImages)
	} else {
		p("  window     not measured (see the errors)\n")
	}
	p("  at the end dead tuples %d, live tuples %d, tables %s (before the topic was deleted)\n", pg.DeadTuples, pg.LiveTuples, fmtBytes(pg.TotalBytes))
	if len(pg.Tables) > 0 {
		p("  tables     size, live and dead tuples at the end; inserted .. autovacuums over the window; upd/msg = updated per message published\n")
		p("  %-30s %10s %10s %10s %10s %10s %10s %10s %7s %8s\n", "table", "size", "live", "dead",
			"inserted", "updated", "hot upd", "deleted", "autovac", "upd/msg")
		for _, t := range pg.Tables {
			name := t.Name
			if t.Partitions > 0 || t.DroppedPartitions > 0 {
				name += fmt.Sprintf(" (%d part.", t.Partitions)
				if t.DroppedPartitions > 0 {
					name += fmt.Sprintf(", %d dropped", t.DroppedPartitions)
				}
				name += ")"
			}
			perMsg := "-"
			if pg.Messages > 0 {
				perMsg = fmt.Sprintf("%.2f", float64(t.Updated)/float64(pg.Messages))
			}
			p("  %-30s %10s %10d %10d %10d %10d %10d %10d %7d %8s\n", name, fmtBytes(t.SizeBytes), t.LiveTuples, t.DeadTuples,
				t.Inserted, t.Updated, t.HotUpdated, t.Deleted, t.Autovacuums, perMsg)
		}
	}
	if len(pg.Samples) > 0 {
		p("  series     %9s  %-12s %11s %11s %10s %12s %12s\n", "elapsed", "phase", "total", "messages", "partitions", "dead tuples", "WAL")
		for _, s := range pg.Samples {
			p("             %7.1f s  %-12s %11s %11s %10d %12d %12s", s.Elapsed, s.Phase, fmtBytes(s.TotalBytes),
				fmtBytes(s.MessagesBytes), s.Partitions, s.DeadTuples, fmtBytes(s.WALBytes))
			if s.Error != "" {
				p("  (incomplete: %s)", s.Error)
			}
			p("\n")
		}
	}
	if pg.ErrorCount > 0 {
		p("  %d error(s) reading statistics; first: %s\n", pg.ErrorCount, pg.Errors[0])
	}
}

// fmtBytes formats a byte count in binary units.
func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/unit, 0
	for ; (v >= unit || v <= -unit) && i < 4; i++ {
		v /= unit
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTP"[i])
}

func orDefault(s string) string {
	if s == "" {
		return "default"
	}
	return s
}

func secs(s float64) string { return (time.Duration(s * float64(time.Second))).String() }

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// verdict says whether every acknowledged message arrived, and if not, whether the missing ones
// were lost or the drain ended before the groups got them.
func (d *DeliveryResult) verdict() string {
	waited := fmt.Sprintf("after waiting %s for the last deliveries", time.Duration(d.DrainSeconds*float64(time.Second)).Round(time.Millisecond))
	switch {
	case d.Missing == 0:
		return "every acknowledged message reached every group " + waited
	case d.Lost == nil:
		return fmt.Sprintf("%d acknowledged messages not received %s; lost or still in the backlog: not told apart (no admin API, or reading the groups' backlogs failed)", d.Missing, waited)
	case *d.Lost > 0:
		return fmt.Sprintf("LOST %d acknowledged messages: neither received nor held by the broker %s (%d more still in the backlog)", *d.Lost, waited, *d.InBacklog)
	}
	return fmt.Sprintf("NOT DRAINED: %d acknowledged messages still in the groups' backlog at the broker %s, none lost; raise --drain to see them arrive", *d.InBacklog, waited)
}
