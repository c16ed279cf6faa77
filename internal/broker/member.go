package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/spoolmq/spool/internal/filter"
	"github.com/spoolmq/spool/internal/storage"
)

// Member is one consumer connected to this broker: the result of one Subscribe call. It is attached
// to one subscription per topic its pattern matches (the topic's queue subscription, its group's
// subscription, or an ephemeral subscription of its own) and receives the deliveries of all of them
// on one channel, limited by one credit (MaxInFlight). Every method is safe for concurrent use.
//
// It is a handle: the subscriptions' owners decide what it is given (they claim for it and put
// the deliveries in its channel); the member keeps what is its own, the credit it shares among its
// subscriptions (reserved by an owner for the length of a claim), the deliveries it holds and its
// attachments.
type Member struct {
	b *Broker
	// id is the member's key (memberKey of its principal and clientID): what the engines, the
	// assignments and the listings name it by. clientID is the id its client chose or was given.
	id       string
	clientID string

	pattern string
	group   string
	start   storage.StartPosition
	// leaseDuration overrides the topics' ack_wait in claims for this member when positive.
	leaseDuration time.Duration
	// notify, when not nil, gets a non-blocking send after deliveries were put in ch and after a
	// subscription ended under the member.
	notify chan<- struct{}
	// allow is SubscribeParams.Allow: nil, or the topics the member may be attached to.
	allow func(topic string) bool
	// mode, strategy and maxInFlightPerPartition are SubscribeParams' ordered-group settings.
	mode                    storage.SubscriptionMode
	strategy                string
	maxInFlightPerPartition int
	// batchSize is SubscribeParams.BatchSize: positive for a member of an ordered group that takes
	// per-key batches (batch.go).
	batchSize int
	// filter is SubscribeParams.Filter compiled; nil matches everything (filtered.go).
	filter *filter.Filter

	// closeOnce runs the close; closed is closed when it finished.
	closeOnce sync.Once
	closedCh  chan struct{}
	closeErr  error

	// mu guards the fields below.
	mu     sync.Mutex
	closed bool
	// maxInFlight is the member's credit (SetMaxInFlight changes it).
	maxInFlight int
	// ch has capacity at least maxInFlight (SetMaxInFlight replaces it by a larger one); credit
	// accounting guarantees a send never blocks.
	ch chan *storage.Delivery
	// ended lists the subscriptions that ended under the member, until TakeEnded.
	ended []EndedSubscription
	// refused is set once the member was told that it could not join a new topic's subscription
	// (attachFailed), which closes it.
	refused bool
	// rejoin is SubscribeParams.Rejoin until Subscribe attached the member, then 0 (rejoin.go).
	rejoin int64
	// reserved counts deliveries being claimed for this member right now.
	reserved int
	// queueLimit, when not negative, bounds the deliveries waiting in ch plus those reserved,
	// whatever the credit (SetQueueLimit): acks and expired leases free credit, not queue room.
	queueLimit int
	// waiting holds the owners that found the member without credit. Credit coming back (an ack,
	// a nack, a reservation of another owner returned unused, a larger MaxInFlight, deliveries
	// dropped by a detach) wakes them, and only them: a wildcard member on a thousand topics
	// whose every ack woke all its owners made them claim for nothing, and owners that woke
	// each other when their claims found nothing kept claiming without end.
	waiting map[*owner]struct{}
	// inflight maps the deliveries the member holds to their lease deadline.
	inflight map[leaseKey]time.Time
	// minDeadline is at most the earliest deadline in inflight (zero when empty).
	minDeadline time.Time
	// subs are the owners of the subscriptions the member is attached to. They are added only under
	// Broker.mu (see the package's lock order).
	subs map[int64]*owner
	// topics maps each attached topic to its subscription ID.
	topics map[string]int64
	// joining holds the last join queued for each attached topic: an attach that finds the
	// topic attached by another goroutine (the notifier's pass for a topic just created, and
	// Subscribe's own) waits for that join too, so that Subscribe returns once the owner has the
	// member. The attach that queued it removes it once handled (or detach does).
	joining map[string]*event
	// owned are the ephemeral subscriptions the member created and deletes when it leaves.
	owned map[int64]bool
	// delivered counts deliveries pushed to the channel (monotonic, for stats).
	delivered int64
}

// leaseKey names one delivery held by a member.
type leaseKey struct {
	sub       int64
	partition int32
	offset    int64
}

// MemberInfo describes a member for admin listings.
type MemberInfo struct {
	// ID is the member's ID.
	ID string `json:"id"`
	// Pattern is the topic name or pattern it subscribed with.
	Pattern string `json:"pattern"`
	// Group is its consumer group, empty if none.
	Group string `json:"group,omitempty"`
	// Filter is its member filter, empty if none.
	Filter string `json:"filter,omitempty"`
	// MaxInFlight is its credit.
	MaxInFlight int `json:"max_in_flight"`
	// InFlight counts the deliveries the member holds (leases not expired, not acked or nacked).
	InFlight int `json:"in_flight"`
	// Delivered counts the deliveries handed to the member since it subscribed.
	Delivered int64 `json:"delivered"`
	// SubscriptionCount is the number of subscriptions the member is attached to.
	SubscriptionCount int `json:"subscription_count"`
	// Subscriptions are the IDs of the subscriptions the member is attached to, in ID order. A
	// listing that describes a member once per subscription leaves them out (a wildcard member on
	// n topics would repeat n IDs n times): the admin API's group listings do.
	Subscriptions []int64 `json:"subscriptions,omitempty"`
}

