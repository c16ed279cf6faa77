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

// Seed 000's manual admin operations (ConsumerGroupAdmin): remove a group, resurrect a DEAD one,
// force-complete the messages a group never processed, and a health verdict per group.

// Health verdicts of a group (GroupInfo.Health).
const (
	// HealthOK: ACTIVE, with a member here or a recent heartbeat, nothing dead-lettered, nothing
	// left unacked longer than StaleUnackedAge.
	HealthOK = "OK"
	// HealthWarn: the group receives, but something needs a look (Reasons).
	HealthWarn = "WARN"
	// HealthFail: the group receives nothing (DEAD, PAUSED or CANCELLED).
	HealthFail = "FAIL"
)

// StaleUnackedAge is the age of a group's oldest unacked message past which its health warns.
const StaleUnackedAge = time.Hour

// Force-complete bounds: the messages one call scans (MaxForceComplete; the default when the
// caller gives none is DefaultForceComplete), and a page of the scan.
const (
	DefaultForceComplete = 100_000
	MaxForceComplete     = 1_000_000
	forceCompletePage    = 1000
)

// forceCompleteMember is the member name the force-complete acks carry (acks need no lease).
const forceCompleteMember = "$admin-force-complete"

// groupHealth sets info.Health and info.Reasons from its state, members, heartbeat, DLQ and oldest
// unacked message, at now.
func groupHealth(info *GroupInfo, now time.Time) {
	info.Reasons = []string{}
	fail := false
	sub := info.Subscription
	switch info.State {
	case storage.Dead:
		fail = true
		info.Reasons = append(info.Reasons, fmt.Sprintf("DEAD: no live consumer for its heartbeat timeout %s (last heartbeat %s ago); a consumer subscribing or a resurrect makes it ACTIVE",
			sub.HeartbeatTimeout, now.Sub(sub.LastHeartbeatAt).Round(time.Second)))
	case storage.Paused:
		fail = true
		info.Reasons = append(info.Reasons, "PAUSED: receives nothing until resumed, and holds retention")
	case storage.Cancelled:
		fail = true
		info.Reasons = append(info.Reasons, "CANCELLED: terminal; subscribe again to create a new subscription")
	case storage.Active:
		if len(info.Members) == 0 {
			info.Reasons = append(info.Reasons, fmt.Sprintf("no consumer attached to this broker (last heartbeat %s ago, DEAD after %s)",
				now.Sub(sub.LastHeartbeatAt).Round(time.Second), sub.HeartbeatTimeout))
		}
	}
	if st := info.Stats; st != nil && st.DeadLettered > 0 {
		info.Reasons = append(info.Reasons, fmt.Sprintf("%d messages dead-lettered", st.DeadLettered))
	}
	if !info.OldestUnackedAt.IsZero() {
		if age := now.Sub(info.OldestUnackedAt); age > StaleUnackedAge {
			info.Reasons = append(info.Reasons, fmt.Sprintf("oldest unacked message is %s old (more than %s)", age.Round(time.Second), StaleUnackedAge))
		}
	}
	switch {
	case fail:
		info.Health = HealthFail
	case len(info.Reasons) > 0:
		info.Health = HealthWarn
	default:
		info.Health = HealthOK
	}
}

// oldestUnacked returns the publish time of the oldest message the subscription has not completed:
// the first retained message at or above each partition's ack floor, one read per partition with
// work left; zero when nothing is left.
func (b *Broker) oldestUnacked(ctx context.Context, sub *storage.Subscription, st *storage.SubscriptionStats) (time.Time, error) {
	var oldest time.Time
	if st == nil || st.Pending == 0 {
		return oldest, nil
	}
	for _, p := range st.Partitions {
		if p.AckFloor >= p.HighWater {
			continue
		}
		msgs, err := b.engine.MessagesRead(ctx, &storage.MessagesReadParams{Topic: sub.Topic, Partition: p.Partition, Offset: p.AckFloor, Limit: 1})
		if err != nil {
			if errors.Is(err, storage.ErrPartitionDamaged) {
				continue
			}
			return time.Time{}, fmt.Errorf("broker: oldest unacked message of subscription %d: %w", sub.ID, err)
		}
		if len(msgs) == 1 && (oldest.IsZero() || msgs[0].PublishedAt.Before(oldest)) {
			oldest = msgs[0].PublishedAt
		}
	}
	return oldest, nil
}

