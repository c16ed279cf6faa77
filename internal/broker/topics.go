package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
)

// Publish appends msgs to topic as one all-or-nothing batch and returns their positions in batch
// order. The messages are durable (per the engine's durability setting) when Publish returns.
// An unknown topic is created with Config.AutoCreateConfig (QUEUE by default) unless auto-create
// is disabled, in which case Publish fails with storage.ErrTopicNotFound. Members whose pattern
// matches a topic created here are attached before the first append.
func (b *Broker) Publish(ctx context.Context, topic string, msgs []storage.AppendMessage) ([]storage.MessagePosition, error) {
	return b.PublishWith(ctx, topic, msgs, PublishOptions{})
}

// PublishOptions are the hints of PublishWith.
type PublishOptions struct {
	// Prompt: the publisher sent this right after its previous publish was acknowledged and
	// waits for this one before the next (storage.MessagesAppendParams.Prompt).
	Prompt bool
	// Priority: the publisher holds the priority permission on the topic and is exempt from its
	// backpressure (backpressure.go).
	Priority bool
	// NoWait: the caller must not wait (it appends other topics' publishes too): a publish its
	// topic's throttle would delay is refused with ErrWouldThrottle instead, counting nothing;
	// the caller publishes it again without NoWait where it can wait (server/publish.go).
	NoWait bool
}

// PublishWith is Publish with hints for the engine.
func (b *Broker) PublishWith(ctx context.Context, topic string, msgs []storage.AppendMessage, opts PublishOptions) ([]storage.MessagePosition, error) {
	start := b.trace.now()
	var res *storage.MessagesAppendResult
	err := b.appendTo(ctx, topic, msgs, opts, func(params *storage.MessagesAppendParams, adm admission) (err error) {
		res, err = b.engine.MessagesAppend(ctx, params)
		if err == nil {
			adm.appended()
		}
		return err
	})
	if took, slow := b.trace.isSlow(start); slow {
		b.trace.logSlow(ctx, "publish", took, slog.String("topic", topic), slog.Int("messages", len(msgs)))
	}
	b.noteStorage(err)
	if err != nil {
		return nil, err
	}
	b.trace.published(ctx, topic, b.trace.correlationIDs(ctx, msgs), res.Positions)
	return res.Positions, nil
}

// PublishAsync is PublishWith without waiting for the append. It returns PublishWith's error
// when the batch was refused or not appended, and then never calls done. Otherwise done is called
// exactly once with the positions: later, from an engine goroutine, once the batch is durable
// (storage.AsyncAppender; before PublishAsync returns for a batch of duplicates only, see
// storage.Engine.MessagesAppend), or with the append's error (a write failure, the engine closing);
// on an engine that cannot append asynchronously PublishAsync appends synchronously and calls
// done before it returns. done must not block and must not call the broker or the
// engine synchronously. Appends of one caller are queued in call order.
func (b *Broker) PublishAsync(ctx context.Context, topic string, msgs []storage.AppendMessage, opts PublishOptions, done func([]storage.MessagePosition, error)) error {
	ae, ok := b.engine.(storage.AsyncAppender)
	if !ok {
		ps, err := b.PublishWith(ctx, topic, msgs, opts)
		if err == nil {
			done(ps, nil)
		}
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("broker: publish to %q: %w", topic, err)
	}
	start, ids := b.trace.now(), b.trace.correlationIDs(ctx, msgs)
	appended := func(res *storage.MessagesAppendResult, err error) {
		b.noteStorage(err)
		if took, slow := b.trace.isSlow(start); slow {
			b.trace.logSlow(ctx, "publish", took, slog.String("topic", topic), slog.Int("messages", len(msgs)))
		}
		if err != nil {
			done(nil, fmt.Errorf("broker: publish to %q: %w", topic, err))
			return
		}
		b.trace.published(ctx, topic, ids, res.Positions)
		done(res.Positions, nil)
	}
	err := b.appendTo(ctx, topic, msgs, opts, func(params *storage.MessagesAppendParams, adm admission) error {
		return ae.MessagesAppendAsync(params, func(res *storage.MessagesAppendResult, err error) {
			adm.appended()
			appended(res, err)
		})
	})
	if err != nil {
		b.noteStorage(err) // refused when queued; a queued append notes its outcome in appended
	}
	return err
}

