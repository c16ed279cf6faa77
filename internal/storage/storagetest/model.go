package storagetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/policy"
)

// model is the in-memory reference the randomized case (C5) compares the engine with: per
// subscription, the cursor of never-delivered messages and the state of every delivered message.
// It predicts exactly what the interface defines and tracks as uncertain what it leaves open (what
// a restart does to leases and nack delays, what DeliveriesRelease does to an expired lease).
type model struct {
	t      *testing.T
	topics map[string]*mTopic
	subs   []*mSub
}

type mTopic struct {
	name          string
	partitions    int
	ackWait       time.Duration
	maxDeliveries int
	poison        storage.PoisonRules
	high          []int64
}

type mSub struct {
	id     int64
	name   string
	topic  *mTopic
	cursor []int64
	msgs   map[storage.DeliveryRef]*mMsg
	// ackedByEngine sums DeliveriesAck's Acked; it must end equal to the messages done by ack.
	ackedByEngine int
}

type mState int

const (
	stLeased  mState = iota + 1 // leased to member until deadline
	stWaiting                   // available again at due
	stDone                      // acked
	stDead                      // in the DLQ
)

type mMsg struct {
	state    mState
	member   string    // member of the last delivery
	attempt  int       // attempt of the last delivery; 0 after a DLQ replay
	deadline time.Time // stLeased
	due      time.Time // stWaiting
	// uncertain: after a restart (or a release of an expired lease) the message may be delivered
	// at any time, with an attempt above the last one, but need not be.
	uncertain bool
	// avoidUnknown: after a DLQ replay, whether AvoidMember skips it for its last member is open.
	avoidUnknown bool
	deadReason   storage.DLQReason
	deadAttempts int
	// failures is the message's failure history while its topic has poison rules (durable: a
	// restart keeps it); deadRule and deadFailures what its DLQ entry must show.
	failures     []policy.Failure
	deadRule     storage.PoisonRule
	deadFailures []policy.Failure
}

// availability of a message for a claim.
type availability int

const (
	availNo    availability = iota // must not be delivered
	availYes                       // must be delivered by a claim that has room for it
	availMaybe                     // may be delivered
)

// limbo reports a message leased on its max_deliveries-th delivery whose lease has expired (or whose
// lease state a restart made unknown): it goes to the DLQ when the engine processes the expiry,
// which may not have happened yet.
func (s *mSub) limbo(m *mMsg, now time.Time) bool {
	if m.state != stLeased {
		return false
	}
	if m.uncertain {
		return m.attempt >= s.topic.maxDeliveries
	}
	x, _ := policy.ExpireAt(now.UnixNano(), m.deadline.UnixNano(), m.attempt, s.topic.maxDeliveries)
	return x == policy.DeadLetter
}

// plan returns the plan (policy.Claim) of claim p on s at now: the model asks it what the rules
// say about each message.
func (md *model) plan(s *mSub, p storage.DeliveriesClaimParams, now time.Time) *policy.Claim {
	md.t.Helper()
	pl := &policy.Claim{}
	if err := pl.Start(policy.Input{Params: &p, Topic: s.topic.name, Partitions: s.topic.partitions, AckWait: s.topic.ackWait,
		MaxDeliveries: s.topic.maxDeliveries, Now: now.UnixNano()}); err != nil {
		md.fail("claim on %s: %v", s.name, err)
	}
	return pl
}

// avail says whether the claim planned by pl may (or must) redeliver message r, as the policy's
// rules say, with what a restart or a replay leaves open.
func (s *mSub) avail(r storage.DeliveryRef, m *mMsg, pl *policy.Claim) availability {
	var due int64
	switch m.state {
	case stLeased:
		if m.uncertain {
			if m.attempt >= s.topic.maxDeliveries {
				return availNo // to the DLQ once its lease expires
			}
			return availMaybe
		}
		x, d := pl.Expire(m.deadline.UnixNano(), m.attempt)
		if x != policy.Wait {
			return availNo
		}
		due = d
	case stWaiting:
		if m.uncertain {
			return availMaybe
		}
		due = m.due.UnixNano()
	default:
		return availNo
	}
	switch {
	case pl.Claimable(due, r.Partition, m.member):
		return availYes
	case due > pl.Now():
		return availNo
	case m.member == pl.Member() && (m.avoidUnknown || m.uncertain):
		return availMaybe // avoided, unless the engine lost track of the member (replay, restart)
	}
	return availNo
}

func (md *model) fail(format string, args ...any) {
	md.t.Helper()
	md.t.Fatalf("model: "+format, args...)
}

