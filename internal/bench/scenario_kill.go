package bench

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolmq/spool/client"
	"github.com/spoolmq/spool/internal/storage"
)

// Kill-and-resurrect (seed 000, "Kill-and-resurrect chaos test"), scaled: three groups (email,
// analytics, inventory) on one PUB_SUB topic at Rate msg/s; inventory's only consumer runs in a
// child process, SIGKILLed after Live. The group must become DEAD within its heartbeat timeout
// plus the broker's detection interval, email and analytics must never stall, the topic's storage
// must not grow while inventory is DEAD (DEAD does not hold retention), and when a consumer of
// inventory comes back (after DeadFor) the group is ACTIVE again and what it gets of the messages
// published before it came back (the backfill) stays within BackfillBound.

// Defaults of KillConfig.
const (
	DefaultKillRate             = 1000
	DefaultKillHeartbeatTimeout = 10 * time.Second
	DefaultKillLive             = 2 * time.Minute
	DefaultKillDeadFor          = 2 * time.Minute
	DefaultKillAfter            = time.Minute
	DefaultKillRetention        = 30 * time.Second
	DefaultKillBackfillBound    = 100_000
	DefaultKillStall            = 2 * time.Second
	DefaultKillSample           = 500 * time.Millisecond
	// maxStorageGrowth is the seed's bound on the growth of storage while a group is DEAD.
	maxStorageGrowth = 0.10
	// maxBackfillTime is the seed's bound on the time the backfill takes.
	maxBackfillTime = 5 * time.Minute
	// maxKillSamples bounds the storage series (its memory).
	maxKillSamples = 100_000
	// childReadyTimeout bounds the wait for the child consumer to subscribe.
	childReadyTimeout = 30 * time.Second
)

// The groups of the scenario; killGroup is the one whose consumer is killed.
var killGroups = []string{"email", "analytics", "inventory"}

const killGroup = "inventory"

// KillConfig configures kill-and-resurrect. Zero fields take the defaults above.
type KillConfig struct {
	Addr, Admin string
	TLS         *tls.Config
	Token       string
	Logger      *slog.Logger
	// Rate is the publish rate (msg/s) of the one topic; Size the payload size.
	Rate float64
	Size int
	// HeartbeatTimeout is the groups' heartbeat timeout (spool group create --heartbeat-timeout).
	HeartbeatTimeout time.Duration
	// Live is the time before the kill, DeadFor the time inventory stays down after its DEAD
	// bound (timeout plus detection interval) passed, After the time after it comes back.
	Live, DeadFor, After time.Duration
	// MessageRetention and MaxRetention of the topic (MaxRetention 0: the broker's default).
	MessageRetention, MaxRetention time.Duration
	// BackfillBound is the seed's bound on what the resurrected group gets of the messages
	// published before it came back (100,000).
	BackfillBound int64
	// Stall is the longest end-to-end latency email and analytics may see ("never blocked").
	Stall time.Duration
	// Sample is the interval of the storage and state series.
	Sample time.Duration
	// Drain bounds the wait for the last deliveries after the schedule.
	Drain time.Duration
	// Child is the command line of the consumer child process; "--topic T --group G" are
	// appended. spool runs itself as "spool bench scenario kill-child --addr ...".
	Child []string
}

