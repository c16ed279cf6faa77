package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// owner is the one writer of a subscription's runtime state on this broker: a goroutine (run)
// that owns the subscription's membership, the round-robin position, the dispatch passes with
// their timers and the subscription's end. Everything else talks to it through its inbox: events
// (a member joined, left, the subscription ended) queued in order, and wake-ups (the engine
// notified messages, a member's credit came back, an admin call resumed it), which coalesce.
// Membership is read by others only through the published view, so a subscription has no lock of
// its own besides the inbox's, a leaf.
//
// An owner starts with its first member (Broker.attach) and ends when its last member left or the
// subscription ended (cancelled, deleted, its topic deleted): it then unregisters from the
// broker under Broker.mu, where joins are queued, so a join never reaches an owner that has
// ended; the next member starts a new one.
type owner struct {
	b     *Broker
	id    int64
	topic string
	// group is the subscription's group as this broker last knew it (groupName): a semantics
	// change of the topic renames the subscription (QUEUE to PUB_SUB: the queue's to the group
	// it becomes; PUB_SUB to QUEUE: the one live group's to the queue's), and the members that
	// stay on it are labelled (metrics, Member.SubscriptionGroup) with its new name.
	group atomic.Pointer[string]
	// bfDirty asks the goroutine to reread the subscription at once (refresh): this instance
	// changed its backfill, or the engine notified a change of its state or group
	// (storage.NotifySubscription, rereadSubscription).
	bfDirty atomic.Bool

	// signal (capacity 1) wakes the goroutine after a wake-up or an event; never blocks.
	signal chan struct{}
	// Test signals: wakes counts wake-ups and events, handled the ones a dispatch pass started
	// after, idle is true while the goroutine waits. Tests wait for idle && handled == wakes before
	// the action whose wake-up they check.
	wakes, handled atomic.Int64
	idle           atomic.Bool
	// pausing is true while the goroutine waits out the claim interval (a test signal too).
	pausing atomic.Bool
	// view is the membership as last published by the goroutine (copy on write), for readers
	// (acks finding the holders, listings) that must not wait for it.
	view atomic.Pointer[[]*Member]
	// queued is true while events wait in the inbox: a dispatch pass stops claiming to let them in.
	queued atomic.Bool

	// qmu guards the inbox. It is a leaf: taken under Broker.mu (joins), never around another lock.
	qmu    sync.Mutex
	events []*event
	// ended is set, under Broker.mu and qmu, when the owner unregistered: pushes fail from then on.
	ended bool
	// attached counts the members whose join was queued and leave not yet, under Broker.mu: an
	// ordered group refuses a join past Broker.maxOrderedMembers with it, a shared one on a
	// shared engine past Broker.maxSharedMembers.
	attached int

	// The goroutine's own state: no lock.
	members []*Member
	// served is the member that last received deliveries: a pass starts after it, so that new
	// messages go to the members in turn.
	served *Member
	// problem is the last problem a pass ran into, to log changes only.
	problem string
	// passCut is set when the last pass stopped at maxPass: the next one starts at once.
	passCut bool
	// checkState makes the next pass read the subscription (refreshBackfill) whatever its
	// schedule: a rebalance was refused as not active, and a cancel ends the owner (endReason).
	checkState bool
	// inactive is set while the subscription was last found PAUSED or DEAD (a claim refused as
	// not active, then a read): passes read it instead of claiming (stillInactive). Written by
	// the goroutine only; atomic as a test signal.
	inactive atomic.Bool
	// recordAgain: writing the records of joined members failed (filtered.go): write them all
	// again before the next pass.
	recordAgain bool
	// ord is the state of an ORDERED subscription (ordered.go), nil for a shared one.
	ord *ordered
	// filtering is true while a member here has a filter: claims are routed (filtered.go).
	filtering bool
	// parked are claimed deliveries that another member's filter wants, waiting for its credit
	// (filtered.go); at most maxParked. Their leases are renewed while they wait.
	parked []parkedDelivery
	// bf paces the subscription's backfill range (backfill.go); nil before the first pass.
	bf *ownerBackfill
	// others are the live members of other broker instances with their filters (shared
	// engine, filtered.go), as last read; nil before the first read.
	others atomic.Pointer[othersView]
	// givenBack counts the messages this owner gave back to other instances (a test signal).
	givenBack atomic.Int64
}

// eventKind is what an inbox event says.
type eventKind uint8