// published records positions returned by MessagesAppend and checks them against the prediction.
func (md *model) published(tp *mTopic, msgs []storage.AppendMessage, pos []storage.MessagePosition, now time.Time) {
	md.t.Helper()
	if len(pos) != len(msgs) {
		md.fail("publish to %s: %d positions for %d messages", tp.name, len(pos), len(msgs))
	}
	for i, p := range pos {
		if msgs[i].Key != nil {
			if want := storage.PartitionForKey(msgs[i].Key, tp.partitions); p.Partition != want {
				md.fail("publish to %s: key %q went to partition %d, want %d", tp.name, msgs[i].Key, p.Partition, want)
			}
		}
		if p.Partition < 0 || int(p.Partition) >= tp.partitions {
			md.fail("publish to %s: partition %d", tp.name, p.Partition)
		}
		if p.Offset != tp.high[p.Partition] {
			md.fail("publish to %s: offset %d in partition %d, want %d", tp.name, p.Offset, p.Partition, tp.high[p.Partition])
		}
		if !p.PublishedAt.Equal(now) {
			md.fail("publish to %s: PublishedAt %s, want %s", tp.name, fmtTime(p.PublishedAt), fmtTime(now))
		}
		tp.high[p.Partition]++
	}
}

// claimed checks a claim's result against the model and records it.
func (md *model) claimed(s *mSub, p storage.DeliveriesClaimParams, res *storage.DeliveriesClaimResult, now time.Time) {
	md.t.Helper()
	what := fmt.Sprintf("claim on %s by %s (max %d, avoid %v) at %s", s.name, p.Member, p.Max, p.AvoidMember, fmtTime(now))
	pl := md.plan(s, p, now)
	deadline := time.Unix(0, pl.Deadline())
	got := map[storage.DeliveryRef]bool{}
	sawNew := false
	for _, d := range res.Deliveries {
		r := d.Ref()
		got[r] = true
		if !d.LeaseDeadline.Equal(deadline) {
			md.fail("%s: %d:%d lease deadline %s, want %s (now + ack_wait %s)", what, r.Partition, r.Offset, fmtTime(d.LeaseDeadline), fmtTime(deadline), s.topic.ackWait)
		}
		if r.Partition < 0 || int(r.Partition) >= s.topic.partitions {
			md.fail("%s: partition %d", what, r.Partition)
		}
		if d.Offset >= s.cursor[r.Partition] {
			if d.Offset != s.cursor[r.Partition] {
				md.fail("%s: new message %d:%d delivered, but %d:%d was never delivered (offset order per partition)",
					what, r.Partition, r.Offset, r.Partition, s.cursor[r.Partition])
			}
			if d.Offset >= s.topic.high[r.Partition] {
				md.fail("%s: %d:%d is above the high water %d", what, r.Partition, r.Offset, s.topic.high[r.Partition])
			}
			if d.Attempt != 1 {
				md.fail("%s: first delivery of %d:%d has attempt %d", what, r.Partition, r.Offset, d.Attempt)
			}
			s.cursor[r.Partition]++
			s.msgs[r] = &mMsg{state: stLeased, member: p.Member, attempt: 1, deadline: d.LeaseDeadline}
			sawNew = true
			continue
		}
		if sawNew {
			md.fail("%s: redelivery %d:%d after a new message in the result: redeliveries come first", what, r.Partition, r.Offset)
		}
		m := s.msgs[r]
		if m == nil {
			md.fail("%s: %d:%d is below the cursor but was never delivered", what, r.Partition, r.Offset)
		}
		if a := s.avail(r, m, pl); a == availNo {
			md.fail("%s: %d:%d delivered but not claimable: %s", what, r.Partition, r.Offset, m.describe())
		}
		switch {
		case m.uncertain && d.Attempt <= m.attempt:
			md.fail("%s: %d:%d attempt %d after a restart, last was %d", what, r.Partition, r.Offset, d.Attempt, m.attempt)
		case !m.uncertain && d.Attempt != m.attempt+1:
			md.fail("%s: %d:%d attempt %d, last was %d", what, r.Partition, r.Offset, d.Attempt, m.attempt)
		}
		*m = mMsg{state: stLeased, member: p.Member, attempt: d.Attempt, deadline: d.LeaseDeadline, failures: m.failures}
	}

	// Liveness: a claim with room left delivers everything claimable; one that delivered a new
	// message delivered every claimable redelivery first.
	room := len(res.Deliveries) < p.Max
	for r, m := range s.msgs {
		if got[r] || s.avail(r, m, pl) != availYes {
			continue
		}
		if room {
			md.fail("%s: returned %d < max, but %d:%d is claimable (%s)", what, len(res.Deliveries), r.Partition, r.Offset, m.describe())
		}
		if sawNew {
			md.fail("%s: delivered a new message while redelivery %d:%d is due (%s)", what, r.Partition, r.Offset, m.describe())
		}
	}
	if room {
		for part, c := range s.cursor {
			if c < s.topic.high[part] {
				md.fail("%s: returned %d < max, but %d:%d was never delivered", what, len(res.Deliveries), part, c)
			}
		}
	}
	if !p.AvoidMember && room {
		md.checkNextDue(s, res.NextDue, now, what)
	}
}

