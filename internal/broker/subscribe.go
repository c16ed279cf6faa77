package broker

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
)

// SubscribeParams are the parameters of Broker.Subscribe.
type SubscribeParams struct {
	// Pattern is a topic name or a wildcard pattern ("orders.*.created", "orders.#"). Required.
	Pattern string
	// Group is the consumer group. Empty means no group: on a QUEUE topic the member shares the
	// topic's one subscription like everyone else; on a PUB_SUB topic it gets an ephemeral
	// subscription of its own that is deleted when it leaves.
	Group string
	// MemberID names the member; it must be unique among this broker's live members of its
	// principal. Empty means generated.
	MemberID string
	// Principal is the authenticated principal the member subscribes for; empty without
	// authentication. It scopes MemberID (memberid.go): the member is known to the engines and
	// listed as Member.ID, a key that no member of another principal can have, whatever id it
	// chooses, on this instance or another, while its client sees MemberID (Member.ClientID).
	Principal string
	// MaxInFlight is the member's credit (unacknowledged deliveries it may hold); 0 means
	// Config.DefaultMaxInFlight. At most MaxInFlightLimit.
	MaxInFlight int
	// Start is where a subscription this call creates starts: the group's subscription on an
	// existing PUB_SUB topic (and the Start of the group's binding for a pattern), or the member's
	// ephemeral subscription on an existing PUB_SUB topic. Ignored when joining an existing
	// subscription. Subscriptions on topics created after the call start at the topic's beginning.
	// The zero value means FROM_NOW.
	Start storage.StartPosition
	// LeaseDuration is the lease of the member's deliveries, overriding each topic's ack_wait
	// (for consumers with known slow handlers, and for text sessions that hold deliveries until
	// they ack). 0 means the topic's ack_wait; at most MaxLeaseDuration.
	LeaseDuration time.Duration
	// Notify, when not nil, receives a send that never blocks (so give it capacity 1) whenever the
	// broker put deliveries in the member's channel, moved them to a larger channel
	// (Member.SetMaxInFlight), or a subscription ended under the member (Member.TakeEnded). A
	// connection serving many members waits on one channel this way instead of on each member's.
	// Several members may share it.
	Notify chan<- struct{}
	// Allow, when not nil, says which topics matching Pattern the member may be attached to
	// (authorization: a principal's wildcard subscription binds only the topics it may consume).
	// A topic it refuses is skipped, now and when created later. It must be fast and pure.
	Allow func(topic string) bool
	// Mode is storage.ModeShared (the default) or storage.ModeOrdered: each partition is owned by
	// one member of the group at a time and delivered in offset order (ordered.go). An ordered
	// member needs a group and a topic name (no wildcard) of a PUB_SUB topic; every member of the
	// group must ask for the same mode (storage.ErrModeConflict otherwise).
	Mode storage.SubscriptionMode
	// Strategy (round-robin, the default, or sticky) and MaxInFlightPerPartition (default 1) are
	// the settings of an ordered subscription this call creates; ignored when joining one.
	Strategy                string
	MaxInFlightPerPartition int
	// Filter is a member filter over message headers (package filter: "region=eu",
	// "tier in (gold,silver), !test"): the member is given only the messages it matches, and a
	// message that no member of the subscription on this broker matches is completed for the
	// subscription without a delivery (filtered.go; with Config.SharedEngine, no live member on
	// any instance). Empty matches everything. Refused with ModeOrdered.
	Filter string
	// BatchSize, when positive (at most storage.MaxBatchSize), makes an ordered member take
	// per-key batches (batch.go): per partition it owns, consecutive messages up to BatchSize,
	// extended so that a publish's run of one key is never split, settled as a unit. Refused
	// for a shared member.
	BatchSize int
	// Rejoin, when not 0, makes the call a resubscription that only joins (rejoin.go): it names
	// the subscription the member had on Pattern, a topic name, before its client reconnected.
	// The call then creates nothing: a missing topic fails with storage.ErrTopicNotFound (no
	// binding is registered), and a group whose subscription Rejoin ended meanwhile fails with
	// storage.ErrSubscriptionNotActive (cancelled) or storage.ErrSubscriptionNotFound (deleted,
	// or its topic deleted) instead of getting a new subscription. A member without a group on
	// a PUB_SUB topic still gets a new ephemeral subscription: only its topic is checked.
	Rejoin int64
}