const (
	// evJoin: member m was attached (it already lists the owner among its subscriptions).
	evJoin eventKind = iota
	// evLeave: member m detached itself; done is closed once the owner forgot it, which is also a
	// fence: no claim for m is in progress then, and none starts again.
	evLeave
	// evEnd: the subscription ended (err says why): every member is detached and told so, the
	// owner ends; owned reports whether one of them had created it (an ephemeral subscription).
	evEnd
	// evRebalance: an admin asked for a rebalance of an ORDERED subscription (strategy, when not
	// empty, is the new one); done is closed after it ran.
	evRebalance
	// evExpired: the liveness renewal found members of other instances in the assignment of an
	// ORDERED subscription that are no longer live (livenessLoop): rebalance without them.
	evExpired
)

// event is one inbox entry.
type event struct {
	kind eventKind
	m    *Member
	// err is evEnd's reason, and evJoin's answer: the member's record could not be written
	// (shared engine, filtered.go), written before done is closed.
	err error
	// done, when not nil, is closed once the event was handled (or the owner ended without it).
	done chan struct{}
	// owned is evEnd's answer, written before done is closed.
	owned bool
	// strategy and dropForeign are evRebalance's parameters.
	strategy    string
	dropForeign bool
}

func newOwner(b *Broker, sub *storage.Subscription) *owner {
	o := &owner{b: b, id: sub.ID, topic: sub.Topic, signal: make(chan struct{}, 1)}
	o.group.Store(&sub.Group)
	if sub.Mode == storage.ModeOrdered {
		o.ord = &ordered{}
	}
	return o
}

// groupName returns the subscription's group as this broker last knew it.
func (o *owner) groupName() string { return *o.group.Load() }

// renamed records the subscription's group as a read of it found it and reports whether it
// changed: a semantics change of the topic renamed it (perhaps through another broker instance).
func (o *owner) renamed(group string) bool {
	if old := o.group.Swap(&group); *old != group {
		return true
	}
	return false
}

// wakeUp asks the owner for a dispatch pass. It never blocks and coalesces.
func (o *owner) wakeUp() {
	o.wakes.Add(1)
	select {
	case o.signal <- struct{}{}:
	default:
	}
}

// push queues ev and wakes the owner. It returns false when the owner has ended (ev is dropped).
func (o *owner) push(ev *event) bool {
	o.qmu.Lock()
	if o.ended {
		o.qmu.Unlock()
		return false
	}
	o.events = append(o.events, ev)
	o.queued.Store(true)
	o.qmu.Unlock()
	o.wakeUp()
	return true
}

// call queues ev and waits until it was handled. It returns false when the owner had ended
// (nothing was done).
func (o *owner) call(ev *event) bool {
	ev.done = make(chan struct{})
	if !o.push(ev) {
		return false
	}
	<-ev.done
	return true
}

// leaveLocked detaches m from o's subscription and tells o. It returns the leave event to wait for
// (its done is the fence after which no claim for m runs), nil when m was not attached or o has
// ended, and whether m owned the subscription (an ephemeral one the caller deletes). Broker.mu must
// be held: joins are queued under it, so o gets m's leave after m's join.
func (b *Broker) leaveLocked(m *Member, o *owner) (ev *event, owned bool) {
	attached, owned := m.detach(o, nil)
	if !attached {
		return nil, false
	}
	o.attached--
	ev = &event{kind: evLeave, m: m, done: make(chan struct{})}
	if !o.push(ev) {
		return nil, owned
	}
	return ev, owned
}

// end ends the subscription on this broker: its members are detached and told reason. It reports
// whether one of them owned the subscription (an ephemeral one the caller deletes).
func (o *owner) end(reason error) (owned bool) {
	ev := &event{kind: evEnd, err: reason}
	if !o.call(ev) {
		return false
	}
	return ev.owned
}

// take empties the inbox.
func (o *owner) take() []*event {
	o.qmu.Lock()
	defer o.qmu.Unlock()
	evs := o.events
	o.events = nil
	o.queued.Store(false)
	return evs
}

// memberIDs lists the members' IDs as last published.
func (o *owner) memberIDs() []string {
	ms := o.viewMembers()
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.id
	}
	slices.Sort(ids)
	return ids
}

// viewMembers returns the published membership; it must not be modified.
func (o *owner) viewMembers() []*Member {
	if p := o.view.Load(); p != nil {
		return *p
	}
	return nil
}

