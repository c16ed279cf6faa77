package protocol

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Error is an error of the Spool protocol: an entry of the error-code table, and the Error frame
// (opcode 0x80) that carries one over the wire.
//
// Codes, names and retry flags are part of the contract between servers and clients in every
// language (docs/protocol.md section 9): a code never changes its meaning, its name or its retry
// flag, and a retired code is never reused. New codes may be added in any protocol version.
//
// The table's entries are the package variables ErrMalformedFrame ... ErrStorageFull. They are
// sentinels: test with errors.Is (which compares codes, so a received *Error with the code of
// ErrTopicNotFound matches ErrTopicNotFound whatever its message), never modify them, and create
// errors with a message through WithMessage or Errorf.
type Error struct {
	// Code is the numeric error code, the only part of the table that travels on the wire.
	Code uint16
	// Name is the code's stable upper-case name (TOPIC_NOT_FOUND), used in logs and by the text
	// mode (ERR <NAME> <message>). Decoding fills it from the table; it is empty for a code this
	// package does not know (sent by a newer peer).
	Name string
	// Retryable reports whether the same request may succeed if sent again later, possibly on a
	// new connection. It travels on the wire so that a client can handle codes newer than itself.
	// A retried publish may store a message twice when the first attempt did in fact succeed (see
	// PublishMessage.ProducerID).
	Retryable bool
	// RetryAfter is the server's hint for how long to wait before retrying (OVERLOADED,
	// RATE_LIMITED); 0 means no hint. Carried on the wire in milliseconds.
	RetryAfter time.Duration
	// Message says what went wrong in this instance, for humans; may be empty.
	Message string
}

// Error codes. 1-99: protocol and connection errors; 100-199: errors of a request's content or of
// the broker's state; 200-299: availability errors. See docs/protocol.md section 9.
// Part of the wire contract: never change a value.
const (
	CodeMalformedFrame     uint16 = 1
	CodeFrameTooLarge      uint16 = 2
	CodeUnknownOpcode      uint16 = 3
	CodeUnsupportedVersion uint16 = 4
	CodeNotAuthenticated   uint16 = 5
	CodeUnexpectedFrame    uint16 = 6
	CodePermissionDenied   uint16 = 7
	CodeUnknownHandle      uint16 = 8
	CodeSessionTimeout     uint16 = 9
	CodeUnknownCommand     uint16 = 10
	CodeLineTooLong        uint16 = 11
	CodeInvalidArgument    uint16 = 100
	CodeTopicNotFound      uint16 = 101
	CodeTopicExists        uint16 = 102
	CodeTopicHasSubs       uint16 = 103
	CodeNoSubscriptions    uint16 = 104
	CodeSubNotFound        uint16 = 105
	CodeSubExists          uint16 = 106
	CodeSubNotActive       uint16 = 107
	CodeInvalidTransition  uint16 = 108
	CodeLeaseNotHeld       uint16 = 109
	CodeMessageTooLarge    uint16 = 110
	CodeOffsetOutOfRange   uint16 = 111
	CodeBindingExists      uint16 = 112
	CodeBindingNotFound    uint16 = 113
	CodeStaleGeneration    uint16 = 114
	CodeLimitExceeded      uint16 = 115
	CodeTopicChanged       uint16 = 116
	CodeClosed             uint16 = 200
	CodeInternal           uint16 = 201
	CodeOverloaded         uint16 = 202
	CodeRateLimited        uint16 = 203
	CodeTimeout            uint16 = 204
	CodeStorageUnavailable uint16 = 205
	CodeStorageFull        uint16 = 206
)

