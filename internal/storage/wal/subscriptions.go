package wal

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/spoolmq/spool/internal/storage"
)

func subNotFound(id int64) error { return fmt.Errorf("%w: id %d", storage.ErrSubscriptionNotFound, id) }

// subLocked returns a subscription that is not DELETED. e.mu must be held.
func (e *Engine) subLocked(id int64) (*sub, error) {
	s := e.subs[id]
	if s == nil || s.meta.State == storage.Deleted || s.topic == nil {
		return nil, subNotFound(id)
	}
	return s, nil
}

// subUpdatable returns a subscription for SubscriptionUpdate: like subLocked, but a DELETED one
// (kept, listed with IncludeDeleted) is returned for CanTransition to refuse: DELETED is final.
// e.mu must be held.
func (e *Engine) subUpdatable(id int64) (*sub, error) {
	if s := e.subs[id]; s != nil && s.meta.State == storage.Deleted {
		return s, nil
	}
	return e.subLocked(id)
}

// subWithState returns a subscription whose delivery state may be acted on (not CANCELLED). e.mu
// must be held.
func (e *Engine) subWithState(id int64) (*sub, error) {
	s, err := e.subLocked(id)
	if err != nil {
		return nil, err
	}
	if s.st == nil {
		return nil, fmt.Errorf("%w: subscription %d is %s", storage.ErrSubscriptionNotActive, id, s.meta.State)
	}
	return s, nil
}

// lockSub takes e.mu (exclusively) and returns the subscription lookup finds (subLocked or
// subWithState) with e.mu still held; on an error e.mu is released.
func (e *Engine) lockSub(id int64, lookup func(int64) (*sub, error)) (*sub, error) {
	e.mu.Lock()
	if err := e.checkLocked(); err != nil {
		e.mu.Unlock()
		return nil, err
	}
	s, err := lookup(id)
	if err != nil {
		e.mu.Unlock()
		return nil, err
	}
	return s, nil
}

// endAfterRepair is the start (floor and cursor) given to a partition damaged at Open by a
// subscription from now: above any offset, so that the Open after the repair clamps it to the
// partition's new end (nothing can be published to it meanwhile).
const endAfterRepair = int64(1) << 62

// resolveStartLocked turns a start position into the first offset of every partition. A
// partition damaged at Open (no log) starts from its beginning, or from its end after the repair
// for FromNow (endAfterRepair); a start at one of its messages is refused.
func (e *Engine) resolveStartLocked(t *topic, sp storage.StartPosition) ([]int64, error) {
	starts := make([]int64, len(t.parts))
	searchAll := func(ts int64) error {
		for i, p := range t.parts {
			if p.log == nil {
				continue // 0: raised to its first retained offset by the Open after the repair
			}
			o, err := p.log.SearchTime(ts)
			if err != nil {
				return e.readFailure(t.meta.Name, p, fmt.Errorf("wal: search topic %q partition %d by time: %w", t.meta.Name, i, err))
			}
			starts[i] = max(o, p.log.FirstIndex())
		}
		return nil
	}
	switch sp.Kind {
	case storage.FromNow:
		for i, p := range t.parts {
			starts[i] = endAfterRepair
			if p.log != nil {
				starts[i] = p.log.NextIndex()
			}
		}
	case storage.FromBeginning:
		for i, p := range t.parts {
			if p.log != nil {
				starts[i] = p.log.FirstIndex()
			}
		}
	case storage.FromTimestamp:
		if sp.Time.IsZero() {
			for i, p := range t.parts {
				if p.log != nil {
					starts[i] = p.log.FirstIndex()
				}
			}
			break
		}
		if err := searchAll(sp.Time.UnixNano()); err != nil {
			return nil, err
		}
	case storage.FromMessageID:
		if int(sp.Partition) >= len(t.parts) {
			return nil, invalid("start position: partition %d out of range, topic %q has %d", sp.Partition, t.meta.Name, len(t.parts))
		}
		if p := t.parts[sp.Partition]; p.damaged() != nil {
			return nil, unavailable(t.meta.Name, p)
		}
		l := t.parts[sp.Partition].log
		hw := l.NextIndex()
		if sp.Offset > hw {
			return nil, fmt.Errorf("%w: start offset %d is above the high-water mark %d of topic %q partition %d",
				storage.ErrOffsetOutOfRange, sp.Offset, hw, t.meta.Name, sp.Partition)
		}
		// A message below the first retained one starts at the first retained one.
		o := max(sp.Offset, l.FirstIndex())
		ts := e.clock.Now().UnixNano()
		if o < hw {
			m, err := e.readMessage(t, sp.Partition, o)
			if err != nil {
				return nil, fmt.Errorf("wal: read start message: %w", err)
			}
			ts = m.PublishedAt.UnixNano()
		}
		if err := searchAll(ts); err != nil {
			return nil, err
		}
		starts[sp.Partition] = o
	}
	return starts, nil
}