// publish makes the goroutine's membership visible to readers.
func (o *owner) publish() {
	ms := slices.Clone(o.members)
	o.view.Store(&ms)
}

// run is the owner's goroutine: it handles the inbox, then makes a dispatch pass, whenever woken
// (messages appended, a member gained credit, joined or left, the subscription was resumed or got
// messages replayed), when the earliest NextDue or lease deadline passes, and when it has not
// looked for a while: every poll interval at first, then, as long as it delivers nothing, twice
// as long after each poll up to maxIdlePolls poll intervals (idlePoll). A delivery starts over; a
// wake-up makes a pass at once but does not (a member's returned credit wakes owners that may
// have nothing to claim). The polls are a safety net (every change that makes messages claimable
// wakes the owners, also those of other instances on PostgreSQL), and an idle broker with
// thousands of subscriptions must not claim thousands of times a second for nothing.
func (o *owner) run() {
	b := o.b
	defer o.abandon()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var lastPass time.Time
	quiet := 0 // polls in a row that delivered nothing
	for {
		o.handled.Store(o.wakes.Load())
		if !o.handleEvents() {
			return
		}
		if iv := b.claimIntervalNow(); iv > 0 && !o.passCut {
			// Let what is published meanwhile gather into one claim (see Config.ClaimInterval).
			if d := time.Until(lastPass.Add(iv)); d > 0 {
				// Events are handled while waiting (a Subscribe or a Close waits for its join or
				// leave); wake-ups wait for the interval's end, which is the point of it.
				timer.Reset(d)
				o.pausing.Store(true)
				for waiting := true; waiting; {
					select {
					case <-b.quit:
						return
					case <-timer.C:
						waiting = false
					case <-o.signal:
						if o.queued.Load() && !o.handleEvents() {
							return
						}
					}
				}
				o.pausing.Store(false)
				o.handled.Store(o.wakes.Load())
				if !o.handleEvents() {
					return
				}
			}
			lastPass = time.Now()
		}
		// An ordered subscription rebalances first when one is due (ordered.go).
		rebalanceIn := o.rebalanceDue()
		if o.recordAgain {
			o.recordAgain = o.recordAll() != nil
		}
		o.passCut = false
		wait, delivered, end := o.dispatch(idlePoll(b.pollInterval, quiet))
		if end != nil {
			o.endHere(end)
			return
		}
		if delivered {
			quiet = 0
		}
		if rebalanceIn > 0 {
			wait = min(wait, rebalanceIn)
		}
		timer.Reset(wait)
		o.idle.Store(true)
		select {
		case <-b.quit:
			return
		case <-o.signal:
		case <-timer.C:
			if !o.passCut {
				quiet++ // a pass cut at maxPass is not an idle poll
			}
		}
		o.idle.Store(false)
	}
}

// handleEvents handles what the inbox holds. It returns false when the owner ended: the
// subscription ended, or its last member left (then it unregisters, unless a join came in
// meanwhile).
func (o *owner) handleEvents() bool {
	for {
		evs := o.take()
		// The member records (filtered.go): those who left are forgotten, those who joined are
		// written before their joins are answered (a Subscribe returns after its record).
		var left []string
		var joins []*event
		for i, ev := range evs {
			switch ev.kind {
			case evJoin:
				if !slices.Contains(o.members, ev.m) {
					o.members = append(o.members, ev.m)
					o.publish()
					o.refilter()
				}
				joins = append(joins, ev)
			case evLeave:
				if j := slices.Index(o.members, ev.m); j >= 0 {
					o.members = slices.Delete(o.members, j, j+1)
					o.publish()
					o.refilter()
				}
				if o.served == ev.m {
					o.served = nil
				}
				o.dropParked(ev.m.id)
				left = append(left, ev.m.id)
			case evEnd:
				// The subscription ended: no record to write; the joins' members are told why.
				answer(joins, nil)
				ev.owned = o.finish(ev.err, evs[i+1:])
				close(ev.done)
				return false
			}
			if o.ord != nil {
				o.orderedEvent(ev)
			}
			if ev.done != nil && ev.kind != evJoin && (ev.kind != evRebalance || o.ord == nil) {
				close(ev.done)
			}
		}
		if len(evs) > 0 {
			err := o.recordMembers(joins, left)
			// A Subscribe answered with the error closes its member; a join from a topic's
			// creation (attachMatching) stays: its record is written again before the next pass.
			o.recordAgain = o.recordAgain || (err != nil && len(joins) > 0)
			answer(joins, err)
		}
		if len(o.members) > 0 {
			return true
		}
		if o.ord != nil && !o.ord.due.IsZero() {
			// The last member left: take it out of the assignment before ending (other instances'
			// members get its partitions; a later member here starts from a clean assignment).
			o.rebalance()
		}
		if o.unregister() {
			return false
		}
	}
}