func (c KillConfig) withDefaults() KillConfig {
	c.Addr = cmp.Or(c.Addr, DefaultAddr)
	c.Admin = cmp.Or(c.Admin, DefaultAdmin)
	c.Rate = cmp.Or(c.Rate, DefaultKillRate)
	c.Size = cmp.Or(c.Size, DefaultSize)
	c.HeartbeatTimeout = cmp.Or(c.HeartbeatTimeout, DefaultKillHeartbeatTimeout)
	c.Live = cmp.Or(c.Live, DefaultKillLive)
	c.DeadFor = cmp.Or(c.DeadFor, DefaultKillDeadFor)
	c.After = cmp.Or(c.After, DefaultKillAfter)
	c.MessageRetention = cmp.Or(c.MessageRetention, DefaultKillRetention)
	c.BackfillBound = cmp.Or(c.BackfillBound, DefaultKillBackfillBound)
	c.Stall = cmp.Or(c.Stall, DefaultKillStall)
	c.Sample = cmp.Or(c.Sample, DefaultKillSample)
	c.Drain = cmp.Or(c.Drain, DefaultDrain)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func (c KillConfig) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("bench: %w: %s", storage.ErrInvalidArgument, fmt.Sprintf(format, args...))
	}
	total := (c.Live + c.HeartbeatTimeout + c.DeadFor + c.After).Seconds() * c.Rate
	switch {
	case c.Rate <= 0 || c.Rate > 1_000_000:
		return bad("rate must be above 0 and at most 1000000, got %v", c.Rate)
	case c.Size < StampSize || c.Size > storage.MaxMessageBytesLimit:
		return bad("size must be between %d and %d, got %d", StampSize, storage.MaxMessageBytesLimit, c.Size)
	case c.HeartbeatTimeout < time.Second:
		return bad("heartbeat timeout must be at least 1s, got %s", c.HeartbeatTimeout)
	case c.Live <= 0 || c.DeadFor <= 0 || c.After <= 0:
		return bad("live, dead-for and after must be above 0")
	case c.MessageRetention < 0 || c.MaxRetention < 0 || c.BackfillBound < 0 || c.Stall < 0 || c.Drain < 0:
		return bad("durations and bounds must not be negative")
	case c.Sample < 10*time.Millisecond:
		return bad("sample interval must be at least 10ms, got %s", c.Sample)
	case (c.Live+c.HeartbeatTimeout+c.DeadFor+c.After)/c.Sample > maxKillSamples:
		return bad("a sample every %s makes more than %d samples: lengthen --sample", c.Sample, maxKillSamples)
	case (total/8+8)*float64(len(killGroups)) > MaxSeenBytes:
		return bad("%.0f messages need more than %d MiB of bookkeeping: shorten the run or lower the rate", total, MaxSeenBytes>>20)
	case len(c.Child) == 0:
		return bad("no command line for the consumer child")
	}
	return nil
}

// KillSample is one point of the series: the topic's storage and inventory's state.
type KillSample struct {
	Elapsed  float64 `json:"elapsed_s"` // since the first message's intended time
	Phase    string  `json:"phase"`     // live, killed, dead, resurrected
	State    string  `json:"state"`     // inventory's state ("" if unread)
	Messages int64   `json:"messages"`
	Bytes    int64   `json:"bytes"`
	Error    string  `json:"error,omitempty"`
}

// KillGroupResult is a live group's deliveries over the whole run.
type KillGroupResult struct {
	Group     string      `json:"group"`
	Delivered int64       `json:"delivered"`
	Missing   int64       `json:"missing"`
	Latency   Percentiles `json:"latency"`
}

// KillResult is the outcome of kill-and-resurrect.
type KillResult struct {
	Topic            string  `json:"topic"`
	Rate             float64 `json:"rate"`
	HeartbeatTimeout string  `json:"heartbeat_timeout"`
	// DetectionInterval is the broker's lifecycle interval for this timeout: its
	// broker.lifecycle_interval, at most a fifth of the timeout, at least 1 s.
	DetectionInterval string `json:"detection_interval"`
	MessageRetention  string `json:"message_retention"`
	Published         int64  `json:"published"`
	PublishErrors     int64  `json:"publish_errors"`
	// KilledAt, DeadAt, ResurrectedAt are seconds since the first message ("DeadAt" 0: never
	// seen DEAD); DeadAfter is DeadAt - KilledAt, DeadBound the seed's bound (timeout plus one
	// detection interval).
	KilledAt      float64 `json:"killed_at_s"`
	DeadAt        float64 `json:"dead_at_s"`
	DeadAfter     float64 `json:"dead_after_s"`
	DeadBound     float64 `json:"dead_bound_s"`
	ResurrectedAt float64 `json:"resurrected_at_s"`
	// StateAfterResurrection is inventory's state at the end of the run.
	StateAfterResurrection string            `json:"state_after_resurrection"`
	Groups                 []KillGroupResult `json:"live_groups"`
	// Storage: the largest size sampled before the kill and while DEAD; RetentionBeforeKill
	// says retention removed messages before the kill (a steady baseline).
	MaxBytesLive        int64   `json:"max_bytes_live"`
	MaxBytesDead        int64   `json:"max_bytes_dead"`
	MaxMessagesLive     int64   `json:"max_messages_live"`
	MaxMessagesDead     int64   `json:"max_messages_dead"`
	StorageGrowth       float64 `json:"storage_growth"`
	RetentionBeforeKill bool    `json:"retention_before_kill"`
	// The resurrected group: Backfilled counts the messages published before it came back that
	// it received afterwards (the backfill), of which PublishedWhileDown were published between
	// the kill and the resurrection; LostWhileDown were published then and never received
	// (removed by retention while it was DEAD). New counts the messages published after it came
	// back that it received; BackfillSeconds is the time from its return to its last backfilled
	// message.
	// BackfillTotal and BackfillSkipped are the broker's backfill range of the resurrection (the
	// group's backfill object): the messages it was to get, and those it gave up for the bound.
	BackfillBound      int64        `json:"backfill_bound"`
	BackfillTotal      int64        `json:"backfill_total"`
	BackfillSkipped    int64        `json:"backfill_skipped"`
	Backfilled         int64        `json:"backfilled"`
	PublishedWhileDown int64        `json:"published_while_down"`
	ReceivedWhileDown  int64        `json:"received_while_down"`
	LostWhileDown      int64        `json:"lost_while_down"`
	New                int64        `json:"new"`
	NewExpected        int64        `json:"new_expected"`
	BackfillSeconds    float64      `json:"backfill_s"`
	NewLatency         Percentiles  `json:"new_latency"`
	Samples            []KillSample `json:"samples"`
	Verdicts           []Verdict    `json:"verdicts"`
	Outcome            string       `json:"outcome"`
}

