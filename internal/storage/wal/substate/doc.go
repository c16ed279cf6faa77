// Package substate is the delivery state machine of one subscription of the embedded log engine
// (internal/storage/wal). It is pure: no IO, no clock, no locks. The engine reads messages from the
// partition logs, takes the time from its clock, holds the subscription's mutex, and records every
// durable transition in its state log; replaying that log on startup calls the same methods.
//
// State per partition is sparse (BRIEF.md section 2, "Ack floor"):
//
//   - Floor: every offset below it is done (acked, dead-lettered, or expired undelivered).
//   - Cursor: the next offset never handed out. Floor <= Cursor.
//   - pending: one Entry per offset in [Floor, Cursor) that is leased or waiting (for its
//     redelivery backoff, a nack delay, or a NotBefore time).
//   - done: a bitset of offsets >= Floor that are done (acked out of order, or acked before they
//     were delivered). The floor advances over the contiguous done prefix and the bitset is trimmed.
//   - replayed: DLQ messages replayed into the subscription (BRIEF.md 4, "replay back to that group
//     only"). They may lie below the floor, so they live apart from pending; each names the DLQ ID
//     whose record (in the engine's DLQ log) holds its copy of the message.
//   - Horizon and suspect (attempt numbers after a crash, see package wal): the engine delivers
//     an offset at or above the claim horizon only once a horizon record further ahead is durable;
//     after an unclean shutdown (UncleanRestart) the offsets in [Cursor, suspect) may have been
//     delivered once, so their first delivery is attempt 2.
//
// Every offset in [Floor, Cursor) is either pending or done, never both. An undelivered backlog of
// any length costs nothing here: only leased, waiting and out-of-order-done messages take memory (a
// done message costs one bit).
//
// The DLQ is an index of IDs (dlq.go): a bitset of the IDs in it, from the lowest to the next ID.
// The entries are records of the engine's DLQ log, found by ID.
//
// Two heaps order the entries of the whole subscription: leases by deadline (expiry processing) and
// waiting entries by due time (redelivery goes first, oldest due first).
//
// Times are unix nanoseconds (int64). A due time of 0 means "due at once".
//
// A Sub is not safe for concurrent use; the engine guards each one with its own mutex.
package substate