// EndedSubscription tells a member that it was detached from one of its subscriptions for a reason
// other than its own Close: the subscription was cancelled or deleted, or its topic was deleted.
// The member stays open and keeps its other subscriptions (and joins matching topics created
// later); its leases on the ended subscription are gone. A member that could not follow a
// semantics change is told so for the subscription it was on, and then closed (moveFailed).
//
// SubscriptionID 0 tells the member that it could not join the subscription of Topic, a matching
// topic created after it subscribed, and that the broker closes it (attachFailed): it would miss
// Topic for good otherwise.
type EndedSubscription struct {
	// SubscriptionID is the subscription that ended; 0 for a topic the member could not join.
	SubscriptionID int64
	// Topic is its topic.
	Topic string
	// Err says why. It wraps storage.ErrSubscriptionNotFound (the subscription or its topic was
	// deleted) or storage.ErrSubscriptionNotActive (it was cancelled); after a failed move or
	// join, the error of the join (storage.ErrLimitExceeded, storage.ErrModeConflict, ...).
	Err error
}

// Attachment names one subscription a member is attached to.
type Attachment struct {
	SubscriptionID int64
	Topic          string
}

func newMember(b *Broker, id string, p SubscribeParams, maxInFlight int, start storage.StartPosition) *Member {
	return &Member{
		b:             b,
		id:            id,
		pattern:       p.Pattern,
		group:         p.Group,
		start:         start,
		leaseDuration: p.LeaseDuration,
		notify:        p.Notify,
		allow:         p.Allow,
		mode:          p.Mode,
		strategy:      p.Strategy,

		maxInFlightPerPartition: p.MaxInFlightPerPartition,
		batchSize:               p.BatchSize,
		rejoin:                  p.Rejoin,
		maxInFlight:             maxInFlight,
		queueLimit:              -1,
		ch:                      make(chan *storage.Delivery, maxInFlight),
		closedCh:                make(chan struct{}),
		inflight:                make(map[leaseKey]time.Time),
		subs:                    make(map[int64]*owner),
		topics:                  make(map[string]int64),
		joining:                 make(map[string]*event),
		owned:                   make(map[int64]bool),
	}
}

// ID returns the member's key, the id the engines, assignments and listings know it by: ClientID
// scoped by SubscribeParams.Principal ("id@principal", memberid.go), or ClientID itself without a
// principal.
func (m *Member) ID() string { return m.id }

// ClientID returns the member id its client sees: SubscribeParams.MemberID, or the one generated
// when it was empty.
func (m *Member) ClientID() string { return m.clientID }

// Pattern returns the topic name or pattern the member subscribed with.
func (m *Member) Pattern() string { return m.pattern }

// Group returns the member's consumer group, empty if none.
func (m *Member) Group() string { return m.group }

// SubscriptionGroup returns the group of subscription subID as the subscription names it, which
// is not always Group: storage.QueueGroup for the subscription of a QUEUE topic (whatever group
// the member gave), "$ephemeral-<id>" for the ephemeral subscription of a member without a group
// on a PUB_SUB topic. The metrics of deliveries, acks and nacks are labelled with it (folding the
// ephemeral ones into one label), as the scrape-time metrics label the subscription, so that the
// two join. When the member is not attached to subID (it was detached after the delivery was
// taken) it returns Group.
func (m *Member) SubscriptionGroup(subID int64) string {
	m.mu.Lock()
	o := m.subs[subID]
	m.mu.Unlock()
	if o == nil {
		return m.group
	}
	return o.groupName()
}

// Filter returns the member's filter as given (trimmed), empty if none.
func (m *Member) Filter() string { return m.filter.String() }

// MaxInFlight returns the member's credit: the most unacknowledged deliveries it holds at a time.
func (m *Member) MaxInFlight() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.maxInFlight
}

// LeaseDuration returns the lease of the member's deliveries; 0 means each topic's ack_wait.
func (m *Member) LeaseDuration() time.Duration { return m.leaseDuration }

// Deliveries returns the channel the member's deliveries arrive on. Its capacity is at least
// MaxInFlight, so the broker never blocks on it. It is closed when the member closes; deliveries
// still in it then are dropped and their leases released.
//
// SetMaxInFlight above the channel's capacity replaces the channel by a larger one and moves what
// the old one held; the old channel then receives nothing more and is not closed. A consumer that
// raises the credit therefore calls Deliveries again afterwards (or at every receive, as a consumer
// woken through SubscribeParams.Notify does). The channel of a batch member (BatchSize) is also
// replaced when a batch claim brings more than it can hold (batch.go): such a consumer takes its
// deliveries with Take after a Notify signal.
func (m *Member) Deliveries() <-chan *storage.Delivery {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ch
}

