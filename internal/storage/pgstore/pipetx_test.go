package pgstore

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestPipeTx: a pipelined transaction commits everything or nothing, whether its last batch
// carries the COMMIT or not, and a failure (SQL error in a batch, or fn's own error) leaves no
// transaction open on the pooled connection (a pool of 2 would otherwise run dry).
func TestPipeTx(t *testing.T) {
	t.Parallel()
	e := openConns(t, 2)
	ctx := t.Context()
	if _, err := e.pool.Exec(ctx, e.sql("CREATE TABLE spool.scratch (x int NOT NULL)")); err != nil {
		t.Fatal(err)
	}
	insert := func(tx pgx.Tx, vals ...any) error {
		b := &pgx.Batch{}
		for _, v := range vals {
			b.Queue(e.sql("INSERT INTO spool.scratch (x) VALUES ($1)"), v)
		}
		return tx.SendBatch(ctx, b).Close()
	}
	count := func() int {
		t.Helper()
		var n int
		if err := e.pool.QueryRow(ctx, e.sql("SELECT count(*) FROM spool.scratch")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	errOwn := errors.New("fn failed")
	for i := range 5 {
		// COMMIT with the last batch.
		if err := e.pipeTx(ctx, func(tx pgx.Tx) error {
			if err := insert(tx, 1); err != nil {
				return err
			}
			finalBatch(tx)
			return insert(tx, 2)
		}); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		// COMMIT alone: no batch after finalBatch.
		if err := e.pipeTx(ctx, func(tx pgx.Tx) error { return insert(tx, 3) }); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		// An SQL error in the final batch: nothing of the transaction stays.
		err := e.pipeTx(ctx, func(tx pgx.Tx) error {
			if err := insert(tx, 4); err != nil {
				return err
			}
			finalBatch(tx)
			return insert(tx, 5, nil) // NOT NULL violation
		})
		if pgCode(err) != "23502" {
			t.Fatalf("round %d: got %v, want a not-null violation", i, err)
		}
		// fn's own error after a batch: rolled back.
		if err := e.pipeTx(ctx, func(tx pgx.Tx) error {
			if err := insert(tx, 6); err != nil {
				return err
			}
			return errOwn
		}); !errors.Is(err, errOwn) {
			t.Fatalf("round %d: got %v, want fn's error", i, err)
		}
		if n := count(); n != 3*(i+1) {
			t.Fatalf("round %d: %d rows, want %d (only the committed transactions)", i, n, 3*(i+1))
		}
	}
	// Every pooled connection is idle, outside a transaction.
	conns := e.pool.AcquireAllIdle(context.Background())
	for _, c := range conns {
		if st := c.Conn().PgConn().TxStatus(); st != 'I' {
			t.Errorf("pooled connection in transaction status %q", st)
		}
		c.Release()
	}
}
