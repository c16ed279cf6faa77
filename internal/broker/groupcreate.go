package broker

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
)

// CreateGroupParams are the parameters of Broker.CreateGroup.
type CreateGroupParams struct {
	// Topic is an existing PUB_SUB topic.
	Topic string
	// Group is the consumer group.
	Group string
	// Start is where the subscription starts; the zero value means FROM_NOW.
	Start storage.StartPosition
	// HeartbeatTimeout is how long the group may have no live member before it becomes DEAD; 0
	// means storage.DefaultHeartbeatTimeout.
	HeartbeatTimeout time.Duration
	// MaxBackfillMessages bounds the group's backfill ranges (0: storage.DefaultMaxBackfillMessages,
	// storage.UnlimitedBackfill: none); the newest are kept.
	MaxBackfillMessages int64
	// Ordered makes an ordered group (storage.ModeOrdered: each partition owned by one member at a
	// time, delivered in offset order), whose members subscribe ordered. Strategy (round-robin,
	// the default, or sticky) and MaxInFlightPerPartition (default 1) are its settings, refused
	// for a shared group.
	Ordered                 bool
	Strategy                string
	MaxInFlightPerPartition int
}

// CreateGroup creates a consumer group's subscription on a PUB_SUB topic ahead of its consumers
// (seed 004's createSubscription): messages published from its start on are kept for it, and its
// members continue from there when they subscribe. The topic must exist (no auto-create): an
// unknown topic is storage.ErrTopicNotFound, a QUEUE topic (whose one subscription exists from
// its creation) storage.ErrInvalidArgument, a group already subscribed storage.ErrSubscriptionExists.
// The group has no member until one subscribes, so it becomes DEAD after its heartbeat timeout
// without one (a member subscribing resurrects it).
func (b *Broker) CreateGroup(ctx context.Context, p CreateGroupParams) (*storage.Subscription, error) {
	if err := b.checkRunning(); err != nil {
		return nil, err
	}
	if err := names.ValidateTopic(p.Topic); err != nil {
		return nil, invalidName(err)
	}
	if err := names.ValidateGroup(p.Group); err != nil {
		return nil, invalidName(err)
	}
	start, err := validateStart(p.Start)
	if err != nil {
		return nil, err
	}
	if err := storage.CheckHeartbeatTimeout(p.HeartbeatTimeout); err != nil {
		return nil, err
	}
	if err := storage.CheckMaxBackfill(p.MaxBackfillMessages); err != nil {
		return nil, err
	}
	mode := storage.ModeShared
	switch {
	case !p.Ordered && (p.Strategy != "" || p.MaxInFlightPerPartition != 0):
		return nil, invalid("create group %q: strategy and max_in_flight_per_partition are for ordered groups only", p.Group)
	case !p.Ordered:
	case p.MaxInFlightPerPartition < 0 || p.MaxInFlightPerPartition > storage.MaxInFlightPerPartitionLimit:
		return nil, invalid("create group %q: max_in_flight_per_partition must be between 1 and %d, got %d",
			p.Group, storage.MaxInFlightPerPartitionLimit, p.MaxInFlightPerPartition)
	default:
		if err := storage.CheckStrategy(p.Strategy); err != nil {
			return nil, err
		}
		mode = storage.ModeOrdered
	}
	t, err := b.engine.TopicGet(ctx, p.Topic)
	if err != nil {
		return nil, fmt.Errorf("broker: create group %q: %w", p.Group, err)
	}
	if t.Config.Semantics != storage.PubSub {
		return nil, invalid("create group %q: topic %q is QUEUE: its consumers share its one subscription, groups are for PUB_SUB topics", p.Group, p.Topic)
	}
	sub, err := b.engine.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{
		Topic: p.Topic, Group: p.Group, Start: start, HeartbeatTimeout: p.HeartbeatTimeout, MaxBackfillMessages: p.MaxBackfillMessages,
		Mode: mode, Strategy: p.Strategy, MaxInFlightPerPartition: p.MaxInFlightPerPartition,
		MaxSubscriptions: b.maxSubscriptions,
	})
	if err != nil {
		return nil, fmt.Errorf("broker: create group %q on topic %q: %w", p.Group, p.Topic, err)
	}
	if sub.Backfill != nil {
		b.countMissed(ctx, sub, sub.Backfill.Skipped, false, "range cut to max_backfill_messages")
	}
	b.logger.InfoContext(ctx, "group created", subAttrs(sub)...)
	b.lifecycleSooner(sub.HeartbeatTimeout)
	return sub, nil
}

// UpdateGroupParams are the parameters of Broker.UpdateGroup.
type UpdateGroupParams struct {
	Topic, Group string
	// Start, when not nil, is the new start position: accepted only while the group has no
	// progress (storage.ErrSubscriptionHasProgress otherwise).
	Start *storage.StartPosition
	// HeartbeatTimeout, when not zero, is the new heartbeat timeout.
	HeartbeatTimeout time.Duration
}

// UpdateGroup changes a durable group's start position (only before it delivered anything) and
// its heartbeat timeout (Engine.SubscriptionConfigure), and wakes its dispatcher.
func (b *Broker) UpdateGroup(ctx context.Context, p UpdateGroupParams) (*storage.Subscription, error) {
	if err := b.checkRunning(); err != nil {
		return nil, err
	}
	params := &storage.SubscriptionConfigureParams{HeartbeatTimeout: p.HeartbeatTimeout}
	if p.Start != nil {
		start, err := validateStart(*p.Start)
		if err != nil {
			return nil, err
		}
		params.Start = &start
	}
	if params.Start == nil && params.HeartbeatTimeout == 0 {
		return nil, invalid("update group %q: nothing to change: give a start position or a heartbeat timeout", p.Group)
	}
	if err := storage.CheckHeartbeatTimeout(p.HeartbeatTimeout); err != nil {
		return nil, err
	}
	sub, err := b.lookup(ctx, p.Topic, p.Group)
	if err != nil {
		return nil, err
	}
	params.ID = sub.ID
	up, err := b.engine.SubscriptionConfigure(ctx, params)
	if err != nil {
		return nil, fmt.Errorf("broker: update group %q on topic %q: %w", sub.Group, p.Topic, err)
	}
	b.logger.InfoContext(ctx, "group updated", append(subAttrs(up), slog.String("start", string(up.Start.Kind)),
		slog.Duration("heartbeat_timeout", up.HeartbeatTimeout))...)
	b.wakeSubscription(up.ID)
	if up.State == storage.Active {
		b.lifecycleSooner(up.HeartbeatTimeout)
	}
	return up, nil
}