// Take appends to dst the deliveries waiting for the consumer, in order, without blocking, and
// returns it; open is false once the member has closed (what was waiting then is dropped, its
// leases released). It is how a connection drains its members after a SubscribeParams.Notify
// signal (binary and text sessions, HTTP pull sessions alike); unlike a receive from the channel
// of Deliveries, it always reads the current channel, also after SetMaxInFlight replaced it.
//
// Deliveries whose lease expired while they waited still take room in the channel, so taking them
// gives credit back: the owners waiting for it are woken (a receive from the channel cannot).
func (m *Member) Take(dst []*storage.Delivery) (ds []*storage.Delivery, open bool) {
	return m.take(dst, false)
}

// TakeQueued is Take for a consumer whose queue limit (SetQueueLimit) also bounds what it took
// and has not handed on yet: the limit drops by the deliveries taken (not below 0) in the same
// step, so no claim fills the room they leave before the consumer raises the limit again (after
// Take a claim may, until the consumer lowers it). Without a queue limit it is Take.
func (m *Member) TakeQueued(dst []*storage.Delivery) (ds []*storage.Delivery, open bool) {
	return m.take(dst, true)
}

func (m *Member) take(dst []*storage.Delivery, counted bool) (ds []*storage.Delivery, open bool) {
	now := m.b.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return dst, false
	}
	m.pruneLocked(now)
	// Taking frees credit when leases of waiting deliveries expired, and queue room under a
	// queue limit (unless counted).
	wake := len(m.ch) > len(m.inflight) || (m.queueLimit >= 0 && len(m.ch) > 0 && !counted)
	n := len(dst)
	for {
		select {
		case d := <-m.ch:
			dst = append(dst, d)
			continue
		default:
		}
		if counted && m.queueLimit >= 0 {
			m.queueLimit = max(0, m.queueLimit-(len(dst)-n))
		}
		if wake {
			m.returnCreditLocked(nil)
		}
		return dst, true
	}
}

// Waiting returns how many deliveries wait in the member's channel for the consumer.
func (m *Member) Waiting() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.ch)
}

// InFlight returns how many deliveries the member holds: handed to it, not acked, nacked or
// expired (MemberInfo.InFlight without the rest of Info).
func (m *Member) InFlight() int {
	now := m.b.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pruneLocked(now)
	return len(m.inflight)
}

// SetMaxInFlight changes the member's credit to n, between 0 and MaxInFlightLimit: the most
// unacknowledged deliveries it may hold at a time. Raising it wakes the member's owners. With
// 0 the member keeps its leases (it may still ack, nack and extend them) and receives nothing
// more: a server draining its connections uses it. Lowering the credit below what the member holds
// takes effect as its deliveries are settled. It fails with ErrMemberClosed after Close.
func (m *Member) SetMaxInFlight(n int) error {
	if n < 0 || n > MaxInFlightLimit {
		return invalid("max_in_flight must be between 0 and %d, got %d", MaxInFlightLimit, n)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrMemberClosed
	}
	grew := n > m.maxInFlight
	m.maxInFlight = n
	if n > cap(m.ch) {
		m.growChannelLocked(n)
	}
	m.mu.Unlock()
	if grew {
		m.creditReturned()
	}
	return nil
}

// SetQueueLimit bounds the deliveries waiting in the member's channel (and being claimed for it)
// to n, whatever its credit; n < 0 removes the bound. Unlike the credit, the bound does not grow
// when deliveries are acked or their leases expire, only when the consumer takes them: a server
// bounding the memory of a connection's queued deliveries uses it. Raising it wakes the member's
// owners. It fails with ErrMemberClosed after Close.
func (m *Member) SetQueueLimit(n int) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrMemberClosed
	}
	grew := n != m.queueLimit && (n < 0 || (m.queueLimit >= 0 && n > m.queueLimit))
	m.queueLimit = n
	m.mu.Unlock()
	if grew {
		m.creditReturned()
	}
	return nil
}

// growChannelLocked replaces the member's channel by one of capacity at least n and moves what
// the old one holds (in order). Channels cannot grow; deliver sends under m.mu, so nothing is sent
// to the old channel after this. The capacity at least doubles (up to MaxInFlightLimit unless n
// is larger: a batch past the credit), so a credit raised step by step does not reallocate at
// every step. m.mu must be held.
func (m *Member) growChannelLocked(n int) {
	ch := make(chan *storage.Delivery, max(n, min(2*cap(m.ch), MaxInFlightLimit)))
	moved := false
	for {
		select {
		case d := <-m.ch:
			ch <- d
			moved = true
			continue
		default:
		}
		break
	}
	m.ch = ch
	if moved {
		m.notifyLocked()
	}
}

// Subscriptions lists the subscriptions the member is attached to now, ordered by ID.
func (m *Member) Subscriptions() []Attachment {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Attachment, 0, len(m.subs))
	for id, s := range m.subs {
		out = append(out, Attachment{SubscriptionID: id, Topic: s.topic})
	}
	slices.SortFunc(out, func(a, b Attachment) int { return cmp.Compare(a.SubscriptionID, b.SubscriptionID) })
	return out
}

// AttachedTo reports whether the member is attached to subscription subID now.
func (m *Member) AttachedTo(subID int64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.subs[subID]
	return ok
}