// SubscriptionCreate creates a subscription. On a QUEUE topic it fails with
// storage.ErrSubscriptionExists while the queue subscription is not CANCELLED (one created
// after a cancel gets the group storage.QueueGroup whatever Group says). On a PUB_SUB topic a
// durable subscription needs a group with no other non-cancelled subscription on the topic; an
// ephemeral one without a group gets "$ephemeral-<id>". Ephemeral subscriptions are never
// persisted: a restart forgets them.
func (e *Engine) SubscriptionCreate(ctx context.Context, params *storage.SubscriptionCreateParams) (*storage.Subscription, error) {
	start, err := params.Check()
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	if err := e.checkLocked(); err != nil {
		e.mu.Unlock()
		return nil, err
	}
	t := e.topics[params.Topic]
	if t == nil {
		e.mu.Unlock()
		return nil, topicNotFound(params.Topic)
	}
	group, ephemeral := params.Group, params.Ephemeral
	if t.meta.Config.Semantics == storage.Queue {
		group, ephemeral = storage.QueueGroup, false
	} else if group == storage.QueueGroup {
		e.mu.Unlock()
		return nil, invalid("group %q is reserved for QUEUE topics", storage.QueueGroup)
	} else if group == "" && !ephemeral {
		e.mu.Unlock()
		return nil, invalid("a durable subscription to PUB_SUB topic %q needs a group", params.Topic)
	}
	if !ephemeral && params.MaxSubscriptions > 0 {
		if n := e.durableSubsLocked(); n >= params.MaxSubscriptions {
			e.mu.Unlock()
			return nil, fmt.Errorf("%w: %d subscriptions, the most this broker keeps (broker.max_subscriptions); delete groups or raise it",
				storage.ErrLimitExceeded, n)
		}
	}
	ord := params.Ordering()
	if group != "" {
		for _, s := range t.subs {
			if s.meta.Group == group && s.meta.State != storage.Cancelled {
				e.mu.Unlock()
				exists := storage.ErrSubscriptionExists
				if s.meta.Ordering() != ord {
					exists = storage.ErrModeConflict
				}
				return nil, fmt.Errorf("%w: topic %q group %q (subscription %d, %s)",
					exists, params.Topic, group, s.meta.ID, s.meta.State)
			}
		}
	}
	starts, err := e.resolveStartLocked(t, start)
	if err != nil {
		e.mu.Unlock()
		return nil, err
	}
	var skips [][][2]int64
	if refcount(t) {
		// Added to the pending messages only: its start skips those already complete.
		starts, skips = e.refcountStartsLocked(t, -1, starts)
	}
	id := e.nextSubID
	if group == "" {
		group = fmt.Sprintf("$ephemeral-%d", id)
	}
	now := e.now()
	// The backfill range: from the start to the log end now, cut to the newest
	// MaxBackfillMessages (the cut raises the starts).
	bf, starts := e.newBackfillLocked(t, starts, params.MaxBackfillMessages)
	rec := subRec{
		Sub: storage.Subscription{
			ID: id, Topic: params.Topic, Group: group, Pattern: params.Pattern, Ephemeral: ephemeral,
			State: storage.Active, Start: start, CreatedAt: now, UpdatedAt: now,
			Mode: ord.Mode, MaxInFlightPerPartition: ord.MaxInFlightPerPartition, Strategy: ord.Strategy,
			HeartbeatTimeout:    heartbeatTimeoutField(params.HeartbeatTimeout),
			MaxBackfillMessages: params.MaxBackfillMessages, Backfill: bf,
		},
		Starts: starts,
		Skips:  skips,
	}
	s := e.applySubCreate(t, &rec)
	out := cloneSub(s)
	var ch <-chan error
	if ephemeral {
		// Not persisted, but its ID must never be reused.
		e.queueState(encodeSubIDs(e.nextSubID), nil)
	} else {
		ch = e.queueStateWait(encodeJSON(recSubCreate, &rec))
	}
	e.mu.Unlock()
	if err := wait(ctx, ch); err != nil {
		return nil, err
	}
	return out, nil
}

