package pgstore

import (
	"context"
	"embed"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolmq/spool/internal/storage"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migration is one embedded, versioned schema change: migrations/NNNN_name.sql.
type migration struct {
	version int
	name    string
	sql     string
}

// migrations returns the embedded migrations in version order.
func migrations() ([]migration, error) {
	names, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, n := range names {
		base := path.Base(n)
		v, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("pgstore: migration %s: name must start with its version number", base)
		}
		b, err := migrationFiles.ReadFile(n)
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: base, sql: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	for i, m := range ms {
		if m.version != i+1 {
			return nil, fmt.Errorf("pgstore: migration %s: versions must be 1, 2, 3, ... without gaps", m.name)
		}
	}
	return ms, nil
}

// LatestVersion is the schema version this build expects.
func LatestVersion() int {
	ms, err := migrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].version
}

// lockKey is the advisory lock key of a schema's migrations (and other store-wide jobs, offset by
// the job).
func lockKey(schema, job string) int64 {
	h := fnv.New64a()
	h.Write([]byte("spool:" + schema + ":" + job))
	return int64(h.Sum64())
}

// MinServerVersion is the oldest PostgreSQL the engine runs on (server_version_num): the
// pipelined publish transactions check their predecessor with pg_xact_status over xid8 (13+).
const MinServerVersion = 130000

// checkServer refuses a PostgreSQL server older than MinServerVersion.
func checkServer(ctx context.Context, pool *pgxpool.Pool) error {
	var num int
	var version string
	if err := pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, current_setting('server_version')").Scan(&num, &version); err != nil {
		return fmt.Errorf("pgstore: server version: %w", err)
	}
	return serverSupported(num, version)
}

// serverSupported refuses server_version_num num (version: its text) below MinServerVersion.
func serverSupported(num int, version string) error {
	if num < MinServerVersion {
		return fmt.Errorf("%w: pgstore: PostgreSQL %s is too old: the engine needs PostgreSQL 13 or later", storage.ErrInvalidArgument, version)
	}
	return nil
}

// Migrate creates the schema if needed and applies every pending migration, each in its own
// transaction, under a session advisory lock so that concurrent broker instances migrate once.
// bucketWidth is recorded in spool.settings when the store is created (0: DefaultBucketWidth).
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string, bucketWidth time.Duration) error {
	_, _, err := MigrateReport(ctx, pool, schema, bucketWidth)
	return err
}

// MigrateReport is Migrate that also returns the schema version before and after.
func MigrateReport(ctx context.Context, pool *pgxpool.Pool, schema string, bucketWidth time.Duration) (before, after int, err error) {
	if !schemaName.MatchString(schema) {
		return 0, 0, fmt.Errorf("pgstore: schema %q: must match %s", schema, schemaName)
	}
	if bucketWidth == 0 {
		bucketWidth = DefaultBucketWidth
	}
	if err := checkServer(ctx, pool); err != nil {
		return 0, 0, err
	}
	ms, err := migrations()
	if err != nil {
		return 0, 0, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("pgstore: migrate: %w", err)
	}
	defer conn.Release()
	key := lockKey(schema, "migrate")
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		return 0, 0, fmt.Errorf("pgstore: migrate: lock: %w", err)
	}
	defer func() {
		// A failed unlock (connection gone) releases the session lock anyway.
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", key)
	}()
	q := pgx.Identifier{schema}.Sanitize()
	if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+q); err != nil {
		return 0, 0, fmt.Errorf("pgstore: migrate: create schema: %w", err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+q+".schema_migrations "+
		"(version int PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"); err != nil {
		return 0, 0, fmt.Errorf("pgstore: migrate: %w", err)
	}
	current, err := schemaVersion(ctx, conn.Conn(), schema)
	if err != nil {
		return 0, 0, err
	}
	if current > len(ms) {
		return 0, 0, fmt.Errorf("pgstore: schema %q is at version %d, newer than this build (%d): upgrade spool", schema, current, len(ms))
	}
	if err := checkApplied(ctx, conn.Conn(), schema, ms); err != nil {
		return current, current, err
	}
	for _, m := range ms[current:] {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, renderSchema(m.sql, schema)); err != nil {
				return err
			}
			if m.version == 1 {
				if _, err := tx.Exec(ctx, "INSERT INTO "+q+".settings (key, value) VALUES ('bucket_seconds', $1)",
					strconv.FormatInt(int64(bucketWidth/time.Second), 10)); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+q+".schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name)
			return err
		})
		if err != nil {
			return current, m.version - 1, fmt.Errorf("pgstore: migration %s: %w", m.name, err)
		}
	}
	return current, len(ms), nil
}

// schemaVersion returns the highest applied migration, 0 for none.
func schemaVersion(ctx context.Context, conn *pgx.Conn, schema string) (int, error) {
	var v int
	err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+pgx.Identifier{schema}.Sanitize()+".schema_migrations").Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("pgstore: schema version: %w", err)
	}
	return v, nil
}

// checkApplied fails unless each applied migration this build knows (by version) has the name of
// this build's migration of that version: a database that applied a different 0011 (another
// branch's build) must not silently skip this build's 0011.
func checkApplied(ctx context.Context, conn *pgx.Conn, schema string, ms []migration) error {
	rows, err := conn.Query(ctx, "SELECT version, name FROM "+pgx.Identifier{schema}.Sanitize()+".schema_migrations ORDER BY version")
	if err != nil {
		return fmt.Errorf("pgstore: applied migrations: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int
		var name string
		if err := rows.Scan(&v, &name); err != nil {
			return fmt.Errorf("pgstore: applied migrations: %w", err)
		}
		if v >= 1 && v <= len(ms) && ms[v-1].name != name {
			return fmt.Errorf("pgstore: schema %q applied migration %d as %q, but this build's migration %d is %q: "+
				"the schema was migrated by a different build; restore it or use a fresh schema", schema, v, name, v, ms[v-1].name)
		}
	}
	return rows.Err()
}

// checkVersion fails unless the schema is at LatestVersion.
func checkVersion(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: connect: %w", err)
	}
	defer conn.Release()
	v, err := schemaVersion(ctx, conn.Conn(), schema)
	if err != nil {
		return fmt.Errorf("%w (run `spool migrate`)", err)
	}
	if want := LatestVersion(); v != want {
		return fmt.Errorf("pgstore: schema %q is at version %d, this build needs %d: run `spool migrate`", schema, v, want)
	}
	ms, err := migrations()
	if err != nil {
		return err
	}
	return checkApplied(ctx, conn.Conn(), schema, ms)
}