// TakeEnded returns the subscriptions that ended under the member since the last call (see
// EndedSubscription) and forgets them. A consumer woken through SubscribeParams.Notify calls it.
func (m *Member) TakeEnded() []EndedSubscription {
	m.mu.Lock()
	defer m.mu.Unlock()
	ended := m.ended
	m.ended = nil
	return ended
}

// endedLocked records that the member was detached from o's subscription for reason and notifies
// the consumer. m.mu must be held.
func (m *Member) endedLocked(o *owner, reason error) {
	if m.closed {
		return
	}
	m.ended = append(m.ended, EndedSubscription{SubscriptionID: o.id, Topic: o.topic, Err: reason})
	m.notifyLocked()
}

// detach removes the member's attachment to o's subscription and its accounting there: the
// deliveries of it the member holds are forgotten and those still in its channel dropped (the
// caller releases their leases, or they went with the subscription). From then on deliver drops
// what a claim in progress brings for it. A non-nil reason records that the subscription ended
// under the member (TakeEnded). It reports whether the member was attached, and whether it owned
// the subscription (an ephemeral one it created). Detaching what is not attached does nothing.
func (m *Member) detach(o *owner, reason error) (attached, owned bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.subs[o.id] != o {
		return false, false
	}
	delete(m.subs, o.id)
	if id, ok := m.topics[o.topic]; ok && id == o.id {
		delete(m.topics, o.topic)
		delete(m.joining, o.topic)
	}
	owned = m.owned[o.id]
	delete(m.owned, o.id)
	dropped := 0
	for k := range m.inflight {
		if k.sub == o.id {
			delete(m.inflight, k)
			dropped++
		}
	}
	dropped += m.purgeChannelLocked(o.id)
	if reason != nil {
		m.endedLocked(o, reason)
	}
	delete(m.waiting, o)
	if dropped > 0 && !m.closed {
		// The member has credit again: its other subscriptions may have been waiting for it.
		m.returnCreditLocked(nil)
	}
	return true, owned
}

// notifyLocked signals SubscribeParams.Notify without blocking. m.mu must be held (so that the
// consumer's drain after the signal sees what was added before it).
func (m *Member) notifyLocked() {
	if m.notify == nil {
		return
	}
	select {
	case m.notify <- struct{}{}:
	default:
	}
}

// Done is closed when the member has closed (by Close, by Stop of the broker).
func (m *Member) Done() <-chan struct{} { return m.closedCh }

// Info describes the member now.
func (m *Member) Info() MemberInfo {
	now := m.b.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pruneLocked(now)
	info := MemberInfo{
		ID:          m.id,
		Pattern:     m.pattern,
		Group:       m.group,
		Filter:      m.filter.String(),
		MaxInFlight: m.maxInFlight,
		InFlight:    len(m.inflight),
		Delivered:   m.delivered,
	}
	for id := range m.subs {
		info.Subscriptions = append(info.Subscriptions, id)
	}
	sortInt64s(info.Subscriptions)
	info.SubscriptionCount = len(info.Subscriptions)
	return info
}

// creditLocked returns how many more deliveries the member may receive now. m.mu must be held.
//
// Two bounds: the deliveries it holds (live leases) plus those being claimed must not exceed
// maxInFlight, and the channel must have room for those being claimed. A delivery whose lease
// expired no longer counts as held (the engine may give it to another member) but may still sit
// in the channel; hence the max of the two.
func (m *Member) creditLocked(now time.Time) int {
	if m.closed {
		return 0
	}
	m.pruneLocked(now)
	used := max(len(m.inflight), len(m.ch))
	k := max(0, m.maxInFlight-m.reserved-used)
	if m.queueLimit >= 0 {
		k = min(k, max(0, m.queueLimit-m.reserved-len(m.ch)))
	}
	return k
}

// pruneLocked forgets deliveries whose lease expired. m.mu must be held.
func (m *Member) pruneLocked(now time.Time) {
	if m.minDeadline.IsZero() || now.Before(m.minDeadline) {
		return
	}
	var next time.Time
	for k, deadline := range m.inflight {
		if !now.Before(deadline) {
			delete(m.inflight, k)
			continue
		}
		if next.IsZero() || deadline.Before(next) {
			next = deadline
		}
	}
	m.minDeadline = next
}

// credit returns creditLocked under m.mu.
func (m *Member) credit(now time.Time) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.creditLocked(now)
}

// reserve reserves all the member's credit for a claim of o and returns it. Finding none makes o
// wait for the member's credit: credit coming back wakes it.
func (m *Member) reserve(now time.Time, o *owner) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := m.creditLocked(now)
	if k == 0 && !m.closed {
		if m.waiting == nil {
			m.waiting = map[*owner]struct{}{}
		}
		m.waiting[o] = struct{}{}
	}
	m.reserved += k
	return k
}

// unreserve gives back a reservation after a failed claim.
func (m *Member) unreserve(k int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reserved -= k
	m.returnCreditLocked(nil)
}

// returnCreditLocked wakes the owners that found the member without credit (other than from,
// which is dispatching for it right now): the member may take their messages now. m.mu must be
// held.
func (m *Member) returnCreditLocked(from *owner) {
	for o := range m.waiting {
		if o != from {
			o.wakeUp()
		}
	}
	clear(m.waiting)
}

