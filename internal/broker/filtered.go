package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/spoolmq/spool/internal/filter"
	"github.com/spoolmq/spool/internal/storage"
)

// Member filters (issue 18 item 7, seed 000's "all member filters reject it: filtered").
//
// A member may subscribe with a filter over message headers (package filter). Its subscription's
// owner claims for members as always (round robin over the members with credit, Max = the
// member's credit), then routes each claimed delivery:
//   - the member it was claimed for matches it: delivered to that member;
//   - another member of the subscription here matches it: parked in the owner and handed over to
//     the first such member with credit (Engine.DeliveriesExtend with NewMember moves the lease,
//     fresh deadline, same attempt count), at once when it has credit, else when its credit
//     comes back (the owner waits for it like for a claim);
//   - no member here matches it: completed for the subscription without a delivery (acked
//     as the member it was claimed for), counted by Config.OnFiltered.
//
// Credit: a member is charged only for what it is given. The reservation of a claim is returned
// for what went elsewhere or was filtered out (Member.deliver), so a member whose filter rarely
// matches keeps claiming at full credit and a run of filtered messages never stalls the round
// robin. Parked deliveries are bounded by maxParked per subscription (a claim asks for no more
// than the room left): when that many wait for members without credit the owner stops claiming
// until those members take some (a slow member
// holds up the messages of its own filter and, past the bound, the group's claims: the price of
// routing after the claim; the engine cannot skip messages by header). A parked delivery whose
// lease runs out is dropped (the engine gives it out again after its backoff, as for any expired
// lease); one whose holder left is dropped too (the holder's release gave it back). Parking must
// not cost delivery attempts: the owner renews a parked lease (DeliveriesExtend as its holder)
// once half of it has passed, so a delivery waiting for a slow member's credit is never given out
// again, counted as an attempt and dead-lettered unseen after max_deliveries lease periods.
//
// The rule is evaluated with the members connected now: a message that no current member
// wants is done for the group, also when a member that would want it is reconnecting. Seed 000
// never marks messages filtered for a group with no member, and neither does Spool (an owner
// exists only while the subscription has members here). Ordered groups take no filters (a
// partition has one owner, who must see every message of it).
//
// Several broker instances (Config.SharedEngine, PostgreSQL): an instance knows its own
// members' filters only, so each records them in the engine with their liveness
// (Engine.SubscriptionMembersRenew: a record per member of every subscription with members here,
// naming this instance and the member's filter, "" for none, renewed every third of
// Config.MemberTimeout by livenessLoop, written when members join or leave: a join is answered,
// and Subscribe returns, only once its record is stored), and reads the live records of the
// other instances with each renewal (owner.others). A subscription takes at most
// Broker.maxSharedMembers members per instance (storage.MaxRenewMembers, what one write holds:
// attach refuses more with LIMIT_EXCEEDED), so no member goes unrecorded. A claimed message that
// no member here wants is then:
//   - given back when a live member of another instance wants it (unfiltered, or its filter
//     matches): Engine.DeliveriesNack with GiveBack addressed to one such instance (its name
//     after giveBackPrefix), which undoes the delivery's attempt (give-backs never dead-letter).
//     Every instance's claims Skip give-backs for giveBackSkip, except those addressed to it
//     (Take): the addressee (woken by the nack's notification) takes it at once, no other
//     instance passes it on (with three instances, skipping only one's own give-backs let two
//     that do not want a message trade it at database speed); past giveBackSkip any instance
//     claims it and decides again with what it knows then (the wanting member may have left);
//   - completed as filtered when no live member anywhere wants it. Before completing, an owner
//     rereads the records unless its view was read after the claim started: a member whose
//     Subscribe returned before the claim is recorded by then, so every message claimed (or
//     published) after a Subscribe returned is judged with that member, filtered or not (the
//     rule stays "the members connected now"). That costs a read per claim that has messages
//     to complete. An instance that died stops counting when its records expire
//     (MemberTimeout).
// Views are also reread when older than othersFresh, so that give-backs follow members that
// left. An unreadable view counts as "another member may want it" (give back: nothing is lost).
// See docs/ARCHITECTURE.md.

