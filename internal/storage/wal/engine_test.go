package wal

import (
	"testing"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
)

// conformanceMaxIDs is the producer id bound of the conformance runs (Dedup/bounded fills it).
const conformanceMaxIDs = 32

// TestConformance runs the shared storage conformance suite against the embedded log engine, with
// real files in a temporary directory and small segments so retention cases cross segment
// boundaries.
func TestConformance(t *testing.T) {
	t.Parallel()
	storagetest.Run(t, storagetest.Capabilities{Restart: true, AsyncAppend: true, Ordered: true, SegmentBytes: 64 << 10, MaxProducerIDs: conformanceMaxIDs}, func(t *testing.T) storagetest.OpenFunc {
		dir := t.TempDir()
		return func(clock storage.Clock) (storage.Engine, error) {
			return Open(dir, Config{Clock: clock, SegmentBytes: 64 << 10, Logger: testLogger(t), MaxProducerIDs: conformanceMaxIDs})
		}
	})
}

// TestConformanceFewOpenFiles runs the suite with at most 2 segment files open (beside the state
// log's, which stay open): every partition's files are closed between uses and opened again, so
// every case also checks that reads, claims, retention and restarts see the same data through
// reopened files.
func TestConformanceFewOpenFiles(t *testing.T) {
	t.Parallel()
	storagetest.Run(t, storagetest.Capabilities{Restart: true, AsyncAppend: true, Ordered: true, SegmentBytes: 64 << 10, MaxProducerIDs: conformanceMaxIDs}, func(t *testing.T) storagetest.OpenFunc {
		dir := t.TempDir()
		return func(clock storage.Clock) (storage.Engine, error) {
			return Open(dir, Config{Clock: clock, SegmentBytes: 64 << 10, Logger: testLogger(t), MaxOpenFiles: 2, MaxProducerIDs: conformanceMaxIDs})
		}
	})
}