// deliver hands claimed deliveries of o's subscription to the member and ends the reservation of
// k. If the member closed or left the subscription meanwhile, the deliveries are dropped: their
// leases are released by Close or Leave (or vanished with the subscription).
func (m *Member) deliver(o *owner, ds []*storage.Delivery, k int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reserved -= k
	if m.closed {
		return
	}
	if m.subs[o.id] != o {
		m.returnCreditLocked(o)
		return
	}
	if len(ds) < k {
		m.returnCreditLocked(o)
	}
	if need := len(m.ch) + len(ds); need > cap(m.ch) {
		// A batch claim may bring more than the reservation (batch.go): the channel grows so that
		// the batch is never cut, as SetMaxInFlight makes it grow.
		m.growChannelLocked(need)
	}
	for _, d := range ds {
		key := leaseKey{sub: o.id, partition: d.Partition, offset: d.Offset}
		select {
		case m.ch <- d:
			m.inflight[key] = d.LeaseDeadline
			if m.minDeadline.IsZero() || d.LeaseDeadline.Before(m.minDeadline) {
				m.minDeadline = d.LeaseDeadline
			}
			m.delivered++
		default:
			// Unreachable by the credit accounting; if it ever happens the lease expires and the
			// message is redelivered.
			m.b.logger.Error("deliveries channel full, dropping delivery",
				slog.String("member", m.id), slog.Int64("subscription", o.id),
				slog.Int("partition", int(d.Partition)), slog.Int64("offset", d.Offset))
		}
	}
	if len(ds) > 0 {
		m.notifyLocked()
	}
}

// purgeChannelLocked removes the deliveries of subscription subID from the channel, keeping the
// order of the others: the consumer has not seen them, and their leases are released or gone with
// the subscription. It returns how many it removed. m.mu must be held (so deliver cannot send
// meanwhile; the consumer may receive).
func (m *Member) purgeChannelLocked(subID int64) int {
	n := len(m.ch)
	if n == 0 || m.closed {
		return 0
	}
	keep := make([]*storage.Delivery, 0, n)
	taken := 0
	for range n {
		select {
		case d := <-m.ch:
			taken++
			if d.SubscriptionID != subID {
				keep = append(keep, d)
			}
			continue
		default:
		}
		break
	}
	for _, d := range keep {
		select {
		case m.ch <- d:
		default: // unreachable: at most as many as were taken out
		}
	}
	return taken - len(keep)
}

// nextExpiry returns the earliest lease deadline of the member's deliveries after now, zero if
// none.
func (m *Member) nextExpiry(now time.Time) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pruneLocked(now)
	return m.minDeadline
}

// forget drops deliveries from the member's accounting and returns how many it held.
func (m *Member) forget(subID int64, refs []storage.DeliveryRef) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, r := range refs {
		key := leaseKey{sub: subID, partition: r.Partition, offset: r.Offset}
		if _, ok := m.inflight[key]; ok {
			delete(m.inflight, key)
			n++
		}
	}
	return n
}

// creditReturned wakes the owners that wait for the member's credit (it gained some).
func (m *Member) creditReturned() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.returnCreditLocked(nil)
}

// checkSub returns an error unless the member is open and attached to subscription subID.
func (m *Member) checkSub(subID int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrMemberClosed
	}
	if _, ok := m.subs[subID]; !ok {
		return fmt.Errorf("%w: member %q is not attached to subscription %d", storage.ErrSubscriptionNotFound, m.id, subID)
	}
	return nil
}

func validateRefs(refs []storage.DeliveryRef) error {
	for _, r := range refs {
		if r.Partition < 0 || r.Offset < 0 {
			return invalid("delivery ref %d:%d: partition and offset must not be negative", r.Partition, r.Offset)
		}
	}
	return nil
}

// Ack completes deliveries of subscription subID (the Delivery.SubscriptionID). Acks are durable
// when Ack returns and idempotent. The member's credit grows by the acked deliveries. Refs the
// engine does not know (above the high-water mark) make Ack return an error wrapping
// storage.ErrInvalidArgument after the others were acked.
func (m *Member) Ack(ctx context.Context, subID int64, refs ...storage.DeliveryRef) error {
	if len(refs) == 0 {
		return nil
	}
	if err := validateRefs(refs); err != nil {
		return err
	}
	if err := m.checkSub(subID); err != nil {
		return err
	}
	res, err := m.b.ack(ctx, subID, m.id, 0, refs)
	if err != nil {
		return err
	}
	if len(res.Unknown) > 0 {
		return invalid("ack on subscription %d: %d of %d refs name no message (first %d:%d)",
			subID, len(res.Unknown), len(refs), res.Unknown[0].Partition, res.Unknown[0].Offset)
	}
	return nil
}

