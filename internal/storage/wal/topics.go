package wal

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
)

// invalid and validName are the shared validation errors of package storage.
var (
	invalid   = storage.Invalid
	validName = storage.InvalidName
)

func topicNotFound(name string) error { return fmt.Errorf("%w: %q", storage.ErrTopicNotFound, name) }

// reserveName marks a topic name busy while its directories are created, grown or removed
// outside e.mu. check runs under e.mu (exclusive) once nothing else holds the name. The returned
// function releases the name.
func (e *Engine) reserveName(ctx context.Context, name string, check func() error) (func(), error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		e.mu.Lock()
		if err := e.checkLocked(); err != nil {
			e.mu.Unlock()
			return nil, err
		}
		if ch, ok := e.busy[name]; ok {
			e.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if err := check(); err != nil {
			e.mu.Unlock()
			return nil, err
		}
		ch := make(chan struct{})
		e.busy[name] = ch
		e.mu.Unlock()
		return func() {
			e.mu.Lock()
			delete(e.busy, name)
			close(ch)
			e.mu.Unlock()
		}, nil
	}
}

// createPartitions creates fresh partition logs from..to-1 of a topic (outside e.mu).
func (e *Engine) createPartitions(name string, from, to int) ([]*partition, error) {
	var parts []*partition
	for i := from; i < to; i++ {
		dir := e.partitionDir(name, i)
		if err := e.removeAll(dir); err != nil {
			e.closePartitions(parts)
			return nil, ioFailure(fmt.Errorf("wal: clear %s: %w", dir, err), false)
		}
		p, err := e.openPartition(name, i)
		if err != nil {
			e.closePartitions(parts)
			return nil, ioFailure(err, false) // nothing refers to the new logs yet
		}
		parts = append(parts, p)
	}
	return parts, nil
}

func (e *Engine) closePartitions(parts []*partition) {
	for _, p := range parts {
		_ = p.log.Close()
		_ = e.removeAll(p.dir)
	}
}

// TopicCreate creates a topic and its partition logs. A QUEUE topic gets its subscription (group
// storage.QueueGroup, from the beginning); a PUB_SUB topic gets one subscription per matching
// binding (its group, from the beginning), in the same state record as the topic.
func (e *Engine) TopicCreate(ctx context.Context, params *storage.TopicCreateParams) (*storage.Topic, error) {
	cfg, err := params.Check()
	if err != nil {
		return nil, err
	}
	release, err := e.reserveName(ctx, params.Name, func() error {
		if e.topics[params.Name] != nil {
			return fmt.Errorf("%w: %q", storage.ErrTopicExists, params.Name)
		}
		// Creations in progress count: their names are reserved and not yet topics.
		if n := len(e.topics) + e.creating; params.MaxTopics > 0 && n >= params.MaxTopics {
			return fmt.Errorf("%w: %d topics, the most this broker keeps (broker.max_topics); delete topics or raise it", storage.ErrLimitExceeded, n)
		}
		e.creating++ // the name is reserved right after this check, under the same lock
		return nil
	})
	if err != nil {
		return nil, err
	}
	defer release()
	counted := true // in e.creating until the topic is in e.topics (under the same lock)
	defer func() {
		if counted {
			e.mu.Lock()
			e.creating--
			e.mu.Unlock()
		}
	}()
	parts, err := e.createPartitions(params.Name, 0, cfg.Partitions)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	if err := e.checkLocked(); err != nil {
		e.mu.Unlock()
		e.closePartitions(parts)
		return nil, err
	}
	now := e.now()
	rec := topicCreateRec{Topic: storage.Topic{Name: params.Name, Config: cfg, CreatedAt: now}}
	zero := make([]int64, cfg.Partitions)
	newSub := func(group, pattern string) {
		rec.Subs = append(rec.Subs, subRec{
			Sub: storage.Subscription{
				ID: e.nextSubID, Topic: params.Name, Group: group, Pattern: pattern, State: storage.Active,
				Start: storage.StartPosition{Kind: storage.FromBeginning}, CreatedAt: now, UpdatedAt: now,
			},
			Starts: zero,
		})
		e.nextSubID++
	}
	if cfg.Semantics == storage.Queue {
		newSub(storage.QueueGroup, "")
	} else {
		seen := map[string]bool{}
		for _, b := range e.sortedBindingsLocked() {
			if !seen[b.Group] && names.Match(b.Pattern, params.Name) {
				seen[b.Group] = true
				newSub(b.Group, b.Pattern)
			}
		}
	}
	e.applyTopicCreate(&rec)
	e.creating--
	counted = false
	t := e.topics[params.Name]
	t.parts = parts
	ch := e.queueStateWait(encodeJSON(recTopicCreate, &rec))
	out := cloneTopic(t)
	e.mu.Unlock()
	if err := wait(ctx, ch); err != nil {
		return nil, err
	}
	e.notify(storage.Notification{Kind: storage.NotifyTopicCreated, Topic: params.Name})
	return out, nil
}

