// Package pgstore is the PostgreSQL storage engine: many broker instances share one database,
// and applications publish inside their own transactions (PublishTx, SQL spool.publish).
//
// It passes the same conformance suite as the embedded engine (internal/storage/storagetest).
// Every Engine method that changes state is one transaction (retried on serialization failures
// and deadlocks), with these exceptions: RetentionApply uses one per topic and then drops buckets;
// MessagesAppend may first create a bucket in a transaction of its own, and concurrent calls of a
// topic share one (appendcombine.go); PublishTx runs in the caller's transaction and its messages
// are appended by a sequencing transaction after the commit (sequencer.go); and concurrent
// delivery operations share transactions (combine.go). The broker instances share no state in memory: what one instance keeps (its
// members, the message cache) stays correct whatever the others do.
//
// # Schema
//
// Everything lives in one PostgreSQL schema (default "spool", Config.Schema), created by the
// embedded, versioned, transactional migrations in migrations/ (Migrate, `spool migrate`, and at
// Open when Config.Migrate is set; a session advisory lock makes concurrent instances migrate
// once): 0001 the catalog and the message log, 0002 the delivery state and the DLQs, 0003 the SQL
// function spool.publish, 0004 autovacuum settings for the tables every claim and ack rewrites
// (deliveries, sub_partitions, partitions: vacuumed and analyzed after a fixed number of changes,
// unthrottled, instead of a share of the table), 0005 a partial index of the replayed DLQ entries
// (which every delivery operation loads, however long the DLQ), 0006 the producer ids of
// de-duplication (spool.producer_ids; spool.publish de-duplicates and returns duplicate), 0007
// spool.staged (transactional publishes are staged, then sequenced), 0008 ordered subscriptions
// (subscriptions.ordering, spool.sub_assignments). SQL in
// this package is written against "spool." and rendered for the configured schema (Engine.sql).
//
// # No commit-order gaps
//
// Offsets are assigned in visibility order: only broker transactions write to the log, and each
// takes its offsets with UPDATE spool.partitions SET next_offset = next_offset + n ... RETURNING
// and holds that row lock until it commits. The next writer to that partition waits, so offsets
// N..N+n-1 are committed before anyone can take N+n: the visible offsets of a partition are
// always a gapless prefix, and a cursor that passed offset N never misses a message committed
// later. (A sequence or an identity column hands out numbers at call time and lets a later number
// commit first, which is the classic lost-message bug of cursors over sequences; xid8 snapshot
// filtering leaves holes where transactions roll back and stalls every cursor behind the oldest
// transaction of the database.) The broker's own publishes of one topic share transactions
// (appendcombine.go: while one runs, the calls that arrive wait and the next transaction appends
// them all), so a partition's publish rate is the commit rate times the batch, not one commit per
// message. The next transaction, when it carries enough to be worth one (minEarlyMessages,
// minEarlyBytes), starts as soon as the one before holds its rows and waits for them in
// PostgreSQL, carrying that one's transaction id (laneTurn: it fails, writing nothing, and its
// calls queue again when the one before did not commit); MessagesAppendAsync queues there without a goroutine waiting, so one connection's
// publishes share transactions too. Once the instance appended to a partition, its next
// transaction there inserts its rows first, at the offsets that follow, and takes the row last,
// failing (nothing written) unless the row is where it guessed (appendpredict.go): the row is then
// held only for that UPDATE and the commit, and the partition's commits follow one another
// faster. A combined transaction that fails for one call's input runs
// each call again alone; one that fails for the database (unavailable, full, a connection lost
// during the COMMIT, whose outcome is unknown) fails every call with that error, never running
// them again, which could store their messages twice.
//
// Applications' transactions (PublishTx, SQL spool.publish) do not write to the log: they stage
// their messages in spool.staged, without an offset and without the partition row lock, and
// after they commit a sequencer appends the committed rows in one short broker transaction, one
// sequencing transaction at a time per schema (pg_try_advisory_xact_lock; partition rows taken
// with SKIP LOCKED, so a topic being deleted or updated stalls only itself), in staging order
// among committed rows (sequencer.go, migrations/0007_staged.sql). So an application that
// publishes and then works for a while holds up no other publisher.
//
// # Message log
//
// spool.messages is append-only and range-partitioned on published_at into buckets of
// Config.BucketWidth (recorded in spool.settings at creation). Retention advances each
// partition's logical low_offset (one UPDATE per topic partition, never per message) and then
// drops whole buckets that hold no retained message and that no open or later transaction can
// write to (dropBuckets; a broker transaction that appended and has not committed keeps its
// bucket). A claim never passes an offset at or above a partition's low_offset that it cannot
// read (missingMessage): only retention removes messages, by raising low_offset first. Buckets are created ahead of time by maintenance, and on demand
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
// [floor, cursor) that no such row lists is done. Those rows carry no foreign key (migration
// 0021): they are only inserted under their sub_partitions row locks, and a trigger deletes them
// with their sub_partitions row.
//
// A delivery operation loads the subscription's state in one batch (loadState), decides in
// memory and writes the changes back in one batch (save). The load reads what the operation can
// need, never what grows with a backlog: the leased and acked rows, the waiting rows and replayed
// DLQ entries due first (more than its claims can take, so the earliest due time of the rest is
// among them: loadWant), the replayed entries its refs name, and, in one more query only when an
// ack names an offset of a waiting row left out, that row (loadAckedRows). The save writes the
// new ack floors it knows from the rows it read (all of them, or a row still at the old floor);
// only for the others does its statement look for the lowest listed offset. Claims, acks, nacks
// and extends commit synchronously: a claim is durable before its deliveries leave the broker, so
// a database crash never hands a message out again with the same attempt number, and an ack or
// an extended lease never goes back. Only DeliveriesRelease commits with synchronous_commit off (a lost release
// only lets the leases expire).
//
// # Pipelined transactions
//
// Delivery operations, DLQ changes and MessagesAppend run in pipelined transactions (pipetx.go):
// BEGIN travels in the pipeline of the first batch and COMMIT in that of the last, so a claim, an
// ack or an append costs two round trips instead of four; an append planned from a remembered
// topic one (its partition rows' UPDATE checks the topic's gen, migration 0018). These
// transactions also set enable_seqscan off and plan_cache_mode force_generic_plan (txSettings):
// their prepared statements keep generic plans per connection, a plan made while
// spool.deliveries was nearly empty would scan its dead versions, and statements over unnested
// arrays were otherwise planned again at every execution.
//
// # Combined delivery transactions
//
// Claims, acks, nacks and extends do not get a transaction each (combine.go): they queue on one of
// deliveryLanes lanes (by subscription id), and while a transaction of a lane runs, the operations
// that arrive wait for the next one, which runs all of them: every subscription loaded once (the
// delivery rows and replayed DLQ entries its operations need, loadWant) by six statements that
// read all the subscriptions of the transaction, in one round trip, and saved by one statement per kind for all of them
// (rows deleted, rows inserted, sub_partitions updated), with the COMMIT. A nack storm (a
// consumer that gives back every message while its downstream is down) thus costs a transaction
// per lane batch, not per nack. Releases keep a transaction each. Operations of
// one subscription run in arrival order on its state, each with the answer it would have got alone;
// one that fails on its own fails alone, and a failed transaction runs its operations again one by
// one. On two cores with 16 groups this halved the p99 end-to-end latency (docs/benchmarks.md):
// fewer transactions, statements, round trips and WAL flushes per delivered message. A lane's
// transaction is bounded by Config.TxTimeout: one that exceeds it (a database that stopped
// answering, a row lock held elsewhere) fails all of its operations (claims, acks, nacks and
// extends) with a timeout at once, without running them again one by one, and the lane goes on with
// the next batch. The same deadline bounds releases, broker publishes (MessagesAppend; not
// PublishTx, whose transaction is the application's), DLQ lists, catalog operations, reads and
// statistics (withTxTimeout); a timed-out one is rolled back and fails with the same retryable
// timeout. Topic and subscription deletes and DLQ purges and replays are bounded until they hold
// their locks, not during the statement that changes a DLQ of any size (txLocksBounded).
// Retention is not bounded.
//
// # Message cache
//
// Each Engine keeps the most recent messages of each partition in memory (cache.go,
// Config.MessageCacheBytes): filled by MessagesAppend after commit and by claims that read from
// the database, read by claims before the database (a claim takes the cached run of a partition
// and reads only what follows it). Messages are immutable and topic ids never
// reused, so an entry is never stale; fan-out to many groups then reads a message from
// PostgreSQL once per instance instead of once per group.
//
// # Lock order
//
// topics -> partitions (in partition order) -> subscriptions -> sub_partitions (subscriptions in
// id order, each one's rows in partition order) -> delivery rows -> dlq. Every transaction takes
// the locks it needs in this order, so transactions of several instances never deadlock.
//
// # Time
//
// Every time the engine stores or compares (lease deadlines and expiry, retention, publish times,
// FROM_TIMESTAMP, backfill, heartbeats) is the engine's clock: Config.Clock when one is given (the
// conformance suite's fake clock), else the database's. Statements compare heartbeats and member
// expiry with now() in SQL; everything else uses the database's clock as this instance estimates
// it (clock.go): readings of clock_timestamp() when the engine opens and with each instance
// heartbeat, each bracketed by two readings of the local clock (the database's time at their
// midpoint, within half the round trip), the most precise one extrapolated with the local
// monotonic clock. No publish or delivery transaction pays a round trip for the time, a step of
// the host's wall clock changes nothing, and instances whose clocks differ agree within their
// round trips to the database: a lease one instance took is not claimable on another before it
// expired by the database's clock, beyond that margin. An instance whose clock is more than 1 s
// off the database's logs a warning. published_at is kept non-decreasing per partition across
// instances (partitions.last_published_at), also when a new reading moves the estimate back. SQL
// spool.publish uses clock_timestamp().
//
// # Wake-up
//
// A publish does not NOTIFY per message: NOTIFY takes a global lock at commit. The broker's
// publishes mark their topic dirty and a notifier goroutine sends one NOTIFY per topic per
// Config.NotifyDelay from its own connection, after the publishing transaction committed, and
// none while no other instance is registered (each was a transaction with its WAL flush, ~18% of
// a single instance's commits in a 16-group fan-out). An instance says hello on its channel once
// it LISTENs; an instance that was alone notifies again on hearing it (or at its next heartbeat,
// which reads spool.instances), first what it left unsent in the last 10 s (at most 16,384).
// Transactional publishes send "staged" inside the caller's transaction (coalesced by PostgreSQL
// to one per transaction), which wakes the sequencers; a sequencing transaction announces its
// topics as a broker publish does. A listener connection LISTENs, reconnects with backoff
// and LISTENs again after the database restarts (then wakes every topic, since notifications may
// have been missed), and a poller compares high-water marks every Config.PollInterval as the
// fallback. A change of a subscription's state or group is announced the same way
// (storage.NotifySubscription, one per change and subscription, its id in the payload), so that
// the brokers of other instances reread it at once; an instance older than that kind ignores it
// (parsePayload rejects kinds it does not know) and finds the change at its periodic reread.
//
// # Instances
//
// Each Engine registers in spool.instances with a heartbeat. Ephemeral subscriptions belong to one
// instance (owner); Close removes them, and maintenance removes, in one statement, the rows of
// instances whose heartbeat is stale with their ephemeral subscriptions, and the ephemeral
// subscriptions of owners without a row. An instance whose row was removed while it lived (a
// pause longer than the stale bound) registers again at its next heartbeat. Maintenance jobs run under pg_try_advisory_xact_lock, so several instances may run
// them at the same time safely.
package pgstore
