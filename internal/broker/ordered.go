package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/policy"
)

// Ordered groups (issue 17 item 3), the broker's part. The owner of an ORDERED subscription keeps
// its partition assignment: a join or a leave schedules a rebalance, debounced by
// Config.RebalanceDelay so that a burst of joins and leaves (a deploy, a crash loop) makes one;
// rebalances run on the owner's goroutine, so they are serialized, and what comes in during one
// waits in the inbox for the next. A rebalance reads the engine's assignment, computes the next
// one with policy.Assign over the live members and stores it with Engine.SubscriptionAssign from
// the generation it read (compare-and-set): when another broker instance won, it reads again.
// Claims carry the generation; a claim refused with storage.ErrStaleGeneration (another instance
// rebalanced) makes the owner read the assignment again and adopt it, or rebalance when it does
// not fit its members.
//
// Which members are live: this instance's attached members, and, with Config.SharedEngine (several
// instances on one PostgreSQL database), the members the current assignment lists that did not
// leave this instance and whose liveness record in the engine has not expired (they are other
// instances' members: each instance removes its own when they leave, and renews the liveness of
// those attached, Engine.SubscriptionMembersRenew, every third of Config.MemberTimeout in
// livenessLoop and before each rebalance, so that a member is recorded before any assignment
// lists it). When an instance dies its members expire after MemberTimeout; the next renewal of a
// surviving instance with members in the group sees them listed but not live and makes its owner
// rebalance without them (evExpired), a compare-and-set like any other. Should the instance come
// back (it was only cut off), its next claim fails STALE_GENERATION and its owner rebalances its
// members in again. Without SharedEngine (the embedded engine, one instance by nature), only this
// instance's members are live, so the assignment left by a crash or a restart is replaced at the
// first rebalance.

// DefaultRebalanceDelay is the default Config.RebalanceDelay.
const DefaultRebalanceDelay = 100 * time.Millisecond

// DefaultMemberTimeout is the default Config.MemberTimeout: the member session timeout of
// BRIEF.md section 5.
const DefaultMemberTimeout = 30 * time.Second

// maxAssignRetries bounds the compare-and-set attempts of one rebalance.
const maxAssignRetries = 8

// RebalanceInfo describes one rebalance this broker stored (Config.OnRebalance).
type RebalanceInfo struct {
	SubscriptionID int64
	Topic, Group   string
	Generation     int64
	Took           time.Duration
}

// ordered is an owner's state for an ORDERED subscription; only the owner's goroutine writes it,
// except view (published for readers).
type ordered struct {
	// assign is the assignment the owner claims with (nil until read).
	assign *storage.Assignment
	// view is assign as last published.
	view atomic.Pointer[storage.Assignment]
	// due is when the scheduled rebalance runs (zero: none scheduled).
	due time.Time
	// force makes the next rebalance compute and store an assignment even when the current one
	// fits (an admin trigger); strategy, when not empty, is the new strategy.
	force    bool
	strategy string
	// dropForeign makes the next rebalance ignore members of other instances.
	dropForeign bool
	// departed are members that left this instance since the last stored assignment.
	departed map[string]bool
	// waiters are closed after the next rebalance (admin triggers wait for it).
	waiters []chan struct{}
}

// schedule asks for a rebalance after delay (an earlier schedule stands: joins and leaves within
// one window coalesce).
func (s *ordered) schedule(now time.Time, delay time.Duration) {
	if s.due.IsZero() {
		s.due = now.Add(delay)
	}
}

// orderedEvent updates the ordered state for an inbox event.
func (o *owner) orderedEvent(ev *event) {
	s := o.ord
	now := time.Now()
	switch ev.kind {
	case evJoin:
		delete(s.departed, ev.m.id)
		s.schedule(now, o.b.rebalanceDelay)
	case evLeave:
		if s.departed == nil {
			s.departed = make(map[string]bool)
		}
		s.departed[ev.m.id] = true
		s.schedule(now, o.b.rebalanceDelay)
	case evExpired:
		if s.due.IsZero() || s.due.After(now) {
			s.due = now
		}
	case evRebalance:
		s.force = true
		s.dropForeign = s.dropForeign || ev.dropForeign
		if ev.strategy != "" {
			s.strategy = ev.strategy
		}
		s.due = now
		if ev.done != nil {
			s.waiters = append(s.waiters, ev.done) // closed after the rebalance, not by handleEvents
		}
	}
}