// noteStorage records the outcome of a publish for StorageFull: one refused because the storage
// is out of space (storage.ErrFull) starts the condition, a successful one ends it. A refusal
// more than storageFullFor after the one before also starts it again (StorageFull had expired):
// a new run of refusals logs its WARN and reports its own since.
func (b *Broker) noteStorage(err error) {
	switch {
	case err == nil:
		if b.storageFullSince.Load() != 0 {
			b.storageFullSince.Store(0)
			b.logger.Info("publishes stored again: the storage has room")
		}
	case errors.Is(err, storage.ErrFull):
		now := b.clock.Now().UnixNano()
		// Of concurrent refusals after an expiry only the first gets the old last refusal from
		// the swap, so only it starts the new run.
		last := b.storageFullLast.Swap(now)
		since := b.storageFullSince.Load()
		expired := since != 0 && now-last > int64(storageFullFor)
		if (since == 0 || expired) && b.storageFullSince.CompareAndSwap(since, now) {
			b.logger.Warn("storage full: publishes are refused (STORAGE_FULL) until space is freed; deliveries of stored messages go on",
				slog.Any("error", err))
		}
	}
}

// storageFullFor is how long a refusal for lack of space counts without a newer one: readiness
// must come back even when no publish arrives (a load balancer sends none to an unready broker).
const storageFullFor = 10 * time.Second

// StorageFull reports whether a publish was refused because the storage is out of space (disk
// full, quota, PostgreSQL disk_full) within the last storageFullFor and none was stored since,
// and since when. Readiness and the spool_storage_full metric show it.
func (b *Broker) StorageFull() (since time.Time, full bool) {
	ns := b.storageFullSince.Load()
	if ns == 0 || b.clock.Now().Sub(time.Unix(0, b.storageFullLast.Load())) > storageFullFor {
		return time.Time{}, false
	}
	return time.Unix(0, ns), true
}

// appendTo checks a publish of msgs to topic and runs appendFn with its parameters and its
// backpressure admission, which appendFn must mark appended when its append finishes after
// appendFn returned nil (at once, or in an asynchronous completion); when the engine does not
// know the topic and auto-create is on, it creates the topic (rare: the first publish to it)
// and runs appendFn again.
func (b *Broker) appendTo(ctx context.Context, topic string, msgs []storage.AppendMessage, opts PublishOptions,
	appendFn func(*storage.MessagesAppendParams, admission) error) error {
	if err := b.checkRunning(); err != nil {
		return err
	}
	if err := names.ValidateTopic(topic); err != nil {
		return invalidName(err)
	}
	if len(msgs) == 0 {
		return invalid("publish to %q: no messages", topic)
	}
	// Backpressure: a refused publish changes nothing; an admitted one counts in the topic's
	// estimated backlog until its append finished (adm.appended: here when appendFn fails,
	// otherwise by appendFn's caller); a throttled one waits before its append (the TCP
	// server's later publishes to the topic on that connection wait behind it), or is refused
	// with ErrWouldThrottle when the caller cannot wait (PublishOptions.NoWait).
	delay, adm, err := b.admit(topic, msgs, opts)
	if err != nil {
		return fmt.Errorf("broker: publish to %q: %w", topic, err)
	}
	if err := b.waitThrottle(ctx, topic, delay); err != nil {
		adm.appended()
		return err
	}
	params := &storage.MessagesAppendParams{Topic: topic, Messages: msgs, Prompt: opts.Prompt}
	err = appendFn(params, adm)
	if errors.Is(err, storage.ErrTopicNotFound) && b.autoCreate {
		if err := b.autoCreateTopic(ctx, topic); err != nil {
			adm.appended()
			return err
		}
		err = appendFn(params, adm)
	}
	if err != nil {
		adm.appended()
		return fmt.Errorf("broker: publish to %q: %w", topic, err)
	}
	return nil
}

// autoCreateTopic creates topic with the auto-create configuration and attaches waiting members.
func (b *Broker) autoCreateTopic(ctx context.Context, topic string) error {
	_, err := b.engine.TopicCreate(ctx, &storage.TopicCreateParams{Name: topic, Config: b.autoCreateConfig, MaxTopics: b.maxTopics})
	switch {
	case err == nil:
		b.logger.InfoContext(ctx, "topic auto-created", slog.String("topic", topic),
			slog.String("semantics", string(b.autoCreateConfig.Semantics)))
		if b.autoCreateConfig.HasBacklogBound() {
			b.topicConfigChanged()
		}
	case errors.Is(err, storage.ErrTopicExists):
		// Created concurrently; whoever created it attaches members too, attaching again is a no-op.
	default:
		return fmt.Errorf("broker: publish to %q: auto-create topic: %w", topic, err)
	}
	b.attachMatching(ctx, topic, true)
	return nil
}

