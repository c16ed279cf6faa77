package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
)

// GroupInfo describes one subscription (a consumer group on a topic) for admin listings.
type GroupInfo struct {
	// Topic is the subscription's topic.
	Topic string `json:"topic"`
	// Group is the consumer group; storage.QueueGroup for the subscription of a QUEUE topic, a
	// name the engine chose (starting with '$') for an ephemeral subscription.
	Group string `json:"group"`
	// State is the subscription's lifecycle state (a copy of Subscription.State).
	State storage.SubscriptionState `json:"state"`
	// Subscription is the engine's record of the subscription.
	Subscription *storage.Subscription `json:"subscription"`
	// Stats are its depth, lag, in-flight and DLQ figures (nil for a DELETED subscription).
	Stats *storage.SubscriptionStats `json:"stats,omitempty"`
	// Members are the IDs of this broker's members attached to the subscription (members connected
	// to other broker instances are not listed).
	Members []string `json:"members"`
	// Backfill is the group's backfill: state (NOT_STARTED, IN_PROGRESS, COMPLETED, CANCELLED,
	// FAILED), processed, total, rate and ETA (backfill.go).
	Backfill *BackfillInfo `json:"backfill"`
	// OldestUnackedAt is the publish time of the oldest message the group has not completed (zero
	// when none). Only the one-topic listing and Group read it (a read per partition with work
	// left); the all-topics listing leaves it zero.
	OldestUnackedAt time.Time `json:"oldest_unacked_at,omitzero"`
	// OldestUnackedAge is the broker clock's now minus OldestUnackedAt (0 when zero).
	OldestUnackedAge time.Duration `json:"oldest_unacked_age,omitempty"`
	// Health is HealthOK, HealthWarn or HealthFail; Reasons say why (empty when OK).
	Health  string   `json:"health"`
	Reasons []string `json:"reasons"`
	// Counts are the group's processed, failed and filtered messages on this broker instance
	// since it started (groupcounts.go: the engines keep no such totals).
	Counts GroupCounts `json:"counts"`
	// Assignment is the partition assignment of an ORDERED subscription (nil for a shared one):
	// its generation, strategy and which member owns which partitions, on every instance.
	Assignment *storage.Assignment `json:"assignment,omitempty"`
}

// Groups describes every subscription that is not DELETED, ordered by subscription ID.
func (b *Broker) Groups(ctx context.Context) ([]*GroupInfo, error) {
	return b.TopicGroups(ctx, "")
}