// giveBackSkip is how long the claims of instances other than its addressee pass over a give-back.
const giveBackSkip = 5 * time.Second

// othersFresh is the age past which an owner rereads the other instances' member records before
// settling messages no member here wants.
const othersFresh = time.Second

// othersView is what an owner knows of the live members of other instances: at is when it was
// read by the broker's clock (its age), read when the read started by the monotonic clock (what
// it can have missed: only records stored after that).
type othersView struct {
	at, read time.Time
	members  []otherMember
}

// otherMember is a live member of another instance; f nil matches everything.
type otherMember struct {
	id, inst string
	f        *filter.Filter
}

// maxParked bounds the deliveries an owner holds for members whose filter wants them but that
// have no credit now.
const maxParked = 256

// parkedDelivery is a delivery waiting in the owner; its lease is renewed from renewAt on.
type parkedDelivery struct {
	*storage.Delivery
	renewAt time.Time
}

// parkedAt returns d parked at now: renewed once half of its lease has passed.
func parkedAt(d *storage.Delivery, now time.Time) parkedDelivery {
	return parkedDelivery{Delivery: d, renewAt: now.Add(d.LeaseDeadline.Sub(now) / 2)}
}

// parseFilter compiles p.Filter; nil when empty. Bad text and an ordered member get an error
// wrapping storage.ErrInvalidArgument; every engine takes filters.
func (b *Broker) parseFilter(p *SubscribeParams) (*filter.Filter, error) {
	if p.Filter == "" {
		return nil, nil
	}
	f, err := filter.Parse(p.Filter)
	if err != nil {
		return nil, invalid("%v", err)
	}
	switch {
	case f == nil:
		return nil, nil
	case p.Mode == storage.ModeOrdered:
		return nil, invalid("filter: an ordered group's members take no filter (each partition has one owner, who gets all its messages)")
	}
	return f, nil
}

// refilter updates o.filtering after the membership changed.
func (o *owner) refilter() {
	o.filtering = slices.ContainsFunc(o.members, func(m *Member) bool { return m.filter != nil })
}

// wanted reports whether a member of the subscription here matches d.
func (o *owner) wanted(d *storage.Delivery) bool {
	return slices.ContainsFunc(o.members, func(m *Member) bool { return m.filter.Match(d.Headers) })
}

// route splits the deliveries of a claim made for m that started at claimed (time.Now; see the
// top of this file) and returns m's. It reports whether it completed filtered messages or gave
// messages back.
func (o *owner) route(m *Member, ds []*storage.Delivery, claimed time.Time) (mine []*storage.Delivery, filtered bool) {
	var out []*storage.Delivery
	now := o.b.clock.Now()
	for _, d := range ds {
		switch {
		case m.filter.Match(d.Headers):
			mine = append(mine, d)
		case o.wanted(d):
			o.parked = append(o.parked, parkedAt(d, now))
		default:
			out = append(out, d)
		}
	}
	return mine, o.settleUnwanted(m.id, out, claimed)
}

// settleUnwanted settles deliveries held by holder, claimed by a claim that started at claimed
// (time.Now), that no member here wants: given back when a live member of another instance
// wants them, else completed as filtered (see the top of this file). It reports whether there
// were any.
func (o *owner) settleUnwanted(holder string, ds []*storage.Delivery, claimed time.Time) bool {
	if len(ds) == 0 {
		return false
	}
	var v *othersView
	if o.b.sharedEngine {
		o.freshOthers()
		v = o.others.Load()
	}
	back, done := o.judge(v, ds)
	if len(done) > 0 && v != nil && !v.read.After(claimed) {
		// A member that joined another instance since the view was read is recorded by the
		// time its Subscribe returned: a read that starts now sees every member whose
		// Subscribe returned before the claim. A failed read (nil) knows nothing: everything
		// is given back.
		back, done = o.judge(o.readOthers(), ds)
	}
	if len(done) > 0 {
		o.completeFiltered(holder, done)
	}
	for to, refs := range back {
		o.giveBack(holder, to, refs)
	}
	return true
}