// validateStart normalizes a start position (storage.StartPosition.Normalize) and, stricter than
// the engines, refuses FROM_TIMESTAMP without a time.
func validateStart(p storage.StartPosition) (storage.StartPosition, error) {
	p, err := p.Normalize()
	if err != nil {
		return p, err
	}
	if p.Kind == storage.FromTimestamp && p.Time.IsZero() {
		return p, invalid("start position FROM_TIMESTAMP needs a time")
	}
	return p, nil
}

// Subscribe adds a member. For each existing topic that Pattern matches, the member joins that
// topic's subscription according to the topic's semantics (QUEUE: the shared one; PUB_SUB: its
// group's, created at Start if missing, or an ephemeral one without a group). A durable group also
// registers a binding for Pattern (a wildcard, or a topic name that does not exist yet) so that
// topics created later get the group's subscription atomically with their creation; the member
// joins those as they appear, as does a member without a group. A member whose pattern matches no
// topic yet is valid and waits.
//
// With Config.SharedEngine, Subscribe returns once the member's record (with its filter) is
// stored, so other instances judge every message claimed from then on with it (filtered.go); a
// shared subscription takes at most maxSharedMembers members on this instance
// (storage.ErrLimitExceeded past it).
//
// Bad input returns an error wrapping storage.ErrInvalidArgument and changes nothing.
func (b *Broker) Subscribe(ctx context.Context, p SubscribeParams) (*Member, error) {
	if err := names.ValidatePattern(p.Pattern); err != nil {
		return nil, invalidName(err)
	}
	if p.Group != "" {
		if err := names.ValidateGroup(p.Group); err != nil {
			return nil, invalidName(err)
		}
	}
	if p.MemberID != "" {
		if err := names.ValidateGroup(p.MemberID); err != nil {
			return nil, invalid("member id: %v", err)
		}
	}
	if p.MaxInFlight < 0 || p.MaxInFlight > MaxInFlightLimit {
		return nil, invalid("max_in_flight must be between 0 (default) and %d, got %d", MaxInFlightLimit, p.MaxInFlight)
	}
	if err := CheckLeaseDuration("lease duration", p.LeaseDuration); err != nil {
		return nil, err
	}
	start, err := validateStart(p.Start)
	if err != nil {
		return nil, err
	}
	if err := checkMode(&p); err != nil {
		return nil, err
	}
	if err := checkRejoin(&p); err != nil {
		return nil, err
	}
	flt, err := b.parseFilter(&p)
	if err != nil {
		return nil, err
	}
	clientID := p.MemberID
	if clientID == "" {
		clientID = "m-" + rand.Text()[:16]
	}
	id := memberKey(p.Principal, clientID)
	m := newMember(b, id, p, cmpOr(p.MaxInFlight, b.defaultMaxInFlight), start)
	m.clientID = clientID
	m.filter = flt

	// Register first, so that a topic created from now on is attached by the notifier; the listing
	// below covers the topics created before. Attaching is idempotent per topic.
	b.mu.Lock()
	switch {
	case b.state != stateRunning:
		b.mu.Unlock()
		return nil, ErrNotRunning
	case b.members[id] != nil:
		b.mu.Unlock()
		return nil, invalid("member id %q is already subscribed to this broker", clientID)
	}
	b.members[id] = m
	b.mu.Unlock()

	if err := b.subscribeExisting(ctx, m); err != nil {
		b.closeFailed(ctx, m)
		return nil, err
	}
	m.rejoined()
	b.logger.DebugContext(ctx, "member joined", slog.String("member", id), slog.String("pattern", p.Pattern),
		slog.String("group", p.Group), slog.Int("max_in_flight", m.maxInFlight), slog.Int("subscriptions", len(m.Info().Subscriptions)))
	return m, nil
}

// awaitJoin waits for join (nil: none), the join another goroutine queued when it attached m to
// topic, so that an attach that found the topic attached returns, like the one that queued it,
// once the owner has the member.
func awaitJoin(ctx context.Context, m *Member, topic string, join *event) error {
	if join == nil {
		return nil
	}
	select {
	case <-join.done:
	case <-ctx.Done():
		return fmt.Errorf("broker: attach %q to %q: %w", m.id, topic, context.Cause(ctx))
	}
	if join.err != nil {
		return fmt.Errorf("broker: attach %q to %q: %w", m.id, topic, join.err)
	}
	return nil
}