// TopicGroups is Groups for the subscriptions of one topic (all with topic ""). It reads the
// figures of those only: each SubscriptionStats looks at every partition of its topic, so a
// topic's page must not pay for the whole broker's. An unknown topic has no groups.
func (b *Broker) TopicGroups(ctx context.Context, topic string) ([]*GroupInfo, error) {
	if err := b.checkRunning(); err != nil {
		return nil, err
	}
	subs, err := b.engine.SubscriptionList(ctx, &storage.SubscriptionListParams{Topic: topic})
	if err != nil {
		return nil, fmt.Errorf("broker: list groups: %w", err)
	}
	out := make([]*GroupInfo, 0, len(subs))
	for _, sub := range subs {
		info, err := b.groupInfo(ctx, sub, topic != "")
		if errors.Is(err, storage.ErrSubscriptionNotFound) || errors.Is(err, storage.ErrTopicNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	return out, nil
}

// GroupPageParams select a page of GroupsPage.
type GroupPageParams struct {
	// Topic, Group and State, when set, keep only the subscriptions that match.
	Topic, Group string
	State        storage.SubscriptionState
	// AfterID starts the page after this subscription ID (0: from the first).
	AfterID int64
	// Limit is the page size, at least 1.
	Limit int
}

// GroupsPage is TopicGroups one page at a time, ordered by subscription ID: the filters are
// applied to the engine's list first, so it reads the figures of the page's subscriptions only.
// next is the AfterID of the next page, 0 on the last one.
func (b *Broker) GroupsPage(ctx context.Context, p GroupPageParams) (page []*GroupInfo, next int64, err error) {
	if p.Limit < 1 {
		return nil, 0, invalid("group page limit must be at least 1, got %d", p.Limit)
	}
	if err := b.checkRunning(); err != nil {
		return nil, 0, err
	}
	subs, err := b.engine.SubscriptionList(ctx, &storage.SubscriptionListParams{Topic: p.Topic})
	if err != nil {
		return nil, 0, fmt.Errorf("broker: list groups: %w", err)
	}
	subs = slices.DeleteFunc(subs, func(s *storage.Subscription) bool {
		return s.ID <= p.AfterID || p.Group != "" && s.Group != p.Group || p.State != "" && s.State != p.State
	})
	page = make([]*GroupInfo, 0, min(len(subs), p.Limit))
	for i, sub := range subs {
		if len(page) == p.Limit {
			return page, subs[i-1].ID, nil
		}
		info, err := b.groupInfo(ctx, sub, p.Topic != "")
		if errors.Is(err, storage.ErrSubscriptionNotFound) || errors.Is(err, storage.ErrTopicNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, 0, err
		}
		page = append(page, info)
	}
	return page, 0, nil
}

// Group describes the subscription of group on topic; group "" means the queue subscription
// (storage.QueueGroup).
func (b *Broker) Group(ctx context.Context, topic, group string) (*GroupInfo, error) {
	sub, err := b.lookup(ctx, topic, group)
	if err != nil {
		return nil, err
	}
	return b.groupInfo(ctx, sub, true)
}

// groupInfo describes sub; oldest says to read its oldest unacked message.
func (b *Broker) groupInfo(ctx context.Context, sub *storage.Subscription, oldest bool) (*GroupInfo, error) {
	info := &GroupInfo{Topic: sub.Topic, Group: sub.Group, State: sub.State, Subscription: sub, Members: []string{},
		Backfill: b.backfillInfo(sub, nil)}
	if sub.State != storage.Deleted {
		stats, err := b.engine.SubscriptionStats(ctx, sub.ID)
		if err != nil {
			return nil, fmt.Errorf("broker: stats of subscription %d: %w", sub.ID, err)
		}
		info.Stats = stats
		info.Backfill = b.backfillInfo(sub, stats.Partitions)
		if sub.Mode == storage.ModeOrdered {
			if info.Assignment, err = b.engine.SubscriptionAssignment(ctx, sub.ID); err != nil {
				return nil, fmt.Errorf("broker: assignment of subscription %d: %w", sub.ID, err)
			}
		}
	}
	b.mu.RLock()
	s := b.subs[sub.ID]
	b.mu.RUnlock()
	if s != nil {
		info.Members = s.memberIDs()
	}
	if oldest {
		at, err := b.oldestUnacked(ctx, sub, info.Stats)
		if err != nil {
			return nil, err
		}
		info.OldestUnackedAt = at
	}
	now := b.clock.Now()
	if !info.OldestUnackedAt.IsZero() {
		info.OldestUnackedAge = now.Sub(info.OldestUnackedAt)
	}
	info.Counts = b.groupCounts(sub.ID)
	groupHealth(info, now)
	return info, nil
}

// validateGroupRef validates a group given to an admin call: a user group, or a group the broker
// or engine named ('$' and a valid name: storage.QueueGroup, an ephemeral subscription's group).
// "" means storage.QueueGroup.
func validateGroupRef(group string) (string, error) {
	if group == "" {
		return storage.QueueGroup, nil
	}
	if err := names.ValidateGroup(strings.TrimPrefix(group, "$")); err != nil {
		return "", invalidName(err)
	}
	return group, nil
}

// lookup returns the newest subscription of (topic, group) that is not DELETED.
func (b *Broker) lookup(ctx context.Context, topic, group string) (*storage.Subscription, error) {
	if err := b.checkRunning(); err != nil {
		return nil, err
	}
	if err := names.ValidateTopic(topic); err != nil {
		return nil, invalidName(err)
	}
	group, err := validateGroupRef(group)
	if err != nil {
		return nil, err
	}
	sub, err := b.engine.SubscriptionGetByGroup(ctx, topic, group)
	if err != nil {
		return nil, fmt.Errorf("broker: group %q on topic %q: %w", group, topic, err)
	}
	return sub, nil
}

// setGroupState moves a subscription to state and wakes its owner.
func (b *Broker) setGroupState(ctx context.Context, topic, group string, state storage.SubscriptionState) (*storage.Subscription, error) {
	up, _, err := b.changeGroupState(ctx, topic, group, state)
	return up, err
}

// changeGroupState is setGroupState, also returning the state the subscription left.
func (b *Broker) changeGroupState(ctx context.Context, topic, group string, state storage.SubscriptionState) (*storage.Subscription, storage.SubscriptionState, error) {
	sub, err := b.lookup(ctx, topic, group)
	if err != nil {
		return nil, "", err
	}
	up, err := b.engine.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: sub.ID, State: state})
	if err != nil {
		return nil, "", fmt.Errorf("broker: group %q on topic %q: set state %s: %w", sub.Group, topic, state, err)
	}
	b.logger.InfoContext(ctx, "group state changed", slog.String("topic", topic), slog.String("group", sub.Group),
		slog.Int64("subscription", sub.ID), slog.String("from", string(sub.State)), slog.String("to", string(state)))
	b.wakeSubscription(sub.ID)
	if up.State == storage.Active {
		b.lifecycleSooner(up.HeartbeatTimeout)
	}
	if sub.State == storage.Dead && up.State == storage.Active {
		// ResumeGroup or ResurrectGroup of a DEAD group (a concurrent change would have made
		// the update fail: no state moves to itself).
		b.reportTransition(&LifecycleResult{Resurrected: []*storage.Subscription{up}})
	}
	return up, sub.State, nil
}

