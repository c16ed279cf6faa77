package pgstore

import (
	"log/slog"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
)

// testURL is testutil.DatabaseURL.
func testURL(t testing.TB) string { return testutil.DatabaseURL(t) }

// testSchema makes a fresh schema name for one test and drops the schema at the end.
func testSchema(t testing.TB) string {
	t.Helper()
	return testutil.PGSchema(t, testURL(t), "t_")
}

// testConfig is the engine configuration of the tests over a fresh schema.
func testConfig(t testing.TB, clock storage.Clock) Config {
	return Config{
		URL:      testURL(t),
		Schema:   testSchema(t),
		Clock:    clock,
		Migrate:  true,
		MaxConns: 4,
		Logger:   slog.New(slog.DiscardHandler),
	}
}