// RemoveGroup is seed 000's removeConsumerGroup: it cancels the subscription of group on topic
// (its members here are detached, its leases fenced: their later acks answer already done) and
// deletes it at once, without waiting subscription_retention (CANCELLED then DELETED in one call).
// Subscribing again creates a new subscription. A CANCELLED group is deleted as is.
func (b *Broker) RemoveGroup(ctx context.Context, topic, group string) (*storage.Subscription, error) {
	sub, err := b.lookup(ctx, topic, group)
	if err != nil {
		return nil, err
	}
	if sub.Group == storage.QueueGroup {
		return nil, fmt.Errorf("%w: the queue subscription of a QUEUE topic is removed with its topic", storage.ErrInvalidTransition)
	}
	if sub.State != storage.Cancelled {
		if sub, err = b.CancelGroup(ctx, topic, sub.Group); err != nil {
			return nil, err
		}
	}
	err = b.engine.SubscriptionDelete(ctx, sub.ID)
	if err != nil && !errors.Is(err, storage.ErrSubscriptionNotFound) {
		return nil, fmt.Errorf("broker: remove group %q on topic %q: %w", sub.Group, topic, err)
	}
	b.counts.forget(sub.ID)
	b.logger.InfoContext(ctx, "group removed", subAttrs(sub)...)
	sub.State = storage.Deleted
	if err == nil {
		// This call deleted it (not found: someone else did, and counted it).
		b.reportTransition(&LifecycleResult{Deleted: []*storage.Subscription{sub}})
	}
	return sub, nil
}

// ResurrectGroup is seed 000's resurrectConsumerGroup: a DEAD group becomes ACTIVE (a heartbeat
// does the same when a consumer attaches). Any other state is refused with
// storage.ErrInvalidTransition. With backfill the group catches up on what it missed while DEAD,
// from its ack floors to the log end, bounded to its newest max_backfill_messages (what a
// consumer attaching does too); without, it gives all of that up (counted and logged) and
// continues from the log end.
func (b *Broker) ResurrectGroup(ctx context.Context, topic, group string, backfill bool) (*storage.Subscription, error) {
	sub, err := b.lookup(ctx, topic, group)
	if err != nil {
		return nil, err
	}
	if sub.State != storage.Dead {
		return nil, fmt.Errorf("%w: group %q on topic %q is %s, only a DEAD group is resurrected (resume a PAUSED one)",
			storage.ErrInvalidTransition, sub.Group, topic, sub.State)
	}
	up, err := b.setGroupState(ctx, topic, sub.Group, storage.Active)
	if err != nil {
		return nil, err
	}
	return b.beginBackfill(ctx, up, !backfill)
}

// ForceCompleteParams are the parameters of ForceCompleteGroup.
type ForceCompleteParams struct {
	Topic, Group string
	// OlderThan: messages published more than this before now are completed. At least 1 s.
	OlderThan time.Duration
	// Limit is the most messages one call scans (0: DefaultForceComplete, at most
	// MaxForceComplete); Truncated says it stopped there.
	Limit int
}

// ForceCompleteResult is the result of ForceCompleteGroup.
type ForceCompleteResult struct {
	// Completed counts the messages this call completed for the group.
	Completed int `json:"completed"`
	// AlreadyDone counts scanned messages the group had already completed.
	AlreadyDone int `json:"already_done"`
	// Before is the cutoff: messages published before it were completed.
	Before time.Time `json:"before"`
	// Truncated says the call stopped at its limit: call again for the rest.
	Truncated bool `json:"truncated"`
}

// forceCompleteOrderedWhy explains why an ORDERED group is not force-completed: its acks are
// fenced by partition ownership (storage.Assignment.Fence: only the member owning a partition
// since the deliveries' generation may ack there). An admin is no member, a group without
// consumers (the orphaned case) owns no partition, and acking as the owner would complete
// messages behind the back of the member processing that partition in order.
const forceCompleteOrderedWhy = "an ORDERED group's acks are fenced by partition ownership (only the member owning a partition " +
	"in the current generation may ack there; an admin is no member and a group without consumers has no owners); " +
	"to give up its backlog remove the group, or resurrect a DEAD one without backfill"

