// Package storagetest is the conformance suite of storage.Engine: the executable definition of the
// engine semantics that the embedded log engine (internal/storage/wal) and the PostgreSQL engine
// both run unchanged (STYLE.md C4, C5).
//
// An engine's test calls Run with a NewStoreFunc that makes a fresh, empty store per test case (a
// t.TempDir() or a fresh PostgreSQL schema) and the Capabilities it has:
//
//	func TestConformance(t *testing.T) {
//		storagetest.Run(t, storagetest.Capabilities{Restart: true}, func(t *testing.T) storagetest.OpenFunc {
//			dir := t.TempDir()
//			return func(clock storage.Clock) (storage.Engine, error) {
//				return wal.Open(dir, wal.Config{Clock: clock})
//			}
//		})
//	}
//
// Every case drives time with a FakeClock (nothing sleeps) and, after the case, a checker verifies
// the invariants of BRIEF.md section 3 on what the engine stored:
//
//   - offsets are gapless and increase by one per partition, from the low offset to the
//     high-water mark, and PublishedAt never decreases inside a partition (MessagesRead);
//   - TopicStats.Messages is the number of retained messages;
//   - per subscription and partition 0 <= AckFloor <= Cursor <= HighWater, Lag is the sum of
//     HighWater-Cursor, Pending = Lag + InFlight + Redelivering (when a never-delivered message was
//     acked, Lag still counts it: then InFlight+Redelivering <= Pending <= that sum), DeadLettered
//     is the DLQ's length, every figure is non-negative, and the leases the suite knows to be live
//     are counted in InFlight (a CANCELLED subscription may list no partitions).
//
// While a case runs, every claim, ack, nack, extend, release and DLQ replay goes through a recorder
// that checks, with happens-before ordering so that concurrent cases get no false alarms:
//
//   - one lease at a time: a claim never returns a message while another lease on it (any member)
//     is unexpired and was neither acked, nacked nor released (restarts excepted);
//   - an acked message is never delivered again (also across restarts), unless a DLQ replay brought
//     it back;
//   - attempt numbers: the first delivery (and the first after a DLQ replay) is attempt 1, each
//     redelivery is the previous attempt + 1 (only strictly greater across a restart), and no
//     delivery exceeds the topic's max_deliveries;
//   - a claim result has at most Max deliveries, no duplicate, the claiming member and
//     subscription, respects Partitions, and a lease deadline in the future.
//
// Violations are reported in detail up to a bound, and a panic inside a case (in the engine or in
// the suite) fails that case only: an engine under construction gets a readable failure list.
//
// Decisions the interface leaves implicit and the suite pins down (engines must agree):
//
//   - Time intervals are half-open. A lease is valid while now < LeaseDeadline. A message waiting
//     until a due time (backoff after an expiry, nack delay, NotBefore) is claimable when now >= due.
//     The backoff after the attempt-th delivery expired is measured from the lease deadline: the
//     message is claimable at LeaseDeadline + storage.RedeliveryBackoff(attempt).
//   - DeliveriesExtend sets the lease deadline to now + Duration (ack_wait when 0), also when that
//     is earlier than the current deadline: DeliveriesExtendResult has one Deadline for all.
//   - Names are ordered byte-wise (Go string order, COLLATE "C" on PostgreSQL).
//   - In a claim result, redeliveries come before new messages (in the result's order too), oldest
//     due first; a claim that returns fewer than Max left nothing claimable behind.
//   - SubscriptionUpdate to the current state is ErrInvalidTransition: storage.CanTransition has no
//     transition from a state to itself.
//   - QUEUE to PUB_SUB keeps the subscription (same ID), its leases and acks, under the new group.
//   - DeliveriesAck completes any message of the subscription below the high-water mark, delivered
//     or not (the ack of a never-delivered message counts in Acked, and it is never delivered).
//   - DeliveriesRelease counts like DeliveriesNack: Released are the messages given back for
//     redelivery, DeadLettered those that reached max_deliveries; the two are disjoint.
//   - A message whose ExpiresAt has passed is never delivered and is not Pending.
//   - After RetentionApply removed messages by max_retention, every subscription's ack floor and
//     cursor are at least the new low offset: those messages are no longer Pending.
//   - DLQPurge and DLQReplay ignore IDs that are not in the DLQ (they count what they did).
//   - Ordered subscriptions (group Ordered, Capabilities.Ordered): a claim returns only the
//     member's partitions, each in offset order, waiting messages (nacked, expired, released,
//     replayed from the DLQ) before any later offset; a partition whose owner changes loses its
//     leases at the SubscriptionAssign (due at once, attempts kept); a member fenced by the
//     assignment gets ErrStaleGeneration for the whole call, which changes nothing. The
//     randomized_joins_and_leaves case checks its deliveries against its own bookkeeping (owner,
//     lowest offset not acked) rather than against model.go, which models shared subscriptions.
//
// Where the interface allows more than one answer (which sentinel an invalid topic name wraps,
// whether NextDue reports a lease deadline or the end of the backoff after it), the suite accepts
// every allowed answer and logs the one it saw.
//
// The randomized case (C5) applies a seeded random sequence of operations to the engine and to a
// small in-memory model (model.go) and compares every result. The seed is logged; fix it with the
// environment variable SPOOL_TEST_SEED or the flag -spool.seed.
package storagetest
