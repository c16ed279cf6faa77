package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spoolmq/spool/internal/storage"
)

// TestClassify: failures of the database become storage.IOError of the right kind, with reasons
// that carry none of the server's text (PostgreSQL's disk_full message names a data file); a lost
// connection after the COMMIT was sent has an unknown outcome; other errors stay as they are.
// (TestDatabaseStoppedPG in internal/server checks a real stopped database over the wire.)
func TestClassify(t *testing.T) {
	t.Parallel()
	pg := func(code string) error {
		return fmt.Errorf("pgstore: append: %w", &pgconn.PgError{Severity: "ERROR", Code: code, Message: `could not extend file "base/16384/16385": No space left on device`})
	}
	cases := []struct {
		name       string
		err        error
		commitSent bool
		kind       error // nil: unknown outcome
		same       bool  // not classified
	}{
		{"disk_full", pg("53100"), true, storage.ErrFull, false},
		{"too_many_connections", pg("53300"), false, storage.ErrUnavailable, false},
		{"admin_shutdown", pg("57P01"), true, storage.ErrUnavailable, false},
		{"cannot_connect_now", pg("57P03"), false, storage.ErrUnavailable, false},
		{"connection_failure", pg("08006"), false, storage.ErrUnavailable, false},
		{"read_only", pg("25006"), false, storage.ErrUnavailable, false},
		{"unique_violation", pg("23505"), false, nil, true},
		{"EOF before COMMIT", fmt.Errorf("x: %w", io.ErrUnexpectedEOF), false, storage.ErrUnavailable, false},
		{"EOF during COMMIT", fmt.Errorf("x: %w", io.ErrUnexpectedEOF), true, nil, false},
		{"closed conn", fmt.Errorf("x: %w", pgconn.ErrConnClosed), false, storage.ErrUnavailable, false},
		{"deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), true, nil, true},
		{"sentinel", storage.ErrTopicNotFound, false, nil, true},
		{"other", errors.New("boom"), false, nil, true},
	}
	for _, c := range cases {
		got := classify(c.err, c.commitSent)
		var ioe *storage.IOError
		isIO := errors.As(got, &ioe)
		switch {
		case c.same:
			if got != c.err {
				t.Errorf("%s: classified as %v", c.name, got)
			}
		case !isIO:
			t.Errorf("%s: %v is not an IOError", c.name, got)
		case ioe.Kind != c.kind:
			t.Errorf("%s: kind %v, want %v", c.name, ioe.Kind, c.kind)
		case !errors.Is(got, c.err):
			t.Errorf("%s: the cause is lost", c.name)
		}
		if isIO && (ioe.Reason == "" || len(ioe.Reason) > 60 || containsAny(ioe.Public(), "base/", "SQLSTATE", "extend")) {
			t.Errorf("%s: public text %q", c.name, ioe.Public())
		}
	}
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// TestMapErrClosedKeepsSentinels: once the engine is closing, a database error becomes CLOSED,
// but a storage sentinel the operation failed with stays what it is (a limit reached or a stale
// generation must not turn into a retryable CLOSED).
func TestMapErrClosedKeepsSentinels(t *testing.T) {
	t.Parallel()
	e := &Engine{}
	e.closed.Store(true)
	for _, s := range []error{storage.ErrInvalidArgument, storage.ErrTopicNotFound, storage.ErrTopicExists,
		storage.ErrTopicHasSubscriptions, storage.ErrNoSubscriptions, storage.ErrSubscriptionNotFound,
		storage.ErrSubscriptionExists, storage.ErrSubscriptionNotActive, storage.ErrInvalidTransition,
		storage.ErrLeaseNotHeld, storage.ErrMessageTooLarge, storage.ErrOffsetOutOfRange,
		storage.ErrBindingExists, storage.ErrBindingNotFound, storage.ErrCorrupt, storage.ErrUnavailable,
		storage.ErrFull, storage.ErrRateLimited, storage.ErrTopicChanged, storage.ErrLimitExceeded,
		storage.ErrStaleGeneration, storage.ErrSubscriptionHasProgress, storage.ErrNotImplemented} {
		err := fmt.Errorf("pgstore: op: %w", s)
		if got := e.mapErr(err); got != err {
			t.Errorf("%v became %v", s, got)
		}
	}
	if got := e.mapErr(errors.New("boom")); !errors.Is(got, storage.ErrClosed) {
		t.Errorf("a database error of a closed engine: %v, want CLOSED", got)
	}
}