// SubscriptionDelete deletes a subscription and its delivery state at once. A durable one is kept
// as DELETED (SubscriptionList with IncludeDeleted); an ephemeral one is forgotten.
func (e *Engine) SubscriptionDelete(ctx context.Context, id int64) error {
	e.mu.Lock()
	if err := e.checkLocked(); err != nil {
		e.mu.Unlock()
		return err
	}
	s, err := e.subLocked(id)
	if err != nil {
		e.mu.Unlock()
		return err
	}
	rec := subDeleteRec{ID: id, At: e.now()}
	ephemeral, topic := s.meta.Ephemeral, s.meta.Topic
	e.applySubDelete(&rec)
	var ch <-chan error
	if !ephemeral {
		ch = e.queueStateWait(encodeJSON(recSubDelete, &rec))
	}
	e.mu.Unlock()
	if err := wait(ctx, ch); err != nil {
		return err
	}
	e.subscriptionChanged(topic, id)
	return nil
}

// SubscriptionGet returns a subscription that is not DELETED.
func (e *Engine) SubscriptionGet(ctx context.Context, id int64) (*storage.Subscription, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return nil, storage.ErrClosed
	}
	s, err := e.subLocked(id)
	if err != nil {
		return nil, err
	}
	return cloneSub(s), nil
}

// SubscriptionGetByGroup returns the newest subscription of (topic, group) that is not DELETED.
func (e *Engine) SubscriptionGetByGroup(ctx context.Context, topicName, group string) (*storage.Subscription, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return nil, storage.ErrClosed
	}
	var best *sub
	if t := e.topics[topicName]; t != nil {
		for _, s := range t.subs {
			if s.meta.Group == group && (best == nil || s.meta.ID > best.meta.ID) {
				best = s
			}
		}
	}
	if best == nil {
		return nil, fmt.Errorf("%w: topic %q group %q", storage.ErrSubscriptionNotFound, topicName, group)
	}
	return cloneSub(best), nil
}

