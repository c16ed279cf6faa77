// Package assemble builds a broker's components from its configuration: the engine it selects
// and the broker's settings. spool serve and the embed package share it, so that an embedded
// broker runs as the served one does.
package assemble

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/config"
	"github.com/spoolmq/spool/internal/metrics"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/pgstore"
	"github.com/spoolmq/spool/internal/storage/wal"
)

// OpenEngine opens the engine cfg selects: the embedded log engine in DataDir, or the PostgreSQL
// engine when Store is a postgres:// URL (migrating the schema first unless postgres.migrate is
// off). m (nil: no metrics) follows the engine's topic notifications, so that every instance
// forgets the series of a topic deleted by any of them (metrics.Metrics.ObserveNotification).
func OpenEngine(ctx context.Context, cfg config.Config, logger *slog.Logger, m *metrics.Metrics) (storage.Engine, error) {
	start := time.Now()
	if cfg.Store != "" {
		eng, err := pgstore.Open(ctx, PGConfig(cfg, logger))
		if err != nil {
			return nil, fmt.Errorf("open PostgreSQL engine %s: %w", cfg.Redacted(), err)
		}
		logger.Info("engine open", slog.String("store", cfg.Redacted()), slog.String("schema", cfg.Postgres.Schema),
			slog.Duration("took", time.Since(start)))
		watchTopics(eng, m)
		return eng, nil
	}
	walCfg := wal.Config{Logger: logger, SegmentBytes: cfg.WAL.SegmentBytes, OnSync: m.ObserveFsync, NoSharedFlush: !cfg.WAL.SharedFlush, SlowSync: cfg.WAL.SlowSync,
		MaxProducerIDs: cfg.WAL.MaxProducerIDs, MaxOpenFiles: cfg.WAL.MaxOpenFiles}
	if cfg.WAL.UnsafeNoSync {
		walCfg.Sync = wal.UnsafeNoSync
		logger.Warn("fsync is off (wal.unsafe_no_sync): a machine crash loses acknowledged messages")
	}
	eng, err := wal.Open(cfg.DataDir, walCfg)
	if err != nil {
		return nil, fmt.Errorf("open embedded engine in %s: %w", cfg.DataDir, err)
	}
	logger.Info("engine open", slog.String("data_dir", cfg.DataDir), slog.Int("max_open_files", eng.OpenFiles().Max),
		slog.Duration("took", time.Since(start)))
	watchTopics(eng, m)
	return eng, nil
}

// watchTopics registers m for eng's notifications for as long as eng is open.
func watchTopics(eng storage.Engine, m *metrics.Metrics) {
	if m != nil {
		eng.NotifyRegister(m.ObserveNotification)
	}
}

// claimInterval is the broker's ClaimInterval: postgres.claim_interval on the PostgreSQL engine,
// 0 on the embedded engine (a claim there is a memory operation).
func claimInterval(cfg config.Config) time.Duration {
	if cfg.Store == "" {
		return 0
	}
	return cfg.Postgres.ClaimInterval
}

// PGConfig is the PostgreSQL engine configuration of cfg.
func PGConfig(cfg config.Config, logger *slog.Logger) pgstore.Config {
	return pgstore.Config{
		URL:          cfg.Store,
		Schema:       cfg.Postgres.Schema,
		Logger:       logger,
		Migrate:      cfg.Postgres.Migrate,
		MaxConns:     int32(cfg.Postgres.MaxConns),
		BucketWidth:  cfg.Postgres.BucketWidth,
		PollInterval: cfg.Postgres.PollInterval,
		TxTimeout:    cfg.Postgres.TxTimeout,

		MaxProducerIDs: cfg.Postgres.MaxProducerIDs,
	}
}

// BrokerConfig is the broker configuration of cfg on eng, reporting to m (nil: no metrics).
func BrokerConfig(cfg config.Config, eng storage.Engine, logger *slog.Logger, m *metrics.Metrics) broker.Config {
	return broker.Config{
		Engine:             eng,
		Logger:             logger,
		DisableAutoCreate:  !cfg.Broker.AutoCreate,
		AutoCreateConfig:   storage.TopicConfig{Semantics: storage.Semantics(cfg.Broker.AutoCreateSemantics)},
		RetentionInterval:  cfg.Broker.RetentionInterval,
		OnRetention:        m.ObserveRetention,
		SlowOperation:      cmp.Or(cfg.Broker.SlowOperation, -1), // config 0: off
		DefaultMaxInFlight: cfg.Broker.DefaultMaxInFlight,
		MaxTopics:          cmp.Or(cfg.Broker.MaxTopics, -1), // config 0: no bound
		MaxSubscriptions:   cmp.Or(cfg.Broker.MaxSubscriptions, -1),
		MaxBindings:        cmp.Or(cfg.Broker.MaxBindings, -1),
		MaxPartitions:      cfg.Broker.MaxPartitions,
		PollInterval:       cfg.Broker.PollInterval,
		ClaimInterval:      claimInterval(cfg),
		// Topic backpressure (broker backpressure.go).
		BackpressureInterval: cfg.Broker.BackpressureInterval,
		MaxThrottleDelay:     cfg.Broker.MaxThrottleDelay,
		LifecycleInterval:    cfg.Broker.LifecycleInterval,
		Backfill: broker.BackfillConfig{Batch: cfg.Broker.BackfillBatch, TargetP95: cfg.Broker.BackfillTargetP95,
			MaxRate: float64(cfg.Broker.BackfillMaxRate)},
		SubscriptionRetention: cfg.Broker.SubscriptionRetention,
		OnLifecycle:           m.ObserveLifecycle,
		OnForceComplete:       m.ObserveForceComplete,
		OnFiltered:            m.ObserveFiltered,
		OnDeadLettered:        m.ObserveDeadLettered,
		// Ordered groups (broker ordered.go): on PostgreSQL other instances' members stay in the
		// assignments while their instance renews them; one that stops renewing loses them after
		// the member session timeout.
		SharedEngine:   cfg.Store != "",
		MemberTimeout:  min(max(cfg.Server.SessionTimeout, storage.MinMemberTTL), storage.MaxMemberTTL),
		OnRebalance:    m.ObserveRebalance,
		RebalanceDelay: cmp.Or(cfg.Broker.RebalanceDelay, -1), // config 0: at once
	}
}