// The error-code table. Each variable is the sentinel of one code; see docs/protocol.md section 9
// for when each is sent and whether it closes the connection.
var (
	// ErrMalformedFrame: a frame or text line could not be decoded (bad length, bad preamble,
	// truncated or trailing bytes, a count larger than the bytes that follow, invalid UTF-8,
	// an undefined enum value or flag). Every decode error of this package wraps it.
	ErrMalformedFrame = &Error{Code: CodeMalformedFrame, Name: "MALFORMED_FRAME"}
	// ErrFrameTooLarge: a frame is larger than the receiver's max frame size. The connection is
	// closed.
	ErrFrameTooLarge = &Error{Code: CodeFrameTooLarge, Name: "FRAME_TOO_LARGE"}
	// ErrUnknownOpcode: the opcode is not defined in the negotiated version.
	ErrUnknownOpcode = &Error{Code: CodeUnknownOpcode, Name: "UNKNOWN_OPCODE"}
	// ErrUnsupportedVersion: the client's version range and the server's do not overlap. The
	// message lists the server's range. The connection is closed.
	ErrUnsupportedVersion = &Error{Code: CodeUnsupportedVersion, Name: "UNSUPPORTED_VERSION"}
	// ErrNotAuthenticated: the credentials are missing or invalid. The connection is closed.
	ErrNotAuthenticated = &Error{Code: CodeNotAuthenticated, Name: "NOT_AUTHENTICATED"}
	// ErrUnexpectedFrame: a frame that is valid but not allowed now or in this direction (anything
	// before Hello, a second Hello, a server frame sent by a client, a request with correlation id
	// 0).
	ErrUnexpectedFrame = &Error{Code: CodeUnexpectedFrame, Name: "UNEXPECTED_FRAME"}
	// ErrPermissionDenied: authenticated, but not allowed to do this on this topic.
	ErrPermissionDenied = &Error{Code: CodePermissionDenied, Name: "PERMISSION_DENIED"}
	// ErrUnknownHandle: the subscription handle is not open on this connection (handles do not
	// survive a reconnect).
	ErrUnknownHandle = &Error{Code: CodeUnknownHandle, Name: "UNKNOWN_HANDLE"}
	// ErrSessionTimeout: no frame arrived for the session timeout; the connection is closed and
	// its members leave their groups.
	ErrSessionTimeout = &Error{Code: CodeSessionTimeout, Name: "SESSION_TIMEOUT"}
	// ErrUnknownCommand: text mode only: the line does not start with a known command.
	ErrUnknownCommand = &Error{Code: CodeUnknownCommand, Name: "UNKNOWN_COMMAND"}
	// ErrLineTooLong: text mode only: the line is longer than the line limit; it was discarded.
	ErrLineTooLong = &Error{Code: CodeLineTooLong, Name: "LINE_TOO_LONG"}

	// ErrInvalidArgument: a field is invalid (a topic name, a pattern, a group name, a start
	// position, a count, a duration, ...). Nothing was changed.
	ErrInvalidArgument = &Error{Code: CodeInvalidArgument, Name: "INVALID_ARGUMENT"}
	// ErrTopicNotFound: the topic does not exist (and auto-creation is off).
	ErrTopicNotFound = &Error{Code: CodeTopicNotFound, Name: "TOPIC_NOT_FOUND"}
	// ErrTopicExists: the topic already exists.
	ErrTopicExists = &Error{Code: CodeTopicExists, Name: "TOPIC_EXISTS"}
	// ErrTopicHasSubscriptions: the topic has live subscriptions and the operation needs force.
	ErrTopicHasSubscriptions = &Error{Code: CodeTopicHasSubs, Name: "TOPIC_HAS_SUBSCRIPTIONS"}
	// ErrNoSubscriptions: the PUB_SUB topic blocks writes while it has no ACTIVE subscription
	// (block_writes_on_zero_subscriptions). Nothing was appended.
	ErrNoSubscriptions = &Error{Code: CodeNoSubscriptions, Name: "NO_SUBSCRIPTIONS"}
	// ErrSubscriptionNotFound: the subscription does not exist (any more).
	ErrSubscriptionNotFound = &Error{Code: CodeSubNotFound, Name: "SUBSCRIPTION_NOT_FOUND"}
	// ErrSubscriptionExists: the subscription already exists.
	ErrSubscriptionExists = &Error{Code: CodeSubExists, Name: "SUBSCRIPTION_EXISTS"}
	// ErrSubscriptionNotActive: the subscription is PAUSED, DEAD, CANCELLED or DELETED.
	ErrSubscriptionNotActive = &Error{Code: CodeSubNotActive, Name: "SUBSCRIPTION_NOT_ACTIVE"}
	// ErrInvalidTransition: the subscription state change is not allowed.
	ErrInvalidTransition = &Error{Code: CodeInvalidTransition, Name: "INVALID_TRANSITION"}
	// ErrLeaseNotHeld: the member does not hold the lease of the message (it expired, or was
	// never given).
	ErrLeaseNotHeld = &Error{Code: CodeLeaseNotHeld, Name: "LEASE_NOT_HELD"}
	// ErrMessageTooLarge: a message is larger than the topic's max message size. Nothing was
	// appended.
	ErrMessageTooLarge = &Error{Code: CodeMessageTooLarge, Name: "MESSAGE_TOO_LARGE"}
	// ErrOffsetOutOfRange: a start position or read names an offset that does not exist.
	ErrOffsetOutOfRange = &Error{Code: CodeOffsetOutOfRange, Name: "OFFSET_OUT_OF_RANGE"}
	// ErrBindingExists: the group already has a binding on that pattern.
	ErrBindingExists = &Error{Code: CodeBindingExists, Name: "BINDING_EXISTS"}
	// ErrBindingNotFound: the group has no binding on that pattern.
	ErrBindingNotFound = &Error{Code: CodeBindingNotFound, Name: "BINDING_NOT_FOUND"}
	// ErrStaleGeneration: ordered groups: the ref's generation is older than the partition's
	// current owner generation; the member lost the partition and its ack is refused.
	ErrStaleGeneration = &Error{Code: CodeStaleGeneration, Name: "STALE_GENERATION"}
	// ErrLimitExceeded: the request would take the server past a configured bound (broker
	// max_topics, max_partitions, max_subscriptions, max_bindings). Nothing changed; not
	// retryable until an operator raises the bound or frees room (deletes topics or groups).
	ErrLimitExceeded = &Error{Code: CodeLimitExceeded, Name: "LIMIT_EXCEEDED"}
	// ErrTopicChanged: a topic's configuration changed between the read an update was based on
	// and its write, more times than the server re-applies the update (HTTP PUT
	// .../topics/{topic}/config). Nothing changed; send the update again.
	ErrTopicChanged = &Error{Code: CodeTopicChanged, Name: "TOPIC_CHANGED"}

	// ErrClosed: the broker is shutting down or the engine is closed. Retry on another connection
	// (or instance) after a backoff.
	ErrClosed = &Error{Code: CodeClosed, Name: "CLOSED", Retryable: true}
	// ErrInternal: an unexpected server error. The request may or may not have taken effect.
	ErrInternal = &Error{Code: CodeInternal, Name: "INTERNAL", Retryable: true}
	// ErrOverloaded: the server sheds load (a connection past its connection limit). RetryAfter
	// may carry a hint.
	ErrOverloaded = &Error{Code: CodeOverloaded, Name: "OVERLOADED", Retryable: true}
	// ErrRateLimited: the topic's backlog is at its bound (topic backpressure), or a publish would
	// remember more producer ids than the engine's bound. RetryAfter may carry a hint.
	ErrRateLimited = &Error{Code: CodeRateLimited, Name: "RATE_LIMITED", Retryable: true}
	// ErrTimeout: the server gave up waiting for its storage. The request may or may not have
	// taken effect.
	ErrTimeout = &Error{Code: CodeTimeout, Name: "TIMEOUT", Retryable: true}
	// ErrStorageUnavailable: the storage cannot be used now (database unreachable, shutting down or
	// out of connections, out of file handles, the embedded engine stopped after a write failure).
	// Nothing was stored by the request. Deliveries of stored messages may continue.
	ErrStorageUnavailable = &Error{Code: CodeStorageUnavailable, Name: "STORAGE_UNAVAILABLE", Retryable: true}
	// ErrStorageFull: the storage is out of space (disk full, disk quota, PostgreSQL disk_full).
	// Nothing was stored by the request; it may succeed once space was freed.
	ErrStorageFull = &Error{Code: CodeStorageFull, Name: "STORAGE_FULL", Retryable: true}
)