// ForceCompleteGroup is seed 000's forceCompleteOrphanedMessages for one group: it acks, for the
// group, every retained message published more than OlderThan ago that the group has not
// completed (never delivered, leased, waiting for redelivery). A consumer still holding a lease
// on one of them gets "already done" for its ack. It can lose work if the group is alive, which
// is why it is an explicit admin call. Dead-lettered messages stay in the DLQ. An ORDERED group
// is refused with storage.ErrInvalidArgument (forceCompleteOrderedWhy says why).
//
// It scans each partition from the group's ack floor in offset order (publish times do not
// decrease inside a partition) and stops at the first message at or after the cutoff, acking in
// pages of 1,000, at most Limit messages.
func (b *Broker) ForceCompleteGroup(ctx context.Context, p ForceCompleteParams) (*ForceCompleteResult, error) {
	limit, err := checkForceComplete(p.OlderThan, p.Limit)
	if err != nil {
		return nil, err
	}
	sub, err := b.lookup(ctx, p.Topic, p.Group)
	if err != nil {
		return nil, err
	}
	if sub.Mode == storage.ModeOrdered {
		return nil, invalid("force-complete of ORDERED group %q on topic %q is not supported: %s", sub.Group, p.Topic, forceCompleteOrderedWhy)
	}
	return b.forceCompleteSub(ctx, sub, b.clock.Now().Add(-p.OlderThan), limit)
}

// checkForceComplete validates the cutoff and limit of a force-complete and returns the limit to
// apply.
func checkForceComplete(olderThan time.Duration, limit int) (int, error) {
	switch {
	case olderThan < time.Second:
		return 0, invalid("force-complete: older_than must be at least 1s, got %s", olderThan)
	case limit < 0 || limit > MaxForceComplete:
		return 0, invalid("force-complete: limit must be 0 to %d, got %d", MaxForceComplete, limit)
	case limit == 0:
		return DefaultForceComplete, nil
	}
	return limit, nil
}

// ForceCompleteTopicParams are the parameters of ForceCompleteTopic.
type ForceCompleteTopicParams struct {
	Topic string
	// OlderThan: messages published more than this before now are completed. At least 1 s.
	OlderThan time.Duration
	// Limit is the most messages one call scans over all the groups (0: DefaultForceComplete, at
	// most MaxForceComplete); Truncated says it stopped there.
	Limit int
}

// GroupForceComplete is one group's part of a ForceCompleteTopic.
type GroupForceComplete struct {
	Group string `json:"group"`
	// Completed and AlreadyDone are as in ForceCompleteResult; Truncated: the limit stopped the
	// call inside or before this group.
	Completed   int  `json:"completed"`
	AlreadyDone int  `json:"already_done"`
	Truncated   bool `json:"truncated"`
	// Skipped says why the group was not scanned (an ORDERED group, or the limit was reached
	// before it); empty when it was.
	Skipped string `json:"skipped,omitempty"`
}

// ForceCompleteTopicResult is the result of ForceCompleteTopic.
type ForceCompleteTopicResult struct {
	// Completed counts the messages completed over all the groups.
	Completed int
	// Before is the cutoff: messages published before it were completed.
	Before time.Time
	// Truncated: the call stopped at its limit; call again for the rest.
	Truncated bool
	// Groups are the topic's groups, ordered by subscription ID.
	Groups []GroupForceComplete
}

