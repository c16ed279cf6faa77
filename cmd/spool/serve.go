package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal"
)

// serve runs the broker on the embedded engine until ctx is cancelled (SIGINT, SIGTERM), then
// shuts down in order: stop the broker (members leave, leases are released), close the engine
// (flush, snapshot, close files).
func serve(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "./spool-data", "directory of the embedded engine")
	demo := fs.Bool("demo", true, "publish and consume a few messages in-process at start-up (until the wire protocol lands)")
	unsafeNoSync := fs.Bool("unsafe-no-sync", false, "acknowledge publishes before they are fsynced (loses acknowledged messages on power loss)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))

	cfg := wal.Config{Logger: logger}
	if *unsafeNoSync {
		cfg.Sync = wal.UnsafeNoSync
	}
	start := time.Now()
	eng, err := wal.Open(*dataDir, cfg)
	if err != nil {
		return fmt.Errorf("open embedded engine in %s: %w", *dataDir, err)
	}
	logger.Info("engine open", slog.String("data_dir", *dataDir), slog.Duration("took", time.Since(start)))
	defer func() {
		if err := eng.Close(); err != nil {
			logger.Error("engine close", slog.Any("error", err))
		}
	}()

	b, err := broker.New(broker.Config{Engine: eng, Logger: logger})
	if err != nil {
		return err
	}
	if err := b.Start(ctx); err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := b.Stop(stopCtx); err != nil {
			logger.Error("broker stop", slog.Any("error", err))
		}
	}()
	logger.Info("spool running on the embedded engine; the TCP and HTTP listeners arrive with the wire protocol")

	if *demo {
		if err := runDemo(ctx, b, logger); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
	}
	<-ctx.Done()
	logger.Info("shutting down")
	return nil
}

// runDemo shows the in-process API: two groups on a PUB_SUB topic each receive every message.
func runDemo(ctx context.Context, b *broker.Broker, logger *slog.Logger) error {
	const topic = "spool.demo"
	if _, err := b.CreateTopic(ctx, topic, storage.TopicConfig{Semantics: storage.PubSub}); err != nil && !errors.Is(err, storage.ErrTopicExists) {
		return err
	}
	var members []*broker.Member
	for _, group := range []string{"billing", "audit"} {
		m, err := b.Subscribe(ctx, broker.SubscribeParams{Pattern: "spool.*", Group: group})
		if err != nil {
			return err
		}
		members = append(members, m)
	}
	defer func() {
		for _, m := range members {
			_ = m.Close(context.WithoutCancel(ctx))
		}
	}()
	msgs := make([]storage.AppendMessage, 3)
	for i := range msgs {
		msgs[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: fmt.Appendf(nil, "hello %d", i)}
	}
	if _, err := b.Publish(ctx, topic, msgs); err != nil {
		return err
	}
	for i, m := range members {
		for range msgs {
			select {
			case d := <-m.Deliveries():
				logger.Info("demo delivery", slog.Int("member", i), slog.String("topic", d.Topic),
					slog.Int64("offset", d.Offset), slog.String("payload", string(d.Payload)), slog.Int("attempt", d.Attempt))
				if err := m.Ack(ctx, d.SubscriptionID, d.Ref()); err != nil {
					return err
				}
			case <-time.After(10 * time.Second):
				return fmt.Errorf("member %d: no delivery within 10s", i)
			case <-ctx.Done():
				return nil
			}
		}
	}
	return nil
}