// errorTable lists every entry, ordered by code. It is the single source of the table.
var errorTable = []*Error{
	ErrMalformedFrame, ErrFrameTooLarge, ErrUnknownOpcode, ErrUnsupportedVersion,
	ErrNotAuthenticated, ErrUnexpectedFrame, ErrPermissionDenied, ErrUnknownHandle,
	ErrSessionTimeout, ErrUnknownCommand, ErrLineTooLong,
	ErrInvalidArgument, ErrTopicNotFound, ErrTopicExists, ErrTopicHasSubscriptions,
	ErrNoSubscriptions, ErrSubscriptionNotFound, ErrSubscriptionExists, ErrSubscriptionNotActive,
	ErrInvalidTransition, ErrLeaseNotHeld, ErrMessageTooLarge, ErrOffsetOutOfRange,
	ErrBindingExists, ErrBindingNotFound, ErrStaleGeneration, ErrLimitExceeded, ErrTopicChanged,
	ErrClosed, ErrInternal, ErrOverloaded, ErrRateLimited, ErrTimeout, ErrStorageUnavailable,
	ErrStorageFull,
}

var (
	errorsByCode = func() map[uint16]*Error {
		m := make(map[uint16]*Error, len(errorTable))
		for _, e := range errorTable {
			m[e.Code] = e
		}
		return m
	}()
	errorsByName = func() map[string]*Error {
		m := make(map[string]*Error, len(errorTable))
		for _, e := range errorTable {
			m[e.Name] = e
		}
		return m
	}()
)