// closeFailed closes a member whose Subscribe failed. Its joins may still be queued (ctx ended
// while an owner was busy in a claim): its leaves must follow them, so when ctx has ended the
// close finishes in an owned goroutine instead of making the caller wait.
func (b *Broker) closeFailed(ctx context.Context, m *Member) {
	closeCtx := context.WithoutCancel(ctx)
	closeIt := func() {
		if err := m.Close(closeCtx); err != nil {
			b.logger.WarnContext(closeCtx, "closing failed member", slog.String("member", m.id), slog.Any("error", err))
		}
	}
	if ctx.Err() != nil {
		b.mu.Lock()
		running := b.state == stateRunning
		if running {
			b.goLocked(closeIt)
		}
		b.mu.Unlock()
		if running {
			return
		}
	}
	closeIt()
}

// subscribeExisting creates the group's binding where needed and attaches m to the topics that
// exist now.
func (b *Broker) subscribeExisting(ctx context.Context, m *Member) error {
	wildcard := names.IsPattern(m.pattern)
	var topics []string
	if wildcard {
		if m.group != "" {
			if err := b.bind(ctx, m); err != nil {
				return err
			}
		}
		all, err := b.engine.TopicList(ctx)
		if err != nil {
			return fmt.Errorf("broker: subscribe %q: list topics: %w", m.pattern, err)
		}
		for _, t := range all {
			if names.Match(m.pattern, t.Name) {
				topics = append(topics, t.Name)
			}
		}
	} else {
		_, err := b.engine.TopicGet(ctx, m.pattern)
		switch {
		case err == nil:
			topics = append(topics, m.pattern)
		case errors.Is(err, storage.ErrTopicNotFound):
			if id := m.rejoining(); id != 0 {
				return rejoinTopicMissing(id, m.pattern, err)
			}
			// An ordered group has no binding (bindings create shared subscriptions): its member
			// attaches when the topic is created, from the topic's beginning.
			if m.group != "" && m.mode != storage.ModeOrdered {
				if err := b.bind(ctx, m); err != nil {
					return err
				}
			}
			// The topic may have been created between TopicGet and the binding: the notifier
			// attaches the member then, and so does this retry.
			if _, err := b.engine.TopicGet(ctx, m.pattern); err == nil {
				return b.attachOrIgnore(ctx, m, m.pattern, true)
			}
			return nil
		default:
			return fmt.Errorf("broker: subscribe %q: %w", m.pattern, err)
		}
	}
	for _, t := range topics {
		attach := b.attachOrIgnore
		if m.rejoining() != 0 {
			attach = b.attach // a topic deleted since TopicGet refuses the rejoin
		}
		if err := attach(ctx, m, t, false); err != nil {
			return err
		}
	}
	return nil
}

// bind registers the durable binding of m's group on m's pattern.
func (b *Broker) bind(ctx context.Context, m *Member) error {
	_, err := b.engine.BindingCreate(ctx, &storage.BindingCreateParams{Group: m.group, Pattern: m.pattern, Start: m.start,
		MaxBindings: b.maxBindings})
	if err != nil && !errors.Is(err, storage.ErrBindingExists) {
		return fmt.Errorf("broker: subscribe %q group %q: create binding: %w", m.pattern, m.group, err)
	}
	return nil
}

// attachOrIgnore attaches m to topic, ignoring a topic deleted meanwhile.
func (b *Broker) attachOrIgnore(ctx context.Context, m *Member, topic string, created bool) error {
	err := b.attach(ctx, m, topic, created)
	if errors.Is(err, storage.ErrTopicNotFound) {
		return nil
	}
	return err
}