// liveDurableLocked reports whether a non-ephemeral subscription other than the queue
// subscription is ACTIVE or PAUSED.
func liveDurableLocked(t *topic) bool {
	for _, s := range t.subs {
		if s.meta.Ephemeral || !s.meta.State.HoldsRetention() {
			continue
		}
		if s.meta.Group != storage.QueueGroup || queuePendingLocked(t, s) {
			return true
		}
	}
	return false
}

// queuePendingLocked reports whether the queue subscription s still has work: a message not yet
// acked or dead-lettered. Deleting a queue with unprocessed messages needs force. e.mu must be
// held.
func queuePendingLocked(t *topic, s *sub) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st == nil {
		return false
	}
	for i, p := range t.parts {
		if p.log == nil {
			return true // damaged at Open: what it holds is unknown
		}
		if _, _, pending := s.st.PartStats(int32(i), p.log.NextIndex()); pending > 0 {
			return true
		}
	}
	return false
}

// TopicDelete deletes a topic, its messages, its subscriptions (they become DELETED) and the
// bindings on its plain name (applyTopicDelete; wildcard bindings stay). Without
// Force it fails with storage.ErrTopicHasSubscriptions while a durable PUB_SUB subscription is
// ACTIVE or PAUSED, or while the queue subscription (ACTIVE or PAUSED) has messages not yet done.
func (e *Engine) TopicDelete(ctx context.Context, params *storage.TopicDeleteParams) error {
	if err := params.Check(); err != nil {
		return err
	}
	check := func() error {
		t := e.topics[params.Name]
		if t == nil {
			return topicNotFound(params.Name)
		}
		if !params.Force && liveDurableLocked(t) {
			return fmt.Errorf("%w: topic %q (use force to cancel them)", storage.ErrTopicHasSubscriptions, params.Name)
		}
		return nil
	}
	release, err := e.reserveName(ctx, params.Name, check)
	if err != nil {
		return err
	}
	defer release()
	e.mu.Lock()
	if err := e.checkLocked(); err != nil {
		e.mu.Unlock()
		return err
	}
	if err := check(); err != nil { // a subscription may have been created meanwhile
		e.mu.Unlock()
		return err
	}
	t := e.topics[params.Name]
	rec := topicDeleteRec{Name: params.Name, At: e.now()}
	e.applyTopicDelete(&rec)
	ch := e.queueStateWait(encodeJSON(recTopicDelete, &rec))
	e.mu.Unlock()
	if err := wait(ctx, ch); err != nil {
		return err
	}
	// Appends queued before the deletion complete first; nothing can reach the logs now.
	t.inflight.Wait()
	var errs []error
	for _, p := range t.parts {
		if p.log != nil {
			errs = append(errs, p.log.Close())
		}
	}
	errs = append(errs, e.discardDir(e.topicDir(params.Name)))
	if err := errors.Join(errs...); err != nil {
		// The topic is deleted; the next Open removes what is left.
		e.logger.Warn("wal: remove topic files", "topic", params.Name, "error", err)
	}
	e.notify(storage.Notification{Kind: storage.NotifyTopicDeleted, Topic: params.Name})
	return nil
}

