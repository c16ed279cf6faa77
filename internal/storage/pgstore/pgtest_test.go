package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
)

// testURL is testutil.DatabaseURL.
func testURL(t testing.TB) string { return testutil.DatabaseURL(t) }

// testSchema makes a fresh schema name for one test and drops the schema at the end.
func testSchema(t testing.TB) string {
	t.Helper()
	url := testURL(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "t_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return schema
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
