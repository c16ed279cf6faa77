package testutil

import (
	"os"
	"testing"
)

// DatabaseURL returns the shared test database, TEST_DATABASE_URL (scripts/test.sh starts one).
// Without it the test is skipped, unless SPOOL_TEST_REQUIRE_PG=1 (CI, the test script), where it
// fails: PostgreSQL tests are never skipped silently there.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("TEST_DATABASE_URL")
	if u == "" {
		if os.Getenv("SPOOL_TEST_REQUIRE_PG") == "1" {
			t.Fatal("TEST_DATABASE_URL is not set but SPOOL_TEST_REQUIRE_PG=1: PostgreSQL tests must run (use ./scripts/test.sh)")
		}
		t.Skip("TEST_DATABASE_URL not set: PostgreSQL tests skipped (./scripts/test.sh starts a database)")
	}
	return u
}
