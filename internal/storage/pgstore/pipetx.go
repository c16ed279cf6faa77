package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// pipeTx is a transaction whose BEGIN travels in the pipeline of its first batch and whose COMMIT
// travels in the pipeline of its last one (the batch sent after finalBatch was called): a claim or
// an ack then costs two round trips instead of four. Under load, every round trip is a pair of
// context switches between the broker and its database backend, so this is what lets many
// subscriptions claim and ack at once on a small machine.
//
// Only SendBatch and QueryRow are implemented (the delivery operations and appends use nothing
// else); the embedded pgx.Tx is nil, so any other method panics.
type pipeTx struct {
	pgx.Tx
	conn      *pgx.Conn
	begun     bool
	final     bool // the next batch ends with COMMIT
	committed bool // a batch ending with COMMIT was sent
}

// noSeqScan keeps the planner off sequential scans in pipelined transactions. Their statements
// are prepared, and PostgreSQL keeps a generic plan per connection: one made while
// spool.deliveries was nearly empty (or its statistics said so) is a sequential scan, which turns
// slow once the table holds thousands of dead versions between two autovacuum runs (seen: acks at
// 100-165 ms). Every statement of these transactions has an index to use.
const noSeqScan = "SET LOCAL enable_seqscan = off"

// finalBatch makes the next batch of tx (a *pipeTx) carry the COMMIT; a no-op for other
// transactions.
func finalBatch(tx pgx.Tx) {
	if t, ok := tx.(*pipeTx); ok {
		t.final = true
	}
}

// SendBatch sends b, preceded by BEGIN if it is the transaction's first batch and followed by
// COMMIT after finalBatch. The results of BEGIN are read here; the caller reads b's own, and the
// COMMIT's error (if any) comes from Close.
func (t *pipeTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	qs := b.QueuedQueries
	if !t.begun {
		qs = append([]*pgx.QueuedQuery{{SQL: "BEGIN"}, {SQL: noSeqScan}}, qs...)
	}
	if t.final {
		qs = append(qs, &pgx.QueuedQuery{SQL: "COMMIT"})
		t.committed = true
	}
	br := t.conn.SendBatch(ctx, &pgx.Batch{QueuedQueries: qs})
	if !t.begun {
		t.begun = true
		for range 2 { // BEGIN, SET LOCAL
			if _, err := br.Exec(); err != nil {
				_ = br.Close()
				return errBatch{br, err}
			}
		}
	}
	return br
}

// QueryRow runs one query as a batch of its own (so BEGIN and COMMIT travel with it like with
// any batch); the row must be scanned, which ends the batch.
func (t *pipeTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br := t.SendBatch(ctx, b)
	return batchRow{br: br, row: br.QueryRow()}
}

// batchRow is the one row of a one-query batch: Scan reads it and closes the batch.
type batchRow struct {
	br  pgx.BatchResults
	row pgx.Row
}

func (r batchRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

// errBatch is the results of a batch that failed before the caller's first statement (the closed
// batch is embedded for the rest of pgx.BatchResults).
type errBatch struct {
	pgx.BatchResults
	err error
}

func (r errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, r.err }
func (r errBatch) Query() (pgx.Rows, error)         { return nil, r.err }
func (r errBatch) QueryRow() pgx.Row                { return errRow{r.err} }
func (r errBatch) Close() error                     { return r.err }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// maxRollbackWait bounds the ROLLBACK of a failed pipelined transaction; a connection that does
// not answer in time is closed.
const maxRollbackWait = 5 * time.Second

// pipeTx runs fn in a pipelined transaction (see pipeTx) on a pool connection, retrying like tx.
// fn may only call SendBatch and QueryRow and must call finalBatch before its last batch (or send none after
// it); if fn sends no batch carrying the COMMIT, the COMMIT is sent alone.
func (e *Engine) pipeTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	if err := e.checkOpen(); err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		var commitSent bool
		err := e.runPipeTx(ctx, fn, &commitSent)
		if err != nil && attempt < maxTxRetries && retryable(err) {
			e.log.Debug("pgstore: retrying transaction", "attempt", attempt+1, "err", err)
			continue
		}
		return e.mapTxErr(err, commitSent)
	}
}

// runPipeTx runs one attempt of pipeTx; *commitSent reports whether the COMMIT was sent.
func (e *Engine) runPipeTx(ctx context.Context, fn func(tx pgx.Tx) error, commitSent *bool) (err error) {
	pc, err := e.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	t := &pipeTx{conn: pc.Conn()}
	defer func() {
		*commitSent = t.committed
		if err == nil {
			pc.Release()
			return
		}
		// Leave no transaction open on a connection that goes back to the pool.
		if st := t.conn.PgConn().TxStatus(); st != 'I' {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), maxRollbackWait)
			defer cancel()
			if _, rerr := t.conn.Exec(rctx, "ROLLBACK"); rerr != nil {
				_ = t.conn.Close(rctx) // the pool drops a closed connection
			}
		}
		pc.Release()
	}()
	if err := fn(t); err != nil {
		return err
	}
	if !t.begun {
		return nil // nothing was sent: nothing to commit
	}
	if !t.committed {
		t.committed = true
		if _, err := t.conn.Exec(ctx, "COMMIT"); err != nil {
			return err
		}
	}
	if st := t.conn.PgConn().TxStatus(); st != 'I' {
		return fmt.Errorf("pgstore: transaction still open after COMMIT (status %q)", st)
	}
	return nil
}
