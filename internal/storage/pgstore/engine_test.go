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
	storagetest.Run(t, storagetest.Capabilities{Restart: true}, func(t *testing.T) storagetest.OpenFunc {
		cfg := testConfig(t, nil)
		return func(clock storage.Clock) (storage.Engine, error) {
			c := cfg
			c.Clock = clock
			return Open(context.WithoutCancel(t.Context()), c)
		}
	})
}