// giveBackPrefix starts the tags of give-backs (DeliveriesNackParams.GiveBack), followed by the
// addressed instance. Member IDs cannot hold ':' (names.ValidateGroup), so no member's nack or
// expiry is taken for a give-back.
const giveBackPrefix = "give-back:"

// skipTag is the Skip of this owner's claims: every give-back (shared engine), ...
func (o *owner) skipTag() string {
	if o.b.sharedEngine && o.ord == nil {
		return giveBackPrefix
	}
	return ""
}

// takeTag is the Take of this owner's claims: ... except those addressed to this instance.
func (o *owner) takeTag() string {
	if o.b.sharedEngine && o.ord == nil {
		return giveBackPrefix + o.b.instance
	}
	return ""
}

// judge splits ds, which no member here wants, by view v (nil: nothing known) into give-backs
// by addressee and completions.
func (o *owner) judge(v *othersView, ds []*storage.Delivery) (back map[string][]storage.DeliveryRef, done []storage.DeliveryRef) {
	for _, d := range ds {
		if to, ok := o.othersWant(v, d); ok {
			if back == nil {
				back = make(map[string][]storage.DeliveryRef)
			}
			back[to] = append(back[to], d.Ref())
		} else {
			done = append(done, d.Ref())
		}
	}
	return back, done
}

// othersWant reports whether, by view v, a live member of another instance may want d
// (unfiltered, or its filter matches, or nothing is known of them: v nil) and to which instance
// to address d's give-back: one of those whose member wants it, at random (so one instance
// whose wanting member has no credit does not hold d back from another's); "" when nothing is
// known.
func (o *owner) othersWant(v *othersView, d *storage.Delivery) (to string, ok bool) {
	if !o.b.sharedEngine {
		return "", false
	}
	if v == nil {
		return "", true
	}
	var insts []string
	for _, m := range v.members {
		if m.f.Match(d.Headers) && !slices.Contains(insts, m.inst) {
			insts = append(insts, m.inst)
		}
	}
	if len(insts) == 0 {
		return "", false
	}
	return insts[rand.IntN(len(insts))], true
}

// setOthers makes the live records recs, read from read on (time.Now), o's view of other
// instances' members unless it has a view read later (renewals run beside the owner), and
// returns the view it keeps.
func (o *owner) setOthers(recs []storage.MemberRecord, read time.Time) *othersView {
	v := &othersView{at: o.b.clock.Now(), read: read}
	for _, r := range recs {
		if r.Instance == o.b.instance {
			continue // ours: the owner knows its members
		}
		f, err := filter.Parse(r.Filter)
		if err != nil {
			f = nil // a filter this version cannot read: count the member as wanting everything
		}
		v.members = append(v.members, otherMember{id: r.Member, inst: r.Instance, f: f})
	}
	for {
		old := o.others.Load()
		if old != nil && old.read.After(read) {
			return old
		}
		if o.others.CompareAndSwap(old, v) {
			return v
		}
	}
}

// freshOthers rereads the other instances' member records when the view is older than
// othersFresh (readOthers). A failure keeps the view (none: other members count as wanting
// everything).
func (o *owner) freshOthers() {
	if v := o.others.Load(); v != nil && o.b.clock.Now().Sub(v.at) < othersFresh {
		return
	}
	o.readOthers()
}

