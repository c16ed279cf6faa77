package errmap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

func TestErrorFrom(t *testing.T) {
	t.Parallel()
	if ErrorFrom(nil) != nil {
		t.Fatal("ErrorFrom(nil) is not nil")
	}
	cases := []struct {
		err  error
		want *protocol.Error
	}{
		{fmt.Errorf("broker: publish to %q: %w", "a", storage.ErrTopicNotFound), protocol.ErrTopicNotFound},
		{fmt.Errorf("%w: %w", storage.ErrInvalidArgument, names.ErrInvalidName), protocol.ErrInvalidArgument},
		{names.ErrInvalidName, protocol.ErrInvalidArgument},
		{fmt.Errorf("%w: %w: 2 MiB", storage.ErrInvalidArgument, storage.ErrMessageTooLarge), protocol.ErrMessageTooLarge},
		{fmt.Errorf("wal: %w: topic", storage.ErrRateLimited), protocol.ErrRateLimited},
		{storage.ErrLimitExceeded, protocol.ErrLimitExceeded},
		{fmt.Errorf("broker: update topic %q: %w", "a", storage.ErrTopicChanged), protocol.ErrTopicChanged},
		{storage.ErrTopicExists, protocol.ErrTopicExists},
		{storage.ErrTopicHasSubscriptions, protocol.ErrTopicHasSubscriptions},
		{storage.ErrNoSubscriptions, protocol.ErrNoSubscriptions},
		{storage.ErrSubscriptionNotFound, protocol.ErrSubscriptionNotFound},
		{storage.ErrSubscriptionExists, protocol.ErrSubscriptionExists},
		{storage.ErrSubscriptionNotActive, protocol.ErrSubscriptionNotActive},
		{storage.ErrInvalidTransition, protocol.ErrInvalidTransition},
		{storage.ErrLeaseNotHeld, protocol.ErrLeaseNotHeld},
		{fmt.Errorf("subscription 3: %w: partition 1", storage.ErrStaleGeneration), protocol.ErrStaleGeneration},
		{fmt.Errorf("%w: topic", storage.ErrModeConflict), protocol.ErrSubscriptionExists},
		{storage.ErrOffsetOutOfRange, protocol.ErrOffsetOutOfRange},
		{storage.ErrBindingExists, protocol.ErrBindingExists},
		{storage.ErrBindingNotFound, protocol.ErrBindingNotFound},
		{storage.ErrClosed, protocol.ErrClosed},
		{broker.ErrNotRunning, protocol.ErrClosed},
		{broker.ErrMemberClosed, protocol.ErrClosed},
		{fmt.Errorf("wait: %w", context.DeadlineExceeded), protocol.ErrTimeout},
		{context.Canceled, protocol.ErrClosed},
		{fmt.Errorf("%w: file x at 12", storage.ErrCorrupt), protocol.ErrInternal},
		{errors.New("boom"), protocol.ErrInternal},
		{protocol.ErrOverloaded.WithMessage("busy"), protocol.ErrOverloaded},
		{fmt.Errorf("broker: ack: %w", &storage.IOError{Kind: storage.ErrFull, Reason: "no space left on device", Err: errors.New("x")}), protocol.ErrStorageFull},
		{&storage.IOError{Kind: storage.ErrUnavailable, Reason: "database unreachable", Err: errors.New("x")}, protocol.ErrStorageUnavailable},
		{&storage.IOError{Reason: "no space left on device", Err: errors.New("x")}, protocol.ErrInternal},
	}
	for _, c := range cases {
		got := ErrorFrom(c.err)
		if got.Code != c.want.Code || got.Name != c.want.Name || got.Retryable != c.want.Retryable {
			t.Errorf("ErrorFrom(%v) = %+v, want code %s", c.err, got, c.want.Name)
		}
		if got.Message == "" {
			t.Errorf("ErrorFrom(%v): empty message", c.err)
		}
		if got == c.want {
			t.Errorf("ErrorFrom(%v) returned the sentinel itself", c.err)
		}
	}
}

// TestStorageFailures: a failure of the files or the database answers the code of its kind, with a
// message that names neither the file nor the cause's details; other availability and internal
// errors lose their paths too; errors of the request's content keep their text.
func TestStorageFailures(t *testing.T) {
	t.Parallel()
	cause := &os.PathError{Op: "write", Path: "/var/lib/spool/topics/t/0/00000000000000000000.seg", Err: syscall.ENOSPC}
	cases := []struct {
		err  error
		want *protocol.Error
	}{
		{fmt.Errorf("wal: append: %w", &storage.IOError{Kind: storage.ErrFull, Reason: "no space left on device", Err: cause}), protocol.ErrStorageFull},
		{&storage.IOError{Kind: storage.ErrUnavailable, Reason: "too many open files", Err: cause}, protocol.ErrStorageUnavailable},
		{&storage.IOError{Reason: "no space left on device", Err: cause}, protocol.ErrInternal},
		{fmt.Errorf("%w: wlog: %v at 12", storage.ErrCorrupt, cause), protocol.ErrInternal},
		{fmt.Errorf("%w (%v)", storage.ErrClosed, cause), protocol.ErrClosed},
		{fmt.Errorf("wal: %w", cause), protocol.ErrInternal},
		{fmt.Errorf("pgstore: transaction exceeded tx_timeout 10s: %w (%w)", context.DeadlineExceeded,
			&storage.IOError{Kind: storage.ErrUnavailable, Reason: "database connection lost", Err: cause}), protocol.ErrTimeout},
	}
	for _, c := range cases {
		got := ErrorFrom(c.err)
		if got.Code != c.want.Code || got.Retryable != c.want.Retryable {
			t.Errorf("ErrorFrom(%v) = %+v, want code %s", c.err, got, c.want.Name)
		}
		if strings.Contains(got.Message, "/var/lib") || strings.Contains(got.Message, ".seg") {
			t.Errorf("ErrorFrom(%v): message %q carries the path", c.err, got.Message)
		}
	}
	full := ErrorFrom(cases[0].err)
	if full.Message != "storage full: no space left on device" {
		t.Errorf("STORAGE_FULL message %q", full.Message)
	}
	if !strings.Contains(ErrorFrom(cases[2].err).Message, "may or may not") {
		t.Errorf("unknown outcome not said: %q", ErrorFrom(cases[2].err).Message)
	}
	in := fmt.Errorf("%w: topic %q: segment %q is invalid", names.ErrInvalidName, "a/b", "a/b")
	if got := ErrorFrom(in); got.Message != in.Error() {
		t.Errorf("INVALID_ARGUMENT message changed: %q", got.Message)
	}
}

// A publish refused by backpressure is RATE_LIMITED with the broker's retry-after hint.
func TestBackpressureRetryAfter(t *testing.T) {
	err := fmt.Errorf("broker: publish: %w", &broker.BackpressureError{Topic: "t", Backlog: 10, Bound: "max_backlog_messages 10", RetryAfter: 3 * time.Second})
	e := ErrorFrom(err)
	if e.Code != protocol.CodeRateLimited || !e.Retryable || e.RetryAfter != 3*time.Second {
		t.Fatalf("got %+v, want RATE_LIMITED, retryable, retry_after 3s", e)
	}
}