// resurrectRecorder records the resurrected group's receipts: before (intended before its
// return) and after. Safe for concurrent use.
type resurrectRecorder struct {
	run                  uint64
	total                int64
	killOff, resurrectAt int64 // offsets from the run's time origin

	mu         sync.Mutex
	seen       []uint64
	backfilled int64
	whileDown  int64
	newMsgs    int64
	lastBackAt int64
	lat        *Histogram
}

func (r *resurrectRecorder) observe(payload []byte, now int64) {
	st, err := ReadStamp(payload)
	if err != nil || st.Run != r.run || st.Seq >= uint64(r.total) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	w, bit := st.Seq/64, uint64(1)<<(st.Seq%64)
	if r.seen[w]&bit != 0 {
		return
	}
	r.seen[w] |= bit
	if st.Intended < r.resurrectAt {
		r.backfilled++
		if st.Intended >= r.killOff {
			r.whileDown++
		}
		r.lastBackAt = max(r.lastBackAt, now)
		return
	}
	r.newMsgs++
	r.lat.Record(now - st.Intended)
}

// RunKill runs kill-and-resurrect.
func RunKill(ctx context.Context, cfg KillConfig) (*KillResult, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &runner{cfg: Config{Addr: cfg.Addr, Admin: cfg.Admin, TLS: cfg.TLS, Token: cfg.Token, Logger: cfg.Logger,
		Semantics: SemanticsPubSub}, runID: newRunID()}
	r.adm = newAdmin(cfg.Admin, cfg.TLS, cfg.Token)
	defer r.cleanup()
	topic := scenarioTopic(ScenarioKill, "orders", r.runID)
	if _, err := r.adm.createTopic(ctx, topic, topicSpec{semantics: SemanticsPubSub, partitions: 1,
		messageRetention: cfg.MessageRetention, maxRetention: cfg.MaxRetention}); err != nil {
		return nil, err
	}
	r.topic = TopicInfo{Name: topic, Semantics: SemanticsPubSub, Created: true}
	res := &KillResult{Topic: topic, Rate: cfg.Rate, HeartbeatTimeout: cfg.HeartbeatTimeout.String(),
		MessageRetention: cfg.MessageRetention.String(), BackfillBound: cfg.BackfillBound}

	// The broker's detection interval for this timeout.
	jobs, err := r.adm.cleanupJobs(ctx)
	if err != nil {
		return nil, err
	}
	lj, ok := jobs["subscription_lifecycle"]
	if !ok {
		return nil, errors.New("bench: the broker runs no subscription lifecycle job (broker.lifecycle_interval disabled): DEAD is never detected")
	}
	cfgInterval, err := time.ParseDuration(lj.Interval)
	if err != nil {
		return nil, fmt.Errorf("bench: lifecycle interval %q: %w", lj.Interval, err)
	}
	detect := max(min(cfgInterval, cfg.HeartbeatTimeout/5), time.Second)
	res.DetectionInterval = detect.String()
	deadBound := cfg.HeartbeatTimeout + detect
	res.DeadBound = deadBound.Seconds()

	for _, g := range killGroups {
		if err := r.adm.createGroup(ctx, topic, g, groupSpec{heartbeatTimeout: cfg.HeartbeatTimeout, maxBackfill: cfg.BackfillBound}); err != nil {
			return nil, err
		}
	}
	// The lifecycle job picks its next wait after each run from the groups it sees: wait for one
	// run after the groups exist, so that the detection interval above applies.
	if err := waitLifecycleRun(ctx, r.adm, lj.Runs, cfgInterval+childReadyTimeout); err != nil {
		return nil, err
	}

	// Inventory's consumer: a child process, killed later.
	child, err := startKillChild(cfg.Child, topic, killGroup)
	if err != nil {
		return nil, err
	}
	defer child.stop()

	// The timeline, offsets from base.
	base := time.Now()
	start := time.Since(base) + startDelay
	killOff := start + cfg.Live
	resurrectOff := killOff + deadBound + cfg.DeadFor
	endOff := resurrectOff + cfg.After
	total := int64(math.Round((endOff - start).Seconds() * cfg.Rate))
	at := func(off time.Duration) float64 { return (off - start).Seconds() }
	res.KilledAt, res.ResurrectedAt = at(killOff), at(resurrectOff)

	live := make([]*groupRecorder, 2)
	for i, g := range killGroups[:2] {
		live[i] = newGroupRecorder(g, r.runID, base, 0, total)
		if err := r.consume(ctx, topic, g, live[i].observe, base); err != nil {
			return nil, err
		}
	}
	inv := &resurrectRecorder{run: r.runID, total: total, killOff: int64(killOff),
		resurrectAt: int64(resurrectOff), seen: make([]uint64, (total+63)/64), lat: NewHistogram()}

	pubs, err := r.dial(ctx, "scenario-publisher", client.MaxAsyncInFlight(client.DefaultMaxAsyncInFlight))
	if err != nil {
		return nil, err
	}
	var (
		acked atomic.Int64
		errs  errorLog
		wg    sync.WaitGroup
	)
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	sched := Schedule{Start: base.Add(start), Rate: cfg.Rate, Count: total}
	var pubErr error
	wg.Go(func() {
		_, pubErr = sched.Run(runCtx, SystemClock{}, func(i int64, intended time.Time) error {
			payload := make([]byte, cfg.Size)
			Stamp{Run: r.runID, Seq: uint64(i), Intended: int64(intended.Sub(base))}.Put(payload)
			pubs.PublishAsync(topic, client.Message{Payload: payload}, func(_ client.Position, err error) {
				if err != nil {
					errs.add(err)
					return
				}
				acked.Add(1)
			})
			return nil
		})
	})

	// The sampler: storage and inventory's state every Sample.
	var (
		smu     sync.Mutex
		deadOff time.Duration
	)
	phaseOf := func(off time.Duration) string {
		switch {
		case off < killOff:
			return "live"
		case off >= resurrectOff:
			return "resurrected"
		case deadOff > 0:
			return "dead"
		}
		return "killed"
	}
	sampleDone := make(chan struct{})
	go func() {
		defer close(sampleDone)
		t := time.NewTicker(cfg.Sample)
		defer t.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
			}
			off := time.Since(base)
			s := KillSample{Elapsed: at(off)}
			var serr []string
			st, err := r.adm.groupState(runCtx, topic, killGroup)
			if err != nil {
				serr = append(serr, err.Error())
			}
			s.State = st
			s.Messages, s.Bytes, err = r.adm.topicStored(runCtx, topic)
			if err != nil {
				serr = append(serr, err.Error())
			}
			s.Error = strings.Join(serr, "; ")
			smu.Lock()
			if st == string(storage.Dead) && deadOff == 0 && off >= killOff {
				deadOff = off
			}
			s.Phase = phaseOf(off)
			res.Samples = append(res.Samples, s)
			smu.Unlock()
		}
	}()

	// The kill.
	removedAtStart := jobs["retention"].Removed
	if err := sleepCtx(ctx, time.Until(base.Add(killOff))); err != nil {
		return nil, err
	}
	if j, err := r.adm.cleanupJobs(ctx); err == nil {
		res.RetentionBeforeKill = j["retention"].Removed > removedAtStart
	}
	if err := child.kill(); err != nil {
		return nil, err
	}

	// The resurrection: a consumer of inventory comes back (in this process).
	if err := sleepCtx(ctx, time.Until(base.Add(resurrectOff))); err != nil {
		return nil, err
	}
	if err := r.consume(ctx, topic, killGroup, inv.observe, base); err != nil {
		return nil, err
	}

	wg.Wait()
	if pubErr != nil {
		return nil, pubErr
	}
	flushCtx, cancelFlush := context.WithTimeout(ctx, cfg.Drain)
	defer cancelFlush()
	if err := pubs.Flush(flushCtx); err != nil {
		return nil, fmt.Errorf("bench: waiting for the last acknowledgements: %w", err)
	}
	// Drain: the live groups get every acknowledged message, inventory every new one.
	newExpected := total - int64(math.Ceil((resurrectOff-start).Seconds()*cfg.Rate))
	deadline := time.Now().Add(cfg.Drain)
	for time.Now().Before(deadline) {
		inv.mu.Lock()
		n := inv.newMsgs
		inv.mu.Unlock()
		if live[0].count() >= acked.Load() && live[1].count() >= acked.Load() && n >= newExpected {
			break
		}
		if err := sleepCtx(ctx, drainPoll); err != nil {
			return nil, err
		}
	}
	stopRun()
	<-sampleDone
	if st, err := r.adm.groupState(ctx, topic, killGroup); err == nil {
		res.StateAfterResurrection = st
	}
	if bf, err := r.adm.groupBackfill(ctx, topic, killGroup); err == nil {
		res.BackfillTotal, res.BackfillSkipped = bf.Total, bf.Skipped
	}

	res.Published = acked.Load()
	res.PublishErrors, _ = errs.get()
	for i, g := range live {
		g.mu.Lock()
		res.Groups = append(res.Groups, KillGroupResult{Group: killGroups[i], Delivered: g.received,
			Missing: max(res.Published-g.received, 0), Latency: percentilesOf(g.lat)})
		g.mu.Unlock()
	}
	if deadOff > 0 {
		res.DeadAt, res.DeadAfter = at(deadOff), (deadOff - killOff).Seconds()
	}
	for _, s := range res.Samples {
		switch s.Phase {
		case "live":
			res.MaxBytesLive, res.MaxMessagesLive = max(res.MaxBytesLive, s.Bytes), max(res.MaxMessagesLive, s.Messages)
		case "dead":
			res.MaxBytesDead, res.MaxMessagesDead = max(res.MaxBytesDead, s.Bytes), max(res.MaxMessagesDead, s.Messages)
		}
	}
	if res.MaxBytesLive > 0 {
		res.StorageGrowth = float64(res.MaxBytesDead)/float64(res.MaxBytesLive) - 1
	}
	inv.mu.Lock()
	res.Backfilled, res.ReceivedWhileDown, res.New = inv.backfilled, inv.whileDown, inv.newMsgs
	if inv.lastBackAt > 0 {
		res.BackfillSeconds = time.Duration(inv.lastBackAt - int64(resurrectOff)).Seconds()
	}
	res.NewLatency = percentilesOf(inv.lat)
	inv.mu.Unlock()
	res.NewExpected = newExpected
	res.PublishedWhileDown = int64(math.Ceil((resurrectOff-start).Seconds()*cfg.Rate)) - int64(math.Ceil((killOff-start).Seconds()*cfg.Rate))
	res.LostWhileDown = max(res.PublishedWhileDown-res.ReceivedWhileDown, 0)
	res.Verdicts = killVerdicts(res, cfg)
	res.Outcome = overall(res.Verdicts)
	if err := r.cleanup(); err != nil {
		return nil, err
	}
	return res, nil
}