// attachMatching attaches every live member whose pattern matches topic and that is not attached to
// it yet. created says the topic was created after those members subscribed. A member that
// cannot be attached is told why and closed (attachFailed).
//
// Every creation runs it twice: in the call that created the topic (CreateTopic, an
// auto-creating publish) with the caller's ctx, and in the notifier on the engine's
// storage.NotifyTopicCreated with the broker's (the only run for a topic created elsewhere). A
// failure because ctx ended is left to the other run: a caller that stops waiting must not close
// members, and a stopping broker closes them itself.
func (b *Broker) attachMatching(ctx context.Context, topic string, created bool) {
	b.mu.RLock()
	var ms []*Member
	for _, m := range b.members {
		if names.Match(m.pattern, topic) {
			ms = append(ms, m)
		}
	}
	b.mu.RUnlock()
	for _, m := range ms {
		err := b.attachOrIgnore(ctx, m, topic, created)
		switch {
		case err == nil, errors.Is(err, ErrNotRunning):
		case ctx.Err() != nil:
			b.logger.DebugContext(ctx, "attaching member to new topic cut short", slog.String("member", m.id),
				slog.String("topic", topic), slog.Any("error", err))
		default:
			b.attachFailed(ctx, m, topic, err)
		}
	}
}

// attachFailed handles member m that could not be attached to topic, created after it subscribed
// (attach failed with err: a limit such as max_subscriptions or the members a shared
// subscription takes on this instance, a mode conflict, the storage unavailable). Left open, m
// would miss topic for good without its client knowing: as a member that cannot follow a
// semantics change (moveFailed), it is told why (Member.TakeEnded: an EndedSubscription with
// SubscriptionID 0, topic and a reason wrapping err, so its code says why) and closed. Its client
// subscribes again when the code is retryable, and gets what a new Subscribe gets: topic's
// subscription among the others, or the same refusal. A member attached meanwhile (the join
// happened but its record was not written, which the owner retries; another run of
// attachMatching) misses nothing and stays; one told already is not told again.
func (b *Broker) attachFailed(ctx context.Context, m *Member, topic string, err error) {
	reason := fmt.Errorf("topic %q was created and the member could not join its subscription: %w", topic, err)
	m.mu.Lock()
	_, attached := m.topics[topic]
	tell := !attached && !m.closed && !m.refused
	if tell {
		m.refused = true
		m.ended = append(m.ended, EndedSubscription{Topic: topic, Err: reason})
		m.notifyLocked()
	}
	m.mu.Unlock()
	if !tell {
		b.logger.DebugContext(ctx, "attaching member to new topic failed; it is attached or closed", slog.String("member", m.id),
			slog.String("topic", topic), slog.Bool("attached", attached), slog.Any("error", err))
		return
	}
	b.logger.WarnContext(ctx, "attaching member to new topic failed; closing it", slog.String("member", m.id),
		slog.String("topic", topic), slog.Any("error", err))
	if err := m.Close(context.WithoutCancel(ctx)); err != nil {
		b.logger.WarnContext(ctx, "closing member that could not join a new topic failed", slog.String("member", m.id), slog.Any("error", err))
	}
}