// PauseGroup pauses the subscription of group on topic ("" for the queue subscription): it
// receives nothing and keeps holding retention (bounded by max_retention). Leases already given
// stay valid.
func (b *Broker) PauseGroup(ctx context.Context, topic, group string) (*storage.Subscription, error) {
	return b.setGroupState(ctx, topic, group, storage.Paused)
}

// ResumeGroup makes a PAUSED or DEAD subscription ACTIVE again and wakes its owner. A DEAD one is
// resurrected as by a consumer attaching: it begins the bounded backfill of what it missed
// (ResurrectGroup with backfill).
func (b *Broker) ResumeGroup(ctx context.Context, topic, group string) (*storage.Subscription, error) {
	up, from, err := b.changeGroupState(ctx, topic, group, storage.Active)
	if err != nil || from != storage.Dead {
		return up, err
	}
	return b.beginBackfill(ctx, up, false)
}

// CancelGroup cancels the subscription of group on topic: it releases everything at once and is
// terminal. The members of this broker attached to it are detached and told so
// (Member.TakeEnded); they stay open for their other subscriptions. Those of other broker
// instances on the same database are told the same by their own owner once it finds the cancel
// (owner.endReason). Subscribing again creates a new subscription. The group's pattern bindings
// stay (see DeleteBinding).
func (b *Broker) CancelGroup(ctx context.Context, topic, group string) (*storage.Subscription, error) {
	sub, err := b.setGroupState(ctx, topic, group, storage.Cancelled)
	if err != nil {
		return nil, err
	}
	b.mu.RLock()
	s := b.subs[sub.ID]
	b.mu.RUnlock()
	if s != nil {
		owned := s.end(cancelledReason(sub))
		if owned {
			if err := b.engine.SubscriptionDelete(ctx, sub.ID); err != nil && !errors.Is(err, storage.ErrSubscriptionNotFound) {
				b.logger.WarnContext(ctx, "deleting cancelled ephemeral subscription failed", slog.Int64("subscription", sub.ID), slog.Any("error", err))
			}
		}
	}
	return sub, nil
}