// TopicGet returns a topic.
func (e *Engine) TopicGet(ctx context.Context, name string) (*storage.Topic, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return nil, storage.ErrClosed
	}
	t := e.topics[name]
	if t == nil {
		return nil, topicNotFound(name)
	}
	return cloneTopic(t), nil
}

// TopicList lists all topics ordered by name.
func (e *Engine) TopicList(ctx context.Context) ([]*storage.Topic, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return nil, storage.ErrClosed
	}
	out := make([]*storage.Topic, 0, len(e.topics))
	for _, t := range e.topics {
		out = append(out, cloneTopic(t))
	}
	slices.SortFunc(out, func(a, b *storage.Topic) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// TopicStats describes a topic's partitions: first retained offset, high-water mark, bytes.
func (e *Engine) TopicStats(ctx context.Context, name string) (*storage.TopicStats, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return nil, storage.ErrClosed
	}
	t := e.topics[name]
	if t == nil {
		return nil, topicNotFound(name)
	}
	ts := &storage.TopicStats{Topic: name, Partitions: make([]storage.PartitionStats, len(t.parts))}
	for i, p := range t.parts {
		ps := storage.PartitionStats{Partition: int32(i), Damaged: p.damaged() != nil}
		if p.log == nil {
			ts.Partitions[i] = ps // damaged at Open: offsets and size unknown
			continue
		}
		ps.LowOffset, ps.HighWater = p.log.FirstIndex(), p.log.NextIndex()
		for _, s := range p.log.Segments() {
			ps.Bytes += s.Bytes
		}
		ts.Partitions[i] = ps
		ts.Messages += ps.HighWater - ps.LowOffset
		ts.Bytes += ps.Bytes
	}
	return ts, nil
}