// CreateTopic creates a topic with cfg completed by storage.TopicConfig.WithDefaults. It fails
// with storage.ErrTopicExists if the topic exists. Members whose pattern matches the new topic are
// attached before it returns.
func (b *Broker) CreateTopic(ctx context.Context, name string, cfg storage.TopicConfig) (*storage.Topic, error) {
	if err := b.checkRunning(); err != nil {
		return nil, err
	}
	cfg, err := storage.CheckTopic(name, cfg)
	if err != nil {
		return nil, fmt.Errorf("broker: create topic %q: %w", name, err)
	}
	if err := b.checkPartitions(cfg.Partitions); err != nil {
		return nil, fmt.Errorf("broker: create topic %q: %w", name, err)
	}
	t, err := b.engine.TopicCreate(ctx, &storage.TopicCreateParams{Name: name, Config: cfg, MaxTopics: b.maxTopics})
	if err != nil {
		return nil, fmt.Errorf("broker: create topic %q: %w", name, err)
	}
	b.logger.InfoContext(ctx, "topic created", slog.String("topic", name), slog.String("semantics", string(cfg.Semantics)),
		slog.Int("partitions", cfg.Partitions))
	b.attachMatching(ctx, name, true)
	b.topicConfigChanged()
	return t, nil
}

// UpdateTopicParams are the parameters of Broker.UpdateTopic.
type UpdateTopicParams struct {
	// Name is the topic to change.
	Name string
	// Config replaces the topic's configuration (completed with defaults and validated).
	// Partitions may only grow.
	Config storage.TopicConfig
	// QueueToGroup names the group the queue subscription becomes when Semantics changes from
	// QUEUE to PUB_SUB (nothing pending is lost). Required for that change.
	QueueToGroup string
	// Expect, when set, applies the update only if the topic's configuration is still Expect
	// (what the caller read, as Topic returns it), checked by the engine atomically with the
	// write: otherwise the update fails with storage.ErrTopicChanged and changes nothing
	// (storage.TopicUpdateParams.Expect). Nil: the update replaces whatever configuration the
	// topic has (the last update wins); UpdateTopic then reads it and writes with that read as
	// the expected configuration, reading again when another update landed in between, and
	// fails with storage.ErrTopicChanged only after updateTopicAttempts such attempts.
	Expect *storage.TopicConfig
}

// updateTopicAttempts bounds the compare-and-set attempts of an UpdateTopic without Expect (as
// the HTTP API bounds its own, admin.topicUpdateAttempts).
const updateTopicAttempts = 5

// UpdateTopic changes a topic's configuration. When the semantics change, members of this broker
// attached to the topic move to the subscription they belong to under the new semantics (their
// leases on the old one are released). Members connected to other broker instances move when
// their instance finds the subscription they are on renamed (owner.refresh, followSemantics): at
// once on the engine's notification of the rename (storage.NotifySubscription), else within
// about a minute. PUB_SUB to QUEUE is refused with storage.ErrTopicHasSubscriptions while
// the one live subscription it would make the queue's is an ordered group's (checkToQueue), as
// the engine refuses it while more than one lives. With p.Expect set it is a compare-and-set on the configuration
// (storage.ErrTopicChanged).
//
// Every write is a compare-and-set, so that the checks and the members' move are decided from the
// configuration the write replaced: the caller's Expect, or else UpdateTopic's own read. Judged
// from a read that another update overtook (PUB_SUB read, then changed to QUEUE, then this write
// back to PUB_SUB), the write's own semantics change would go unnoticed and the members would
// stay on the subscription the queue became, which is another group's.
func (b *Broker) UpdateTopic(ctx context.Context, p UpdateTopicParams) (*storage.Topic, error) {
	if err := b.checkRunning(); err != nil {
		return nil, err
	}
	cfg, err := storage.CheckTopic(p.Name, p.Config)
	if err != nil {
		return nil, fmt.Errorf("broker: update topic %q: %w", p.Name, err)
	}
	if p.QueueToGroup != "" {
		if err := names.ValidateGroup(p.QueueToGroup); err != nil {
			return nil, invalidName(err)
		}
	}
	for attempt := 1; ; attempt++ {
		t, old, err := b.updateTopicOnce(ctx, p, cfg)
		if errors.Is(err, storage.ErrTopicChanged) && p.Expect == nil && attempt < updateTopicAttempts {
			continue // another update landed after the read: judge from a fresh one
		}
		if err != nil {
			return nil, err
		}
		b.logger.InfoContext(ctx, "topic updated", slog.String("topic", p.Name), slog.String("semantics", string(t.Config.Semantics)))
		if old.Semantics != t.Config.Semantics {
			// The change is written: moving the members is its consequence, whether or not
			// the caller waits for it (a move cut short would end members, moveFailed).
			b.reattachTopic(context.WithoutCancel(ctx), t.Name)
		}
		b.wakeTopic(p.Name)
		b.topicConfigChanged()
		return t, nil
	}
}