// readOthers reads the other instances' member records: a renewal naming only the subscription
// (no upsert of this instance's members; livenessLoop and joins renew those). It returns the
// view read, nil when the read failed (logged; the view is kept).
func (o *owner) readOthers() *othersView {
	b := o.b
	read := time.Now()
	res, err := b.engine.SubscriptionMembersRenew(b.rootCtx, &storage.SubscriptionMembersRenewParams{
		Subscriptions: []int64{o.id}, TTL: b.memberTimeout, Instance: b.instance,
	})
	if err != nil {
		if !errors.Is(err, storage.ErrClosed) && b.rootCtx.Err() == nil {
			b.logger.Warn("reading member filters failed", slog.Int64("subscription", o.id), slog.String("topic", o.topic), slog.Any("error", err))
		}
		return nil
	}
	return o.setOthers(res.Records[o.id], read)
}

// recordMembers writes, with a shared engine, the records of the members of joins that are
// still members (Engine.SubscriptionMembersRenew: the member with its filter), forgets those of
// left, and reads the other instances' records; it returns the write's error. Records of the
// other members here are renewed by livenessLoop. The owner has at most
// Broker.maxSharedMembers members (storage.MaxRenewMembers), so one write holds its joins and
// its leaves. Ordered groups keep their own renewals (ordered.go).
func (o *owner) recordMembers(joins []*event, left []string) error {
	var ms []*Member
	for _, ev := range joins {
		if slices.Contains(o.members, ev.m) { // not gone again in the same batch
			ms = append(ms, ev.m)
		}
	}
	return o.writeRecords(ms, left)
}

// recordAll writes the records of every member here (after a failed write).
func (o *owner) recordAll() error { return o.writeRecords(o.members, nil) }

// writeRecords records members ms of o's subscription and forgets those that left (not back).
func (o *owner) writeRecords(ms []*Member, left []string) error {
	b := o.b
	if !b.sharedEngine || o.ord != nil {
		return nil
	}
	refs := make([]storage.MemberRef, 0, len(ms))
	for _, m := range ms {
		refs = append(refs, storage.MemberRef{SubscriptionID: o.id, Member: m.id, Filter: m.filter.String()})
	}
	var forget []storage.MemberRef
	for _, id := range left {
		if !slices.ContainsFunc(o.members, func(m *Member) bool { return m.id == id }) { // not back again
			forget = append(forget, storage.MemberRef{SubscriptionID: o.id, Member: id})
		}
	}
	read := time.Now()
	res, err := b.engine.SubscriptionMembersRenew(b.rootCtx, &storage.SubscriptionMembersRenewParams{
		Members: refs, Forget: forget, Subscriptions: []int64{o.id}, TTL: b.memberTimeout, Instance: b.instance,
	})
	if err != nil {
		if !errors.Is(err, storage.ErrClosed) && b.rootCtx.Err() == nil {
			b.logger.Warn("recording member filters failed", slog.Int64("subscription", o.id), slog.String("topic", o.topic), slog.Any("error", err))
		}
		return fmt.Errorf("record the member for the other broker instances: %w", err)
	}
	o.setOthers(res.Records[o.id], read)
	return nil
}

// memberRefs lists o's members as last published, with their filters, sorted by ID (the
// liveness renewal's records, ordered.go).
func (o *owner) memberRefs() []storage.MemberRef {
	ms := o.viewMembers()
	refs := make([]storage.MemberRef, len(ms))
	for i, m := range ms {
		refs[i] = storage.MemberRef{SubscriptionID: o.id, Member: m.id, Filter: m.filter.String()}
	}
	slices.SortFunc(refs, func(a, b storage.MemberRef) int { return strings.Compare(a.Member, b.Member) })
	return refs
}