// killVerdicts judges a kill-and-resurrect run against seed 000's criteria.
func killVerdicts(res *KillResult, cfg KillConfig) []Verdict {
	var vs []Verdict
	// DEAD within the timeout plus the detection interval of the kill (sampled every Sample).
	slack := cfg.Sample.Seconds()
	if res.DeadAt == 0 {
		vs = append(vs, verdict("inventory DEAD", fmt.Sprintf("<= %.1f s after the kill", res.DeadBound), false,
			"never seen DEAD before the resurrection (%.1f s after the kill)", res.ResurrectedAt-res.KilledAt))
	} else {
		vs = append(vs, verdict("inventory DEAD", fmt.Sprintf("<= %.1f s after the kill", res.DeadBound),
			res.DeadAfter <= res.DeadBound+slack, "%.1f s after the kill (sampled every %s)", res.DeadAfter, cfg.Sample))
	}
	// The live groups never stall and miss nothing.
	for _, g := range res.Groups {
		vs = append(vs, verdict(g.Group+" never blocked", fmt.Sprintf("max latency <= %s, nothing missing", cfg.Stall),
			g.Missing == 0 && g.Latency.Max <= float64(cfg.Stall.Milliseconds()),
			"p99 %s, max %s, %d missing", fmtMS(g.Latency.P99), fmtMS(g.Latency.Max), g.Missing))
	}
	// Storage while DEAD.
	v := verdict("storage while DEAD", "grows < 10% over the live phase's largest size",
		res.MaxBytesLive > 0 && res.StorageGrowth < maxStorageGrowth, "%s live, %s dead (%+.1f%%); %d -> %d messages",
		fmtBytes(res.MaxBytesLive), fmtBytes(res.MaxBytesDead), 100*res.StorageGrowth, res.MaxMessagesLive, res.MaxMessagesDead)
	if !res.RetentionBeforeKill {
		v.Outcome = Inconclusive
		v.Note = "retention removed nothing before the kill: the live phase never reached a steady size (lengthen --live past message retention plus broker.retention_interval and a segment's fill time)"
	}
	if cfg.DeadFor <= cfg.MessageRetention {
		v.Outcome = Inconclusive
		v.Note = "--dead-for is not longer than --message-retention: storage would not grow even if DEAD held retention"
	}
	if res.MaxBytesDead == 0 {
		v.Outcome = Inconclusive
		v.Note = "no sample while DEAD"
	}
	vs = append(vs, v)
	// Resurrection and backfill.
	vs = append(vs, verdict("inventory resurrected", "ACTIVE, receives new messages",
		res.StateAfterResurrection == string(storage.Active) && res.New >= res.NewExpected,
		"%s, %d of %d new messages", res.StateAfterResurrection, res.New, res.NewExpected))
	bf := verdict("backfill bounded", fmt.Sprintf("<= %d messages", cfg.BackfillBound),
		res.Backfilled <= cfg.BackfillBound && res.BackfillTotal <= cfg.BackfillBound,
		"%d messages published before the return received after it (%d of the %d published while down; %d lost); the broker's range %d, %d given up for the bound",
		res.Backfilled, res.ReceivedWhileDown, res.PublishedWhileDown, res.LostWhileDown, res.BackfillTotal, res.BackfillSkipped)
	vs = append(vs, bf)
	vs = append(vs, verdict("backfill time", "<= 5m", res.BackfillSeconds <= maxBackfillTime.Seconds(),
		"%.1f s from the return to the last backfilled message", res.BackfillSeconds))
	return vs
}