// updateTopicOnce checks cfg against the configuration it is to replace, p.Expect or a fresh read,
// and writes it if the topic still has that configuration (storage.ErrTopicChanged otherwise). It
// returns the topic written and the configuration it replaced.
func (b *Broker) updateTopicOnce(ctx context.Context, p UpdateTopicParams, cfg storage.TopicConfig) (*storage.Topic, storage.TopicConfig, error) {
	var old storage.TopicConfig
	if p.Expect != nil {
		old = p.Expect.WithDefaults()
	} else {
		t, err := b.engine.TopicGet(ctx, p.Name)
		if err != nil {
			return nil, old, fmt.Errorf("broker: update topic %q: %w", p.Name, err)
		}
		old = t.Config
	}
	if cfg.Partitions > old.Partitions {
		if err := b.checkPartitions(cfg.Partitions); err != nil {
			return nil, old, fmt.Errorf("broker: update topic %q: %w", p.Name, err)
		}
	}
	if old.Semantics == storage.Queue && cfg.Semantics == storage.PubSub && p.QueueToGroup == "" {
		return nil, old, invalid("update topic %q: changing QUEUE to PUB_SUB needs QueueToGroup, the group the queue subscription becomes", p.Name)
	}
	if old.Semantics == storage.PubSub && cfg.Semantics == storage.Queue {
		if err := b.checkToQueue(ctx, p.Name); err != nil {
			return nil, old, err
		}
	}
	t, err := b.engine.TopicUpdate(ctx, &storage.TopicUpdateParams{Name: p.Name, Config: cfg, QueueToGroup: p.QueueToGroup,
		Expect: &old})
	if err != nil {
		return nil, old, fmt.Errorf("broker: update topic %q: %w", p.Name, err)
	}
	return t, old, nil
}

// checkToQueue refuses to change topic from PUB_SUB to QUEUE while its one live subscription
// (ACTIVE or PAUSED), which the change would rename to the queue's, is an ordered group's. A
// QUEUE topic's one subscription is shared by every consumer, with or without a group (BRIEF.md
// 2), and ordered groups need a PUB_SUB topic (resolveSubscription): renamed, it would stay
// ordered, and no member could join it any more (an ordered one is refused on a
// QUEUE topic, a shared one by the mode conflict), so the group's members would lose it and
// consumers of the queue could not consume. The engine refuses more than one live
// subscription, or an ephemeral one, itself (storage.ErrTopicHasSubscriptions), and creates a
// shared queue subscription when none lives; an ordered group that is not live (DEAD, CANCELLED)
// stays the group's and does not block the change.
//
// The check reads the subscriptions before the engine's write, which decides under its own lock:
// an ordered group resurrected (or the other live group cancelled) in between is not seen.
func (b *Broker) checkToQueue(ctx context.Context, topic string) error {
	subs, err := b.engine.SubscriptionList(ctx, &storage.SubscriptionListParams{Topic: topic})
	if err != nil {
		return fmt.Errorf("broker: update topic %q: list subscriptions: %w", topic, err)
	}
	var live []*storage.Subscription
	for _, s := range subs {
		if s.State.HoldsRetention() {
			live = append(live, s)
		}
	}
	if len(live) == 1 && live[0].Mode == storage.ModeOrdered {
		return fmt.Errorf("broker: update topic %q to QUEUE: %w: the one that would become the queue's is the ordered group %q "+
			"(subscription %d), and a QUEUE topic's one subscription is shared by every consumer; cancel the group first, or keep the topic PUB_SUB",
			topic, storage.ErrTopicHasSubscriptions, live[0].Group, live[0].ID)
	}
	return nil
}

