package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolmq/spool/client"
	"github.com/spoolmq/spool/protocol"
)

// startDelay is the time between the end of the setup (every consumer subscribed, every client
// connected) and the first message's intended send time.
const startDelay = 100 * time.Millisecond

// drainPoll is how often the end of the drain is checked.
const drainPoll = 5 * time.Millisecond

// keptUpBacklog is the largest backlog, in time of publishing at the target rate, that the slowest
// group may have when publishing ends for the consumers to have kept up.
const keptUpBacklog = time.Second

// groupRecorder records the deliveries of one consumer group: the first receipt of each message
// of the run (its latency if measured), and duplicates. Its memory is fixed when it is made: one
// bit per message of the schedule (Config.Validate bounds it, MaxSeenBytes) and one Histogram;
// nothing grows per message received. Safe for concurrent use.
type groupRecorder struct {
	name     string // the group's name at the broker ("" for a QUEUE topic's subscription)
	run      uint64
	base     time.Time // the run's time origin: stamps count nanoseconds from it
	measured int64     // stamps at or after this offset are measured (the warm-up ends)
	total    int64     // messages in the schedule

	mu         sync.Mutex
	seen       []uint64 // bitmap of the sequence numbers received
	received   int64    // distinct messages of the run received
	inWindow   int64    // distinct measured messages received
	duplicates int64
	foreign    int64 // messages of other runs, or without a stamp
	lastAt     int64 // offset of the last receipt of a measured message
	lat        *Histogram
}

func newGroupRecorder(name string, run uint64, base time.Time, measured, total int64) *groupRecorder {
	return &groupRecorder{name: name, run: run, base: base, measured: measured, total: total,
		seen: make([]uint64, (total+63)/64), lat: NewHistogram()}
}

// observe records the receipt of payload at offset now (nanoseconds since base).
func (g *groupRecorder) observe(payload []byte, now int64) {
	st, err := ReadStamp(payload)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil || st.Run != g.run || st.Seq >= uint64(g.total) {
		g.foreign++
		return
	}
	w, bit := st.Seq/64, uint64(1)<<(st.Seq%64)
	if g.seen[w]&bit != 0 {
		g.duplicates++
		return
	}
	g.seen[w] |= bit
	g.received++
	if st.Intended >= g.measured {
		g.inWindow++
		g.lat.Record(now - st.Intended)
		g.lastAt = max(g.lastAt, now)
	}
}

func (g *groupRecorder) count() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.received
}

// compare counts the messages of acked (a bitmap of sequence numbers, as seen) that g has not
// received, and those g received that are not in acked.
func (g *groupRecorder) compare(acked []atomic.Uint64) (notReceived, unacked int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, seen := range g.seen {
		a := acked[i].Load()
		notReceived += int64(bits.OnesCount64(a &^ seen))
		unacked += int64(bits.OnesCount64(seen &^ a))
	}
	return notReceived, unacked
}

// drain waits until every group received every acknowledged message (acked counts them, ackedBits
// names them) and reports whether they did. It waits as long as deliveries go on: it gives up
// after idle without a new receipt, or after MaxDrainFactor times idle in all.
func drain(ctx context.Context, groups []*groupRecorder, acked *atomic.Int64, ackedBits []atomic.Uint64, idle time.Duration) (bool, error) {
	now := time.Now()
	deadline, hardEnd := now.Add(idle), now.Add(MaxDrainFactor*idle)
	last := int64(-1)
	for {
		var got int64
		complete := true
		for _, g := range groups {
			n := g.count()
			got += n
			complete = complete && n >= acked.Load()
		}
		if complete {
			// The counts agree; message by message, a group may have received a message whose
			// publish failed (outcome unknown) instead of an acknowledged one.
			complete = true
			for _, g := range groups {
				if n, _ := g.compare(ackedBits); n > 0 {
					complete = false
				}
			}
			if complete {
				return true, nil
			}
		}
		now := time.Now()
		if got != last {
			last, deadline = got, now.Add(idle)
		}
		if now.After(deadline) || now.After(hardEnd) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(drainPoll):
		}
	}
}

