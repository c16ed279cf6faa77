package storagetest_test

import (
	"testing"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
	"github.com/spoolmq/spool/internal/storage/wal"
)

// Throwaway: runs the suite against the WAL engine while it is being written. Deleted before the
// report; the engine's own engine_test.go owns the real call.
func TestTryWAL(t *testing.T) {
	storagetest.Run(t, storagetest.Capabilities{Restart: true}, func(t *testing.T) storagetest.OpenFunc {
		dir := t.TempDir()
		return func(clock storage.Clock) (storage.Engine, error) {
			return wal.Open(dir, wal.Config{Clock: clock, SegmentBytes: 64 << 10})
		}
	})
}