// giveBack gives refs, leased to holder, back to instance to (whose members want them) without
// counting the delivery (DeliveriesNackParams.GiveBack). A failure is logged: the leases then
// expire and the messages are routed again.
func (o *owner) giveBack(holder, to string, refs []storage.DeliveryRef) {
	b := o.b
	_, err := b.engine.DeliveriesNack(b.rootCtx, &storage.DeliveriesNackParams{
		SubscriptionID: o.id, Member: holder, Refs: refs, GiveBack: giveBackPrefix + to,
	})
	if err != nil {
		if !errors.Is(err, storage.ErrClosed) && b.rootCtx.Err() == nil {
			b.logger.Warn("giving filtered messages back failed", slog.Int64("subscription", o.id), slog.String("topic", o.topic),
				slog.Int("messages", len(refs)), slog.Any("error", err))
		}
		return
	}
	o.givenBack.Add(int64(len(refs)))
	b.trace.settled(b.rootCtx, "given back", o.id, holder, refs)
}

// completeFiltered acks refs, leased to holder, as filtered out. A failure is logged: the
// leases then expire and the messages are routed again.
func (o *owner) completeFiltered(holder string, refs []storage.DeliveryRef) {
	b := o.b
	res, err := b.engine.DeliveriesAck(b.rootCtx, &storage.DeliveriesAckParams{SubscriptionID: o.id, Member: holder, Refs: refs})
	if err != nil {
		if !errors.Is(err, storage.ErrClosed) && b.rootCtx.Err() == nil {
			b.logger.Warn("completing filtered messages failed", slog.Int64("subscription", o.id), slog.String("topic", o.topic),
				slog.Int("messages", len(refs)), slog.Any("error", err))
		}
		return
	}
	b.trace.settled(b.rootCtx, "filtered", o.id, holder, refs)
	b.countSettled(o.id, 0, 0, res.Acked)
	if b.onFiltered != nil && res.Acked > 0 {
		b.onFiltered(o.topic, o.groupName(), res.Acked)
	}
}

// handOver gives parked deliveries to the members that want them and have credit, in
// round-robin order, after renewing the leases due for it, completing those no member wants any
// more (it left) and dropping those whose lease ran out. It reports whether it delivered or
// completed anything.
func (o *owner) handOver() (progress bool) {
	b := o.b
	now := b.clock.Now()
	o.renewParked(now)
	keep := o.parked[:0]
	var out map[string][]*storage.Delivery // by holder
	for _, d := range o.parked {
		switch {
		case !now.Before(d.LeaseDeadline):
			// The engine gives it out again after its backoff.
		case !o.wanted(d.Delivery):
			if out == nil {
				out = make(map[string][]*storage.Delivery)
			}
			out[d.Member] = append(out[d.Member], d.Delivery)
		default:
			keep = append(keep, d)
		}
	}
	clear(o.parked[len(keep):])
	o.parked = keep
	for holder, ds := range out {
		// Claimed before: a read that starts now is after the claim.
		if o.settleUnwanted(holder, ds, time.Now()) {
			progress = true
		}
	}
	n := len(o.members)
	start := 0
	if i := slices.Index(o.members, o.served); i >= 0 {
		start = i + 1
	}
	for i := 0; i < n && len(o.parked) > 0; i++ {
		c := o.members[(start+i)%n]
		if !slices.ContainsFunc(o.parked, func(d parkedDelivery) bool { return c.filter.Match(d.Headers) }) {
			continue
		}
		k := c.reserve(now, o) // none: o waits for c's credit
		if k == 0 {
			continue
		}
		var take []*storage.Delivery
		var rest []parkedDelivery
		for _, d := range o.parked {
			if len(take) < k && c.filter.Match(d.Headers) {
				take = append(take, d.Delivery)
			} else {
				rest = append(rest, d)
			}
		}
		o.parked = rest
		given := o.transfer(c, take)
		b.trace.delivered(c.id, o.topic, o.id, given)
		c.deliver(o, given, k)
		if len(given) > 0 {
			progress = true
			o.served = c
		}
	}
	return progress
}

