// Package errmap maps the errors of the storage engines and of the broker to the protocol's error
// table (protocol.Error), in one place, so that the TCP server, the text mode and the HTTP admin API
// report the same condition with the same code, name and retry flag (docs/protocol.md section 9.2).
package errmap

import (
	"context"
	"errors"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// sentinels is the mapping, most specific first: an error that wraps two sentinels (a broker error
// wrapping storage.ErrInvalidArgument and names.ErrInvalidName, a message-too-large error that
// also says invalid argument) gets the first match.
var sentinels = []struct {
	err   error
	proto *protocol.Error
}{
	{storage.ErrMessageTooLarge, protocol.ErrMessageTooLarge},
	{storage.ErrTopicNotFound, protocol.ErrTopicNotFound},
	{storage.ErrTopicExists, protocol.ErrTopicExists},
	{storage.ErrTopicHasSubscriptions, protocol.ErrTopicHasSubscriptions},
	{storage.ErrNoSubscriptions, protocol.ErrNoSubscriptions},
	{storage.ErrSubscriptionNotFound, protocol.ErrSubscriptionNotFound},
	{storage.ErrSubscriptionExists, protocol.ErrSubscriptionExists},
	{storage.ErrSubscriptionNotActive, protocol.ErrSubscriptionNotActive},
	{storage.ErrInvalidTransition, protocol.ErrInvalidTransition},
	{storage.ErrLeaseNotHeld, protocol.ErrLeaseNotHeld},
	{storage.ErrOffsetOutOfRange, protocol.ErrOffsetOutOfRange},
	{storage.ErrBindingExists, protocol.ErrBindingExists},
	{storage.ErrBindingNotFound, protocol.ErrBindingNotFound},
	{storage.ErrInvalidArgument, protocol.ErrInvalidArgument},
	{names.ErrInvalidName, protocol.ErrInvalidArgument},
	{storage.ErrClosed, protocol.ErrClosed},
	{broker.ErrNotRunning, protocol.ErrClosed},
	{broker.ErrMemberClosed, protocol.ErrClosed},
	{context.DeadlineExceeded, protocol.ErrTimeout},
	{context.Canceled, protocol.ErrClosed},
}

// ErrorFrom returns the protocol error that describes err, with err's text as its message:
//
//   - nil: nil;
//   - a *protocol.Error: err itself; an error wrapping one: a copy with err's text
//     (protocol.AsError);
//   - a storage sentinel: its code from docs/protocol.md section 9.2 (ErrTopicNotFound ->
//     TOPIC_NOT_FOUND, ...); names.ErrInvalidName -> INVALID_ARGUMENT;
//   - broker.ErrNotRunning, broker.ErrMemberClosed, storage.ErrClosed: CLOSED (retryable);
//   - context.DeadlineExceeded: TIMEOUT; context.Canceled (the server or the request is going
//     away): CLOSED;
//   - storage.ErrCorrupt and anything else: INTERNAL.
//
// Apart from the first two cases the result is a new value; the package sentinels are never
// modified. Safe for concurrent use.
func ErrorFrom(err error) *protocol.Error {
	if err == nil {
		return nil
	}
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return protocol.AsError(err)
	}
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			return s.proto.WithMessage(err.Error())
		}
	}
	return protocol.ErrInternal.WithMessage(err.Error())
}