// ForceCompleteTopic is seed 000's forceCompleteOrphanedMessages(topic, olderThan): ForceCompleteGroup
// for every group of topic that holds messages (every subscription but the CANCELLED ones, PAUSED
// and DEAD groups too), with one cutoff and one limit for the call. ORDERED groups are skipped
// with the reason in their entry (see ForceCompleteGroup); groups the limit left out too. Errors:
// storage.ErrTopicNotFound, storage.ErrInvalidArgument, the engine's; the groups done before an
// engine error keep their completions (it is returned with the partial result).
func (b *Broker) ForceCompleteTopic(ctx context.Context, p ForceCompleteTopicParams) (*ForceCompleteTopicResult, error) {
	limit, err := checkForceComplete(p.OlderThan, p.Limit)
	if err != nil {
		return nil, err
	}
	if err := b.checkRunning(); err != nil {
		return nil, err
	}
	if err := names.ValidateTopic(p.Topic); err != nil {
		return nil, invalidName(err)
	}
	if _, err := b.engine.TopicGet(ctx, p.Topic); err != nil {
		return nil, fmt.Errorf("broker: force-complete topic %q: %w", p.Topic, err)
	}
	subs, err := b.engine.SubscriptionList(ctx, &storage.SubscriptionListParams{Topic: p.Topic})
	if err != nil {
		return nil, fmt.Errorf("broker: force-complete topic %q: %w", p.Topic, err)
	}
	res := &ForceCompleteTopicResult{Before: b.clock.Now().Add(-p.OlderThan), Groups: []GroupForceComplete{}}
	scanned := 0
	for _, sub := range subs {
		if sub.State == storage.Cancelled || sub.State == storage.Deleted {
			continue
		}
		g := GroupForceComplete{Group: sub.Group}
		switch {
		case sub.Mode == storage.ModeOrdered:
			g.Skipped = "ORDERED: not supported: " + forceCompleteOrderedWhy
		case scanned >= limit:
			g.Skipped, g.Truncated, res.Truncated = "the call's limit was reached before this group: call again", true, true
		default:
			r, err := b.forceCompleteSub(ctx, sub, res.Before, limit-scanned)
			if r != nil {
				g.Completed, g.AlreadyDone, g.Truncated = r.Completed, r.AlreadyDone, r.Truncated
				scanned += r.Completed + r.AlreadyDone
				res.Completed += r.Completed
				res.Truncated = res.Truncated || r.Truncated
			}
			if errors.Is(err, storage.ErrSubscriptionNotFound) {
				continue // deleted meanwhile
			}
			if err != nil {
				res.Groups = append(res.Groups, g)
				return res, err
			}
		}
		res.Groups = append(res.Groups, g)
	}
	return res, nil
}

// forceCompleteSub force-completes, for shared subscription sub, the messages published before
// before, scanning at most limit (ForceCompleteGroup). The result is not nil, also with an error.
func (b *Broker) forceCompleteSub(ctx context.Context, sub *storage.Subscription, before time.Time, limit int) (*ForceCompleteResult, error) {
	res := &ForceCompleteResult{Before: before}
	st, err := b.engine.SubscriptionStats(ctx, sub.ID)
	if err != nil {
		return res, fmt.Errorf("broker: force-complete group %q on topic %q: %w", sub.Group, sub.Topic, err)
	}
	scanned := 0
	defer func() {
		if res.Completed > 0 {
			b.logger.WarnContext(context.WithoutCancel(ctx), "group force-completed", append(subAttrs(sub),
				slog.Int("messages", res.Completed), slog.Time("before", res.Before))...)
			if b.onForceComplete != nil {
				b.onForceComplete(sub.Topic, sub.Group, res.Completed)
			}
		}
	}()
	for _, part := range st.Partitions {
		off := part.AckFloor
		for off < part.HighWater {
			if scanned >= limit {
				res.Truncated = true
				return res, nil
			}
			n := min(forceCompletePage, limit-scanned)
			msgs, err := b.engine.MessagesRead(ctx, &storage.MessagesReadParams{Topic: sub.Topic, Partition: part.Partition, Offset: off, Limit: n})
			if err != nil {
				return res, fmt.Errorf("broker: force-complete group %q on topic %q: %w", sub.Group, sub.Topic, err)
			}
			refs := make([]storage.DeliveryRef, 0, len(msgs))
			done := len(msgs) == 0
			for _, m := range msgs {
				if !m.PublishedAt.Before(res.Before) {
					done = true
					break
				}
				refs = append(refs, storage.DeliveryRef{Partition: m.Partition, Offset: m.Offset})
				off = m.Offset + 1
			}
			if len(refs) > 0 {
				scanned += len(refs)
				ack, err := b.engine.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: sub.ID, Member: forceCompleteMember, Refs: refs})
				if err != nil {
					return res, fmt.Errorf("broker: force-complete group %q on topic %q: %w", sub.Group, sub.Topic, err)
				}
				res.Completed += ack.Acked
				res.AlreadyDone += ack.AlreadyDone
			}
			if done {
				break
			}
		}
	}
	return res, nil
}