// checkNextDue: NextDue is not after the earliest time a waiting message becomes claimable, is in
// the future, and is zero when nothing waits.
func (md *model) checkNextDue(s *mSub, next, now time.Time, what string) {
	md.t.Helper()
	var earliest time.Time
	waiting := false
	for _, m := range s.msgs {
		var at time.Time
		switch {
		case m.state != stLeased && m.state != stWaiting:
			continue
		case m.uncertain:
			waiting = true
			continue
		case m.state == stLeased:
			waiting = true
			if m.attempt >= s.topic.maxDeliveries {
				continue
			}
			at = time.Unix(0, policy.ExpiredDue(m.deadline.UnixNano(), m.attempt))
		default:
			waiting = true
			at = m.due
		}
		if at.After(now) && (earliest.IsZero() || at.Before(earliest)) {
			earliest = at
		}
	}
	switch {
	case !waiting && !next.IsZero():
		md.fail("%s: NextDue %s, want zero: nothing is leased or waiting", what, fmtTime(next))
	case !earliest.IsZero() && (next.IsZero() || next.After(earliest)):
		md.fail("%s: NextDue %s, want a time not after %s, when a waiting message becomes claimable", what, fmtTime(next), fmtTime(earliest))
	case !next.IsZero() && !next.After(now):
		md.fail("%s: NextDue %s is not in the future", what, fmtTime(next))
	}
}

func (m *mMsg) describe() string {
	states := map[mState]string{stLeased: "leased", stWaiting: "waiting", stDone: "done", stDead: "dead"}
	return fmt.Sprintf("%s member %q attempt %d deadline %s due %s uncertain %v", states[m.state], m.member, m.attempt,
		fmtTime(m.deadline), fmtTime(m.due), m.uncertain)
}

// ackPrediction says what DeliveriesAck must answer for refs.
func (md *model) ackPrediction(s *mSub, refs []storage.DeliveryRef) (acked, already int, unknown []storage.DeliveryRef) {
	for _, r := range refs {
		if r.Partition < 0 || int(r.Partition) >= s.topic.partitions || r.Offset >= s.topic.high[r.Partition] {
			unknown = append(unknown, r)
			continue
		}
		m := s.msgs[r]
		if m == nil {
			md.fail("ack prediction for never-delivered %d:%d is not modelled", r.Partition, r.Offset)
		}
		switch m.state {
		case stDone, stDead:
			already++
		default:
			acked++
		}
	}
	return acked, already, unknown
}

func (md *model) acked(s *mSub, refs []storage.DeliveryRef, res *storage.DeliveriesAckResult) {
	md.t.Helper()
	acked, already, unknown := md.ackPrediction(s, refs)
	if res.Acked != acked || res.AlreadyDone != already {
		md.fail("ack %v on %s: acked %d already done %d, want %d and %d", refs, s.name, res.Acked, res.AlreadyDone, acked, already)
	}
	if !sameRefSet(res.Unknown, unknown) {
		md.fail("ack %v on %s: unknown %v, want %v", refs, s.name, res.Unknown, unknown)
	}
	s.ackedByEngine += res.Acked
	for _, r := range refs {
		if m := s.msgs[r]; m != nil && m.state != stDead {
			m.state = stDone
		}
	}
}

// heldBy reports whether member certainly holds the lease of m at now.
func heldBy(m *mMsg, member string, now time.Time) bool {
	return m != nil && m.state == stLeased && !m.uncertain && m.member == member && now.Before(m.deadline)
}

