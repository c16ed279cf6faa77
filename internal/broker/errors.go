package broker

import (
	"errors"

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

	// ErrWouldThrottle refuses a publish with PublishOptions.NoWait that its topic's throttle
	// would delay; nothing was counted or appended. It never reaches a client: the caller
	// publishes again where it can wait.
	ErrWouldThrottle = errors.New("broker: the publish would be throttled")
)

// invalid and invalidName are the shared validation errors of package storage
// (storage.Invalid, storage.InvalidName).
var (
	invalid     = storage.Invalid
	invalidName = storage.InvalidName
)
