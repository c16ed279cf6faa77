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

// subState is a subscription that has at least one member in this process, with its dispatcher
// goroutine. It is created with its first member and removed (its dispatcher stopped) when its last
// member leaves.
type subState struct {
	b     *Broker
	id    int64
	topic string
	// wake has capacity 1: a wake-up is never lost and never blocks.
	wake chan struct{}
	// stop is closed when the subState is removed from the broker.
	stop chan struct{}
	// Test signals: wakes counts wake-up requests, handled the requests a dispatch pass started
	// after, idle is true while the dispatcher waits. Tests wait for idle && handled == wakes before
	// the action whose wake-up they check.
	wakes, handled atomic.Int64
	idle           atomic.Bool

	// claimMu is held by the dispatcher from choosing a member until the claimed deliveries are in
	// its channel (across the engine call). fence takes it to wait for that.
	claimMu sync.Mutex

	// mu guards the fields below.
	mu      sync.Mutex
	members []*Member
	// served is the member that last received deliveries: a round starts after it, so that new
	// messages go to the members in turn.
	served *Member
	// problem is the last problem the dispatcher saw, to log changes only.
	problem string
}

func newSubState(b *Broker, sub *storage.Subscription) *subState {
	return &subState{
		b:     b,
		id:    sub.ID,
		topic: sub.Topic,
		wake:  make(chan struct{}, 1),
		stop:  make(chan struct{}),
	}
}

// wakeUp asks the dispatcher for another look. It never blocks.
func (s *subState) wakeUp() {
	s.wakes.Add(1)
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// fence waits until no claim is in progress.
func (s *subState) fence() {
	s.claimMu.Lock()
	//lint:ignore SA2001 an empty critical section is the point: it orders us after a claim.
	s.claimMu.Unlock()
}

// memberIDs lists the members' IDs.
func (s *subState) memberIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, len(s.members))
	for i, m := range s.members {
		ids[i] = m.id
	}
	slices.Sort(ids)
	return ids
}

// run is the dispatcher goroutine: it dispatches whenever woken (messages appended, a member
// gained credit, joined or left, the subscription was resumed or got messages replayed), when the
// earliest NextDue or lease deadline passes, and when it has not looked for a while: every poll
// interval at first, then, as long as it delivers nothing, twice as long after each poll up to
// maxIdlePolls poll intervals (idlePoll). A delivery starts over; a wake-up makes a pass at once
// but does not (a member's returned credit wakes dispatchers that may have nothing to claim). The
// polls are a safety net (every change that makes messages claimable wakes the dispatchers, also
// those of other instances on PostgreSQL), and an idle broker with thousands of subscriptions
// must not claim thousands of times a second for nothing.
func (s *subState) run() {
	b := s.b
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var lastPass time.Time
	quiet := 0 // polls in a row that delivered nothing
	for {
		if iv := b.claimInterval; iv > 0 {
			// Let what is published meanwhile gather into one claim (see Config.ClaimInterval).
			if d := time.Until(lastPass.Add(iv)); d > 0 {
				timer.Reset(d)
				select {
				case <-s.stop:
					return
				case <-b.quit:
					return
				case <-timer.C:
				}
			}
			lastPass = time.Now()
		}
		s.handled.Store(s.wakes.Load())
		wait, delivered, gone := s.dispatch(idlePoll(b.pollInterval, quiet))
		if gone {
			// The subscription no longer exists in the engine: detach its members.
			b.detachSub(s, fmt.Errorf("%w: subscription %d of topic %q was deleted", storage.ErrSubscriptionNotFound, s.id, s.topic))
			return
		}
		if delivered {
			quiet = 0
		}
		timer.Reset(wait)
		s.idle.Store(true)
		select {
		case <-s.stop:
			return
		case <-b.quit:
			return
		case <-s.wake:
		case <-timer.C:
			quiet++
		}
		s.idle.Store(false)
	}
}

// maxIdlePolls bounds how far idle polls back off: an idle dispatcher looks at its subscription
// at least every maxIdlePolls poll intervals (16 s by default).
const maxIdlePolls = 16

// idlePoll returns the longest wait of a dispatcher after quiet polls in a row found nothing:
// poll, doubling with each, at most maxIdlePolls times poll.
func idlePoll(poll time.Duration, quiet int) time.Duration {
	return poll * time.Duration(min(1<<min(quiet, 30), maxIdlePolls))
}

