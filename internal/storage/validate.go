package storage

import (
	"fmt"
	"time"

	"github.com/spoolmq/spool/internal/names"
)

// Validation shared by the engines: what they refuse before touching anything, with the same
// errors.

// Invalid returns an error wrapping ErrInvalidArgument with a formatted detail.
func Invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// InvalidName wraps an error of the names package so that it matches ErrInvalidArgument too; nil
// stays nil.
func InvalidName(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
}

// Normalize checks a start position and returns it with its default kind (FromNow) filled in.
func (sp StartPosition) Normalize() (StartPosition, error) {
	switch sp.Kind {
	case "":
		sp.Kind = FromNow
	case FromNow, FromBeginning, FromTimestamp:
	case FromMessageID:
		if sp.Partition < 0 || sp.Offset < 0 {
			return sp, Invalid("start position: partition and offset must not be negative, got %d:%d", sp.Partition, sp.Offset)
		}
	default:
		return sp, Invalid("start position kind %q: want FROM_NOW, FROM_BEGINNING, FROM_TIMESTAMP or FROM_MESSAGE_ID", sp.Kind)
	}
	return sp, nil
}

// CheckTopic validates a topic name and returns its configuration completed with WithDefaults and
// validated (TopicCreate, TopicUpdate).
func CheckTopic(name string, cfg TopicConfig) (TopicConfig, error) {
	if err := names.ValidateTopic(name); err != nil {
		return cfg, InvalidName(err)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// Check validates the parameters of SubscriptionCreate (names, pattern, start position) and
// returns the normalized start position.
func (p *SubscriptionCreateParams) Check() (StartPosition, error) {
	if p == nil {
		return StartPosition{}, nilParams()
	}
	if err := names.ValidateTopic(p.Topic); err != nil {
		return StartPosition{}, InvalidName(err)
	}
	if p.Group != "" && p.Group != QueueGroup {
		if err := names.ValidateGroup(p.Group); err != nil {
			return StartPosition{}, InvalidName(err)
		}
	}
	if p.Pattern != "" {
		if err := names.ValidatePattern(p.Pattern); err != nil {
			return StartPosition{}, InvalidName(err)
		}
	}
	if err := p.checkOrdering(); err != nil {
		return StartPosition{}, err
	}
	if err := CheckHeartbeatTimeout(p.HeartbeatTimeout); err != nil {
		return StartPosition{}, err
	}
	if err := CheckMaxBackfill(p.MaxBackfillMessages); err != nil {
		return StartPosition{}, err
	}
	return p.Start.Normalize()
}

// CheckHeartbeatTimeout refuses a heartbeat timeout that is not zero (the default) and not within
// MinHeartbeatTimeout to MaxHeartbeatTimeout.
func CheckHeartbeatTimeout(d time.Duration) error {
	if d != 0 && (d < MinHeartbeatTimeout || d > MaxHeartbeatTimeout) {
		return Invalid("heartbeat_timeout must be between %s and %s, got %s", MinHeartbeatTimeout, MaxHeartbeatTimeout, d)
	}
	return nil
}

// Check validates the parameters of SubscriptionConfigure and returns the new start position
// normalized (nil when unchanged). Changing nothing is ErrInvalidArgument.
func (p *SubscriptionConfigureParams) Check() (*StartPosition, error) {
	if p == nil {
		return nil, nilParams()
	}
	if p.Start == nil && p.HeartbeatTimeout == 0 {
		return nil, Invalid("subscription %d: nothing to change (give a start position or a heartbeat timeout)", p.ID)
	}
	if err := CheckHeartbeatTimeout(p.HeartbeatTimeout); err != nil {
		return nil, err
	}
	if p.Start == nil {
		return nil, nil
	}
	sp, err := p.Start.Normalize()
	if err != nil {
		return nil, err
	}
	return &sp, nil
}

// Check validates the parameters of SubscriptionsHeartbeat: at most MaxHeartbeatIDs IDs.
func (p *SubscriptionsHeartbeatParams) Check() error {
	if p == nil {
		return nilParams()
	}
	if len(p.IDs) > MaxHeartbeatIDs {
		return Invalid("heartbeat of %d subscriptions, at most %d per call", len(p.IDs), MaxHeartbeatIDs)
	}
	return nil
}

// Check validates the parameters of SubscriptionsMaintain and returns the CANCELLED retention
// (DefaultSubscriptionRetention for zero).
func (p *SubscriptionsMaintainParams) Check() (time.Duration, error) {
	if p == nil {
		return 0, nilParams()
	}
	if p.CancelledRetention < 0 {
		return 0, Invalid("subscription_retention must not be negative, got %s", p.CancelledRetention)
	}
	if p.CancelledRetention == 0 {
		return DefaultSubscriptionRetention, nil
	}
	return p.CancelledRetention, nil
}

// The Check methods below validate an Engine method's parameters before the engine touches
// anything, so both engines refuse the same calls with the same errors: a nil params, and the
// fields that are wrong whatever the state. What depends on the state (a partition out of
// range, an unknown subscription) is the engine's.

// nilParams is the error of a method called with nil parameters.
func nilParams() error { return Invalid("nil params") }

// Check validates the parameters of BindingCreate (group, pattern, start position) and returns
// the normalized start position.
func (p *BindingCreateParams) Check() (StartPosition, error) {
	if p == nil {
		return StartPosition{}, nilParams()
	}
	if err := names.ValidateGroup(p.Group); err != nil {
		return StartPosition{}, InvalidName(err)
	}
	if err := names.ValidatePattern(p.Pattern); err != nil {
		return StartPosition{}, InvalidName(err)
	}
	return p.Start.Normalize()
}

// Check validates the parameters of BindingDelete.
func (p *BindingDeleteParams) Check() error {
	if p == nil {
		return nilParams()
	}
	return nil
}

// Check validates the parameters of DeliveriesAck.
func (p *DeliveriesAckParams) Check() error {
	if p == nil {
		return nilParams()
	}
	return nil
}

// Check validates the parameters of DeliveriesClaim: Max at least 1, a member, a lease duration
// not negative. The partitions are checked against the topic by the engine (policy.Claim).
func (p *DeliveriesClaimParams) Check() error {
	switch {
	case p == nil:
		return nilParams()
	case p.Max < 1:
		return Invalid("max must be at least 1, got %d", p.Max)
	case p.Member == "":
		return Invalid("member must not be empty")
	case p.LeaseDuration < 0:
		return Invalid("lease duration must not be negative, got %s", p.LeaseDuration)
	case p.BatchSize < 0 || p.BatchSize > MaxBatchSize:
		return Invalid("batch_size must be between 1 and %d (0: no batches), got %d", MaxBatchSize, p.BatchSize)
	case len(p.Skip) > MaxGroupNameLen:
		return Invalid("skip tag must have at most %d bytes, got %d", MaxGroupNameLen, len(p.Skip))
	case len(p.Take) > MaxGroupNameLen:
		return Invalid("take tag must have at most %d bytes, got %d", MaxGroupNameLen, len(p.Take))
	case p.SkipFor < 0 || p.SkipFor > MaxSkipFor:
		return Invalid("skip_for must be between 0 and %s, got %s", MaxSkipFor, p.SkipFor)
	}
	return nil
}

// MaxSkipFor bounds DeliveriesClaimParams.SkipFor.
const MaxSkipFor = time.Minute

// Check validates the parameters of DeliveriesExtend: a duration not negative.
func (p *DeliveriesExtendParams) Check() error {
	switch {
	case p == nil:
		return nilParams()
	case p.Duration < 0:
		return Invalid("duration must not be negative, got %s", p.Duration)
	}
	return nil
}

// Check validates the parameters of DeliveriesNack: a delay not negative.
func (p *DeliveriesNackParams) Check() error {
	switch {
	case p == nil:
		return nilParams()
	case p.Delay < 0:
		return Invalid("delay must not be negative, got %s", p.Delay)
	case len(p.GiveBack) > MaxGroupNameLen:
		return Invalid("give-back tag must have at most %d bytes, got %d", MaxGroupNameLen, len(p.GiveBack))
	case p.GiveBack != "" && (p.ToDLQ || p.Batch):
		return Invalid("a give-back neither dead-letters nor nacks whole batches")
	}
	return nil
}

// Check validates the parameters of DeliveriesRelease: a member.
func (p *DeliveriesReleaseParams) Check() error {
	switch {
	case p == nil:
		return nilParams()
	case p.Member == "":
		return Invalid("member must not be empty")
	}
	return nil
}

// Check validates the parameters of DLQList: a limit not negative.
func (p *DLQListParams) Check() error {
	switch {
	case p == nil:
		return nilParams()
	case p.Limit < 0:
		return Invalid("limit must not be negative, got %d", p.Limit)
	}
	return nil
}

// Check validates the parameters of DLQPurge.
func (p *DLQPurgeParams) Check() error {
	if p == nil {
		return nilParams()
	}
	return nil
}

// Check validates the parameters of DLQReplay.
func (p *DLQReplayParams) Check() error {
	if p == nil {
		return nilParams()
	}
	return nil
}

// Check validates the parameters of SubscriptionUpdate: a known state (the transition is the
// engine's to check, CanTransition).
func (p *SubscriptionUpdateParams) Check() error {
	if p == nil {
		return nilParams()
	}
	switch p.State {
	case Active, Paused, Dead, Cancelled, Deleted:
		return nil
	}
	return Invalid("subscription state %q", p.State)
}

// Check validates the parameters of TopicCreate and returns the configuration completed with
// defaults (CheckTopic).
func (p *TopicCreateParams) Check() (TopicConfig, error) {
	if p == nil {
		return TopicConfig{}, nilParams()
	}
	return CheckTopic(p.Name, p.Config)
}

// Check validates the parameters of TopicDelete: the topic's name.
func (p *TopicDeleteParams) Check() error {
	if p == nil {
		return nilParams()
	}
	return InvalidName(names.ValidateTopic(p.Name))
}

// Check validates the parameters of TopicUpdate and returns the configuration completed with
// defaults (CheckTopic). QueueToGroup is checked by the engine when the change needs it.
func (p *TopicUpdateParams) Check() (TopicConfig, error) {
	if p == nil {
		return TopicConfig{}, nilParams()
	}
	return CheckTopic(p.Name, p.Config)
}

// CheckExpect compares Expect with stored, the topic's configuration as the engine holds it: nil
// when Expect is nil or equal to it, else an error wrapping ErrTopicChanged. Both sides are
// completed with WithDefaults first, so a configuration stored before a setting existed equals
// the same configuration read back with the setting's default. Engines call it under the lock
// their update writes with.
func (p *TopicUpdateParams) CheckExpect(stored TopicConfig) error {
	if p.Expect == nil || p.Expect.WithDefaults() == stored.WithDefaults() {
		return nil
	}
	return fmt.Errorf("%w: topic %q", ErrTopicChanged, p.Name)
}
