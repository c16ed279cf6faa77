package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
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

// txSettings are the planner settings of pipelined transactions, made in one statement. Their
// statements are prepared, and PostgreSQL keeps a generic plan per connection:
//   - enable_seqscan off: a generic plan made while spool.deliveries was nearly empty (or its
//     statistics said so) is a sequential scan, which turns slow once the table holds thousands of
//     dead versions between two autovacuum runs (seen: acks at 100-165 ms). Every statement of
//     these transactions has an index to use.
//   - plan_cache_mode force_generic_plan: the planner estimates an unnest of a parameter at 10
//     rows, so for statements such as the delete of acked rows it judged the generic plan dearer
//     than a plan made for the parameters and planned them again at every execution, to the same
//     plan (seen: 125 us of planning per 22 us delete, a tenth of the database's CPU in a fan-out
//     to 16 groups). Every statement here is written for a generic plan.
const txSettings = "SELECT set_config('enable_seqscan', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)"

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
		qs = append([]*pgx.QueuedQuery{{SQL: "BEGIN"}, {SQL: txSettings}}, qs...)
	}
	if t.final {
		qs = append(qs, &pgx.QueuedQuery{SQL: "COMMIT"})
		t.committed = true
	}
	br := t.conn.SendBatch(ctx, &pgx.Batch{QueuedQueries: qs})
	if !t.begun {
		t.begun = true
		for range 2 { // BEGIN, txSettings
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

// sendFlushed is SendBatch for a batch whose first n queries' results the caller needs before
// the rest has run: a Flush request follows them, so the server sends their results at once
// instead of holding them until the batch's end (a server holds its output until Sync). An
// append's next transaction starts when its UPDATEs returned (laneTurn). The queries are
// prepared on the connection (once each) and sent in one pipeline; BEGIN and COMMIT as in
// SendBatch. The results are read like a pgx batch's, with the methods appendInTx uses.
func (t *pipeTx) sendFlushed(ctx context.Context, b *pgx.Batch, n int) (pgx.BatchResults, error) {
	qs := b.QueuedQueries
	sds := make([]*pgconn.StatementDescription, len(qs))
	for i, q := range qs {
		sd, err := t.conn.Prepare(ctx, q.SQL, q.SQL)
		if err != nil {
			return nil, err
		}
		sds[i] = sd
	}
	var settings *pgconn.StatementDescription
	if !t.begun {
		// Prepared like the queries: sent unnamed, it was planned at every transaction.
		sd, err := t.conn.Prepare(ctx, txSettings, txSettings)
		if err != nil {
			return nil, err
		}
		settings = sd
	}
	m := t.conn.TypeMap()
	pc := t.conn.PgConn()
	p := pc.StartPipeline(ctx)
	var eqb pgx.ExtendedQueryBuilder
	lead := 0
	if !t.begun {
		p.SendQueryParams("BEGIN", nil, nil, nil, nil)
		p.SendQueryStatement(settings, nil, nil, nil)
		lead = 2
		t.begun = true
	}
	for i, q := range qs {
		if err := eqb.Build(m, sds[i], q.Arguments); err != nil {
			_ = p.Close()
			return nil, err
		}
		p.SendQueryStatement(sds[i], eqb.ParamValues, eqb.ParamFormats, eqb.ResultFormats)
		if i == n-1 {
			p.SendFlushRequest()
		}
	}
	tail := 0
	if t.final {
		p.SendQueryParams("COMMIT", nil, nil, nil, nil)
		t.committed = true
		tail = 1
	}
	if err := p.Sync(); err != nil {
		_ = p.Close()
		return nil, err
	}
	r := &flushedResults{m: m, p: p, tail: tail}
	for range lead {
		if _, err := r.Exec(); err != nil {
			_ = p.Close()
			return nil, err
		}
	}
	return r, nil
}

// flushedResults reads the results of sendFlushed's pipeline: Exec, QueryRow and Close as a pgx
// batch's (the embedded interface is nil: other methods panic).
type flushedResults struct {
	pgx.BatchResults
	m    *pgtype.Map
	p    *pgconn.Pipeline
	tail int   // COMMIT results to read in Close
	err  error // the first failure read: the server skipped the rest
	done bool
}

// next returns the next query's result reader.
func (r *flushedResults) next() (*pgconn.ResultReader, error) {
	if r.err != nil {
		return nil, r.err
	}
	res, err := r.p.GetResults()
	if err != nil {
		r.err = err
		return nil, err
	}
	rr, ok := res.(*pgconn.ResultReader)
	if !ok {
		r.err = fmt.Errorf("pgstore: pipeline: expected a query's result, got %T", res)
		return nil, r.err
	}
	return rr, nil
}

func (r *flushedResults) Exec() (pgconn.CommandTag, error) {
	rr, err := r.next()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := rr.Close()
	if err != nil {
		r.err = err
	}
	return tag, err
}

func (r *flushedResults) QueryRow() pgx.Row { return flushedRow{r} }

type flushedRow struct{ r *flushedResults }

// Scan reads the first row of the next result into dest (pgx.ErrNoRows without one).
func (row flushedRow) Scan(dest ...any) error {
	rr, err := row.r.next()
	if err != nil {
		return err
	}
	if !rr.NextRow() {
		if _, err := rr.Close(); err != nil {
			row.r.err = err
			return err
		}
		return pgx.ErrNoRows
	}
	fds, vals := rr.FieldDescriptions(), rr.Values()
	if len(fds) != len(dest) {
		_, _ = rr.Close()
		return fmt.Errorf("pgstore: pipeline: %d columns, %d destinations", len(fds), len(dest))
	}
	for i, d := range dest {
		if err := row.r.m.Scan(fds[i].DataTypeOID, fds[i].Format, vals[i], d); err != nil {
			_, _ = rr.Close()
			return err
		}
	}
	if _, err = rr.Close(); err != nil {
		row.r.err = err
	}
	return err
}

// Close reads the COMMIT's result and ends the pipeline.
func (r *flushedResults) Close() error {
	if r.done {
		return nil
	}
	r.done = true
	var err error
	for range r.tail {
		if r.err != nil {
			err = r.err
			break
		}
		if _, err = r.Exec(); err != nil {
			break
		}
	}
	if cerr := r.p.Close(); err == nil {
		err = cerr
	}
	return err
}
