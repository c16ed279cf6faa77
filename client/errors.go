package client

import (
	"errors"
	"fmt"
	"time"

	"github.com/spoolmq/spool/protocol"
)

// Errors of the client itself. Errors of the broker are *protocol.Error values: test them with
// errors.Is against the protocol sentinels (protocol.ErrTopicNotFound, ...).
var (
	// ErrClientClosed: the Client was closed; nothing more can be done with it.
	ErrClientClosed = errors.New("client: closed")
	// ErrSubscriptionClosed: the Subscription was closed, or ended by the broker.
	ErrSubscriptionClosed = errors.New("client: subscription closed")
	// ErrConnectionLost: the connection broke before the answer arrived. The request may or may
	// not have taken effect on the broker. For a delivery it means its lease went with the
	// connection: an ack or nack of it fails with this error and the broker redelivers the message.
	ErrConnectionLost = errors.New("client: connection lost")
	// ErrAlreadySettled: the delivery was already acked or nacked through this client.
	ErrAlreadySettled = errors.New("client: delivery already settled")
	// ErrUnknownMessage: the broker does not know the acked message (AckOK.unknown): its
	// subscription no longer exists (cancelled, topic deleted, an ephemeral subscription that
	// ended) or the message is gone.
	ErrUnknownMessage = errors.New("client: message unknown to the broker")
	// ErrUnsettled: returned by a handler (or wrapped in its error), it settles nothing: the
	// delivery is neither acked nor nacked, keeps its credit and goes back to the group when its
	// lease ends or when the Subscription closes (released: not counted as a failure, no poison
	// rule sees it; its next delivery is a new attempt, and one that was the last attempt is
	// dead-lettered like any lease that ends). For deliveries a consumer took but will not handle,
	// such as those prefetched when it stops.
	ErrUnsettled = errors.New("client: delivery left unsettled")
)

// IsRetryable reports whether the operation that returned err may succeed if tried again later:
// a broker error whose code has the retry flag (protocol.IsRetryable: CLOSED, OVERLOADED, ...) or
// a broken connection (ErrConnectionLost). Retryable does not mean the first attempt had no
// effect: a publish that failed this way may have been stored (see Client.Publish). Context
// errors, ErrClientClosed and non-retryable broker errors report false.
func IsRetryable(err error) bool {
	if err == nil || errors.Is(err, ErrClientClosed) {
		return false
	}
	return errors.Is(err, ErrConnectionLost) || protocol.IsRetryable(err)
}

// ToDLQ wraps a handler error so that the delivery goes straight to its subscription's dead-letter
// queue instead of being redelivered; err's text is recorded as the entry's last error. A nil err
// returns nil (an ack).
func ToDLQ(err error) error {
	if err == nil {
		return nil
	}
	return &nackError{err: err, toDLQ: true}
}

// NackWithDelay wraps a handler error so that the delivery is redelivered no earlier than d from
// now, overriding the subscription's NackDelay. A nil err returns nil (an ack).
func NackWithDelay(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &nackError{err: err, delay: d, hasDelay: true}
}

// nackError carries the nack instructions of ToDLQ and NackWithDelay.
type nackError struct {
	err      error
	toDLQ    bool
	delay    time.Duration
	hasDelay bool
}

func (e *nackError) Error() string {
	if e.toDLQ {
		return fmt.Sprintf("to dlq: %v", e.err)
	}
	return fmt.Sprintf("nack after %v: %v", e.delay, e.err)
}

func (e *nackError) Unwrap() error { return e.err }

// lostError returns ErrConnectionLost wrapping the cause of the break.
func lostError(cause error) error {
	if cause == nil {
		return ErrConnectionLost
	}
	if errors.Is(cause, ErrConnectionLost) {
		return cause
	}
	return fmt.Errorf("%w: %w", ErrConnectionLost, cause)
}
