package testutil

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestPGClusterRestart: the throwaway cluster answers, stops (immediate: a crash) and starts
// again with its data.
func TestPGClusterRestart(t *testing.T) {
	c := StartPGCluster(t)
	ctx := t.Context()
	exec := func(sql string) int {
		t.Helper()
		conn, err := pgx.Connect(ctx, c.URL)
		if err != nil {
			t.Fatalf("connect: %v\n%s", err, c.Log())
		}
		defer conn.Close(context.Background())
		var n int
		if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return n
	}
	exec("SELECT 1")
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE t AS SELECT 41 + 1 AS n"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	c.Stop("immediate")
	if _, err := pgx.Connect(ctx, c.URL); err == nil {
		t.Fatal("connected to a stopped cluster")
	}
	c.Start()
	if n := exec("SELECT n FROM t"); n != 42 {
		t.Fatalf("after restart: got %d, want 42", n)
	}
}