// WriteSummary prints the run's figures and verdicts.
func (res *KillResult) WriteSummary(w io.Writer) error {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("scenario kill-resurrect on %s: %.0f msg/s, groups %s; heartbeat timeout %s, detection interval %s, message retention %s\n",
		res.Topic, res.Rate, strings.Join(killGroups, ", "), res.HeartbeatTimeout, res.DetectionInterval, res.MessageRetention)
	p("published %d (%d errors); killed %s's consumer at %.1f s, DEAD at %.1f s, consumer back at %.1f s; state at the end %s\n",
		res.Published, res.PublishErrors, killGroup, res.KilledAt, res.DeadAt, res.ResurrectedAt, res.StateAfterResurrection)
	for _, g := range res.Groups {
		p("  %-10s delivered %d, missing %d, latency %s\n", g.Group, g.Delivered, g.Missing, g.Latency)
	}
	p("  %-10s backfilled %d (bound %d; range %d, %d given up), new %d of %d, backfill %.1f s, new latency %s\n", killGroup,
		res.Backfilled, res.BackfillBound, res.BackfillTotal, res.BackfillSkipped, res.New, res.NewExpected, res.BackfillSeconds, res.NewLatency)
	p("storage (topic stats; elapsed s, phase, inventory state, messages, bytes):\n")
	step := max(len(res.Samples)/40, 1)
	for i, s := range res.Samples {
		if i%step != 0 && i != len(res.Samples)-1 {
			continue
		}
		p("  %7.1f  %-11s %-9s %10d %12d %s\n", s.Elapsed, s.Phase, s.State, s.Messages, s.Bytes, s.Error)
	}
	_, err := io.WriteString(w, b.String())
	writeVerdicts(w, ScenarioKill, res.Verdicts)
	return err
}