// answer answers join events with err.
func answer(joins []*event, err error) {
	for _, ev := range joins {
		ev.err = err
		if ev.done != nil {
			close(ev.done)
		}
	}
}

// unregister removes the owner from the broker unless events came in; it reports whether it did.
// Joins are queued under Broker.mu, so none can arrive after it.
func (o *owner) unregister() bool {
	b := o.b
	b.mu.Lock()
	defer b.mu.Unlock()
	o.qmu.Lock()
	defer o.qmu.Unlock()
	if len(o.events) > 0 {
		return false
	}
	o.ended = true
	if b.subs[o.id] == o {
		delete(b.subs, o.id)
		if byID := b.byTopic[o.topic]; byID != nil {
			delete(byID, o.id)
			if len(byID) == 0 {
				delete(b.byTopic, o.topic)
			}
		}
	}
	return true
}

// finish ends the subscription on this broker: it detaches every member and tells them reason
// (Member.TakeEnded; they stay open for their other subscriptions and join matching topics created
// later), unregisters, and answers pending and what is still queued (late joins are detached the
// same way). It reports whether one of the members owned the subscription (an ephemeral one).
func (o *owner) finish(reason error, pending []*event) (owned bool) {
	for _, m := range o.members {
		if _, own := m.detach(o, reason); own {
			owned = true
		}
	}
	o.members, o.served, o.parked = nil, nil, nil
	o.publish()
	o.releaseWaiters()
	for {
		for _, ev := range pending {
			if ev.kind == evJoin {
				if _, own := ev.m.detach(o, reason); own {
					owned = true
				}
			}
			if ev.done != nil {
				close(ev.done)
			}
		}
		if o.unregister() {
			return owned
		}
		pending = o.take()
	}
}

// endHere ends the owner for a subscription that ended in the engine without this broker ending
// it (deleted, or cancelled by another broker instance on the same database or in the engine
// directly): its members are detached and told reason as by a local CancelGroup or DeleteTopic,
// and an ephemeral subscription one of them owned is deleted, as CancelGroup does.
func (o *owner) endHere(reason error) {
	b := o.b
	b.logger.Info("subscription ended elsewhere, detaching its members", slog.Int64("subscription", o.id),
		slog.String("topic", o.topic), slog.Any("reason", reason))
	if o.finish(reason, nil) {
		if err := b.engine.SubscriptionDelete(b.rootCtx, o.id); err != nil && !errors.Is(err, storage.ErrSubscriptionNotFound) {
			b.logger.Warn("deleting ended ephemeral subscription failed", slog.Int64("subscription", o.id), slog.Any("error", err))
		}
	}
}

// endReason returns why the subscription ended, judged from a read of it (Engine.SubscriptionGet's
// result): deleted (not found, DELETED: goneReason) or cancelled; nil while it lives (PAUSED and
// DEAD included) or when the read failed otherwise.
func (o *owner) endReason(sub *storage.Subscription, err error) error {
	switch {
	case errors.Is(err, storage.ErrSubscriptionNotFound), err == nil && sub.State == storage.Deleted:
		return o.b.goneReason(o.b.rootCtx, o.id, o.topic)
	case err == nil && sub.State == storage.Cancelled:
		return cancelledReason(sub)
	}
	return nil
}

// cancelledReason is what the members of a cancelled subscription are told (Member.TakeEnded),
// whether this broker cancelled it or found it cancelled.
func cancelledReason(sub *storage.Subscription) error {
	return fmt.Errorf("%w: subscription %d of group %q on topic %q was cancelled",
		storage.ErrSubscriptionNotActive, sub.ID, sub.Group, sub.Topic)
}

// abandon runs when the goroutine returns: after Broker.Stop (quit) it refuses further events and
// releases the callers still waiting for one.
func (o *owner) abandon() {
	o.qmu.Lock()
	o.ended = true
	evs := o.events
	o.events = nil
	o.qmu.Unlock()
	for _, ev := range evs {
		if ev.done != nil {
			close(ev.done)
		}
	}
	o.releaseWaiters()
	o.b.backfill.forget(o.id)
}