// dispatch claims for members with credit, round robin, until nothing more is claimable, and
// returns how long to wait before the next look without a wake-up (at most poll), and whether it
// delivered anything. gone reports that the subscription does not exist any more.
//
// Termination: a claim that returns fewer deliveries than asked for without AvoidMember means the
// subscription is drained for now. With AvoidMember it means that what is left was last delivered
// to that member; the next member claims it, so two short claims in a row by different members
// mean drained too.
func (s *subState) dispatch(poll time.Duration) (wait time.Duration, delivered, gone bool) {
	b := s.b
	s.claimMu.Lock()
	defer s.claimMu.Unlock()
	var nextDue time.Time
	var lastShort *Member
	s.mu.Lock()
	after := s.served
	s.mu.Unlock()
	for {
		select {
		case <-s.stop:
			return 0, delivered, false
		default:
		}
		m, k, others := s.pick(after)
		if m == nil {
			break
		}
		after = m
		start := b.trace.now()
		res, err := b.engine.DeliveriesClaim(b.rootCtx, &storage.DeliveriesClaimParams{
			SubscriptionID: s.id, Member: m.id, Max: k, AvoidMember: others, LeaseDuration: m.leaseDuration,
		})
		if took, slow := b.trace.isSlow(start); slow {
			b.trace.logSlow(b.rootCtx, "claim", took, slog.String("topic", s.topic), slog.Int64("subscription", s.id))
		}
		if err != nil {
			m.unreserve(k)
			wait, gone := s.claimFailed(err)
			return wait, delivered, gone
		}
		b.trace.delivered(m.id, s, res.Deliveries)
		m.deliver(s, res.Deliveries, k)
		if len(res.Deliveries) > 0 {
			delivered = true
			s.mu.Lock()
			s.served = m
			s.mu.Unlock()
		}
		nextDue = earliest(nextDue, res.NextDue)
		if len(res.Deliveries) < k {
			if !others || (lastShort != nil && lastShort != m) {
				break
			}
			lastShort = m
		} else {
			lastShort = nil
		}
	}
	s.setProblem("")
	return s.waitFor(nextDue, poll), delivered, false
}

// pick chooses the first member with credit after member after (from the start of the list if
// after is nil or gone), in round-robin order, and reserves its credit. others reports whether
// another member has credit too (then the claim avoids giving the chosen member what it was last
// given: a nack goes to a different member).
func (s *subState) pick(after *Member) (m *Member, k int, others bool) {
	now := s.b.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.members)
	start := 0
	if i := slices.Index(s.members, after); i >= 0 {
		start = i + 1
	}
	for i := range n {
		c := s.members[(start+i)%n]
		c.mu.Lock()
		k = c.reserveLocked(now, s)
		c.mu.Unlock()
		if k > 0 {
			m = c
			break
		}
	}
	if m == nil {
		return nil, 0, false
	}
	for _, c := range s.members {
		if c != m && c.credit(now) > 0 {
			others = true
			break
		}
	}
	return m, k, others
}

// claimFailed handles a claim error: the dispatcher idles until woken or polled.
func (s *subState) claimFailed(err error) (time.Duration, bool) {
	b := s.b
	switch {
	case errors.Is(err, storage.ErrSubscriptionNotFound):
		b.logger.Info("subscription gone, detaching its members", slog.Int64("subscription", s.id), slog.String("topic", s.topic))
		return 0, true
	case errors.Is(err, storage.ErrSubscriptionNotActive):
		s.setProblem("not active")
	case errors.Is(err, storage.ErrClosed), b.rootCtx.Err() != nil:
		s.setProblem("engine closed")
	default:
		if s.setProblem(err.Error()) {
			b.logger.Warn("claim failed", slog.Int64("subscription", s.id), slog.String("topic", s.topic), slog.Any("error", err))
		}
	}
	return b.pollInterval, false
}

// setProblem records the dispatcher's current problem and reports whether it changed.
func (s *subState) setProblem(p string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := s.problem != p
	s.problem = p
	if changed && p != "" {
		s.b.logger.Debug("dispatcher idle", slog.Int64("subscription", s.id), slog.String("topic", s.topic), slog.String("reason", p))
	}
	return changed
}

// waitFor returns how long to sleep: until the engine's NextDue, until the earliest lease deadline
// of a member (an expired lease gives its credit back), at most poll.
func (s *subState) waitFor(nextDue time.Time, poll time.Duration) time.Duration {
	s.mu.Lock()
	members := slices.Clone(s.members)
	s.mu.Unlock()
	now := s.b.clock.Now()
	for _, m := range members {
		nextDue = earliest(nextDue, m.nextExpiry(now))
	}
	wait := poll
	if !nextDue.IsZero() {
		// A minimum keeps a NextDue in the past (clock skew, an engine quirk) from spinning.
		wait = min(wait, max(time.Millisecond, nextDue.Sub(now)))
	}
	return wait
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