// renewParked extends, as their holders, the leases of the parked deliveries due for renewal (see
// the top of this file). One the holder no longer holds is dropped; after a failure the lease is
// tried again at the next pass and dropped when it runs out.
func (o *owner) renewParked(now time.Time) {
	b := o.b
	var due map[string][]storage.DeliveryRef // by holder
	for _, d := range o.parked {
		if !now.Before(d.renewAt) && now.Before(d.LeaseDeadline) {
			if due == nil {
				due = make(map[string][]storage.DeliveryRef)
			}
			due[d.Member] = append(due[d.Member], d.Ref())
		}
	}
	for holder, refs := range due {
		var dur time.Duration // 0: the topic's ack_wait
		if i := slices.IndexFunc(o.members, func(m *Member) bool { return m.id == holder }); i >= 0 {
			dur = o.members[i].leaseDuration
		}
		res, err := b.engine.DeliveriesExtend(b.rootCtx, &storage.DeliveriesExtendParams{
			SubscriptionID: o.id, Member: holder, Refs: refs, Duration: dur,
		})
		if err != nil {
			if !errors.Is(err, storage.ErrClosed) && b.rootCtx.Err() == nil {
				b.logger.Warn("renewing parked deliveries failed", slog.Int64("subscription", o.id), slog.String("topic", o.topic),
					slog.String("holder", holder), slog.Any("error", err))
			}
			continue
		}
		notHeld := make(map[storage.DeliveryRef]bool, len(res.NotHeld))
		for _, r := range res.NotHeld {
			notHeld[r] = true
		}
		o.parked = slices.DeleteFunc(o.parked, func(d parkedDelivery) bool { return d.Member == holder && notHeld[d.Ref()] })
		for i := range o.parked {
			d := &o.parked[i]
			if d.Member == holder && slices.Contains(refs, d.Ref()) {
				d.LeaseDeadline = res.Deadline
				*d = parkedAt(d.Delivery, now)
			}
		}
	}
}

// transfer moves the leases of ds to member c (Engine.DeliveriesExtend with NewMember, c's lease
// duration from now) and returns those it moved, updated; the others' leases had run out or been
// released.
func (o *owner) transfer(c *Member, ds []*storage.Delivery) []*storage.Delivery {
	b := o.b
	byHolder := make(map[string][]*storage.Delivery)
	for _, d := range ds {
		byHolder[d.Member] = append(byHolder[d.Member], d)
	}
	moved := make(map[*storage.Delivery]bool, len(ds))
	for holder, hs := range byHolder {
		refs := make([]storage.DeliveryRef, len(hs))
		for i, d := range hs {
			refs[i] = d.Ref()
		}
		res, err := b.engine.DeliveriesExtend(b.rootCtx, &storage.DeliveriesExtendParams{
			SubscriptionID: o.id, Member: holder, NewMember: c.id, Refs: refs, Duration: c.leaseDuration,
		})
		if err != nil {
			if !errors.Is(err, storage.ErrClosed) && b.rootCtx.Err() == nil {
				b.logger.Warn("handing filtered deliveries over failed", slog.Int64("subscription", o.id), slog.String("topic", o.topic),
					slog.String("from", holder), slog.String("to", c.id), slog.Any("error", err))
			}
			continue
		}
		notHeld := make(map[storage.DeliveryRef]bool, len(res.NotHeld))
		for _, r := range res.NotHeld {
			notHeld[r] = true
		}
		for _, d := range hs {
			if !notHeld[d.Ref()] {
				d.Member, d.LeaseDeadline = c.id, res.Deadline
				moved[d] = true
			}
		}
	}
	// Keep the claim order (the engine's: redeliveries first, then by offset).
	given := make([]*storage.Delivery, 0, len(moved))
	for _, d := range ds {
		if moved[d] {
			given = append(given, d)
		}
	}
	return given
}

// dropParked forgets the parked deliveries held by member id (it left: its release gives them
// back).
func (o *owner) dropParked(id string) {
	o.parked = slices.DeleteFunc(o.parked, func(d parkedDelivery) bool { return d.Member == id })
}