// topicRenamed asks the notifier to move the members attached to topic as its semantics say
// (followSemantics): an owner found its subscription renamed. It never blocks (owners call it,
// and moving a member waits for its owners).
func (b *Broker) topicRenamed(topic string) {
	b.events.push(storage.Notification{Kind: notifyRenamed, Topic: topic})
}

// followSemantics moves the members of this broker attached to topic to the subscriptions they
// belong to under its semantics as stored now, as UpdateTopic does after its own write changed
// them: the change was made without this broker (another instance on the same database), which
// an owner noticed as its subscription renamed (owner.refresh). Members already where they
// belong stay.
//
// The engines notify the rename of this broker's own changes too (storage.NotifySubscription):
// the move then finds the members where UpdateTopic put them.
func (b *Broker) followSemantics(ctx context.Context, topic string) {
	b.logger.DebugContext(ctx, "subscription of a topic renamed, moving its members", slog.String("topic", topic))
	b.reattachTopic(ctx, topic)
}

// reattachTopic moves the members attached to topic to the subscription they belong to under its
// semantics as stored now. One move runs at a time (Broker.moveMu), each on a read of the topic
// made under it: of two changes in a row, the move of the later runs last and judges from it (a
// move of the earlier, judged from a read before the later change, would undo it), and a second
// move for the same change finds the members where they belong.
func (b *Broker) reattachTopic(ctx context.Context, topic string) {
	b.moveMu.Lock()
	defer b.moveMu.Unlock()
	t, err := b.engine.TopicGet(ctx, topic)
	if err != nil {
		if !errors.Is(err, storage.ErrTopicNotFound) && !errors.Is(err, storage.ErrClosed) && ctx.Err() == nil {
			// A failure is logged: those members stay where they are.
			b.logger.WarnContext(ctx, "reading a topic whose semantics changed failed; its members here were not moved",
				slog.String("topic", topic), slog.Any("error", err))
		}
		return
	}
	b.mu.RLock()
	type attachment struct {
		s *owner
		m *Member
	}
	var all []attachment
	for _, o := range b.byTopic[t.Name] {
		for _, m := range o.viewMembers() {
			all = append(all, attachment{o, m})
		}
	}
	b.mu.RUnlock()
	for _, a := range all {
		sub, err := b.engine.SubscriptionGet(ctx, a.s.id)
		if err == nil {
			// The members that stay count under the subscription's new name from now on.
			a.s.renamed(sub.Group)
		}
		if err == nil && belongs(t, a.m, sub) {
			continue
		}
		if err := b.leave(ctx, a.m, a.s); err != nil {
			b.logger.WarnContext(ctx, "moving member after semantics change: leave failed", slog.String("member", a.m.id),
				slog.Any("error", err))
		}
		if err := b.attach(ctx, a.m, t.Name, false); err != nil {
			b.moveFailed(ctx, a.m, a.s, t.Name, err)
		}
	}
}

// moveFailed handles a member that left s, the subscription of topic it was on before a
// semantics change, and could not attach to the one it belongs to now (attach failed with err):
// it must not stay open detached from the topic, receiving nothing from it without being told.
// It is told that s ended (Member.TakeEnded) with a reason wrapping err, so its code says why
// (LIMIT_EXCEEDED, SUBSCRIPTION_EXISTS for a mode conflict, STORAGE_UNAVAILABLE...), and then
// closed: its client subscribes again, as after any close by the broker, and gets what a new
// Subscribe gets (the subscription it belongs to, or the same refusal, which ends it). A topic
// deleted meanwhile ends s as a deletion does (the member stays open, as detachTopic leaves
// it); a stopping broker closes its members itself.
func (b *Broker) moveFailed(ctx context.Context, m *Member, s *owner, topic string, err error) {
	switch {
	case errors.Is(err, ErrNotRunning):
		return
	case errors.Is(err, storage.ErrTopicNotFound):
		m.tell(s, topicDeletedReason(topic))
		return
	}
	reason := fmt.Errorf("topic %q changed semantics and the member could not join the subscription it belongs to now: %w", topic, err)
	b.logger.WarnContext(ctx, "moving member after semantics change failed; closing it", slog.String("member", m.id),
		slog.String("topic", topic), slog.Int64("subscription", s.id), slog.Any("error", err))
	m.tell(s, reason)
	if err := m.Close(ctx); err != nil {
		b.logger.WarnContext(ctx, "closing member that could not move failed", slog.String("member", m.id), slog.Any("error", err))
	}
}

