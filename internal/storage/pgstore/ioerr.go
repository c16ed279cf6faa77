package pgstore

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spoolmq/spool/internal/storage"
)

// classify returns err as a *storage.IOError when it is a failure of the database or of the
// connection to it (see docs/storage.md, "Storage failures"), and err unchanged otherwise:
//
//   - an error the server reported (a *pgconn.PgError, at connect or on a statement) of SQLSTATE
//     class 08 (connection exception), 53 (insufficient resources: 53100 disk_full is
//     storage.ErrFull, the others storage.ErrUnavailable), 57P0x (the server shuts down or
//     refuses connections), 58030 (I/O error) or 25006 (a read-only server: a standby): the
//     statement failed, so its transaction did not commit, and nothing was stored;
//   - a failed connection attempt (*pgconn.ConnectError: refused, unreachable, timed out):
//     storage.ErrUnavailable, nothing was sent;
//   - a connection that broke (EOF, reset, closed): storage.ErrUnavailable when the transaction's
//     COMMIT was not sent (commitSent false) or the failure happened before anything was sent
//     (pgconn.SafeToRetry); otherwise the COMMIT may have run and the outcome is unknown (Kind
//     nil).
//
// Context errors (the protocol's TIMEOUT and CLOSED), storage sentinels and errors already
// classified are returned as they are. Reasons never carry the server's message, host or paths:
// PostgreSQL's own texts name data files ("could not extend file \"base/...\"").
func classify(err error, commitSent bool) error {
	if err == nil || isStorageErr(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var ioe *storage.IOError
	if errors.As(err, &ioe) {
		return err
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		if reason, kind := sqlStateKind(pe.Code); kind != nil {
			return &storage.IOError{Kind: kind, Reason: reason, Err: err}
		}
		return err
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return &storage.IOError{Kind: storage.ErrUnavailable, Reason: "database unreachable", Err: err}
	}
	if connBroken(err) {
		if commitSent && !pgconn.SafeToRetry(err) {
			return &storage.IOError{Reason: "database connection lost during COMMIT", Err: err}
		}
		return &storage.IOError{Kind: storage.ErrUnavailable, Reason: "database connection lost", Err: err}
	}
	return err
}

// sqlStateKind returns the kind and client-safe reason of a SQLSTATE that says the database
// cannot serve now, or nil.
func sqlStateKind(code string) (reason string, kind error) {
	switch {
	case code == "53100":
		return "database out of disk space", storage.ErrFull
	case code == "53200":
		return "database out of memory", storage.ErrUnavailable
	case code == "53300":
		return "too many database connections", storage.ErrUnavailable
	case strings.HasPrefix(code, "53"):
		return "database out of resources", storage.ErrUnavailable
	case strings.HasPrefix(code, "08"):
		return "database connection failure", storage.ErrUnavailable
	case code == "57P01":
		return "database shutting down", storage.ErrUnavailable
	case code == "57P02":
		return "database crashed", storage.ErrUnavailable
	case code == "57P03":
		return "database not accepting connections", storage.ErrUnavailable
	case strings.HasPrefix(code, "57P0"):
		return "database connection terminated", storage.ErrUnavailable
	case code == "58030":
		return "database I/O error", storage.ErrUnavailable
	case code == "25006":
		return "database is read-only", storage.ErrUnavailable
	}
	return "", nil
}

// connBroken reports whether err says the connection to the database failed or was closed.
func connBroken(err error) bool {
	var ne net.Error
	return errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE) ||
		errors.As(err, &ne)
}