// runE2E is e2e mode: Groups x Consumers consumers subscribe (one client each), then Publishers
// open-loop schedules publish Rate messages per second in all for Warmup + Duration, each
// message stamped with its intended send time; consumers measure the latency from that time.
// After the schedule the run waits for every acknowledged message to reach every group (see
// drain), then tells the messages still missing apart: still held by the broker for the group
// (the wait ran out) or lost.
func (r *runner) runE2E(ctx context.Context, res *Result) error {
	cfg := r.cfg
	total := int64(math.Round((cfg.Warmup + cfg.Duration).Seconds() * cfg.Rate))
	warmupMsgs := int64(math.Round(cfg.Warmup.Seconds() * cfg.Rate))
	if total-warmupMsgs < 1 {
		return fmt.Errorf("bench: %s at %v msg/s measures no message", cfg.Duration, cfg.Rate)
	}

	// The time origin: stamps are monotonic offsets from base, immune to wall-clock steps.
	base := time.Now()
	groups := make([]*groupRecorder, cfg.Groups)
	for g := range groups {
		groups[g] = newGroupRecorder(r.groupName(g), r.runID, base, 0, total)
	}

	// Consumers first, so that every group exists before the first message.
	var subsWG sync.WaitGroup
	subErrs := make([]error, cfg.Groups*cfg.Consumers)
	for g := range cfg.Groups {
		for k := range cfg.Consumers {
			subsWG.Go(func() {
				subErrs[g*cfg.Consumers+k] = r.subscribe(ctx, g, k, groups[g], base)
			})
		}
	}
	subsWG.Wait()
	for _, err := range subErrs {
		if err != nil {
			return err
		}
	}
	clients, err := r.dialPublishers(ctx)
	if err != nil {
		return err
	}

	// The global schedule: message k is due at start + k/Rate. Publisher p sends k = p, p+P, ...
	start := time.Since(base) + startDelay
	startAt := base.Add(start)
	measuredFrom := int64(start) + int64(float64(warmupMsgs)*float64(time.Second)/cfg.Rate)
	for _, g := range groups {
		g.measured = measuredFrom
	}
	measureStart := base.Add(time.Duration(measuredFrom))
	r.windowStart(measureStart)
	P := int64(cfg.Publishers)
	var (
		acked     atomic.Int64 // messages acknowledged (whole run)
		ackedBits = make([]atomic.Uint64, (total+63)/64)
		refused   atomic.Int64 // messages refused RATE_LIMITED (backpressure)
		ackedMeas atomic.Int64 // measured messages acknowledged
		errs      errorLog
		pubLat    = newLockedHistogram()
		lags      = make([]RunStats, P)
		runErrs   = make([]error, P)
		wg        sync.WaitGroup
	)
	for p := range P {
		c := clients[p%int64(len(clients))]
		sched := Schedule{
			Start: startAt.Add(time.Duration(float64(p) * float64(time.Second) / cfg.Rate)),
			Rate:  cfg.Rate / float64(P),
			Count: (total - p + P - 1) / P,
		}
		wg.Go(func() {
			send := func(i int64, intended time.Time) error {
				seq := p + i*P
				off := int64(intended.Sub(base))
				payload := make([]byte, cfg.Size)
				Stamp{Run: r.runID, Seq: uint64(seq), Intended: off}.Put(payload)
				measured := off >= measuredFrom
				finish := func(err error) {
					if err != nil {
						errs.add(err)
						if errors.Is(err, protocol.ErrRateLimited) {
							refused.Add(1)
						}
						return
					}
					ackedBits[seq/64].Or(1 << (seq % 64))
					acked.Add(1)
					if measured {
						ackedMeas.Add(1)
						pubLat.record(time.Since(base) - time.Duration(off))
					}
				}
				msg := client.Message{Payload: payload}
				if cfg.Async {
					c.PublishAsync(r.topic.Name, msg, func(_ client.Position, err error) { finish(err) })
					return nil
				}
				_, err := c.Publish(ctx, r.topic.Name, msg)
				if err != nil && ctx.Err() != nil {
					return err
				}
				finish(err)
				return nil
			}
			lags[p], runErrs[p] = sched.Run(ctx, cfg.Clock, send)
		})
	}
	// What the consumers had received when the measured time started, to tell what they
	// consumed while the publishers published.
	atStart := make([]int64, len(groups))
	var ackedAtStart int64
	startRead := make(chan struct{})
	startCtx, stopStart := context.WithCancel(ctx)
	defer stopStart()
	go func() {
		defer close(startRead)
		t := time.NewTimer(time.Until(measureStart))
		defer t.Stop()
		select {
		case <-t.C:
		case <-startCtx.Done():
			return
		}
		ackedAtStart = acked.Load()
		for i, g := range groups {
			atStart[i] = g.count()
		}
	}()
	wg.Wait()
	for _, err := range runErrs {
		if err != nil {
			return err
		}
	}
	// The last acknowledgements, within the drain time (a broker that went away is not waited for
	// forever: the client reconnects until its context ends).
	flushCtx, cancelFlush := context.WithTimeout(ctx, cfg.Drain)
	defer cancelFlush()
	for _, c := range clients {
		if err := c.Flush(flushCtx); err != nil {
			return fmt.Errorf("bench: waiting for the last acknowledgements (--drain %s): %w", cfg.Drain, err)
		}
	}
	sendEnd := time.Now()
	r.windowEnd()
	<-startRead
	if err := ctx.Err(); err != nil {
		return err
	}
	ackedAtEnd := acked.Load()
	atEnd := make([]int64, len(groups))
	for i, g := range groups {
		atEnd[i] = g.count()
	}
	for _, l := range lags {
		if l.Finished.After(sendEnd) {
			sendEnd = l.Finished
		}
	}

	drainStart := time.Now()
	drained, err := drain(ctx, groups, &acked, ackedBits, cfg.Drain)
	if err != nil {
		return err
	}
	drainTook := time.Since(drainStart)
	// What the broker still holds for each group, to tell an acknowledged message not received
	// yet from a lost one.
	var brokerHeld map[string]int64
	if !drained && r.adm != nil {
		if brokerHeld, err = r.adm.groupBacklogs(ctx, r.topic.Name); err != nil {
			if l := r.cfg.Logger; l != nil {
				l.Warn("bench: reading the groups' backlogs after the drain failed: missing messages not told apart", "error", err)
			}
			brokerHeld = nil
		}
	}

	// Figures over the measured time.
	scheduleEnd := startAt.Add(time.Duration(float64(total) * float64(time.Second) / cfg.Rate))
	pubSpan := later(scheduleEnd, sendEnd).Sub(measureStart)
	lag := NewHistogram()
	for _, l := range lags {
		lag.Merge(l.Lag)
	}
	n, first := errs.get()
	lagP := percentilesOf(lag)
	pr := PublishResult{Messages: ackedMeas.Load(), Errors: n, Refused: refused.Load(), FirstError: first,
		Latency: percentilesOf(pubLat.snapshot()), SenderLag: &lagP}
	pr.Rate = float64(pr.Messages) / pubSpan.Seconds()
	pr.MBps = pr.Rate * float64(cfg.Size) / 1e6
	held := n == 0 && pr.Rate >= 0.99*cfg.Rate
	pr.Held = &held

	d := &DeliveryResult{Drained: drained, DrainSeconds: drainTook.Seconds()}
	all := NewHistogram()
	lastAt := int64(0)
	for _, g := range groups {
		g.mu.Lock()
		d.Delivered += g.inWindow
		d.Duplicates += g.duplicates
		all.Merge(g.lat)
		d.WorstGroupP99 = max(d.WorstGroupP99, ms(g.lat.Quantile(0.99)))
		lastAt = max(lastAt, g.lastAt)
		g.mu.Unlock()
	}
	d.Expected = ackedMeas.Load() * int64(cfg.Groups)
	d.account(groups, ackedBits, drained, brokerHeld)
	d.Latency = percentilesOf(all)
	delSpan := later(scheduleEnd, base.Add(time.Duration(lastAt))).Sub(measureStart)
	d.Rate = float64(d.Delivered) / delSpan.Seconds()
	if d.Missing > 0 {
		held = false
	}
	// Consumed while publishing: first receipts between the end of the warm-up and the last
	// publish acknowledgement; backlog: acknowledged but not yet received by the slowest group.
	for i := range groups {
		d.ConsumedWhilePublishing += atEnd[i] - atStart[i]
		d.BacklogAtWindowStart = max(d.BacklogAtWindowStart, ackedAtStart-atStart[i])
		d.BacklogAtPublishEnd = max(d.BacklogAtPublishEnd, ackedAtEnd-atEnd[i])
	}
	if span := sendEnd.Sub(measureStart).Seconds(); span > 0 {
		d.ConsumedRate = float64(d.ConsumedWhilePublishing) / span
		d.ConsumedRatePerGroup = d.ConsumedRate / float64(len(groups))
	}
	d.KeptUp = float64(d.BacklogAtPublishEnd) <= cfg.Rate*keptUpBacklog.Seconds()
	res.Publish, res.Delivery = pr, d
	return nil
}