// consume subscribes one consumer of group with a handler that records and acknowledges.
func (r *runner) consume(ctx context.Context, topic, group string, observe func([]byte, int64), base time.Time) error {
	c, err := r.dial(ctx, "scenario-"+group)
	if err != nil {
		return err
	}
	_, err = c.Subscribe(ctx, client.SubscribeParams{Topic: topic, Group: group, MaxInFlight: DefaultMaxInFlight},
		func(_ context.Context, d *client.Delivery) error {
			observe(d.Payload, int64(time.Since(base)))
			return nil
		}, client.Concurrency(1))
	if err != nil {
		return fmt.Errorf("bench: subscribe %s on %s: %w", group, topic, err)
	}
	return nil
}

// waitLifecycleRun waits until the lifecycle job has run more than runs times.
func waitLifecycleRun(ctx context.Context, a *adminAPI, runs int64, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		jobs, err := a.cleanupJobs(ctx)
		if err != nil {
			return err
		}
		if jobs["subscription_lifecycle"].Runs > runs {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: the subscription lifecycle job did not run within %s", limit)
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// killChild is the consumer child process.
type killChild struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	killed bool
}

// startKillChild starts the child and waits until it says it subscribed.
func startKillChild(argv []string, topic, group string) (*killChild, error) {
	args := append(append([]string(nil), argv[1:]...), "--topic", topic, "--group", group)
	cmd := exec.Command(argv[0], args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start the consumer child: %w", err)
	}
	c := &killChild{cmd: cmd, stdin: stdin}
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() && sc.Text() == childReady {
			ready <- nil
		} else {
			ready <- fmt.Errorf("bench: the consumer child did not subscribe (%q, %v)", sc.Text(), sc.Err())
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case err = <-ready:
	case <-time.After(childReadyTimeout):
		err = fmt.Errorf("bench: the consumer child did not subscribe within %s", childReadyTimeout)
	}
	if err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

// kill SIGKILLs the child and reaps it.
func (c *killChild) kill() error {
	if err := c.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("bench: kill the consumer child: %w", err)
	}
	c.killed = true
	_ = c.cmd.Wait()
	return nil
}

// stop ends a child that was not killed (it exits when its stdin closes).
func (c *killChild) stop() {
	if c.killed {
		return
	}
	c.killed = true
	_ = c.stdin.Close()
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(closeTimeout):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// childReady is the line the child prints once subscribed.
const childReady = "subscribed"

// KillChildConfig is the consumer child of kill-and-resurrect.
type KillChildConfig struct {
	Addr         string
	TLS          *tls.Config
	Token        string
	Topic, Group string
}

// RunKillChild is the consumer child: it subscribes one consumer of Group that acknowledges every
// message, prints childReady, and runs until stdin ends (its parent closed it, or died) or it is
// killed.
func RunKillChild(ctx context.Context, cfg KillChildConfig, stdin io.Reader, stdout io.Writer) error {
	r := &runner{cfg: Config{Addr: cfg.Addr, TLS: cfg.TLS, Token: cfg.Token, Logger: slog.New(slog.DiscardHandler)}}
	defer r.cleanup()
	if err := r.consume(ctx, cfg.Topic, cfg.Group, func([]byte, int64) {}, time.Now()); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(stdout, childReady); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, stdin)
	return r.cleanup()
}
