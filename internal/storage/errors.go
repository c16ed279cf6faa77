package storage

import "errors"

// Sentinel errors shared by every engine. Engines wrap them with detail ("%w: topic %q"); callers
// test them with errors.Is. The wire protocol maps each of them to one error code (docs/protocol.md).
var (
	// ErrClosed is returned by every method once the engine is closed.
	ErrClosed = errors.New("storage: engine closed")

	// ErrInvalidArgument reports bad input: a name, a size, a setting or a combination of them.
	// Nothing was changed.
	ErrInvalidArgument = errors.New("invalid argument")

	// ErrTopicNotFound is returned when a named topic does not exist.
	ErrTopicNotFound = errors.New("topic not found")

	// ErrTopicExists is returned by TopicCreate when the topic already exists.
	ErrTopicExists = errors.New("topic already exists")

	// ErrTopicHasSubscriptions is returned by TopicDelete without Force while live (ACTIVE or PAUSED)
	// durable subscriptions exist on the topic.
	ErrTopicHasSubscriptions = errors.New("topic has live subscriptions")

	// ErrNoSubscriptions is returned by MessagesAppend on a PUB_SUB topic with
	// block_writes_on_zero_subscriptions when no ACTIVE subscription exists. Checked atomically with
	// the write: nothing was appended.
	ErrNoSubscriptions = errors.New("topic has no active subscription and blocks writes")

	// ErrSubscriptionNotFound is returned when a subscription id or (topic, group) is unknown, or the
	// subscription was deleted.
	ErrSubscriptionNotFound = errors.New("subscription not found")

	// ErrSubscriptionExists is returned by SubscriptionCreate when the topic already has a
	// non-cancelled subscription for the group.
	ErrSubscriptionExists = errors.New("subscription already exists")

	// ErrSubscriptionNotActive is returned when claiming from a subscription that is PAUSED, DEAD,
	// CANCELLED or DELETED, or acting on a CANCELLED one.
	ErrSubscriptionNotActive = errors.New("subscription is not active")

	// ErrInvalidTransition is returned by SubscriptionUpdate for a state change seed 000 forbids
	// (for example anything out of CANCELLED).
	ErrInvalidTransition = errors.New("invalid subscription state transition")

	// ErrLeaseNotHeld is returned by nack and extend when the member does not hold the lease of the
	// message (it expired and may have been given to another member, or was never given).
	ErrLeaseNotHeld = errors.New("lease not held by this member")

	// ErrMessageTooLarge is returned when a message exceeds the topic's max message size.
	ErrMessageTooLarge = errors.New("message too large")

	// ErrOffsetOutOfRange is returned for a start position or read at an offset that does not exist
	// (above the high-water mark, or below the first retained offset where that matters).
	ErrOffsetOutOfRange = errors.New("offset out of range")

	// ErrBindingExists is returned by BindingCreate when the group already has that pattern.
	ErrBindingExists = errors.New("binding already exists")

	// ErrBindingNotFound is returned by BindingDelete for an unknown (group, pattern).
	ErrBindingNotFound = errors.New("binding not found")

	// ErrCorrupt reports on-disk corruption that recovery must not silently repair. Engines wrap it
	// with the file and byte offset.
	ErrCorrupt = errors.New("storage: data corrupt")
)