func (md *model) nacked(s *mSub, p storage.DeliveriesNackParams, res *storage.DeliveriesNackResult, now time.Time) {
	md.t.Helper()
	var nacked, dead int
	var notHeld []storage.DeliveryRef
	for _, r := range p.Refs {
		m := s.msgs[r]
		if !heldBy(m, p.Member, now) {
			notHeld = append(notHeld, r)
			continue
		}
		if p.GiveBack != "" {
			// As if not delivered: the attempt is undone, the tag is its last member.
			nacked++
			m.state, m.due, m.attempt, m.member = stWaiting, now.Add(p.Delay), max(0, m.attempt-1), p.GiveBack
			continue
		}
		hist, rule := m.failures, storage.PoisonRule("")
		if s.topic.poison.On() {
			hist = policy.AddFailure(slices.Clone(m.failures), policy.Failure{Member: p.Member, Reason: p.Reason, At: now.UnixNano()})
			rule = policy.Poison(s.topic.poison, hist, now.UnixNano())
		}
		switch {
		case p.ToDLQ:
			dead++
			m.state, m.deadReason, m.deadAttempts, m.deadFailures = stDead, storage.DLQRejected, m.attempt, hist
		case m.attempt >= s.topic.maxDeliveries:
			dead++
			m.state, m.deadReason, m.deadAttempts, m.deadFailures = stDead, storage.DLQMaxDeliveries, m.attempt, hist
		case rule != "":
			dead++
			m.state, m.deadReason, m.deadAttempts, m.deadRule, m.deadFailures = stDead, storage.DLQPoison, m.attempt, rule, hist
		default:
			nacked++
			m.state, m.due, m.failures = stWaiting, now.Add(p.Delay), hist
		}
	}
	if res.Nacked != nacked || res.DeadLettered != dead || !sameRefSet(res.NotHeld, notHeld) {
		md.fail("nack %+v on %s: got nacked %d dead %d not held %v, want %d, %d, %v", p, s.name, res.Nacked, res.DeadLettered, res.NotHeld, nacked, dead, notHeld)
	}
}

func (md *model) extended(s *mSub, p storage.DeliveriesExtendParams, res *storage.DeliveriesExtendResult, now time.Time) {
	md.t.Helper()
	dur := p.Duration
	if dur == 0 {
		dur = s.topic.ackWait
	}
	var n int
	var notHeld []storage.DeliveryRef
	for _, r := range p.Refs {
		m := s.msgs[r]
		if !heldBy(m, p.Member, now) {
			notHeld = append(notHeld, r)
			continue
		}
		n++
		m.deadline = now.Add(dur)
	}
	if res.Extended != n || !sameRefSet(res.NotHeld, notHeld) {
		md.fail("extend %+v on %s: got extended %d not held %v, want %d, %v", p, s.name, res.Extended, res.NotHeld, n, notHeld)
	}
	if n > 0 && !res.Deadline.Equal(now.Add(dur)) {
		md.fail("extend on %s: deadline %s, want %s", s.name, fmtTime(res.Deadline), fmtTime(now.Add(dur)))
	}
}

func (md *model) released(s *mSub, member string, res *storage.DeliveriesReleaseResult, now time.Time) {
	md.t.Helper()
	var released, dead int
	exact := true
	for _, m := range s.msgs {
		if m.state != stLeased || m.member != member {
			continue
		}
		if !heldBy(m, member, now) {
			// Expired (or unknown after a restart): released now or expired with backoff; the
			// counts are not defined for it and it may come back any time.
			exact = false
			m.uncertain = true
			continue
		}
		if m.attempt >= s.topic.maxDeliveries {
			dead++
			m.state, m.deadReason, m.deadAttempts, m.deadFailures = stDead, storage.DLQMaxDeliveries, m.attempt, m.failures
			continue
		}
		released++
		m.state, m.due = stWaiting, now
	}
	if exact && (res.Released != released || res.DeadLettered != dead) {
		md.fail("release of %s on %s: released %d dead %d, want %d and %d", member, s.name, res.Released, res.DeadLettered, released, dead)
	}
	if !exact && (res.Released < released || res.DeadLettered < dead) {
		md.fail("release of %s on %s: released %d dead %d, want at least %d and %d", member, s.name, res.Released, res.DeadLettered, released, dead)
	}
}

// restarted marks what a restart leaves open.
func (md *model) restarted() {
	for _, s := range md.subs {
		for _, m := range s.msgs {
			if m.state == stLeased || m.state == stWaiting {
				m.uncertain = true
			}
		}
	}
}