// AckBatch completes deliveries of subscription subID on behalf of member (any member of the
// subscription may ack, also one that left or whose lease expired: a connection acks deliveries of
// a handle it closed) and returns the engine's counts; refs the engine does not know are listed in
// the result's Unknown, not returned as an error. Acks are durable when AckBatch returns and
// idempotent. The credit of whichever member of this broker held the deliveries grows by them.
// Errors: storage.ErrInvalidArgument for a negative partition or offset (nothing acked),
// storage.ErrSubscriptionNotFound, the engine's errors.
func (b *Broker) AckBatch(ctx context.Context, subID int64, member string, refs []storage.DeliveryRef) (*storage.DeliveriesAckResult, error) {
	return b.AckBatchGen(ctx, subID, member, 0, refs)
}

// AckBatchGen is AckBatch for deliveries of generation gen (Delivery.Generation) of an ORDERED
// subscription: it fails with storage.ErrStaleGeneration, acking nothing, unless member owns
// every ref's partition since gen. 0 means the generation this broker knows as current (text and
// HTTP sessions, which do not carry one). Shared subscriptions ignore it.
func (b *Broker) AckBatchGen(ctx context.Context, subID int64, member string, gen int64, refs []storage.DeliveryRef) (*storage.DeliveriesAckResult, error) {
	if err := b.checkRunning(); err != nil {
		return nil, err
	}
	if len(refs) == 0 {
		return &storage.DeliveriesAckResult{}, nil
	}
	if err := validateRefs(refs); err != nil {
		return nil, err
	}
	return b.ack(ctx, subID, member, gen, refs)
}

// currentGen returns gen, or when it is 0 and m is an ordered member the generation of
// subscription subID's assignment as its owner here last published (0 without an owner here).
// Shared members do not look: their hot path is unchanged.
func (m *Member) currentGen(subID, gen int64) int64 {
	if gen != 0 || m.mode != storage.ModeOrdered {
		return gen
	}
	b := m.b
	b.mu.RLock()
	o := b.subs[subID]
	b.mu.RUnlock()
	return o.generation()
}

// ack acks refs in the engine, then gives the credit back to the members of this broker that held
// them and wakes their owners.
func (b *Broker) ack(ctx context.Context, subID int64, member string, gen int64, refs []storage.DeliveryRef) (*storage.DeliveriesAckResult, error) {
	b.mu.RLock()
	s := b.subs[subID]
	b.mu.RUnlock()
	if gen == 0 {
		gen = s.generation() // 0 for a shared subscription
	}
	start := b.trace.now()
	// Only ordered subscriptions have batch members: shared acks skip the look-up.
	batch := s != nil && s.ord != nil && b.batchSettle(subID, member)
	res, err := b.engine.DeliveriesAck(ctx, &storage.DeliveriesAckParams{
		SubscriptionID: subID, Member: member, Generation: gen, Refs: refs, Batch: batch,
	})
	if took, slow := b.trace.isSlow(start); slow {
		b.trace.logSlow(ctx, "ack", took, slog.Int64("subscription", subID), slog.Int("refs", len(refs)))
	}
	if err != nil {
		return nil, fmt.Errorf("broker: ack on subscription %d: %w", subID, err)
	}
	b.trace.settled(ctx, "acked", subID, member, refs)
	b.countSettled(subID, res.Acked, 0, 0)
	if s == nil {
		// Attached since the lookup above (its first member joined meanwhile).
		b.mu.RLock()
		s = b.subs[subID]
		b.mu.RUnlock()
	}
	var holders []*Member
	if s != nil {
		holders = s.viewMembers()
	}
	for _, h := range holders {
		if h.forget(subID, refs) > 0 {
			h.creditReturned()
		}
	}
	if s != nil {
		// Also when no member here held them (their leases had expired): credit freed by a
		// consumer receiving expired deliveries from its channel is noticed now.
		s.wakeUp()
	}
	return res, nil
}

// NackOptions says what happens to nacked deliveries.
type NackOptions struct {
	// Delay before the messages are available again; 0 means at once (to a different member of the
	// subscription when one has credit).
	Delay time.Duration
	// ToDLQ dead-letters the messages at once.
	ToDLQ bool
	// Reason is recorded as the DLQ entry's last error.
	Reason string
}

// Nack gives deliveries of subscription subID back: available again after opts.Delay, or
// dead-lettered with opts.ToDLQ or when this was their max_deliveries-th delivery. The member's
// credit grows by them. Refs the member does not hold (their lease expired) make Nack return an
// error wrapping storage.ErrLeaseNotHeld after the others were nacked.
func (m *Member) Nack(ctx context.Context, subID int64, refs []storage.DeliveryRef, opts NackOptions) error {
	if len(refs) == 0 {
		return nil
	}
	res, err := m.NackBatch(ctx, subID, refs, opts)
	if err != nil {
		return err
	}
	if len(res.NotHeld) > 0 {
		return fmt.Errorf("broker: nack on subscription %d: %d of %d refs (first %d:%d): %w",
			subID, len(res.NotHeld), len(refs), res.NotHeld[0].Partition, res.NotHeld[0].Offset, storage.ErrLeaseNotHeld)
	}
	return nil
}

// NackBatch is Nack that returns the engine's counts: refs the member does not hold are listed in
// the result's NotHeld instead of making the call fail.
func (m *Member) NackBatch(ctx context.Context, subID int64, refs []storage.DeliveryRef, opts NackOptions) (*storage.DeliveriesNackResult, error) {
	return m.NackBatchGen(ctx, subID, 0, refs, opts)
}