// attach joins m to the subscription of topic it belongs to. created says the topic was created
// after m subscribed (its new subscriptions start at the beginning then).
func (b *Broker) attach(ctx context.Context, m *Member, topic string, created bool) error {
	m.mu.Lock()
	_, attached := m.topics[topic]
	pending := m.joining[topic]
	closed := m.closed
	m.mu.Unlock()
	if attached {
		return awaitJoin(ctx, m, topic, pending)
	}
	if closed || m.allow != nil && !m.allow(topic) {
		return nil
	}
	sub, owned, err := b.resolveSubscription(ctx, m, topic, created)
	if err != nil {
		return err
	}

	// The join is queued under b.mu, where an owner that lost its last member unregisters: it
	// reaches a live owner, or a new one is started for it.
	b.mu.Lock()
	var o *owner
	m.mu.Lock()
	_, attached = m.topics[topic]
	pending = m.joining[topic]
	ok := b.state == stateRunning && !m.closed && !attached
	if ok && sub.Mode == storage.ModeOrdered {
		if o = b.subs[sub.ID]; o != nil {
			if n := o.orderedMembers(); n >= b.maxOrderedMembers {
				// One assignment lists at most storage.MaxAssignmentMembers members (and one liveness
				// renewal renews as many): a group past it could never be assigned.
				m.mu.Unlock()
				b.mu.Unlock()
				return fmt.Errorf("%w: ordered group %q of topic %q has %d members (on this broker and in the assignment in force), at most %d",
					storage.ErrLimitExceeded, sub.Group, topic, n, b.maxOrderedMembers)
			}
		}
	}
	if ok && sub.Mode != storage.ModeOrdered && b.sharedEngine {
		if o = b.subs[sub.ID]; o != nil && o.attached >= b.maxSharedMembers {
			// Every member here is recorded for the other instances (filtered.go), in writes of
			// at most storage.MaxRenewMembers records: a member past it would go unrecorded.
			m.mu.Unlock()
			b.mu.Unlock()
			return fmt.Errorf("%w: subscription of group %q on topic %q has %d members on this broker instance, at most %d",
				storage.ErrLimitExceeded, sub.Group, topic, o.attached, b.maxSharedMembers)
		}
	}
	if ok {
		o = b.subs[sub.ID]
		if o == nil {
			o = newOwner(b, sub)
			b.subs[sub.ID] = o
			if b.byTopic[o.topic] == nil {
				b.byTopic[o.topic] = make(map[int64]*owner)
			}
			b.byTopic[o.topic][o.id] = o
			b.goLocked(o.run)
		}
		m.subs[o.id] = o
		m.topics[topic] = o.id
		o.attached++
		if owned {
			m.owned[o.id] = true
		}
	}
	var join *event
	if ok {
		join = &event{kind: evJoin, m: m, done: make(chan struct{})}
		m.joining[topic] = join
	}
	m.mu.Unlock()
	if ok {
		o.push(join)
	}
	b.mu.Unlock()
	if ok {
		// Listings show the member once Subscribe returns, and with a shared engine the other
		// instances judge every message claimed from then on with its record (filtered.go). The
		// owner handles its inbox between two claims, so this waits for one claim and one record
		// write at most. When ctx ends first, or the record could not be written, the join
		// still happens; Subscribe then closes the member, whose leave follows the join.
		select {
		case <-join.done:
		case <-ctx.Done():
			return fmt.Errorf("broker: attach %q to %q: %w", m.id, topic, context.Cause(ctx))
		}
		m.mu.Lock()
		if m.joining[topic] == join {
			delete(m.joining, topic) // handled: a later attach has nothing to wait for
		}
		m.mu.Unlock()
		if join.err != nil {
			return fmt.Errorf("broker: attach %q to %q: %w", m.id, topic, join.err)
		}
	}

	if !ok {
		if owned {
			if err := b.engine.SubscriptionDelete(ctx, sub.ID); err != nil && !errors.Is(err, storage.ErrSubscriptionNotFound) {
				b.logger.WarnContext(ctx, "deleting unused ephemeral subscription failed", slog.Int64("subscription", sub.ID), slog.Any("error", err))
			}
		}
		if b.checkRunning() != nil {
			return ErrNotRunning
		}
		if attached {
			return awaitJoin(ctx, m, topic, pending) // attached meanwhile by another goroutine
		}
		return nil
	}
	b.logger.DebugContext(ctx, "member attached", slog.String("member", m.id), slog.String("topic", topic),
		slog.Int64("subscription", sub.ID), slog.String("group", sub.Group), slog.Bool("ephemeral", owned))
	if !owned {
		// A member that attaches and leaves between two lifecycle runs still counts as live.
		b.heartbeatAttached(ctx, sub.ID)
		b.lifecycleSooner(sub.HeartbeatTimeout)
	}
	return nil
}