// releaseWaiters closes the admin rebalances' waits of an owner that ends.
func (o *owner) releaseWaiters() {
	if o.ord == nil {
		return
	}
	for _, w := range o.ord.waiters {
		close(w)
	}
	o.ord.waiters = nil
}

// maxIdlePolls bounds how far idle polls back off: an idle owner looks at its subscription at
// least every maxIdlePolls poll intervals (16 s by default).
const maxIdlePolls = 16

// idlePoll returns the longest wait of an owner after quiet polls in a row found nothing: poll,
// doubling with each, at most maxIdlePolls times poll.
func idlePoll(poll time.Duration, quiet int) time.Duration {
	return poll * time.Duration(min(1<<min(quiet, 30), maxIdlePolls))
}

// maxPass bounds one dispatch pass: a backlog that keeps every member's credit busy would
// otherwise keep the owner in one pass for as long as it lasts, and what the run loop does
// between passes (an ordered group's rebalance, the backfill refresh that rereads a cancel and
// reports the pacer's rate) would wait for it.
const maxPass = 100 * time.Millisecond

// dispatch claims for members with credit, round robin, until nothing more is claimable, events
// wait in the inbox or the pass took maxPass, and returns how long to wait before the next look without a wake-up (at most
// poll), and whether it delivered anything. end, when not nil, says that the subscription ended
// (deleted or cancelled, elsewhere: endReason): the owner ends with it. The deliveries go straight
// from the claim to the member's channel: no other goroutine handles them.
//
// Termination: a claim that returns fewer deliveries than asked for without AvoidMember means the
// subscription is drained for now. With AvoidMember it means that what is left was last delivered
// to that member; the next member claims it, so two short claims in a row by different members
// mean drained too.
func (o *owner) dispatch(poll time.Duration) (wait time.Duration, delivered bool, end error) {
	if o.ord != nil {
		return o.dispatchOrdered(poll)
	}
	b := o.b
	var nextDue time.Time
	var lastShort *Member
	after := o.served
	// Backfill pacing (backfill.go): partitions outside their range are claimed first at full
	// speed (freeDone once they ran dry), then those inside it within the pacer's tokens.
	// Pacing runs on real time (it paces load), not the broker's clock. The refresh's read of the
	// subscription also finds it ended elsewhere, while no claim runs.
	if end := o.refresh(time.Now()); end != nil {
		return 0, false, end
	}
	if wait, end, idle := o.stillInactive(); idle {
		return wait, false, end
	}
	limiting := o.bf.limiting()
	freeDone := false
	var paced time.Duration // > 0: the pacer's tokens ran out, wait that long
	passEnd := time.Now().Add(maxPass)
	for !o.queued.Load() {
		select {
		case <-b.quit:
			return 0, delivered, nil
		default:
		}
		if time.Now().After(passEnd) {
			o.setProblem("")
			o.passCut = true
			return 0, delivered, nil // the next pass at once, after the run loop's own work
		}
		if len(o.parked) > 0 {
			// Deliveries another member's filter wants go first; past the bound, wait for the
			// credit of the members that want them (filtered.go).
			if o.handOver() {
				delivered = true
			}
			if len(o.parked) >= maxParked {
				break
			}
		}
		m, k, others := o.pick(after)
		if m == nil {
			break
		}
		var parts []int32
		limit, ranged := k, false
		if limiting {
			var hold time.Duration
			if parts, limit, ranged, hold = o.planClaim(nil, k, freeDone); parts == nil {
				paced = hold // CANCELLED or FAILED (0: the range waits), or the pacer's wait
				m.unreserve(k)
				break
			}
		}
		after = m
		n := limit
		if o.filtering {
			// What m's filter does not match may be parked: keep that within maxParked.
			n = min(limit, maxParked-len(o.parked))
		}
		start := b.trace.now()
		claimStart := time.Now()
		res, err := b.engine.DeliveriesClaim(b.rootCtx, &storage.DeliveriesClaimParams{
			SubscriptionID: o.id, Member: m.id, Max: n, AvoidMember: others, LeaseDuration: m.leaseDuration, Partitions: parts,
			Skip: o.skipTag(), Take: o.takeTag(), SkipFor: giveBackSkip,
		})
		if took, slow := b.trace.isSlow(start); slow {
			b.trace.logSlow(b.rootCtx, "claim", took, slog.String("topic", o.topic), slog.Int64("subscription", o.id))
		}
		if err != nil {
			m.unreserve(k)
			if ranged {
				if wait, ok := o.rangeFailed(err); ok {
					return wait, delivered, nil
				}
			}
			wait, end := o.claimFailed(err)
			return wait, delivered, end
		}
		b.reportDeadLettered(o, res.DeadLettered)
		if ranged {
			o.rangeSucceeded(len(res.Deliveries), time.Since(claimStart))
		}
		if limiting {
			o.rangeClaimed(res.Deliveries)
		}
		ds := res.Deliveries
		if o.filtering {
			var filtered bool
			ds, filtered = o.route(m, ds, claimStart)
			delivered = delivered || filtered
		}
		b.trace.delivered(m.id, o.topic, o.id, ds)
		m.deliver(o, ds, k)
		if len(ds) > 0 {
			delivered = true
			o.served = m
		}
		nextDue = earliest(nextDue, res.NextDue)
		if len(res.Deliveries) < n {
			if limiting && !ranged && !freeDone {
				freeDone = true // the free partitions ran dry: the range's turn
				continue
			}
			if !others || (lastShort != nil && lastShort != m) {
				break
			}
			lastShort = m
		} else {
			lastShort = nil
		}
	}
	o.setProblem("")
	return o.passWait(nextDue, poll, paced, limiting), delivered, nil
}