// DLQ lists the dead-lettered messages of the subscription of group on topic with an ID above
// afterID, at most limit (0: 100), in ID order.
func (b *Broker) DLQ(ctx context.Context, topic, group string, afterID int64, limit int) ([]*storage.DLQEntry, error) {
	if afterID < 0 || limit < 0 {
		return nil, invalid("dlq: after id and limit must not be negative, got %d and %d", afterID, limit)
	}
	sub, err := b.lookup(ctx, topic, group)
	if err != nil {
		return nil, err
	}
	entries, err := b.engine.DLQList(ctx, &storage.DLQListParams{SubscriptionID: sub.ID, AfterID: afterID, Limit: limit})
	if err != nil {
		return nil, fmt.Errorf("broker: dlq of group %q on topic %q: %w", sub.Group, topic, err)
	}
	return entries, nil
}

// ReplayDLQ moves DLQ entries (all when ids is empty) of the subscription of group on topic back to
// that subscription only, due at once with a fresh attempt count, and returns how many.
func (b *Broker) ReplayDLQ(ctx context.Context, topic, group string, ids []int64) (int, error) {
	sub, err := b.lookup(ctx, topic, group)
	if err != nil {
		return 0, err
	}
	n, err := b.engine.DLQReplay(ctx, &storage.DLQReplayParams{SubscriptionID: sub.ID, IDs: ids})
	if err != nil {
		return 0, fmt.Errorf("broker: replay dlq of group %q on topic %q: %w", sub.Group, topic, err)
	}
	b.logger.InfoContext(ctx, "dlq replayed", slog.String("topic", topic), slog.String("group", sub.Group), slog.Int("entries", n))
	b.wakeSubscription(sub.ID)
	return n, nil
}

// PurgeDLQ removes DLQ entries (all when ids is empty) of the subscription of group on topic and
// returns how many.
func (b *Broker) PurgeDLQ(ctx context.Context, topic, group string, ids []int64) (int, error) {
	sub, err := b.lookup(ctx, topic, group)
	if err != nil {
		return 0, err
	}
	n, err := b.engine.DLQPurge(ctx, &storage.DLQPurgeParams{SubscriptionID: sub.ID, IDs: ids})
	if err != nil {
		return 0, fmt.Errorf("broker: purge dlq of group %q on topic %q: %w", sub.Group, topic, err)
	}
	b.logger.InfoContext(ctx, "dlq purged", slog.String("topic", topic), slog.String("group", sub.Group), slog.Int("entries", n))
	return n, nil
}

// Bindings lists the durable groups' pattern bindings, ordered by group then pattern.
func (b *Broker) Bindings(ctx context.Context) ([]*storage.Binding, error) {
	if err := b.checkRunning(); err != nil {
		return nil, err
	}
	bs, err := b.engine.BindingList(ctx)
	if err != nil {
		return nil, fmt.Errorf("broker: list bindings: %w", err)
	}
	return bs, nil
}

// DeleteBinding removes a group's binding: topics created later no longer get a subscription for
// the group. Subscriptions it created stay.
func (b *Broker) DeleteBinding(ctx context.Context, group, pattern string) error {
	if err := b.checkRunning(); err != nil {
		return err
	}
	if err := names.ValidateGroup(group); err != nil {
		return invalidName(err)
	}
	if err := names.ValidatePattern(pattern); err != nil {
		return invalidName(err)
	}
	if err := b.engine.BindingDelete(ctx, &storage.BindingDeleteParams{Group: group, Pattern: pattern}); err != nil {
		return fmt.Errorf("broker: delete binding of group %q on %q: %w", group, pattern, err)
	}
	return nil
}

// Members describes this broker's live members, ordered by ID.
func (b *Broker) Members() []MemberInfo {
	b.mu.RLock()
	ms := make([]*Member, 0, len(b.members))
	for _, m := range b.members {
		ms = append(ms, m)
	}
	b.mu.RUnlock()
	out := make([]MemberInfo, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.Info())
	}
	slices.SortFunc(out, func(a, c MemberInfo) int { return strings.Compare(a.ID, c.ID) })
	return out
}

func sortInt64s(s []int64) { slices.Sort(s) }