// SubscriptionList lists subscriptions ordered by ID, optionally of one topic, DELETED ones only
// with IncludeDeleted.
func (e *Engine) SubscriptionList(ctx context.Context, params *storage.SubscriptionListParams) ([]*storage.Subscription, error) {
	var p storage.SubscriptionListParams
	if params != nil {
		p = *params
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return nil, storage.ErrClosed
	}
	out := []*storage.Subscription{}
	for _, s := range e.subs {
		if p.Topic != "" && s.meta.Topic != p.Topic {
			continue
		}
		if s.meta.State == storage.Deleted && !p.IncludeDeleted {
			continue
		}
		out = append(out, cloneSub(s))
	}
	slices.SortFunc(out, func(a, b *storage.Subscription) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// SubscriptionStats returns a subscription's depth, lag, in-flight and DLQ figures. Redelivering
// counts every delivered-or-delayed message waiting to go out (backoff, nack delay, a NotBefore
// time, a replayed DLQ message), so Pending = Lag + InFlight + Redelivering (less the messages
// acked before they were delivered, which stay in Lag until the cursor passes them). A CANCELLED
// subscription has no delivery state: its figures are zero.
func (e *Engine) SubscriptionStats(ctx context.Context, id int64) (*storage.SubscriptionStats, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return nil, storage.ErrClosed
	}
	s, err := e.subLocked(id)
	if err != nil {
		return nil, err
	}
	st := &storage.SubscriptionStats{SubscriptionID: id}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st == nil {
		return st, nil
	}
	for i, p := range s.topic.parts {
		hw := s.st.Cursor(int32(i)) // damaged at Open: its log's end is unknown
		if p.log != nil {
			hw = p.log.NextIndex()
		}
		floor, cursor, pending := s.st.PartStats(int32(i), hw)
		st.Pending += pending
		st.Lag += max(hw-cursor, 0)
		st.Partitions = append(st.Partitions, storage.SubscriptionPartitionStats{
			Partition: int32(i), AckFloor: floor, Cursor: cursor, HighWater: hw,
		})
	}
	st.InFlight, st.Redelivering = s.st.Counts()
	st.DeadLettered = int64(s.st.DLQLen())
	return st, nil
}

// SubscriptionUpdate changes a subscription's state following storage.CanTransition (setting the
// current state again is an invalid transition too). CANCELLED drops the delivery state at once; DELETED is
// SubscriptionDelete.
func (e *Engine) SubscriptionUpdate(ctx context.Context, params *storage.SubscriptionUpdateParams) (*storage.Subscription, error) {
	if err := params.Check(); err != nil {
		return nil, err
	}
	s, err := e.lockSub(params.ID, e.subUpdatable)
	if err != nil {
		return nil, err
	}
	if !storage.CanTransition(s.meta.State, params.State) {
		e.mu.Unlock()
		return nil, fmt.Errorf("%w: subscription %d from %s to %s", storage.ErrInvalidTransition, params.ID, s.meta.State, params.State)
	}
	rec := subUpdateRec{ID: params.ID, State: params.State, At: e.now()}
	back, leftAt := s.meta.State == storage.Dead && params.State == storage.Active, s.meta.UpdatedAt
	e.applySubUpdate(&rec)
	out := cloneSub(s)
	var ch <-chan error
	if !s.meta.Ephemeral {
		ch = e.queueStateWait(encodeJSON(recSubUpdate, &rec))
	}
	if back {
		if r := e.rejoinLocked(s, leftAt); r != nil {
			ch = e.queueStateWait(r)
		}
	}
	e.mu.Unlock()
	if err := wait(ctx, ch); err != nil {
		return nil, err
	}
	e.subscriptionChanged(out.Topic, out.ID)
	return out, nil
}

// BindingCreate registers a durable group on a topic pattern: TopicCreate of a matching PUB_SUB
// topic subscribes the group from the topic's beginning, atomically with the creation.
func (e *Engine) BindingCreate(ctx context.Context, params *storage.BindingCreateParams) (*storage.Binding, error) {
	start, err := params.Check()
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	if err := e.checkLocked(); err != nil {
		e.mu.Unlock()
		return nil, err
	}
	key := bindingKey{params.Group, params.Pattern}
	if e.bindings[key] != nil {
		e.mu.Unlock()
		return nil, fmt.Errorf("%w: group %q pattern %q", storage.ErrBindingExists, params.Group, params.Pattern)
	}
	if n := len(e.bindings); params.MaxBindings > 0 && n >= params.MaxBindings {
		e.mu.Unlock()
		return nil, fmt.Errorf("%w: %d bindings, the most this broker keeps (broker.max_bindings); delete bindings or raise it",
			storage.ErrLimitExceeded, n)
	}
	b := &storage.Binding{Group: params.Group, Pattern: params.Pattern, Start: start, CreatedAt: e.now()}
	e.bindings[key] = b
	ch := e.queueStateWait(encodeJSON(recBindingCreate, b))
	out := *b
	e.mu.Unlock()
	if err := wait(ctx, ch); err != nil {
		return nil, err
	}
	return &out, nil
}

// durableSubsLocked counts the durable subscriptions not DELETED (SubscriptionCreateParams.
// MaxSubscriptions). e.mu must be held.
func (e *Engine) durableSubsLocked() int {
	n := 0
	for _, s := range e.subs {
		if !s.meta.Ephemeral && s.meta.State != storage.Deleted {
			n++
		}
	}
	return n
}

// BindingDelete removes a binding; the subscriptions it created stay.
func (e *Engine) BindingDelete(ctx context.Context, params *storage.BindingDeleteParams) error {
	if err := params.Check(); err != nil {
		return err
	}
	e.mu.Lock()
	if err := e.checkLocked(); err != nil {
		e.mu.Unlock()
		return err
	}
	key := bindingKey{params.Group, params.Pattern}
	if e.bindings[key] == nil {
		e.mu.Unlock()
		return fmt.Errorf("%w: group %q pattern %q", storage.ErrBindingNotFound, params.Group, params.Pattern)
	}
	delete(e.bindings, key)
	ch := e.queueStateWait(encodeJSON(recBindingDelete, &bindingDeleteRec{Group: params.Group, Pattern: params.Pattern}))
	e.mu.Unlock()
	return wait(ctx, ch)
}

// BindingList lists all bindings ordered by group, then pattern.
func (e *Engine) BindingList(ctx context.Context) ([]*storage.Binding, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return nil, storage.ErrClosed
	}
	bs := e.sortedBindingsLocked()
	out := make([]*storage.Binding, len(bs))
	for i, b := range bs {
		c := *b
		out[i] = &c
	}
	return out, nil
}

func (e *Engine) sortedBindingsLocked() []*storage.Binding {
	out := make([]*storage.Binding, 0, len(e.bindings))
	for _, b := range e.bindings {
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b *storage.Binding) int {
		if c := strings.Compare(a.Group, b.Group); c != 0 {
			return c
		}
		return strings.Compare(a.Pattern, b.Pattern)
	})
	return out
}