// checkStats compares SubscriptionStats with the model; messages in limbo may be counted either
// as not done yet or as dead-lettered.
func (md *model) checkStats(s *mSub, st *storage.SubscriptionStats, now time.Time) {
	md.t.Helper()
	var lag, open, leased, waiting, dead, limbo int64
	for p, c := range s.cursor {
		lag += s.topic.high[p] - c
	}
	for _, m := range s.msgs {
		switch {
		case s.limbo(m, now):
			limbo++
		case m.state == stDead:
			dead++
		case m.state == stLeased:
			open++
			if !m.uncertain && now.Before(m.deadline) {
				leased++
			}
		case m.state == stWaiting:
			open++
			if !m.uncertain {
				waiting++
			}
		}
	}
	bad := st.Lag != lag ||
		st.InFlight+st.Redelivering+st.DeadLettered != open+dead+limbo ||
		st.InFlight+st.Redelivering < open || st.DeadLettered < dead ||
		st.InFlight < leased || st.Redelivering < waiting ||
		st.Pending != st.Lag+st.InFlight+st.Redelivering
	if bad {
		md.fail("stats of %s at %s: %+v; model: lag %d, open %d (leased %d, waiting %d), dead %d, limbo %d",
			s.name, fmtTime(now), *st, lag, open, leased, waiting, dead, limbo)
	}
}

// checkDLQ compares a DLQ listing with the model and settles messages in limbo that are in it.
func (md *model) checkDLQ(s *mSub, entries []*storage.DLQEntry, now time.Time, final bool) {
	md.t.Helper()
	inDLQ := map[storage.DeliveryRef]*storage.DLQEntry{}
	for _, en := range entries {
		r := storage.DeliveryRef{Partition: en.Message.Partition, Offset: en.Message.Offset}
		if inDLQ[r] != nil {
			md.fail("DLQ of %s lists %d:%d twice", s.name, r.Partition, r.Offset)
		}
		inDLQ[r] = en
	}
	for r, m := range s.msgs {
		en := inDLQ[r]
		switch {
		case m.state == stDead:
			if en == nil {
				md.fail("DLQ of %s lacks dead-lettered %d:%d", s.name, r.Partition, r.Offset)
			}
			if en.Reason != m.deadReason || en.Attempts != m.deadAttempts || en.Rule != m.deadRule {
				md.fail("DLQ entry of %s %d:%d: reason %s attempts %d rule %q, want %s, %d and %q", s.name, r.Partition, r.Offset, en.Reason, en.Attempts, en.Rule, m.deadReason, m.deadAttempts, m.deadRule)
			}
			if !sameFailures(en.Failures, m.deadFailures) {
				md.fail("DLQ entry of %s %d:%d: failures %+v, want %+v", s.name, r.Partition, r.Offset, en.Failures, m.deadFailures)
			}
		case s.limbo(m, now):
			if en != nil {
				if en.Reason != storage.DLQMaxDeliveries || en.Attempts != m.attempt {
					md.fail("DLQ entry of %s %d:%d: reason %s attempts %d, want max_deliveries and %d", s.name, r.Partition, r.Offset, en.Reason, en.Attempts, m.attempt)
				}
				m.state, m.deadReason, m.deadAttempts, m.uncertain = stDead, storage.DLQMaxDeliveries, m.attempt, false
				m.deadFailures = m.failures
			} else if final {
				md.fail("%s %d:%d reached max_deliveries and its lease expired long ago, but it is not in the DLQ (%s)", s.name, r.Partition, r.Offset, m.describe())
			}
		case en != nil:
			md.fail("DLQ of %s lists %d:%d, which the model has as %s", s.name, r.Partition, r.Offset, m.describe())
		}
	}
	for r := range inDLQ {
		if s.msgs[r] == nil {
			md.fail("DLQ of %s lists %d:%d, which was never delivered", s.name, r.Partition, r.Offset)
		}
	}
}

// replayed applies a replay of the whole DLQ.
func (md *model) replayed(s *mSub, n int, now time.Time) {
	md.t.Helper()
	want := 0
	for _, m := range s.msgs {
		if m.state == stDead {
			want++
			*m = mMsg{state: stWaiting, member: m.member, attempt: 0, due: now, avoidUnknown: true}
		}
	}
	if n != want {
		md.fail("DLQReplay of %s replayed %d, want %d", s.name, n, want)
	}
}

func sameRefSet(a, b []storage.DeliveryRef) bool {
	return slices.Equal(sortRefs(a), sortRefs(b))
}

// sameFailures compares a DLQ entry's failures with the model's history.
func sameFailures(got []storage.DeliveryFailure, want []policy.Failure) bool {
	if len(got) != len(want) {
		return false
	}
	for i, f := range want {
		if g := got[i]; g.Member != f.Member || g.Reason != f.Reason || g.At.UnixNano() != f.At {
			return false
		}
	}
	return true
}