// tell records that m's subscription s ended for reason (Member.TakeEnded) after m was detached
// from it, and notifies m's consumer; a closed member is not told.
func (m *Member) tell(s *owner, reason error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.endedLocked(s, reason)
}

// belongs reports whether sub is the subscription m belongs to on t: the queue subscription of a
// QUEUE topic, m's group's subscription, or m's own ephemeral one.
func belongs(t *storage.Topic, m *Member, sub *storage.Subscription) bool {
	switch {
	case t.Config.Semantics == storage.Queue:
		return sub.Group == storage.QueueGroup
	case m.group == "":
		m.mu.Lock()
		defer m.mu.Unlock()
		return sub.Ephemeral && m.owned[sub.ID]
	}
	return sub.Group == m.group
}

// leave detaches m from s and releases its leases there (or deletes s if m owned it).
func (b *Broker) leave(ctx context.Context, m *Member, s *owner) error {
	b.mu.Lock()
	m.mu.Lock()
	attached := m.subs[s.id] == s
	m.mu.Unlock()
	var ev *event
	owned := false
	if attached {
		ev, owned = b.leaveLocked(m, s)
	}
	b.mu.Unlock()
	if !attached {
		return nil
	}
	if ev != nil {
		// m is detached already (deliver drops what a claim brings it); the wait is the fence
		// before the release. When ctx ends first, its leases come back as they expire.
		select {
		case <-ev.done:
		case <-ctx.Done():
			return fmt.Errorf("broker: %q leaves subscription %d: %w", m.id, s.id, context.Cause(ctx))
		}
	}
	if owned {
		if err := b.engine.SubscriptionDelete(ctx, s.id); err != nil && !errors.Is(err, storage.ErrSubscriptionNotFound) {
			return fmt.Errorf("broker: delete ephemeral subscription %d: %w", s.id, err)
		}
		return nil
	}
	res, err := b.engine.DeliveriesRelease(ctx, &storage.DeliveriesReleaseParams{SubscriptionID: s.id, Member: m.id})
	if err == nil {
		b.reportDeadLettered(s, res.DeadLettered)
	}
	b.wakeSubscription(s.id)
	if err != nil && !errors.Is(err, storage.ErrSubscriptionNotFound) && !errors.Is(err, storage.ErrSubscriptionNotActive) {
		return fmt.Errorf("broker: release leases of %q on subscription %d: %w", m.id, s.id, err)
	}
	return nil
}

// DeleteTopic deletes a topic with its messages and subscriptions. Without force it fails with
// storage.ErrTopicHasSubscriptions while live durable subscriptions exist; force cancels them.
// Members of this broker attached to the topic are detached and stay subscribed (a pattern member
// joins topics created later, including this name).
func (b *Broker) DeleteTopic(ctx context.Context, name string, force bool) error {
	if err := b.checkRunning(); err != nil {
		return err
	}
	if err := names.ValidateTopic(name); err != nil {
		return invalidName(err)
	}
	if err := b.engine.TopicDelete(ctx, &storage.TopicDeleteParams{Name: name, Force: force}); err != nil {
		return fmt.Errorf("broker: delete topic %q: %w", name, err)
	}
	b.logger.InfoContext(ctx, "topic deleted", slog.String("topic", name), slog.Bool("force", force))
	b.detachTopic(ctx, name)
	b.forgetBackpressure(name)
	return nil
}

// TopicInfo describes a topic for admin listings.
type TopicInfo struct {
	// Topic is the topic with its configuration.
	Topic *storage.Topic `json:"topic"`
	// Stats describe its partitions (offsets, message and byte counts).
	Stats *storage.TopicStats `json:"stats"`
	// Subscriptions counts the topic's subscriptions that are not DELETED (durable and ephemeral).
	Subscriptions int `json:"subscriptions"`
	// Members counts the members of this broker attached to the topic.
	Members int `json:"members"`
	// Backpressure is the topic's backpressure state when it has a backlog bound (nil without).
	Backpressure *BackpressureInfo `json:"backpressure,omitempty"`
}

