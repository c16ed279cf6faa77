package pgstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// instanceUUID returns the instance id as a pgx value.
func (e *Engine) instanceUUID() pgtype.UUID { return pgtype.UUID{Bytes: e.instance, Valid: true} }

// start registers the instance, loads store-wide settings and starts the background goroutines.
func (e *Engine) start(ctx context.Context) error {
	var secs string
	if err := e.pool.QueryRow(ctx, e.sql("SELECT value FROM spool.settings WHERE key = 'bucket_seconds'")).Scan(&secs); err != nil {
		return fmt.Errorf("pgstore: read settings: %w", err)
	}
	n, err := strconv.ParseInt(secs, 10, 64)
	if err != nil || n <= 0 {
		return fmt.Errorf("pgstore: settings: bad bucket_seconds %q", secs)
	}
	e.bucket.width = time.Duration(n) * time.Second
	e.startedAt = e.clockNow()
	var others bool
	if err := e.pool.QueryRow(ctx, e.sql(`INSERT INTO spool.instances (id, started_at, heartbeat_at) VALUES ($1, $2, $2)
		RETURNING `+othersSQL), e.instanceUUID(), e.startedAt).Scan(&others); err != nil {
		return fmt.Errorf("pgstore: register instance: %w", err)
	}
	e.sawInstances(others, 0)
	e.wg.Add(1)
	go e.heartbeatLoop()
	return e.startNotify(ctx)
}

// othersSQL reports whether instances other than $1 are registered (notifyState.alone). Rows of
// instances that died count until maintenance removes them: notifying nobody costs little.
const othersSQL = `EXISTS (SELECT FROM spool.instances o WHERE o.id <> $1) AS others`

// heartbeatSQL refreshes the instance's heartbeat; it registers the instance again when its row
// is gone (another instance's maintenance found it stale, e.g. after a long pause, and removed
// it with its ephemeral subscriptions): without a row, maintenance would remove every ephemeral
// subscription the instance makes from then on. inserted reports the registration.
const heartbeatSQL = `INSERT INTO spool.instances (id, started_at, heartbeat_at) VALUES ($1, $2, $3)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at
RETURNING xmax = 0 AS inserted, ` + othersSQL

// beatClockSQL is heartbeatSQL that also reads the database's clock (dbTime).
const beatClockSQL = heartbeatSQL + `, clock_timestamp() AS db_now`

// heartbeatLoop refreshes this instance's heartbeat, and its estimate of the database's clock,
// until Close.
func (e *Engine) heartbeatLoop() {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.InstanceHeartbeat)
	defer t.Stop()
	for {
		select {
		case <-e.bgCtx.Done():
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(e.bgCtx, e.cfg.InstanceHeartbeat)
			heard := e.notify.peerHeard.Load()
			inserted, others, err := e.beat(ctx)
			cancel()
			if err == nil {
				e.sawInstances(others, heard)
			}
			switch {
			case err != nil && e.bgCtx.Err() == nil:
				e.log.Warn("pgstore: instance heartbeat failed", "err", err)
			case err == nil && inserted:
				e.log.Warn("pgstore: this instance had been removed as stale (its ephemeral subscriptions with it); registered again")
			}
		}
	}
}

// beat runs heartbeatSQL on a connection of the pool and, on the database's clock, takes the
// reading of clock_timestamp() of the same statement (its round trip, not the pool's wait, bounds
// the reading).
func (e *Engine) beat(ctx context.Context) (inserted, others bool, err error) {
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return false, false, err
	}
	defer conn.Release()
	if !e.dbClock {
		err = conn.QueryRow(ctx, e.sql(heartbeatSQL), e.instanceUUID(), e.startedAt, e.clockNow()).Scan(&inserted, &others)
		return inserted, others, err
	}
	var db time.Time
	t1 := e.dbc.local()
	err = conn.QueryRow(ctx, e.sql(beatClockSQL), e.instanceUUID(), e.startedAt, e.dbc.at(t1)).Scan(&inserted, &others, &db)
	if err == nil {
		e.dbc.observe(e.log, t1, e.dbc.local(), db)
	}
	return inserted, others, err
}

// shutdown removes this instance's ephemeral subscriptions (nobody is connected to them any
// more) and its instance row.
func (e *Engine) shutdown(ctx context.Context) error {
	if _, err := e.pool.Exec(ctx, e.sql("DELETE FROM spool.subscriptions WHERE ephemeral AND owner = $1"), e.instanceUUID()); err != nil {
		return fmt.Errorf("pgstore: close: remove ephemeral subscriptions: %w", err)
	}
	if _, err := e.pool.Exec(ctx, e.sql("DELETE FROM spool.instances WHERE id = $1"), e.instanceUUID()); err != nil {
		return fmt.Errorf("pgstore: close: unregister instance: %w", err)
	}
	return nil
}