// rebalanceDue runs the scheduled rebalance if its time came and returns how long until it is due
// (0: none scheduled or it ran).
func (o *owner) rebalanceDue() time.Duration {
	s := o.ord
	if s == nil || s.due.IsZero() {
		return 0
	}
	if d := time.Until(s.due); d > 0 {
		return d
	}
	o.rebalance()
	return 0
}

// rebalance reads the assignment and stores the next one if it does not fit the live members (or
// an admin asked for one); it adopts the result. On an engine error it tries again a poll
// interval later.
func (o *owner) rebalance() {
	s, b := o.ord, o.b
	start := time.Now()
	ctx := b.rootCtx
	var err error
	for range maxAssignRetries {
		var cur *storage.Assignment
		var stored bool
		cur, stored, err = o.assignOnce(ctx)
		if errors.Is(err, storage.ErrStaleGeneration) {
			continue // another instance stored one meanwhile: look again
		}
		if err != nil {
			break
		}
		s.due, s.force, s.strategy, s.dropForeign = time.Time{}, false, "", false
		o.adopt(cur)
		// Who left here and is not in the assignment in force is out for good (a later member
		// with its name, here or on another instance, is a new one).
		for m := range s.departed {
			if _, ok := cur.Members[m]; !ok {
				delete(s.departed, m)
			}
		}
		if stored {
			took := time.Since(start)
			b.logger.Info("ordered group rebalanced", slog.Int64("subscription", o.id), slog.String("topic", o.topic),
				slog.Int64("generation", cur.Generation), slog.Int("members", len(cur.Members)), slog.Duration("took", took))
			if b.onRebalance != nil {
				b.onRebalance(RebalanceInfo{SubscriptionID: o.id, Topic: o.topic, Group: o.groupName(), Generation: cur.Generation, Took: took})
			}
		}
		for _, w := range s.waiters {
			close(w)
		}
		s.waiters = nil
		return
	}
	if err == nil {
		err = fmt.Errorf("%w: the assignment kept changing (%d attempts)", storage.ErrStaleGeneration, maxAssignRetries)
	}
	switch {
	case errors.Is(err, storage.ErrSubscriptionNotFound), errors.Is(err, storage.ErrSubscriptionNotActive):
		// Deleted, or not active (cancelled elsewhere perhaps): the next pass reads the
		// subscription and ends the owner if so, also before any assignment.
		o.checkState = true
	case errors.Is(err, storage.ErrClosed), ctx.Err() != nil:
		// The broker is stopping.
	default:
		b.logger.Warn("ordered group rebalance failed", slog.Int64("subscription", o.id), slog.String("topic", o.topic), slog.Any("error", err))
	}
	s.due = time.Now().Add(b.pollInterval)
}

// assignOnce reads the assignment and, unless it fits, stores the next one from its generation.
// It returns the assignment in force and whether this call stored it.
func (o *owner) assignOnce(ctx context.Context) (*storage.Assignment, bool, error) {
	s, b := o.ord, o.b
	var live map[string]bool
	if b.sharedEngine {
		// Renew this instance's members first: an assignment must never list a member that other
		// instances could find expired.
		var err error
		if live, err = b.renewOwn(ctx, o); err != nil {
			return nil, false, err
		}
	}
	cur, err := b.engine.SubscriptionAssignment(ctx, o.id)
	if err != nil {
		return nil, false, err
	}
	t, err := b.engine.TopicGet(ctx, o.topic)
	if err != nil {
		return nil, false, err
	}
	n := t.Config.Partitions
	members := o.liveMembers(cur, live)
	if !s.force && fits(cur, members, n) {
		return cur, false, nil
	}
	if gone := expiredMembers(cur, members, s.departed); len(gone) > 0 && !s.dropForeign {
		b.logger.Warn("ordered group members expired: their broker instance stopped renewing them, their partitions move",
			slog.Int64("subscription", o.id), slog.String("topic", o.topic), slog.String("group", o.groupName()),
			slog.Any("members", gone), slog.Duration("member_timeout", b.memberTimeout))
	}
	strategy := cur.Strategy
	if s.strategy != "" {
		strategy = s.strategy
	}
	next, err := policy.Assign(strategy, members, n, cur.Members)
	if err != nil {
		return nil, false, err
	}
	res, err := b.engine.SubscriptionAssign(ctx, &storage.SubscriptionAssignParams{
		SubscriptionID: o.id, Generation: cur.Generation, Members: next, Strategy: s.strategy,
	})
	if err != nil {
		return nil, false, err
	}
	b.reportDeadLettered(o, res.DeadLettered)
	return res.Assignment, true, nil
}

