package wal

import (
	"testing"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
)

// TestConformance runs the shared storage conformance suite against the embedded log engine, with
// real files in a temporary directory and small segments so retention cases cross segment
// boundaries.
func TestConformance(t *testing.T) {
	t.Parallel()
	storagetest.Run(t, storagetest.Capabilities{Restart: true, AsyncAppend: true}, func(t *testing.T) storagetest.OpenFunc {
		dir := t.TempDir()
		return func(clock storage.Clock) (storage.Engine, error) {
			return Open(dir, Config{Clock: clock, SegmentBytes: 64 << 10, Logger: testLogger(t)})
		}
	})
}
