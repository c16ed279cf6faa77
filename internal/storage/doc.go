// Package storage defines the seam between the broker and its storage engines.
//
// An Engine stores topics, their partitioned logs of messages, durable subscriptions with their
// delivery state (ack floors, leases, redelivery backoff, dead-letter queues) and pattern bindings.
// Two engines implement it: the embedded log engine (internal/storage/wal) and the PostgreSQL engine
// (internal/storage/pgstore). Both must pass the conformance suite in internal/storage/storagetest,
// which is the definition of the semantics described here.
//
// Why the engine, not the broker, owns leases and acks: on PostgreSQL many broker instances share one
// database and the members of one group may be connected to different instances. "One lease at a
// time" can then only be enforced where the state lives. The broker owns what is per connection:
// members, credit, dispatch and wake-ups.
//
// Conventions (STYLE.md C2, C3): methods are named noun first, then verb, and take a context and a
// params struct. Errors are the sentinels of errors.go, possibly wrapped with detail; callers test
// them with errors.Is. Engines translate their own errors at the edge.
//
// This interface is not meant to be implemented outside this module and may change with it.
package storage
