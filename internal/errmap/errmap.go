// Package errmap maps the errors of the storage engines and of the broker to the protocol's error
// table (protocol.Error), in one place, so that the TCP server, the text mode and the HTTP admin API
// report the same condition with the same code, name and retry flag (docs/protocol.md section 9.2).
package errmap

import (
	"context"
	"errors"
	"regexp"

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
	{storage.ErrStaleGeneration, protocol.ErrStaleGeneration},
	{storage.ErrOffsetOutOfRange, protocol.ErrOffsetOutOfRange},
	{storage.ErrBindingExists, protocol.ErrBindingExists},
	{storage.ErrBindingNotFound, protocol.ErrBindingNotFound},
	{storage.ErrLimitExceeded, protocol.ErrLimitExceeded},
	{storage.ErrTopicChanged, protocol.ErrTopicChanged},
	{storage.ErrRateLimited, protocol.ErrRateLimited},
	{storage.ErrInvalidArgument, protocol.ErrInvalidArgument},
	{names.ErrInvalidName, protocol.ErrInvalidArgument},
	{storage.ErrClosed, protocol.ErrClosed},
	{storage.ErrFull, protocol.ErrStorageFull},
	{storage.ErrUnavailable, protocol.ErrStorageUnavailable},
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
//   - an error wrapping context.DeadlineExceeded: TIMEOUT, even if it also wraps a storage
//     failure (a transaction deadline that closed the database connection);
//   - a *storage.IOError (a failure of the files or the database): STORAGE_FULL or
//     STORAGE_UNAVAILABLE by its Kind (nothing was stored), INTERNAL when its outcome is unknown;
//     the message is its Public text only, never the cause (which names files and hosts);
//   - broker.ErrNotRunning, broker.ErrMemberClosed, storage.ErrClosed: CLOSED (retryable);
//   - context.DeadlineExceeded: TIMEOUT; context.Canceled (the server or the request is going
//     away): CLOSED;
//   - storage.ErrCorrupt and anything else: INTERNAL.
//
// Client-facing messages never carry the server's file paths: the message of an availability or
// internal error (codes 200-299) built from err's text has each word that holds a "/" replaced by
// "<path>" (the full error belongs in the server's log). Errors of a request's content (codes
// 100-199) keep err's text, which is about the client's own input, and *protocol.Error texts were
// written for clients.
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
	if errors.Is(err, context.DeadlineExceeded) {
		// A deadline that passed stays TIMEOUT even when the failure it caused was classified as
		// a storage failure (pgstore: the connection its deadline closed).
		return protocol.ErrTimeout.WithMessage(scrub(err.Error()))
	}
	var ioe *storage.IOError
	if errors.As(err, &ioe) {
		switch {
		case ioe.Kind == nil:
			return protocol.ErrInternal.WithMessage(scrub(ioe.Public()))
		case errors.Is(ioe.Kind, storage.ErrFull):
			return protocol.ErrStorageFull.WithMessage(scrub(ioe.Public()))
		default:
			return protocol.ErrStorageUnavailable.WithMessage(scrub(ioe.Public()))
		}
	}
	var bpe *broker.BackpressureError
	if errors.As(err, &bpe) {
		// A publish refused by its topic's backpressure: the hint tells the client when to retry.
		e := protocol.ErrRateLimited.WithMessage(err.Error())
		e.RetryAfter = bpe.RetryAfter
		return e
	}
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			if s.proto.Code < 200 {
				// Errors of the request's content: the text is about the client's own input.
				return s.proto.WithMessage(err.Error())
			}
			return s.proto.WithMessage(scrub(err.Error()))
		}
	}
	return protocol.ErrInternal.WithMessage(scrub(err.Error()))
}

// pathWord is a word holding a "/": a file path (absolute or relative, as in PostgreSQL's
// messages) or a URL.
var pathWord = regexp.MustCompile(`[^\s"'(),;]*/[^\s"'(),;]*`)

// scrub replaces the paths in a client-facing message with "<path>".
func scrub(msg string) string {
	return pathWord.ReplaceAllString(msg, "<path>")
}
