package wal

import (
	"context"
	"errors"
	"syscall"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

// writtenBefore reports whether err, an append's error from the committer, may have left the
// append's records on disk: every error but a refusal because of an earlier failure
// (wlog.ErrFailed), no room for a new segment (wlog.ErrNoSegment) and an active segment whose file
// could not be opened again (wlog.ErrNotOpened), which wrote nothing.
func writtenBefore(err error) bool {
	return !errors.Is(err, wlog.ErrFailed) && !errors.Is(err, wlog.ErrNoSegment) && !errors.Is(err, wlog.ErrNotOpened)
}

// ioFailure classifies a failure of the engine's files for clients (a *storage.IOError; see
// docs/storage.md, "Storage failures"). written says that some of the call's records may be on
// disk (the failure hit the call's own write or fsync, or another partition's share of the batch
// was written): the outcome is then unknown (Kind nil, the protocol's INTERNAL). Otherwise nothing
// was stored and the kind follows the errno: ENOSPC and EDQUOT are storage.ErrFull, everything
// else (EMFILE, ENFILE, EIO, ...) storage.ErrUnavailable. The cause, with its file paths, stays in
// IOError.Err for the logs.
//
// Errors that are not failures of the files (nil, storage sentinels of bad input, a closed
// engine, a context that ended, an error already classified) are returned as they are.
func ioFailure(err error, written bool) error {
	if err == nil || notIOFailure(err) {
		return err
	}
	reason, kind := classifyErrno(err)
	if written {
		kind = nil
	}
	return &storage.IOError{Kind: kind, Reason: reason, Err: err}
}

// refusedAfterFailure is the error of a change refused because an earlier write failed (the
// engine's sticky failure cause): nothing was stored, and nothing will be until the engine is
// reopened.
func refusedAfterFailure(cause error) error {
	reason, kind := classifyErrno(cause)
	return &storage.IOError{Kind: kind, Reason: reason + " (an earlier write failed: changes are refused until the broker restarts)",
		Err: cause}
}

func notIOFailure(err error) bool {
	var ioe *storage.IOError
	if errors.As(err, &ioe) {
		return true
	}
	for _, s := range []error{storage.ErrClosed, storage.ErrInvalidArgument, storage.ErrMessageTooLarge,
		context.Canceled, context.DeadlineExceeded} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// classifyErrno returns the kind and a client-safe reason for a file system error.
func classifyErrno(err error) (reason string, kind error) {
	switch {
	case errors.Is(err, syscall.ENOSPC):
		return "no space left on device", storage.ErrFull
	case errors.Is(err, syscall.EDQUOT):
		return "disk quota exceeded", storage.ErrFull
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return "too many open files", storage.ErrUnavailable
	case errors.Is(err, syscall.EROFS):
		return "read-only file system", storage.ErrUnavailable
	case errors.Is(err, syscall.EIO):
		return "input/output error", storage.ErrUnavailable
	}
	return "file system error", storage.ErrUnavailable
}