// Errors returns a copy of the error-code table, ordered by code.
func Errors() []Error {
	out := make([]Error, len(errorTable))
	for i, e := range errorTable {
		out[i] = *e
	}
	return out
}

// ErrorForCode returns a new *Error for code with the table's name and retry flag and an empty
// message. For a code that is not in the table (sent by a newer peer) the name is empty and
// Retryable is false; ok reports whether the code is known.
func ErrorForCode(code uint16) (e *Error, ok bool) {
	if t, ok := errorsByCode[code]; ok {
		c := *t
		return &c, true
	}
	return &Error{Code: code}, false
}

// ErrorForName returns a new *Error for a table name (as printed by the text mode), and whether
// the name is known.
func ErrorForName(name string) (*Error, bool) {
	if t, ok := errorsByName[name]; ok {
		c := *t
		return &c, true
	}
	return nil, false
}

// Error formats the error as "NAME: message" ("CODE_123: message" for an unknown code).
func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = "CODE_" + strconv.Itoa(int(e.Code))
	}
	if e.Message == "" {
		return name
	}
	return name + ": " + e.Message
}

// Is reports whether target is an *Error with the same code, so that errors.Is(err,
// ErrTopicNotFound) holds for any error carrying that code, whatever its message.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// WithMessage returns a copy of e with the given message.
func (e *Error) WithMessage(msg string) *Error {
	c := *e
	c.Message = msg
	return &c
}

// Errorf returns a copy of e with a formatted message. Use %v, not %w, for causes: the wire
// carries only the text.
func (e *Error) Errorf(format string, args ...any) *Error {
	return e.WithMessage(fmt.Sprintf(format, args...))
}

// IsRetryable reports whether err carries a protocol error whose retry flag is set. It says
// nothing about network errors (a broken connection), which a client handles itself.
func IsRetryable(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Retryable
}

// AsError returns the protocol error that describes err, for sending it to a peer: err itself if
// it is an *Error; a copy of the first *Error in err's chain with err's full text as message if
// err wraps one (fmt.Errorf("%w: topic %q", ErrTopicNotFound, name)); otherwise INTERNAL with
// err's text. A nil err returns nil.
func AsError(err error) *Error {
	if err == nil {
		return nil
	}
	if e, ok := err.(*Error); ok {
		return e
	}
	var e *Error
	if !errors.As(err, &e) {
		return ErrInternal.WithMessage(err.Error())
	}
	// fmt.Errorf("%w: detail", ErrX) reads "X: detail": keep "detail" only, so the name is not
	// repeated when the error is printed.
	msg := err.Error()
	if prefix := e.Error(); msg == prefix {
		msg = e.Message
	} else if strings.HasPrefix(msg, prefix+": ") {
		msg = msg[len(prefix)+2:]
	}
	return e.WithMessage(msg)
}