// pick chooses the first member with credit after member after (from the start of the list if
// after is nil or gone), in round-robin order, and reserves its credit. others reports whether
// another member has credit too (then the claim avoids giving the chosen member what it was last
// given: a nack goes to a different member).
func (o *owner) pick(after *Member) (m *Member, k int, others bool) {
	now := o.b.clock.Now()
	n := len(o.members)
	start := 0
	if i := slices.Index(o.members, after); i >= 0 {
		start = i + 1
	}
	for i := range n {
		c := o.members[(start+i)%n]
		if k = c.reserve(now, o); k > 0 {
			m = c
			break
		}
	}
	if m == nil {
		return nil, 0, false
	}
	for _, c := range o.members {
		if c != m && c.credit(now) > 0 {
			others = true
			break
		}
	}
	return m, k, others
}

// refresh rereads the subscription while the owner has members, when refreshBackfill's schedule
// says so (once a minute without a paced backfill range), a rebalance asked (checkState) or the
// engine notified a change of its state or group (storage.NotifySubscription, also from another
// broker instance on PostgreSQL: rereadSubscription), and returns why it ended if it did
// (endReason): a subscription cancelled elsewhere ends its members here at once, even when none
// of them claims (no credit); the once-a-minute reread bounds it when a notification is lost (an
// instance older than the kind made the change, the listener was reconnecting). A read that finds
// it PAUSED or DEAD makes the passes read instead of claim (stillInactive), one that finds it
// ACTIVE makes them claim.
//
// A read that finds the subscription under another group than the last one means the topic's
// semantics changed (QUEUE to PUB_SUB renames the queue subscription to the group it becomes,
// PUB_SUB to QUEUE the one live group's to the queue's), perhaps through another broker instance,
// whose UpdateTopic moved its own members only: the members here then move as after a local
// UpdateTopic (Broker.topicRenamed).
func (o *owner) refresh(now time.Time) error {
	if len(o.members) == 0 {
		return nil
	}
	force := o.checkState
	o.checkState = false
	sub, read, err := o.refreshBackfill(now, force)
	if !read {
		return nil
	}
	if end := o.endReason(sub, err); end != nil {
		return end
	}
	if err == nil {
		// Paused or DEAD: passes read it instead of claiming (stillInactive); ACTIVE: they claim.
		o.inactive.Store(sub.State != storage.Active)
		if o.renamed(sub.Group) {
			o.b.topicRenamed(o.topic)
		}
	}
	return nil
}

