package broker

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
)

// TestStorageFullNewRun: refusals for lack of space start the condition with a WARN; further
// ones within storageFullFor keep it; once it expired, a new refusal starts a new run, with its
// own WARN and since (docs/storage.md: a WARN when publishes start failing); a stored publish
// ends it.
func TestStorageFullNewRun(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	var logs testutil.SyncBuffer
	b := &Broker{clock: clock, logger: slog.New(slog.NewTextHandler(&logs, nil))}
	full := &storage.IOError{Kind: storage.ErrFull, Reason: "disk full", Err: errors.New("no space left on device")}
	warns := func() int { return strings.Count(logs.String(), "storage full: publishes are refused") }
	expect := func(what string, wantFull bool, wantSince time.Time, wantWarns int) {
		t.Helper()
		since, isFull := b.StorageFull()
		if isFull != wantFull || !since.Equal(wantSince) {
			t.Errorf("%s: StorageFull() = %v, %v; want %v, %v", what, since, isFull, wantSince, wantFull)
		}
		if n := warns(); n != wantWarns {
			t.Errorf("%s: %d storage full WARNs, want %d", what, n, wantWarns)
		}
	}

	first := clock.Now()
	b.noteStorage(full)
	expect("first refusal", true, first, 1)
	clock.Advance(storageFullFor / 2)
	b.noteStorage(full)
	expect("refusal within the window", true, first, 1)
	clock.Advance(storageFullFor + time.Second)
	expect("expired", false, time.Time{}, 1)

	second := clock.Now()
	b.noteStorage(full)
	expect("refusal after the expiry", true, second, 2)
	clock.Advance(time.Second)
	b.noteStorage(full)
	expect("refusal in the new run", true, second, 2)

	b.noteStorage(nil)
	expect("stored again", false, time.Time{}, 2)
	third := clock.Now()
	b.noteStorage(full)
	expect("refusal after a stored publish", true, third, 3)
}
