package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolmq/spool/internal/config"
	"github.com/spoolmq/spool/internal/storage/pgstore"
)

func init() {
	addCommand(command{name: "migrate", summary: "create or upgrade the PostgreSQL schema (--store postgres://...)", run: migrate})
}

// migrateFlags maps the flags of spool migrate to their configuration keys.
var migrateFlags = map[string]string{"store": "store", "schema": "postgres.schema"}

// migrate applies the PostgreSQL engine's pending schema migrations. It reads the same settings
// as serve (defaults, --config or $SPOOL_CONFIG, SPOOL_* variables, flags).
func migrate(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: spool migrate --store postgres://USER@HOST:PORT/DB [flags]\n\n"+
			"Creates the PostgreSQL schema of the broker or applies its pending migrations, each in its own\n"+
			"transaction, under an advisory lock (safe while brokers run). Settings as for spool serve (only\n"+
			"the store's are checked: store, postgres.schema, postgres.bucket_width).\n\nFlags:\n")
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), "\nExamples:\n"+
			"  spool migrate --store postgres://spool@127.0.0.1:5432/app\n"+
			"  spool migrate --store postgres://spool@127.0.0.1:5432/app --schema spool_test\n")
	}
	configFile := fs.String("config", "", "YAML configuration file (default $SPOOL_CONFIG, else none)")
	def := config.Defaults()
	fs.String("store", def.Store, "PostgreSQL URL (postgres://...; or $SPOOL_STORE)")
	fs.String("schema", def.Postgres.Schema, "PostgreSQL schema (or $SPOOL_POSTGRES_SCHEMA)")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	// Only the store's settings are checked: spool serve's file may name TLS files or listeners
	// that this shell cannot read or that do not matter here.
	cfg, err := loadConfigWith(config.LoadStore, fs, *configFile, migrateFlags)
	if err != nil {
		return err
	}
	if cfg.Store == "" {
		return fmt.Errorf("migrate: --store (or SPOOL_STORE) must be a postgres:// URL")
	}
	pool, err := pgxpool.New(ctx, cfg.Store)
	if err != nil {
		return fmt.Errorf("migrate: %s: %w", cfg.Redacted(), err)
	}
	defer pool.Close()
	before, after, err := pgstore.MigrateReport(ctx, pool, cfg.Postgres.Schema, cfg.Postgres.BucketWidth)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if before == after {
		fmt.Printf("schema %q is up to date (version %d)\n", cfg.Postgres.Schema, after)
	} else {
		fmt.Printf("schema %q migrated from version %d to %d\n", cfg.Postgres.Schema, before, after)
	}
	return nil
}