// NackBatchGen is NackBatch for deliveries of generation gen of an ORDERED subscription (see
// Broker.AckBatchGen; storage.ErrStaleGeneration when the member lost a ref's partition).
func (m *Member) NackBatchGen(ctx context.Context, subID, gen int64, refs []storage.DeliveryRef, opts NackOptions) (*storage.DeliveriesNackResult, error) {
	if len(refs) == 0 {
		return &storage.DeliveriesNackResult{}, nil
	}
	if opts.Delay < 0 {
		return nil, invalid("nack delay must not be negative, got %s", opts.Delay)
	}
	if err := validateRefs(refs); err != nil {
		return nil, err
	}
	if err := m.checkSub(subID); err != nil {
		return nil, err
	}
	start := m.b.trace.now()
	res, err := m.b.engine.DeliveriesNack(ctx, &storage.DeliveriesNackParams{
		SubscriptionID: subID, Member: m.id, Generation: m.currentGen(subID, gen), Refs: refs,
		Delay: opts.Delay, ToDLQ: opts.ToDLQ, Reason: opts.Reason, Batch: m.batchSize > 0,
	})
	if took, slow := m.b.trace.isSlow(start); slow {
		m.b.trace.logSlow(ctx, "nack", took, slog.Int64("subscription", subID), slog.Int("refs", len(refs)))
	}
	if err != nil {
		return nil, fmt.Errorf("broker: nack on subscription %d: %w", subID, err)
	}
	m.b.trace.settled(ctx, "nacked", subID, m.id, refs, slog.Bool("to_dlq", opts.ToDLQ))
	m.b.countSettled(subID, 0, res.Nacked+res.DeadLettered, 0)
	m.forget(subID, refs)
	m.creditReturned()
	// The nacked messages may be claimable again at once (by this member or another).
	m.b.wakeSubscription(subID)
	return res, nil
}

// Extend pushes the lease deadlines of deliveries of subscription subID to d from now (0: the
// topic's ack_wait; at most MaxLeaseDuration) and returns the new deadline. Refs the member does not hold make Extend return
// an error wrapping storage.ErrLeaseNotHeld after the others were extended.
func (m *Member) Extend(ctx context.Context, subID int64, refs []storage.DeliveryRef, d time.Duration) (time.Time, error) {
	res, err := m.ExtendBatch(ctx, subID, refs, d)
	if err != nil {
		return time.Time{}, err
	}
	if len(res.NotHeld) > 0 {
		return res.Deadline, fmt.Errorf("broker: extend on subscription %d: %d of %d refs (first %d:%d): %w",
			subID, len(res.NotHeld), len(refs), res.NotHeld[0].Partition, res.NotHeld[0].Offset, storage.ErrLeaseNotHeld)
	}
	return res.Deadline, nil
}

// ExtendBatch is Extend that returns the engine's counts: refs the member does not hold are listed
// in the result's NotHeld instead of making the call fail.
func (m *Member) ExtendBatch(ctx context.Context, subID int64, refs []storage.DeliveryRef, d time.Duration) (*storage.DeliveriesExtendResult, error) {
	return m.ExtendBatchGen(ctx, subID, 0, refs, d)
}

// ExtendBatchGen is ExtendBatch for deliveries of generation gen of an ORDERED subscription (see
// Broker.AckBatchGen; storage.ErrStaleGeneration when the member lost a ref's partition).
func (m *Member) ExtendBatchGen(ctx context.Context, subID, gen int64, refs []storage.DeliveryRef, d time.Duration) (*storage.DeliveriesExtendResult, error) {
	if len(refs) == 0 {
		return nil, invalid("extend: no delivery refs")
	}
	if err := CheckLeaseDuration("extend duration", d); err != nil {
		return nil, err
	}
	if err := validateRefs(refs); err != nil {
		return nil, err
	}
	if err := m.checkSub(subID); err != nil {
		return nil, err
	}
	res, err := m.b.engine.DeliveriesExtend(ctx, &storage.DeliveriesExtendParams{
		SubscriptionID: subID, Member: m.id, Generation: m.currentGen(subID, gen), Refs: refs, Duration: d,
	})
	if err != nil {
		return nil, fmt.Errorf("broker: extend on subscription %d: %w", subID, err)
	}
	notHeld := make(map[storage.DeliveryRef]bool, len(res.NotHeld))
	for _, r := range res.NotHeld {
		notHeld[r] = true
	}
	m.mu.Lock()
	earlier, dropped := false, false
	for _, r := range refs {
		key := leaseKey{sub: subID, partition: r.Partition, offset: r.Offset}
		if notHeld[r] {
			// The engine no longer counts it as the member's (its lease expired, or another
			// instance acked it): the credit it took is free again.
			if _, ok := m.inflight[key]; ok {
				delete(m.inflight, key)
				dropped = true
			}
			continue
		}
		// Only deliveries still accounted for are moved: one already forgotten as expired does not
		// take credit back.
		if _, ok := m.inflight[key]; ok {
			m.inflight[key] = res.Deadline
			// A shorter lease frees the member's credit sooner: minDeadline must not stay later
			// (pruneLocked looks only from it on), and the owners waiting for its credit, which
			// sleep until the earliest expiry they knew, must look again.
			if m.minDeadline.IsZero() || res.Deadline.Before(m.minDeadline) {
				m.minDeadline, earlier = res.Deadline, true
			}
		}
	}
	m.mu.Unlock()
	if earlier || dropped {
		// Like an ack, dropping refs gives credit back: the owners waiting for it must look
		// again, or they sleep until their next poll.
		m.creditReturned()
	}
	if earlier {
		// The subscription's next due time may be earlier too.
		m.b.wakeSubscription(subID)
	}
	return res, nil
}

