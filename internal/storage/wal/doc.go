// Package wal is the embedded log engine: a storage.Engine that keeps everything in one directory
// of segmented, checksummed log files (package wlog) with group commit, and the subscriptions'
// delivery state in memory, persisted as records of a state log plus periodic snapshots.
//
// # Files
//
//	<dir>/LOCK                          flock: one engine per directory (OS filesystem only)
//	<dir>/topics/<topic>/<partition>/   one wlog.Log per partition: record index = message offset
//	                                    (dense, gapless, from 0), frame timestamp = PublishedAt
//	                                    (engine clock, non-decreasing per partition), body =
//	                                    record.AppendMessage (key, headers, payload, producer id,
//	                                    NotBefore, ExpiresAt)
//	<dir>/state/                        the state log: one wlog.Log of state records
//	<dir>/dlq/<subscription id>/        a subscription's DLQ log (dlqlog.go): record index = DLQ
//	                                    ID - 1, body = the entry with its copy of the message
//	<dir>/snapshot-<index>.bin          the latest snapshot; replay continues at state log <index>
//
// One wlog.Committer is shared by every log, so publishes to any partition, acks and metadata
// changes of one moment share fsyncs (group commit). One wlog.Files is shared by every log too: at
// most Config.MaxOpenFiles segment files stay open while idle (those of the partitions used the
// longest ago are closed and reopened on use; the state log's active segment stays open), so an
// engine with thousands of topics does not need a descriptor per partition. docs/storage.md
// ("State log and snapshot") specifies the state record and snapshot formats.
//
// # State
//
// Metadata (topics, bindings, subscriptions) lives in maps guarded by Engine.mu. Each
// subscription's delivery state is a substate.Sub guarded by the subscription's own mutex: per
// partition an ack floor, a cursor (next never-delivered offset) and, above the floor only, the
// leased and waiting messages and a bitset of out-of-order completions; plus replayed DLQ messages
// (each reads its message from the DLQ log) and the DLQ as an index of IDs, one bit each: the
// entries and their messages are in the subscription's DLQ log, so a long DLQ costs neither memory
// nor snapshot size. An undelivered backlog costs no memory.
//
// Every change is applied in memory and its state record queued before the locks are released;
// operations that must be durable (acks, nacks, DLQ moves, metadata) then wait for the record's
// fsync with no lock held. Claims and releases normally do not wait: a crash may forget that a
// message was delivered, never that it was acked; the next section keeps attempt numbers from
// repeating anyway.
//
// # Attempt numbers after a crash
//
// Every duplicate delivery carries a higher attempt number than the delivery before it (BRIEF.md
// invariant 3), also across a crash that lost claim records whose deliveries were handed out.
// Three rules, none of which puts an fsync on the path of an ordinary claim:
//
//   - At most one unrecorded delivery per message. A claim that redelivers a message whose previous
//     delivery's claim record is not durable yet (released or expired within one group commit of
//     its delivery: rare) waits for its own records, and with them that one, before returning.
//     Claims carry a per-subscription sequence number (sub.claimSeq, Entry.Claim); the committer
//     raises sub.durableClaim when a claim's records are durable. A suspect message (below) has
//     an unrecorded delivery already: the claim that first delivers it after the crash waits too
//     (as does the claim that redelivers one it first made wait for its NotBefore), so a second
//     crash cannot make it suspect again with the same attempt.
//   - Claim horizon. Per subscription partition, a horizon record (type 20) says that no offset at
//     or above it has been delivered. A claim hands out a new message only below a durable
//     horizon; claims queue the next horizon record, horizonAhead (1024) past the cursor, whenever
//     the cursor comes within half of that of the recorded one, so the record is durable long
//     before it is needed and a claim waits only when it is the first of a partition or outruns a
//     group commit by 512 messages.
//   - Unclean restart. Close ends the state log with a clean-close record (type 18); Open appends a
//     first record before it serves anything, so a log ending with a clean close means nothing was
//     lost. Otherwise Open applies, records (type 19, replayed identically later) and makes durable
//     the rule of substate.Sub.UncleanRestart: every message in the delivery state counts one more
//     attempt (its one possible unrecorded delivery), and the offsets between the recovered cursor
//     and the horizon become suspect: their first delivery is attempt 2. Attempt numbers may
//     therefore skip one after a crash, and a message one delivery short of max_deliveries is
//     dead-lettered at Open (reason max_deliveries); a delivery that would exceed max_deliveries
//     (a suspect message of a topic with max_deliveries 1) goes to the DLQ instead.
//
// State records (first byte = type; JSON for rare metadata records, compact varints for the hot
// ones): topic create (with its queue or binding subscriptions, atomically), topic update, topic
// delete, binding create and delete, subscription create, update and delete, claim (per message:
// delivered with attempt n, delayed until NotBefore, completed undelivered; and the new cursors),
// ack, nack (due time), dead-letter (the DLQ entry with its message copy, also appended to the
// DLQ log in the same group commit: the state record makes it durable, and Open appends to the DLQ
// log what a crash kept from it), DLQ replay and purge
// (explicit IDs), retention (force-advanced floors, expired DLQ IDs), the subscription ID
// high-water mark (ephemeral subscriptions are never persisted, but their IDs are never reused),
// clean close, unclean restart, and claim horizon. Leases and lease extensions are not persisted.
//
// # Snapshot and recovery
//
// When the state log has grown by Config.StateLogSnapshotBytes since the last snapshot (and on
// Close) the engine takes Engine.mu exclusively, which stops every state change, copies the whole
// state (the DLQs as runs of IDs, not their entries), queues a marker record and releases the
// lock; the copy is encoded after that. The marker's index K splits the state log exactly:
// everything before it is in the snapshot, everything after it is not. Once the marker is durable,
// and the DLQ log records queued before it (the snapshot names their entries), the snapshot is
// written as
// snapshot-K.bin (temp file, fsync, rename, fsync of the directory), older snapshots are
// removed, the state log's active segment is sealed and segments entirely before K are deleted.
// Recovery time is thus bounded by the live state plus at most StateLogSnapshotBytes of records,
// not by history.
//
// Open loads the newest valid snapshot (a version 2 or older one holds DLQ entries and replayed
// copies with their messages: Open moves them to DLQ logs and asks for a new snapshot), replays the
// state log from its index, completes the DLQ logs (dlqRecover), opens the partition
// logs (their own recovery truncates torn tails and reports corruption), removes directories of
// topics the state does not know (a crash between creating and recording them, or between
// recording a deletion and removing the files), clamps state to the logs (floors to the first
// retained offset; cursors to the high-water mark if UnsafeNoSync lost records), applies the
// unclean-restart rule when the log does not end with a clean close (above), and applies the
// restart rule: leases are gone, so every delivered message that was not completed is due again
// at once with its attempt count; one whose last delivery was its max_deliveries-th goes to the
// DLQ (reason max_deliveries), as its lease expiry would have sent it. The records of the restart
// (unclean restart or a marker, then those dead-letterings) are durable before Open returns.
//
// # Producer de-duplication
//
// Each topic keeps the producer ids of its last dedup_window in memory (dedup.go): reserved by an
// append before it queues its records, resolved when they are durable, dropped once expired.
// Nothing goes to the state log: the id is in the message record, and Open rebuilds the tables
// from the partition logs' records of the last window. The table's mutex is taken with Engine.mu
// held shared and never while queueing a record (the committer's completions take it).
//
// # Lock order
//
//	Engine.snapMu -> Engine.retentionMu -> Engine.mu -> sub.mu (several: in ID order) -> partition.mu
//	sub.mu -> dlqLog.mu (a leaf: never held while appending)
//	Engine.reapMu -> Engine.mu;  Engine.dlqMu is a leaf (the list of DLQ logs to remove)
//
// Engine.mu is held shared by every operation on messages and delivery state and exclusively by
// metadata changes and the snapshot. A subscription's mutex is only taken with Engine.mu held, so
// holding Engine.mu exclusively excludes every subscription mutex. partition.mu only orders
// appends (timestamps and queueing). wlog has its own internal locks, below all of these. No lock
// is held while waiting for an fsync; log reads (page cache) do happen under Engine.mu (shared)
// and sub.mu. Notification callbacks run with no lock held. Engine.busy marks topic names whose
// directories are being created, grown or removed with no lock held.
//
// # Goroutines
//
// The wlog.Committer's goroutine (group commit), the engine's snapshot goroutine, its trash
// goroutine (which also closes and removes the DLQ logs of cancelled and deleted subscriptions once
// their appends and the change are durable) and its DLQ retry goroutine (appends again, every
// second, the records of DLQ logs that found no room: dlqRetryLoop), all started by Open and
// stopped by Close (which also
// waits for appends in flight and takes the final snapshot). wlog may run a goroutine per log that prepares the next segment; Log.Close stops it.
//
// # Deviations from the design brief
//
//   - Keyless messages of one MessagesAppend call go together to the next partition in
//     round-robin order (not one partition per message), so a batch stays one write per log.
//   - A FROM_MESSAGE_ID start below the first retained offset starts at the first retained one
//     (above the high-water mark it fails with storage.ErrOffsetOutOfRange).
//   - With no subscription holding retention, zero_subscription_retention applies to QUEUE topics
//     too (their queue subscription is DEAD or CANCELLED).
//   - zombie_ttl's view of the floors (retention.go, floorWatch) is in memory: a restart
//     postpones a force-advance.
//   - completion_tracking refcount (completion.go) keeps its completion records in memory (runs
//     per subscription partition, in the snapshot metadata): a 1-second precision for runs of
//     contiguous completions.
//   - SubscriptionStats.Redelivering also counts never-delivered messages waiting for their
//     NotBefore time (so Pending = Lag + InFlight + Redelivering, as the conformance suite checks).
//   - Expired messages (ExpiresAt) are completed when a claim's cursor passes them; until then
//     they count in Lag.
//   - A batch that spans partitions is written with one append per partition log; an I/O error in
//     one (which stops the engine) can leave the others written.
package wal
