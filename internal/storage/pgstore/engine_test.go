package pgstore

import (
	"context"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
)

// TestConformance runs the shared storage conformance suite against the PostgreSQL engine, one
// fresh schema per case.
func TestConformance(t *testing.T) {
	t.Parallel()
	testURL(t)
	storagetest.Run(t, storagetest.Capabilities{Restart: true, AsyncAppend: true, Ordered: true, MaxProducerIDs: conformanceMaxIDs}, conformanceStore(0))
}

// TestConformanceNoCache runs the suite with the message cache off: every claim reads its messages
// from the database, the path a broker instance takes for messages another instance published.
func TestConformanceNoCache(t *testing.T) {
	t.Parallel()
	testURL(t)
	storagetest.Run(t, storagetest.Capabilities{Restart: true, AsyncAppend: true, Ordered: true, MaxProducerIDs: conformanceMaxIDs}, conformanceStore(-1))
}

// conformanceMaxIDs is the producer id bound of the conformance runs (Dedup/bounded fills it).
const conformanceMaxIDs = 32

func conformanceStore(cacheBytes int64) storagetest.NewStoreFunc {
	return func(t *testing.T) storagetest.OpenFunc {
		cfg := testConfig(t, nil)
		cfg.MessageCacheBytes = cacheBytes
		cfg.MaxProducerIDs = conformanceMaxIDs
		return func(clock storage.Clock) (storage.Engine, error) {
			c := cfg
			c.Clock = clock
			// The suite reopens the engine in its cleanup, after the test's context ended.
			return Open(context.WithoutCancel(t.Context()), c)
		}
	}
}