// Close makes the member leave: it stops receiving, its leases are released (the messages go to
// the other members at once, keeping their attempt counts), deliveries still in its channel are
// dropped, the channel is closed, and its ephemeral subscriptions are deleted. Durable
// subscriptions stay: leaving is not cancelling. Close is idempotent; later calls wait for the
// first one and return nil. If ctx ends while the subscriptions' owners have not yet let the
// member go, Close returns its error: the member is closed, but its leases come back only as
// they expire and its ephemeral subscriptions are not deleted (they go DEAD once
// their heartbeats stop).
func (m *Member) Close(ctx context.Context) error {
	_, err := m.Leave(ctx)
	return err
}

// Leave is Close that also reports how many leases it gave back to the subscriptions (the engine's
// count, including deliveries still in the channel; 0 for an ephemeral subscription, which is
// deleted). Later calls wait for the first one and return 0 and nil.
func (m *Member) Leave(ctx context.Context) (released int, err error) {
	first := false
	m.closeOnce.Do(func() {
		first = true
		released, m.closeErr = m.doClose(ctx)
		close(m.closedCh)
	})
	if first {
		return released, m.closeErr
	}
	select {
	case <-m.closedCh:
		return 0, nil
	case <-ctx.Done():
		return 0, fmt.Errorf("broker: close member %q: %w", m.id, context.Cause(ctx))
	}
}

func (m *Member) doClose(ctx context.Context) (int, error) {
	b := m.b

	// 1. Leave the broker and every subscription, in one Broker.mu section (where attach checks
	// closed and queues joins): deliver drops whatever is claimed for m from now on, no topic
	// created later attaches it, and each owner gets the leave after any join of m.
	b.mu.Lock()
	if b.members[m.id] == m {
		delete(b.members, m.id)
	}
	m.mu.Lock()
	m.closed = true
	attached := make([]*owner, 0, len(m.subs))
	for _, o := range m.subs {
		attached = append(attached, o)
	}
	m.mu.Unlock()
	owned := make(map[int64]bool)
	var leaves []*event
	for _, o := range attached {
		ev, own := b.leaveLocked(m, o)
		if own {
			owned[o.id] = true
		}
		if ev != nil {
			leaves = append(leaves, ev)
		}
	}
	b.mu.Unlock()

	// 2. Wait until each owner forgot m: no claim for m runs any more, and one that ran before was
	// dropped by deliver and is released below. When ctx ends first, m is closed all the same
	// (step 3) but gives nothing back: its leases come back as they expire.
	var waitErr error
	for _, ev := range leaves {
		select {
		case <-ev.done:
			continue
		case <-ctx.Done():
			waitErr = fmt.Errorf("broker: close member %q: waiting for its subscriptions: %w", m.id, context.Cause(ctx))
		}
		break
	}

	// 3. Drop what is still in the channel and close it.
	m.mu.Lock()
	dropped := 0
	for {
		select {
		case <-m.ch:
			dropped++
			continue
		default:
		}
		break
	}
	close(m.ch)
	m.mu.Unlock()
	if waitErr != nil {
		return 0, waitErr
	}

	// 4. Give the leases back (or delete the ephemeral subscription with them), then wake the
	// remaining members' owners so the released messages are redelivered at once.
	var errs []error
	released := 0
	for _, s := range attached {
		if owned[s.id] {
			if err := b.engine.SubscriptionDelete(ctx, s.id); err != nil && !errors.Is(err, storage.ErrSubscriptionNotFound) {
				errs = append(errs, fmt.Errorf("broker: member %q: delete ephemeral subscription %d: %w", m.id, s.id, err))
			}
			continue
		}
		res, err := b.engine.DeliveriesRelease(ctx, &storage.DeliveriesReleaseParams{SubscriptionID: s.id, Member: m.id})
		switch {
		case err == nil:
			released += res.Released
			b.reportDeadLettered(s, res.DeadLettered)
		case errors.Is(err, storage.ErrSubscriptionNotFound), errors.Is(err, storage.ErrSubscriptionNotActive):
			// Gone or cancelled: no lease left to give back.
		default:
			errs = append(errs, fmt.Errorf("broker: member %q: release leases of subscription %d: %w", m.id, s.id, err))
		}
		b.wakeSubscription(s.id)
	}
	b.logger.DebugContext(ctx, "member left", slog.String("member", m.id), slog.String("pattern", m.pattern),
		slog.String("group", m.group), slog.Int("subscriptions", len(attached)),
		slog.Int("released", released), slog.Int("dropped_from_channel", dropped))
	return released, errors.Join(errs...)
}