// claimFailed handles a claim error: the owner idles until woken or polled, or ends (end not
// nil) when the subscription was deleted or cancelled.
func (o *owner) claimFailed(err error) (wait time.Duration, end error) {
	b := o.b
	switch {
	case errors.Is(err, storage.ErrSubscriptionNotFound):
		return 0, o.endReason(nil, err)
	case errors.Is(err, storage.ErrSubscriptionNotActive):
		// PAUSED and DEAD wait; CANCELLED (through another broker instance on the same database,
		// or in the engine) is terminal: the members end as by a local CancelGroup. Read when the
		// claims start failing; while it stays PAUSED or DEAD the passes read it instead of
		// claiming (stillInactive).
		o.setProblem("not active")
		sub, rerr := b.engine.SubscriptionGet(b.rootCtx, o.id)
		if end := o.endReason(sub, rerr); end != nil {
			return 0, end
		}
		o.inactive.Store(rerr != nil || sub.State != storage.Active)
	case errors.Is(err, storage.ErrClosed), b.rootCtx.Err() != nil:
		o.setProblem("engine closed")
	default:
		if o.setProblem(err.Error()) {
			b.logger.Warn("claim failed", slog.Int64("subscription", o.id), slog.String("topic", o.topic), slog.Any("error", err))
		}
	}
	return b.pollInterval, nil
}

// stillInactive runs before a pass claims while the subscription was last found PAUSED or DEAD
// (inactive): idle true means the pass claims nothing and ends with wait and end (not nil: the
// subscription ended, endReason). A claim would be refused as not active, which says nothing of
// a cancel (a subscription paused, then cancelled through another broker instance, refuses its
// claims as it did while paused); so while a member has credit the pass reads the subscription
// in its place, at one engine call as the refused claim was, and finds it resumed (the pass
// claims then), cancelled or deleted (the owner ends) within the poll interval instead of at the
// once-a-minute reread. Without credit nothing is read, as nothing was claimed: the reread
// (refresh) finds a cancel then.
//
// The engines' storage.NotifySubscription makes the owner reread the subscription at once
// (refresh) on a pause, resume or cancel, also one made elsewhere while no member has credit;
// these reads cover a notification that was lost.
func (o *owner) stillInactive() (wait time.Duration, end error, idle bool) {
	b := o.b
	if !o.inactive.Load() {
		return 0, nil, false
	}
	now := b.clock.Now()
	credit := false
	for _, m := range o.members {
		if m.credit(now) > 0 {
			credit = true
			break
		}
	}
	if !credit {
		return b.pollInterval, nil, true
	}
	sub, err := b.engine.SubscriptionGet(b.rootCtx, o.id)
	if end := o.endReason(sub, err); end != nil {
		return 0, end, true
	}
	if err != nil || sub.State != storage.Active {
		return b.pollInterval, nil, true
	}
	o.inactive.Store(false)
	return 0, nil, false
}

// setProblem records the owner's current problem and reports whether it changed.
func (o *owner) setProblem(p string) bool {
	changed := o.problem != p
	o.problem = p
	if changed && p != "" {
		o.b.logger.Debug("dispatcher idle", slog.Int64("subscription", o.id), slog.String("topic", o.topic), slog.String("reason", p))
	}
	return changed
}

// waitFor returns how long to sleep: until the engine's NextDue, until the earliest lease deadline
// of a member (an expired lease gives its credit back) or renewal of a parked lease, at most poll.
func (o *owner) waitFor(nextDue time.Time, poll time.Duration) time.Duration {
	now := o.b.clock.Now()
	for _, m := range o.members {
		nextDue = earliest(nextDue, m.nextExpiry(now))
	}
	for _, p := range o.parked {
		nextDue = earliest(nextDue, p.renewAt)
	}
	wait := poll
	if !nextDue.IsZero() {
		// A minimum keeps a NextDue in the past (clock skew, an engine quirk) from spinning.
		wait = min(wait, max(time.Millisecond, nextDue.Sub(now)))
	}
	return wait
}

// reportDeadLettered reports n > 0 messages of o's subscription that the engine dead-lettered
// in a claim, a release or a rebalance to Config.OnDeadLettered.
func (b *Broker) reportDeadLettered(o *owner, n int) {
	b.countDeadLettered(o.topic, o.groupName(), n)
}

// countDeadLettered reports n > 0 messages of group on topic that the engine dead-lettered to
// Config.OnDeadLettered.
func (b *Broker) countDeadLettered(topic, group string, n int) {
	if n > 0 && b.onDeadLettered != nil {
		b.onDeadLettered(topic, group, n)
	}
}

// earliest returns the earlier of two times, ignoring zero ones.
func earliest(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero() || a.Before(b):
		return a
	}
	return b
}