// Topic describes one topic with its statistics.
func (b *Broker) Topic(ctx context.Context, name string) (*TopicInfo, error) {
	if err := b.checkRunning(); err != nil {
		return nil, err
	}
	if err := names.ValidateTopic(name); err != nil {
		return nil, invalidName(err)
	}
	t, err := b.engine.TopicGet(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("broker: topic %q: %w", name, err)
	}
	return b.topicInfo(ctx, t)
}

// TopicConfig returns a topic as stored, its configuration without the statistics Topic gathers
// (one engine read).
func (b *Broker) TopicConfig(ctx context.Context, name string) (*storage.Topic, error) {
	if err := b.checkRunning(); err != nil {
		return nil, err
	}
	if err := names.ValidateTopic(name); err != nil {
		return nil, invalidName(err)
	}
	t, err := b.engine.TopicGet(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("broker: topic %q: %w", name, err)
	}
	return t, nil
}

// TopicPartitions returns the partition count of a topic: the configuration alone (TopicConfig;
// for message ids, BRIEF.md 2b).
func (b *Broker) TopicPartitions(ctx context.Context, name string) (int, error) {
	t, err := b.TopicConfig(ctx, name)
	if err != nil {
		return 0, err
	}
	return t.Config.Partitions, nil
}

// Topics describes every topic, ordered by name. Its cost is linear in the numbers of topics and
// subscriptions: the subscriptions are listed once for all topics, not once per topic (which
// scanned every subscription of the engine for each topic: 1.3 s at 10,000 topics).
func (b *Broker) Topics(ctx context.Context) ([]*TopicInfo, error) {
	if err := b.checkRunning(); err != nil {
		return nil, err
	}
	ts, err := b.engine.TopicList(ctx)
	if err != nil {
		return nil, fmt.Errorf("broker: list topics: %w", err)
	}
	// Listed after the topics: a topic created in between has no entry (it is not described),
	// one deleted in between has subscriptions that are not counted.
	subs, err := b.engine.SubscriptionList(ctx, &storage.SubscriptionListParams{})
	if err != nil {
		return nil, fmt.Errorf("broker: list topics: subscriptions: %w", err)
	}
	counts := make(map[string]int, len(ts))
	for _, s := range subs {
		if s.State != storage.Deleted {
			counts[s.Topic]++
		}
	}
	out := make([]*TopicInfo, 0, len(ts))
	for _, t := range ts {
		info, err := b.topicInfoCounted(ctx, t, counts[t.Name])
		if errors.Is(err, storage.ErrTopicNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	return out, nil
}

// topicInfo describes t, listing its subscriptions.
func (b *Broker) topicInfo(ctx context.Context, t *storage.Topic) (*TopicInfo, error) {
	subs, err := b.engine.SubscriptionList(ctx, &storage.SubscriptionListParams{Topic: t.Name})
	if err != nil {
		return nil, fmt.Errorf("broker: topic %q subscriptions: %w", t.Name, err)
	}
	n := 0
	for _, s := range subs {
		if s.State != storage.Deleted {
			n++
		}
	}
	return b.topicInfoCounted(ctx, t, n)
}

// topicInfoCounted describes t, whose subscriptions that are not DELETED number subs.
func (b *Broker) topicInfoCounted(ctx context.Context, t *storage.Topic, subs int) (*TopicInfo, error) {
	stats, err := b.engine.TopicStats(ctx, t.Name)
	if err != nil {
		return nil, fmt.Errorf("broker: topic %q stats: %w", t.Name, err)
	}
	info := &TopicInfo{Topic: t, Stats: stats, Subscriptions: subs}
	if bp, ok := b.TopicBackpressure(t.Name); ok {
		info.Backpressure = &bp
	}
	b.mu.RLock()
	for _, o := range b.byTopic[t.Name] {
		info.Members += len(o.viewMembers())
	}
	b.mu.RUnlock()
	return info, nil
}

// checkPartitions refuses a partition count above the broker's bound (Config.MaxPartitions).
func (b *Broker) checkPartitions(n int) error {
	if n > b.maxPartitions {
		return fmt.Errorf("%w: %d partitions, this broker allows at most %d per topic (broker.max_partitions)", storage.ErrLimitExceeded, n, b.maxPartitions)
	}
	return nil
}