// resolveSubscription finds or creates the subscription of topic that m belongs to. owned reports
// an ephemeral subscription created for m.
func (b *Broker) resolveSubscription(ctx context.Context, m *Member, topic string, created bool) (sub *storage.Subscription, owned bool, err error) {
	t, err := b.engine.TopicGet(ctx, topic)
	if err != nil {
		return nil, false, fmt.Errorf("broker: attach %q to %q: %w", m.id, topic, err)
	}
	start := m.start
	if created {
		start = storage.StartPosition{Kind: storage.FromBeginning}
	}
	pattern := ""
	if names.IsPattern(m.pattern) {
		pattern = m.pattern
	}
	group := m.group
	switch {
	case t.Config.Semantics == storage.Queue && m.mode == storage.ModeOrdered:
		return nil, false, invalid("topic %q is a QUEUE topic: ordered groups need a PUB_SUB topic", topic)
	case t.Config.Semantics == storage.Queue:
		group = storage.QueueGroup
	case m.group == "":
		sub, err := b.engine.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{
			Topic: topic, Pattern: pattern, Ephemeral: true, Start: start, // the engine names its group
		})
		if err != nil {
			return nil, false, fmt.Errorf("broker: create ephemeral subscription of %q on %q: %w", m.id, topic, err)
		}
		return sub, true, nil
	}
	// A durable subscription: join the live one, resurrect a dead one, or create one.
	for attempt := 0; ; attempt++ {
		sub, err := b.engine.SubscriptionGetByGroup(ctx, topic, group)
		if rerr := b.rejoinRefusal(ctx, m, created, topic, group, sub, err); rerr != nil {
			return nil, false, rerr
		}
		switch {
		case err == nil && sub.Mode != m.mode && sub.State != storage.Cancelled && sub.State != storage.Deleted:
			// Before any state change: a refused Subscribe changes nothing (a DEAD group stays
			// DEAD, without a backfill).
			return nil, false, fmt.Errorf("broker: group %q on topic %q is %s, the member asked for %s: %w",
				group, topic, modeName(sub.Mode), modeName(m.mode), storage.ErrModeConflict)
		case err == nil && sub.State == storage.Dead:
			up, err := b.engine.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: sub.ID, State: storage.Active})
			if err == nil {
				b.logger.InfoContext(ctx, "dead subscription resurrected", slog.Int64("subscription", sub.ID),
					slog.String("topic", topic), slog.String("group", group))
				b.reportTransition(&LifecycleResult{Resurrected: []*storage.Subscription{up}})
				// A bounded backfill of what it missed while DEAD (backfill.go).
				if bf, err := b.beginBackfill(ctx, up, false); err == nil {
					up = bf
				} else {
					b.logger.WarnContext(ctx, "backfill of a resurrected subscription failed", append(subAttrs(up), slog.Any("error", err))...)
				}
				return up, false, nil
			}
			if !errors.Is(err, storage.ErrInvalidTransition) {
				return nil, false, fmt.Errorf("broker: resurrect subscription %d: %w", sub.ID, err)
			}
			// Someone else changed its state meanwhile: look again.
		case err == nil && sub.State != storage.Cancelled && sub.State != storage.Deleted:
			return sub, false, nil
		case err != nil && !errors.Is(err, storage.ErrSubscriptionNotFound):
			return nil, false, fmt.Errorf("broker: attach %q to %q group %q: %w", m.id, topic, group, err)
		default:
			// None, or only a cancelled one: CANCELLED is terminal, subscribing creates a new one.
			sub, err = b.engine.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{
				Topic: topic, Group: group, Pattern: pattern, Start: start,
				Mode: m.mode, Strategy: m.strategy, MaxInFlightPerPartition: m.maxInFlightPerPartition,
				MaxSubscriptions: b.maxSubscriptions,
			})
			if err == nil {
				if sub.Backfill != nil {
					b.countMissed(ctx, sub, sub.Backfill.Skipped, false, "range cut to max_backfill_messages")
				}
				return sub, false, nil
			}
			if !errors.Is(err, storage.ErrSubscriptionExists) {
				return nil, false, fmt.Errorf("broker: create subscription of group %q on %q: %w", group, topic, err)
			}
			// Created concurrently (another member, a binding): look again.
		}
		if attempt == 3 {
			return nil, false, fmt.Errorf("broker: attach %q to %q group %q: subscription keeps changing", m.id, topic, group)
		}
	}
}

// detachTopic detaches every member from the subscriptions of a deleted topic, telling them why
// (goneReason: TOPIC_NOT_FOUND). Only subscriptions the engine no longer has are detached: the
// topic may have been created again meanwhile, and subscription IDs are never reused.
func (b *Broker) detachTopic(ctx context.Context, topic string) {
	b.mu.RLock()
	var subs []*owner
	for _, o := range b.byTopic[topic] {
		subs = append(subs, o)
	}
	b.mu.RUnlock()
	n := 0
	for _, s := range subs {
		sub, err := b.engine.SubscriptionGet(ctx, s.id)
		if err == nil && sub.State != storage.Deleted {
			continue
		}
		if err != nil && !errors.Is(err, storage.ErrSubscriptionNotFound) && !errors.Is(err, storage.ErrTopicNotFound) {
			b.logger.WarnContext(ctx, "checking subscription of deleted topic failed", slog.Int64("subscription", s.id), slog.Any("error", err))
			continue
		}
		s.end(b.goneReason(ctx, s.id, topic))
		n++
	}
	if n > 0 {
		b.logger.InfoContext(ctx, "topic deleted, members detached", slog.String("topic", topic), slog.Int("subscriptions", n))
	}
}