// subscribe connects consumer k of group g and subscribes it; its handler records into rec.
func (r *runner) subscribe(ctx context.Context, g, k int, rec *groupRecorder, base time.Time) error {
	c, err := r.dial(ctx, fmt.Sprintf("bench-g%d-c%d", g, k))
	if err != nil {
		return err
	}
	_, err = c.Subscribe(ctx, client.SubscribeParams{
		Topic:       r.topic.Name,
		Group:       rec.name,
		MaxInFlight: r.cfg.MaxInFlight,
		Start:       client.FromBeginning(),
	}, func(ctx context.Context, d *client.Delivery) error {
		rec.observe(d.Payload, int64(time.Since(base)))
		if g == 0 && r.cfg.SlowConsumer > 0 {
			// The slow group's work on the message (backpressure runs).
			t := time.NewTimer(r.cfg.SlowConsumer)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
			}
		}
		return nil
	}, client.Concurrency(1))
	if err != nil {
		return fmt.Errorf("bench: subscribe group %d consumer %d: %w", g, k, err)
	}
	return nil
}

// account counts the acknowledged messages each group did not receive (Missing) and tells them
// apart with what the broker still held for the group after the drain (brokerHeld, by group
// name; nil: unknown): at most that many are in its backlog, the rest are lost. brokerHeld is
// read before the receipts are compared: what arrives in between lowers Missing, not brokerHeld,
// so Lost is never overstated.
func (d *DeliveryResult) account(groups []*groupRecorder, ackedBits []atomic.Uint64, drained bool, brokerHeld map[string]int64) {
	if brokerHeld != nil || drained {
		d.InBacklog, d.Lost = new(int64), new(int64)
	}
	for _, g := range groups {
		missing, unacked := g.compare(ackedBits)
		d.Missing += missing
		d.Unacknowledged += unacked
		if d.Lost != nil {
			h := brokerHeld[g.name]
			if g.name == "" { // a QUEUE topic's one subscription, whatever its name
				for _, v := range brokerHeld {
					h = max(h, v)
				}
			}
			inBacklog := min(missing, h)
			*d.InBacklog += inBacklog
			*d.Lost += missing - inBacklog
		}
	}
}

// groupName is the name of consumer group g at the broker.
func (r *runner) groupName(g int) string {
	if r.queue() {
		return "" // the topic's one subscription, shared by every consumer
	}
	return fmt.Sprintf("bench-%d", g)
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