// TopicUpdate replaces a topic's configuration. Partitions only grow (new partition logs start
// empty, every subscription reads them from offset 0). QUEUE to PUB_SUB renames the queue
// subscription to the group QueueToGroup; PUB_SUB to QUEUE is refused with
// storage.ErrTopicHasSubscriptions while more than one subscription is ACTIVE or PAUSED, renames
// the one live durable subscription to the queue group, or creates the queue subscription (from
// the first retained message) when none is live. With params.Expect set the configuration is
// compared under e.mu while the name is reserved for this change (storage.ErrTopicChanged).
func (e *Engine) TopicUpdate(ctx context.Context, params *storage.TopicUpdateParams) (*storage.Topic, error) {
	cfg, err := params.Check()
	if err != nil {
		return nil, err
	}
	var old storage.TopicConfig
	release, err := e.reserveName(ctx, params.Name, func() error {
		t := e.topics[params.Name]
		if t == nil {
			return topicNotFound(params.Name)
		}
		old = t.meta.Config
		// Under e.mu with the name not yet reserved by another change: no update lands between
		// this check and the write below, which holds the reservation.
		if err := params.CheckExpect(old); err != nil {
			return err
		}
		if cfg.Partitions < old.Partitions {
			return invalid("partitions may only grow: topic %q has %d, got %d", params.Name, old.Partitions, cfg.Partitions)
		}
		if old.Semantics == storage.Queue && cfg.Semantics == storage.PubSub {
			if params.QueueToGroup == "" {
				return invalid("queue_to_group is required to change topic %q from QUEUE to PUB_SUB", params.Name)
			}
			if err := names.ValidateGroup(params.QueueToGroup); err != nil {
				return validName(err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	defer release()
	newParts, err := e.createPartitions(params.Name, old.Partitions, cfg.Partitions)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	t := e.topics[params.Name]
	rec := topicUpdateRec{Name: params.Name, Config: cfg, At: e.now()}
	err = e.checkLocked()
	if err == nil && cfg.CompletionTracking != old.CompletionTracking {
		err = completionChange(t, cfg.CompletionTracking)
	}
	if err == nil {
		err = e.planSemanticsChangeLocked(t, old, cfg, params.QueueToGroup, &rec)
	}
	if err != nil {
		e.mu.Unlock()
		e.closePartitions(newParts)
		return nil, err
	}
	e.applyTopicUpdate(&rec)
	t.parts = append(t.parts, newParts...)
	ch := e.queueStateWait(encodeJSON(recTopicUpdate, &rec))
	out := cloneTopic(t)
	e.mu.Unlock()
	if err := wait(ctx, ch); err != nil {
		return nil, err
	}
	for _, r := range rec.Renames {
		e.subscriptionChanged(params.Name, r.ID)
	}
	return out, nil
}

// planSemanticsChangeLocked fills rec with the subscription changes of a semantics change.
func (e *Engine) planSemanticsChangeLocked(t *topic, old, cfg storage.TopicConfig, queueTo string, rec *topicUpdateRec) error {
	switch {
	case old.Semantics == storage.Queue && cfg.Semantics == storage.PubSub:
		var queue *sub
		for _, s := range t.subs {
			if s.meta.State == storage.Cancelled {
				continue
			}
			if s.meta.Group == queueTo {
				return fmt.Errorf("%w: topic %q already has group %q", storage.ErrSubscriptionExists, t.meta.Name, queueTo)
			}
			if s.meta.Group == storage.QueueGroup && (queue == nil || s.meta.ID > queue.meta.ID) {
				queue = s
			}
		}
		if queue != nil {
			rec.Renames = append(rec.Renames, subRename{ID: queue.meta.ID, Group: queueTo})
		}
	case old.Semantics == storage.PubSub && cfg.Semantics == storage.Queue:
		var live []*sub
		for _, s := range t.subs {
			if s.meta.State.HoldsRetention() {
				live = append(live, s)
			}
		}
		switch {
		case len(live) > 1:
			return fmt.Errorf("%w: topic %q has %d live subscriptions; PUB_SUB to QUEUE needs at most one",
				storage.ErrTopicHasSubscriptions, t.meta.Name, len(live))
		case len(live) == 1 && live[0].meta.Ephemeral:
			return fmt.Errorf("%w: topic %q has a live ephemeral subscription; PUB_SUB to QUEUE needs a durable one or none",
				storage.ErrTopicHasSubscriptions, t.meta.Name)
		case len(live) == 1 && live[0].meta.Mode == storage.ModeOrdered:
			return fmt.Errorf("%w: topic %q: group %q is ordered; PUB_SUB to QUEUE needs a shared group (the queue's one subscription is shared) or none",
				storage.ErrTopicHasSubscriptions, t.meta.Name, live[0].meta.Group)
		case len(live) == 1:
			rec.Renames = append(rec.Renames, subRename{ID: live[0].meta.ID, Group: storage.QueueGroup})
		default:
			starts := make([]int64, cfg.Partitions)
			for i, p := range t.parts {
				if p.log != nil { // damaged at Open: 0, raised to its first offset at the Open after the repair
					starts[i] = p.log.FirstIndex()
				}
			}
			rec.NewSubs = append(rec.NewSubs, subRec{
				Sub: storage.Subscription{
					ID: e.nextSubID, Topic: t.meta.Name, Group: storage.QueueGroup, State: storage.Active,
					Start: storage.StartPosition{Kind: storage.FromBeginning}, CreatedAt: rec.At, UpdatedAt: rec.At,
				},
				Starts: starts,
			})
			if cfg.CompletionTracking == storage.Refcount {
				// A join: added to the pending messages only.
				n := &rec.NewSubs[len(rec.NewSubs)-1]
				n.Starts, n.Skips = e.refcountStartsLocked(t, -1, starts)
			}
			e.nextSubID++
		}
	}
	return nil
}

// completionChange refuses a change of completion_tracking while topic t holds messages
// (storage.ErrCompletionTrackingChange).
func completionChange(t *topic, to storage.CompletionTracking) error {
	var n int64
	for _, p := range t.parts {
		if p.log != nil {
			n += p.log.NextIndex() - p.log.FirstIndex()
		} else {
			n++ // damaged: unknown, counted as holding messages
		}
	}
	if n > 0 {
		return fmt.Errorf("%w: topic %q holds %d messages (from %s to %s: wait until retention removed them, or use a new topic)",
			storage.ErrCompletionTrackingChange, t.meta.Name, n, t.meta.Config.CompletionTracking, to)
	}
	return nil
}
