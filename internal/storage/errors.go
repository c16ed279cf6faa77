package storage

import (
	"errors"
	"fmt"
)

// Sentinel errors shared by every engine. Engines wrap them with detail ("%w: topic %q"); callers
// test them with errors.Is. The wire protocol maps each of them to one error code (docs/protocol.md).
var (
	// ErrClosed is returned by every method once the engine is closed.
	ErrClosed = errors.New("storage: engine closed")

	// ErrInvalidArgument reports bad input: a name, a size, a setting or a combination of them.
	// Nothing was changed.
	ErrInvalidArgument = errors.New("invalid argument")

	// ErrNotImplemented reports a setting that is part of the design but not built yet
	// (a zombie_ttl other than its default): it is refused rather
	// than accepted and ignored. It wraps ErrInvalidArgument (the protocol's INVALID_ARGUMENT):
	// nothing was changed.
	ErrNotImplemented = fmt.Errorf("%w: not implemented yet", ErrInvalidArgument)

	// ErrTopicNotFound is returned when a named topic does not exist.
	ErrTopicNotFound = errors.New("topic not found")

	// ErrTopicExists is returned by TopicCreate when the topic already exists.
	ErrTopicExists = errors.New("topic already exists")

	// ErrTopicChanged is returned by TopicUpdate with Expect set when the topic's configuration is
	// no longer the expected one: another update landed after the caller read it. Nothing was
	// changed; read the configuration again and re-apply the change to it.
	ErrTopicChanged = errors.New("topic configuration changed since it was read")

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

	// ErrSubscriptionHasProgress is returned by SubscriptionConfigure for a new start position once
	// the subscription delivered, acked or dead-lettered something. It wraps ErrInvalidTransition
	// (protocol INVALID_TRANSITION).
	ErrSubscriptionHasProgress = fmt.Errorf("%w: the subscription has progress, its start position can no longer change", ErrInvalidTransition)

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

	// ErrRateLimited is returned when a request would take the server past a bound that frees up by
	// itself (the producer ids remembered within their de-duplication windows): nothing was
	// changed, and the same request succeeds later.
	ErrRateLimited = errors.New("rate limited")

	// ErrLimitExceeded is returned when a request would take the server past a configured bound
	// on what clients can make it keep (topics, partitions per topic). Nothing was changed; the
	// request succeeds only after an operator raised the bound or freed room.
	ErrLimitExceeded = errors.New("limit exceeded")

	// ErrCorrupt reports on-disk corruption that recovery must not silently repair. Engines wrap it
	// with the file and byte offset.
	ErrCorrupt = errors.New("storage: data corrupt")
)

// Failures of the storage itself (files, database). Engines return them inside an *IOError.
var (
	// ErrUnavailable reports that the engine cannot use its storage now: the database is
	// unreachable, shutting down or out of connections, the process is out of file handles, or the
	// engine stopped accepting changes after a write failure. The call that returns it stored
	// nothing; the same call may succeed later (after the database is back, or the broker was
	// restarted on a repaired disk).
	ErrUnavailable = errors.New("storage unavailable")

	// ErrFull reports that the storage is out of space: disk full, disk quota exceeded, PostgreSQL
	// disk_full. The call that returns it stored nothing; the same call may succeed once space was
	// freed (on the embedded engine, after the broker was restarted).
	ErrFull = errors.New("storage full")

	// ErrPartitionDamaged is the cause (IOError.Err) of every refusal of a partition whose log the
	// embedded engine found damaged (storage.ErrCorrupt): at Open, or by a later read. The error is
	// an *IOError of Kind ErrUnavailable; the other partitions and topics work normally. The
	// partition stays unavailable until an operator repairs it with `spool data truncate` and the
	// broker restarts.
	ErrPartitionDamaged = errors.New("partition damaged")
)

// IOError is a failure of an engine's storage (a file system or database error), classified for
// clients. Engines return it instead of the bare cause so that the wire protocol and the HTTP API
// answer the right code (STORAGE_UNAVAILABLE, STORAGE_FULL, or INTERNAL when the outcome is
// unknown) with a message that carries no file path, host name, SQL or database message: Error
// (for logs) has every detail, Public (for clients) only Kind and Reason.
type IOError struct {
	// Kind is ErrUnavailable or ErrFull when the call stored nothing. Nil means the outcome is
	// unknown: the failure hit the call's own write (a write or fsync that failed midway, a
	// database connection lost after the COMMIT was sent), which may or may not be durable.
	Kind error
	// Reason says what failed in a few client-safe words ("no space left on device", "database
	// unreachable"); never a path or a server message.
	Reason string
	// Err is the cause, with every detail (paths included): for logs only.
	Err error
}

// Error returns the full text, cause included: for logs, never for clients.
func (e *IOError) Error() string {
	return e.Public() + ": " + e.Err.Error()
}

// Public returns the text a client may see: the kind and the reason, no path and no cause.
func (e *IOError) Public() string {
	if e.Kind == nil {
		return "storage failure while the request was written (" + e.Reason + "): it may or may not have taken effect"
	}
	return e.Kind.Error() + ": " + e.Reason
}

// Unwrap returns Kind (when set) and the cause, for errors.Is and errors.As.
func (e *IOError) Unwrap() []error {
	if e.Kind == nil {
		return []error{e.Err}
	}
	return []error{e.Kind, e.Err}
}
