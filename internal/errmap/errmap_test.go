package errmap

import (
	"context"
	"errors"
	"fmt"
	"testing"

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
		{storage.ErrClosed, protocol.ErrClosed},
		{broker.ErrNotRunning, protocol.ErrClosed},
		{broker.ErrMemberClosed, protocol.ErrClosed},
		{fmt.Errorf("wait: %w", context.DeadlineExceeded), protocol.ErrTimeout},
		{context.Canceled, protocol.ErrClosed},
		{fmt.Errorf("%w: file x at 12", storage.ErrCorrupt), protocol.ErrInternal},
		{errors.New("boom"), protocol.ErrInternal},
		{protocol.ErrOverloaded.WithMessage("busy"), protocol.ErrOverloaded},
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
