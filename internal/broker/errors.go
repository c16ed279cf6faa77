package broker

import (
	"errors"
	"fmt"

	"github.com/spoolmq/spool/internal/storage"
)

// Errors of the broker itself. Errors from the engine are passed on wrapped, so callers test both
// these and the storage sentinels with errors.Is.
var (
	// ErrNotRunning is returned by every Broker method except Start and Stop before Start and after
	// Stop.
	ErrNotRunning = errors.New("broker: not running")

	// ErrMemberClosed is returned by the methods of a Member after Close (or after the broker
	// stopped, which closes every member).
	ErrMemberClosed = errors.New("broker: member closed")
)

// invalid returns an error wrapping storage.ErrInvalidArgument with a message.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", storage.ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// invalidName wraps a names error (which wraps names.ErrInvalidName) so that it also wraps
// storage.ErrInvalidArgument.
func invalidName(err error) error {
	return fmt.Errorf("%w: %w", storage.ErrInvalidArgument, err)
}