// liveMembers lists the members the assignment must cover, sorted: this instance's, and with a
// shared engine those of other instances listed in cur and live (see the comment at the top).
func (o *owner) liveMembers(cur *storage.Assignment, live map[string]bool) []string {
	s := o.ord
	set := make(map[string]bool, len(o.members))
	for _, m := range o.members {
		set[m.id] = true
	}
	if o.b.sharedEngine && !s.dropForeign && cur != nil {
		for m := range cur.Members {
			if !s.departed[m] && live[m] {
				set[m] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// expiredMembers lists the members of cur that members leaves out but did not leave this
// instance: other instances' members found expired (or dropped by an admin), sorted.
func expiredMembers(cur *storage.Assignment, members []string, departed map[string]bool) []string {
	var out []string
	for m := range cur.Members {
		if !departed[m] && !slices.Contains(members, m) {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return out
}

// renewOwn renews the liveness of o's members on this instance and returns the live members of
// o's subscription (Engine.SubscriptionMembersRenew).
func (b *Broker) renewOwn(ctx context.Context, o *owner) (map[string]bool, error) {
	refs := make([]storage.MemberRef, 0, len(o.members))
	for _, m := range o.members {
		refs = append(refs, storage.MemberRef{SubscriptionID: o.id, Member: m.id})
	}
	res, err := b.engine.SubscriptionMembersRenew(ctx, &storage.SubscriptionMembersRenewParams{
		Members: refs, Subscriptions: []int64{o.id}, TTL: b.memberTimeout, Instance: b.instance,
	})
	if err != nil {
		return nil, err
	}
	live := make(map[string]bool, len(res.Live[o.id]))
	for _, m := range res.Live[o.id] {
		live[m] = true
	}
	return live, nil
}

// livenessLoop renews, with a shared engine, the liveness of this instance's members of ordered
// groups every third of Config.MemberTimeout until Stop (renewLiveness).
func (b *Broker) livenessLoop() {
	t := time.NewTicker(b.livenessInterval)
	defer t.Stop()
	for {
		select {
		case <-b.quit:
			return
		case <-t.C:
		}
		if err := b.renewLiveness(b.rootCtx); err != nil && !errors.Is(err, storage.ErrClosed) && b.rootCtx.Err() == nil {
			b.logger.Warn("ordered group member renewal failed", slog.Any("error", err))
		}
	}
}

// orderedMembers counts the group's members for the join bound: those attached here and, with a
// shared engine, the other instances' members listed in the assignment in force (a soft bound
// across instances: two joining at once on two instances may both pass). Broker.mu must be held.
func (o *owner) orderedMembers() int {
	n := o.attached
	a := o.ord.view.Load()
	if !o.b.sharedEngine || a == nil || n+len(a.Members) < o.b.maxOrderedMembers {
		return n // the common case: no need to tell this instance's members from the others'
	}
	own := make(map[string]bool, n)
	for _, m := range o.viewMembers() {
		own[m.id] = true
	}
	for m := range a.Members {
		if !own[m] {
			n++
		}
	}
	return n
}

// An ordered group has at most storage.MaxAssignmentMembers members on an instance (attach
// refuses more), so one renewal call always holds a group's members: renewOwn and renewLiveness
// never cut a group. This fails to compile should the bounds part.
const _ = uint(storage.MaxRenewMembers - storage.MaxAssignmentMembers)

// renewLiveness renews the liveness of the members of every ordered group with members on this
// instance, in calls of at most storage.MaxRenewMembers members, and tells the owner of each
// group whose published assignment lists a member of another instance that is no longer live
// (evExpired): it rebalances without it.
func (b *Broker) renewLiveness(ctx context.Context) error {
	b.mu.RLock()
	owners := make([]*owner, 0, len(b.subs))
	for _, o := range b.subs {
		if o.ord != nil || b.sharedEngine { // shared ones for member filters (filtered.go)
			owners = append(owners, o)
		}
	}
	b.mu.RUnlock()
	for len(owners) > 0 {
		var refs []storage.MemberRef
		var ids []int64
		k := 0
		for ; k < len(owners); k++ {
			ms := owners[k].memberRefs()
			if k > 0 && (len(refs)+len(ms) > storage.MaxRenewMembers || len(ids) == storage.MaxRenewMembers) {
				break
			}
			ids = append(ids, owners[k].id)
			// Ordered groups fit (the bound above), shared subscriptions too (attach refuses a
			// member past Broker.maxSharedMembers, storage.MaxRenewMembers): the cut never cuts.
			refs = append(refs, ms[:min(len(ms), storage.MaxRenewMembers)]...)
		}
		batch := owners[:k]
		owners = owners[k:]
		read := time.Now()
		res, err := b.engine.SubscriptionMembersRenew(ctx, &storage.SubscriptionMembersRenewParams{
			Members: refs, Subscriptions: ids, TTL: b.memberTimeout, Instance: b.instance,
		})
		if err != nil {
			return err
		}
		for _, o := range batch {
			if o.ord == nil {
				o.setOthers(res.Records[o.id], read)
				continue
			}
			a := o.ord.view.Load()
			live, ok := res.Live[o.id]
			if a == nil || !ok {
				continue
			}
			own := o.memberIDs() // sorted
			isLive := make(map[string]bool, len(live))
			for _, m := range live {
				isLive[m] = true
			}
			for m := range a.Members {
				if _, mine := slices.BinarySearch(own, m); !mine && !isLive[m] {
					o.push(&event{kind: evExpired})
					break
				}
			}
		}
	}
	return nil
}

// fits reports whether assignment a lists exactly members and gives each of the n partitions an
// owner (when there is a member).
func fits(a *storage.Assignment, members []string, n int) bool {
	if a == nil || len(a.Members) != len(members) {
		return false
	}
	for _, m := range members {
		if _, ok := a.Members[m]; !ok {
			return false
		}
	}
	if len(members) == 0 {
		return true
	}
	if len(a.Since) != n {
		return false
	}
	for _, g := range a.Since {
		if g == 0 {
			return false
		}
	}
	return true
}

// adopt makes a the assignment the owner claims with and publishes it. Members of this instance
// forget the deliveries of partitions they no longer own (the engine dropped those leases; what
// still waits in a channel is dropped, acks of what the consumer has fail STALE_GENERATION).
func (o *owner) adopt(a *storage.Assignment) {
	o.ord.assign = a
	o.ord.view.Store(a)
	for _, m := range o.members {
		m.keepPartitions(o, a.Members[m.id])
	}
}

// dispatchOrdered is dispatch for an ORDERED subscription: each member with partitions claims
// from its own (the engine knows which), with the current generation and its whole credit, in
// turn, until a round brings no full claim or events wait.
func (o *owner) dispatchOrdered(poll time.Duration) (wait time.Duration, delivered bool, end error) {
	b := o.b
	// Backfill pacing as in dispatch (backfill.go), per member among its partitions: those
	// outside their range first, then the range within the pacer's tokens. The refresh also
	// finds the subscription ended elsewhere, also before any assignment (a rebalance refused
	// as not active asks for it at once).
	if end := o.refresh(time.Now()); end != nil {
		return 0, false, end
	}
	if wait, end, idle := o.stillInactive(); idle {
		return wait, false, end
	}
	a := o.ord.assign
	if a == nil {
		if o.ord.due.IsZero() {
			o.ord.due = time.Now()
		}
		return poll, false, nil
	}
	var nextDue time.Time
	limiting := o.bf.limiting()
	var freeDone map[*Member]bool // members whose free partitions ran dry in this pass
	var paced time.Duration
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
			return 0, delivered, nil // as in dispatch
		}
		full := false
		now := b.clock.Now()
		for _, m := range o.members {
			owned := a.Members[m.id]
			if len(owned) == 0 {
				continue
			}
			var k, limit int
			if m.batchSize > 0 {
				k, limit = m.reserveBatch(now, o) // a batch may go past Max (batch.go)
			} else {
				k = m.reserve(now, o)
				limit = k
			}
			if k == 0 {
				continue
			}
			var parts []int32
			ranged := false
			if limiting {
				var hold time.Duration
				if parts, limit, ranged, hold = o.planClaim(owned, limit, freeDone[m]); parts == nil {
					if hold > 0 && (paced == 0 || hold < paced) {
						paced = hold
					}
					m.unreserve(k)
					continue
				}
			}
			claimStart := time.Now()
			res, err := b.engine.DeliveriesClaim(b.rootCtx, &storage.DeliveriesClaimParams{
				SubscriptionID: o.id, Member: m.id, Max: limit, Generation: a.Generation, LeaseDuration: m.leaseDuration, Partitions: parts,
				BatchSize: m.batchSize,
			})
			if err != nil {
				m.unreserve(k)
				if errors.Is(err, storage.ErrStaleGeneration) {
					// Another instance stored a new assignment: read it (rebalanceDue) at once.
					o.ord.due = time.Now()
					return time.Millisecond, delivered, nil
				}
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
			b.trace.delivered(m.id, o.topic, o.id, res.Deliveries)
			m.deliver(o, res.Deliveries, k)
			if len(res.Deliveries) > 0 {
				delivered = true
			}
			switch {
			case len(res.Deliveries) >= limit:
				full = true
			case limiting && !ranged && !freeDone[m]:
				if freeDone == nil {
					freeDone = map[*Member]bool{}
				}
				freeDone[m], full = true, true // the range's turn
			}
			nextDue = earliest(nextDue, res.NextDue)
		}
		if !full {
			break
		}
	}
	o.setProblem("")
	return o.passWait(nextDue, poll, paced, limiting), delivered, nil
}

// generation returns the generation of the assignment the owner last published (0: none, or not
// an ordered subscription).
func (o *owner) generation() int64 {
	if o == nil || o.ord == nil {
		return 0
	}
	if a := o.ord.view.Load(); a != nil {
		return a.Generation
	}
	return 0
}

// keepPartitions forgets the member's deliveries of o's subscription in partitions not in keep
// and drops those still in its channel; freed credit wakes the owners waiting for it.
func (m *Member) keepPartitions(o *owner, keep []int32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.subs[o.id] != o || m.closed {
		return
	}
	dropped := 0
	for k := range m.inflight {
		if k.sub == o.id && !slices.Contains(keep, k.partition) {
			delete(m.inflight, k)
			dropped++
		}
	}
	n := len(m.ch)
	kept := make([]*storage.Delivery, 0, n)
	for range n {
		select {
		case d := <-m.ch:
			if d.SubscriptionID != o.id || slices.Contains(keep, d.Partition) {
				kept = append(kept, d)
			}
			continue
		default:
		}
		break
	}
	for _, d := range kept {
		m.ch <- d // at most as many as were taken out
	}
	if dropped > 0 {
		m.returnCreditLocked(nil)
	}
}

// RebalanceParams are the parameters of Broker.RebalanceGroup.
type RebalanceParams struct {
	Topic, Group string
	// Strategy, when not empty, becomes the group's strategy (round-robin or sticky).
	Strategy string
	// DropForeign leaves out members of other broker instances (on PostgreSQL): an operator's way
	// to take the partitions of an instance that crashed. Their next requests fail
	// STALE_GENERATION and they rejoin.
	DropForeign bool
}

// RebalanceGroup runs a rebalance of an ORDERED group now (the admin trigger, or a strategy
// change) and returns the assignment in force after it. With members on this instance their
// owner runs it (serialized with the others); without, the assignment is recomputed over the
// members it lists (or none with DropForeign). A shared group is refused with ErrInvalidArgument.
func (b *Broker) RebalanceGroup(ctx context.Context, p RebalanceParams) (*storage.Assignment, error) {
	if err := b.checkRunning(); err != nil {
		return nil, err
	}
	if err := storage.CheckStrategy(p.Strategy); err != nil {
		return nil, err
	}
	sub, err := b.lookup(ctx, p.Topic, p.Group)
	if err != nil {
		return nil, err
	}
	if sub.Mode != storage.ModeOrdered {
		return nil, invalid("group %q on topic %q is not ordered", p.Group, p.Topic)
	}
	b.mu.RLock()
	o := b.subs[sub.ID]
	b.mu.RUnlock()
	if o != nil {
		ev := &event{kind: evRebalance, strategy: p.Strategy, dropForeign: p.DropForeign, done: make(chan struct{})}
		if o.push(ev) {
			select {
			case <-ev.done:
			case <-ctx.Done():
				return nil, fmt.Errorf("broker: rebalance: %w", context.Cause(ctx))
			}
			return b.engine.SubscriptionAssignment(ctx, sub.ID)
		}
	}
	// No member here: recompute over the listed members.
	for range maxAssignRetries {
		cur, err := b.engine.SubscriptionAssignment(ctx, sub.ID)
		if err != nil {
			return nil, err
		}
		t, err := b.engine.TopicGet(ctx, p.Topic)
		if err != nil {
			return nil, err
		}
		var members []string
		if !p.DropForeign {
			members = slices.Sorted(maps.Keys(cur.Members))
		}
		if b.sharedEngine && len(members) > 0 {
			// Only the live ones (this instance has none: all are other instances').
			res, err := b.engine.SubscriptionMembersRenew(ctx, &storage.SubscriptionMembersRenewParams{
				Subscriptions: []int64{sub.ID}, TTL: b.memberTimeout,
			})
			if err != nil {
				return nil, err
			}
			members = slices.DeleteFunc(members, func(m string) bool { return !slices.Contains(res.Live[sub.ID], m) })
		}
		strategy := cmpOrString(p.Strategy, cur.Strategy)
		next, err := policy.Assign(strategy, members, t.Config.Partitions, cur.Members)
		if err != nil {
			return nil, err
		}
		start := time.Now()
		res, err := b.engine.SubscriptionAssign(ctx, &storage.SubscriptionAssignParams{
			SubscriptionID: sub.ID, Generation: cur.Generation, Members: next, Strategy: p.Strategy,
		})
		if errors.Is(err, storage.ErrStaleGeneration) {
			continue
		}
		if err != nil {
			return nil, err
		}
		b.countDeadLettered(p.Topic, sub.Group, res.DeadLettered)
		if b.onRebalance != nil {
			b.onRebalance(RebalanceInfo{SubscriptionID: sub.ID, Topic: p.Topic, Group: sub.Group, Generation: res.Assignment.Generation, Took: time.Since(start)})
		}
		return res.Assignment, nil
	}
	return nil, fmt.Errorf("broker: rebalance: %w: the assignment kept changing", storage.ErrStaleGeneration)
}

// GroupAssignment returns the assignment of an ORDERED group (nil for a shared one).
func (b *Broker) GroupAssignment(ctx context.Context, topic, group string) (*storage.Assignment, error) {
	sub, err := b.lookup(ctx, topic, group)
	if err != nil {
		return nil, err
	}
	if sub.Mode != storage.ModeOrdered {
		return nil, nil
	}
	return b.engine.SubscriptionAssignment(ctx, sub.ID)
}

func cmpOrString(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