// goneReason is what the members of subscription id of topic, which the engine no longer has, are
// told (Member.TakeEnded), judged as a rejoining Subscribe is refused (rejoinRefusal): when no
// topic of that name exists, its topic was deleted (topicDeletedReason, TOPIC_NOT_FOUND); else the
// subscription was deleted (SUBSCRIPTION_NOT_FOUND), also when the topic was deleted and created
// again before this broker found the end. So a member is told the same code whether this broker
// deleted the topic (detachTopic), found the deletion notified (storage.NotifyTopicDeleted) or
// found the subscription gone when it read it (endReason), and the same as its client rejoining
// after a reconnect. It costs one read of the topic, made only when a subscription ends.
//
// When that read fails otherwise (the storage unavailable, a timeout), neither code can be told
// and neither is claimed: the reason wraps the read's error, whose code is retryable
// (STORAGE_UNAVAILABLE, TIMEOUT...). The subscription is gone all the same, so its members still
// end; a client subscribes again, and its rejoin is refused with the code judged then, when the
// topic can be read (rejoinRefusal).
func (b *Broker) goneReason(ctx context.Context, id int64, topic string) error {
	_, err := b.engine.TopicGet(context.WithoutCancel(ctx), topic)
	switch {
	case errors.Is(err, storage.ErrTopicNotFound):
		return topicDeletedReason(topic)
	case err != nil:
		return fmt.Errorf("broker: subscription %d of topic %q ended; whether its topic was deleted could not be read: %w", id, topic, err)
	}
	return fmt.Errorf("%w: subscription %d of topic %q was deleted", storage.ErrSubscriptionNotFound, id, topic)
}

// topicDeletedReason is what the members of a subscription whose topic was deleted are told:
// TOPIC_NOT_FOUND, the code a rejoining Subscribe of the topic is refused with
// (rejoinTopicMissing).
func topicDeletedReason(topic string) error {
	return fmt.Errorf("%w: topic %q was deleted", storage.ErrTopicNotFound, topic)
}

// checkMode validates the ordered-group fields of p and normalizes its mode.
func checkMode(p *SubscribeParams) error {
	switch p.Mode {
	case storage.ModeShared, "shared":
		p.Mode = storage.ModeShared
		if p.Strategy != "" || p.MaxInFlightPerPartition != 0 {
			return invalid("strategy and max_in_flight_per_partition are for ordered groups only")
		}
		if p.BatchSize != 0 {
			return invalid("batch_size is for members of ordered groups only, got %d for a shared member", p.BatchSize)
		}
		return nil
	case storage.ModeOrdered:
	default:
		return invalid("subscription mode %q: want shared or ordered", p.Mode)
	}
	switch {
	case p.Group == "":
		return invalid("an ordered subscription needs a group")
	case names.IsPattern(p.Pattern):
		return invalid("an ordered group subscribes to one topic, not a pattern (%q)", p.Pattern)
	case p.MaxInFlightPerPartition < 0 || p.MaxInFlightPerPartition > storage.MaxInFlightPerPartitionLimit:
		return invalid("max_in_flight_per_partition must be between 1 and %d, got %d", storage.MaxInFlightPerPartitionLimit, p.MaxInFlightPerPartition)
	case p.BatchSize < 0 || p.BatchSize > storage.MaxBatchSize:
		return invalid("batch_size must be between 0 (no batches) and %d, got %d", storage.MaxBatchSize, p.BatchSize)
	}
	return storage.CheckStrategy(p.Strategy)
}

// modeName names a subscription mode for messages.
func modeName(m storage.SubscriptionMode) string {
	if m == storage.ModeOrdered {
		return "ordered"
	}
	return "shared"
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}
