package storage

import (
	"fmt"

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
		return StartPosition{}, Invalid("nil params")
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
	return p.Start.Normalize()
}
