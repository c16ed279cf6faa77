// Package pgstore is the PostgreSQL storage engine: many broker instances share one database,
// and applications publish inside their own transactions (PublishTx, SQL spool.publish).
//
// It passes the same conformance suite as the embedded engine (internal/storage/storagetest).
// Every Engine method is one transaction (retried on serialization failures and deadlocks); the
// broker instances keep no shared state in memory besides their members.
//
// # Schema
//
// Everything lives in one PostgreSQL schema (default "spool", Config.Schema), created by the
// embedded, versioned, transactional migrations in migrations/ (Migrate, `spool migrate`, and at
// Open when Config.Migrate is set; a session advisory lock makes concurrent instances migrate
// once). SQL in this package is written against "spool." and rendered for the configured schema
// (Engine.sql).
//
// # No commit-order gaps
//
// Offsets are assigned in visibility order: a publishing transaction takes its offsets with
// UPDATE spool.partitions SET next_offset = next_offset + n ... RETURNING, and holds that row
// lock until it commits. The next publisher to that partition waits, so offsets N..N+n-1 are
// committed before anyone can take N+n: the visible offsets of a partition are always a gapless
// prefix, and a cursor that passed offset N never misses a message committed later. (A sequence
// or an identity column hands out numbers at call time and lets a later number commit first,
// which is the classic lost-message bug of cursors over sequences; xid8 snapshot filtering would
// make every reader compute snapshot horizons.) The cost: transactional publishers to the same
// partition serialize until they commit, so long application transactions should publish last or
// use more partitions; the broker's own publishes batch many messages per transaction.
//
// # Message log
//
// spool.messages is append-only and range-partitioned on published_at into buckets of
// Config.BucketWidth (recorded in spool.settings at creation). Retention advances each
// partition's logical low_offset (one UPDATE per topic partition, never per message) and then
// drops whole buckets that hold no retained message: a bucket ending at or before every live
// partition's low_published_at. Buckets are created ahead of time by maintenance, and on demand
// when a publish finds none (CREATE TABLE + ATTACH PARTITION, which does not block readers).
// Detaching uses DETACH PARTITION CONCURRENTLY. Topic deletion removes the topic's rows in the
// catalog only; its messages (topic ids are never reused) go with their buckets.
//
// # Delivery state
//
// spool.sub_partitions holds, per subscription and partition, the ack floor (every offset below is
// done) and the cursor (next offset never delivered), updated once per claim or ack batch. Delivery
// operations on a subscription lock its sub_partitions rows (FOR UPDATE, in partition order), so
// competing members on different broker instances take turns and no message is leased twice. The
// offsets between floor and cursor that are leased or waiting for redelivery are kept sparse, per
// claim batch rather than per message (see migrations/0002_deliveries.sql); an offset in
// [floor, cursor) that no such row lists is done.
//
// # Lock order
//
// topics -> partitions (in partition order) -> subscriptions -> sub_partitions (in partition
// order) -> delivery rows -> dlq. Every transaction takes the locks it needs in this order.
//
// # Time
//
// Every time-dependent decision uses Config.Clock (the engine's clock), as the conformance suite
// requires; instances sharing a database should run NTP. published_at is kept non-decreasing per
// partition across instances (partitions.last_published_at). SQL spool.publish uses
// clock_timestamp().
//
// # Wake-up
//
// A publish does not NOTIFY per message: NOTIFY takes a global lock at commit. The broker's
// publishes mark their topic dirty and a notifier goroutine sends one NOTIFY per topic per
// Config.NotifyDelay from its own connection, after the publishing transaction committed.
// Transactional publishes notify inside the caller's transaction, which PostgreSQL coalesces to one
// notification per topic and transaction. A listener connection LISTENs, reconnects with backoff
// and LISTENs again after the database restarts (then wakes every topic, since notifications may
// have been missed), and a poller compares high-water marks every Config.PollInterval as the
// fallback.
//
// # Instances
//
// Each Engine registers in spool.instances with a heartbeat. Ephemeral subscriptions belong to one
// instance (owner); Close removes them, and maintenance removes those of instances whose heartbeat
// is stale. Maintenance jobs run under pg_try_advisory_xact_lock, so several instances may run
// them at the same time safely.
package pgstore
