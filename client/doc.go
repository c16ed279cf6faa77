// Package client is the Go client of the Spool message broker. It speaks the binary wire protocol
// (docs/protocol.md) over one TCP connection per Client, publishes (sync, batch, async), consumes
// with handlers, and reconnects by itself.
//
//	c, err := client.Dial(ctx, "localhost:9092", client.ClientName("billing"))
//	pos, err := c.Publish(ctx, "orders.created", client.Message{Payload: body})
//	sub, err := c.Subscribe(ctx, client.SubscribeParams{Topic: "orders.*", Group: "billing"},
//		func(ctx context.Context, d *client.Delivery) error { return handle(d) },
//		client.Concurrency(8))
//	err = c.Close(ctx)
//
// Options are functional and sealed (Opt for Dial, SubscribeOpt for Subscribe); defaults are the
// Default* constants and are stated on each option.
//
// # Delivery guarantees
//
// Publishing is at-least-once. Publish returns once the broker stored the message durably. The
// client retries by itself what certainly had no effect (a request that never left the client,
// OVERLOADED, RATE_LIMITED, STORAGE_UNAVAILABLE, STORAGE_FULL). A request whose outcome is unknown (the
// connection broke after it was sent; INTERNAL, TIMEOUT, CLOSED) is retried only when every
// message carries a Message.ProducerID, which lets the broker drop the duplicate; otherwise the
// error (wrapping ErrConnectionLost, or the broker's *protocol.Error) is returned and the message
// may or may not have been stored.
//
// Consuming is at-least-once. A delivery is leased to this consumer until it is acked, nacked, or
// its lease expires. The handler's nil return acks it, an error nacks it (NackDelay, NackWithDelay,
// ToDLQ). When the connection breaks, the broker releases the leases of the deliveries it held
// and redelivers them (with a higher Delivery.Attempt); acks of deliveries whose handler was still
// running fail with ErrConnectionLost. Handlers must be idempotent.
//
// # Connections and reconnects
//
// A Client owns one connection at a time, shared by all its requests: requests are pipelined
// with correlation ids and answered in any order. When the connection breaks (an I/O error, no
// frame from the broker for the session timeout, the broker's Goodbye), the client reconnects
// with exponential backoff and jitter (ReconnectBackoff) until Close, then subscribes every live
// Subscription again: a durable group continues where its acks left off; an ephemeral
// subscription (no Group on a PUB_SUB topic) ended with its connection and restarts FromNow, so it
// misses what was published while it was disconnected. Publish and Subscribe calls made while
// reconnecting wait for the connection until their ctx ends; PublishAsync messages wait up to
// AsyncPublishTimeout.
//
// When the broker says Goodbye (shutdown), the client stops sending new work on that connection
// and reconnects after the first backoff (ReconnectBackoff's min, 100 ms by default: the broker
// that is going away is not asked again at once); meanwhile it lets the handlers running on
// deliveries of the old connection finish and settle them there (the broker accepts acks for a
// grace period), and answers GoodbyeOK when the last one returned.
//
// Heartbeats: the broker announces the heartbeat interval and session timeout in its handshake
// answer (10 s and 30 s by default; HeartbeatInterval asks for another interval). The client sends
// a Heartbeat when it wrote nothing for one interval, and considers the broker dead when it
// received nothing for the session timeout.
//
// # Flow control and batching
//
// Each subscription has a credit (SubscribeParams.MaxInFlight, default twice the Concurrency): the
// broker never leaves more unsettled deliveries with it. Credit comes back by itself as
// deliveries are settled, so the client sends Credit frames only for Subscription.AddCredit.
// Acks are coalesced into batched Ack frames: an ack waits up to a millisecond for others (or
// until 256 are pending), and goes at once when no other delivery of its subscription is waiting
// for a handler (nothing more would join it soon) and the subscription's window is narrow (less
// than 64 credit per handler goroutine: the broker may be waiting for that credit). With a wider
// window a consumer that receives one delivery at a time still sends an Ack frame per millisecond
// rather than one per delivery. PublishAsync coalesces the messages queued
// while earlier requests are on their way into one Publish request per topic. The writer sends
// every frame queued since its last write in one system call; a caller that waits for its answer
// (Publish, PublishBatch, Subscribe...) writes the queued frames itself when the writer is idle,
// with a write that never waits (what the socket does not take at once is left to the writer,
// which writes it first), saving a goroutine hand-off per request. Acks, PublishAsync and the
// client's own frames always go through the writer; so does everything on a TLS connection.
//
// # Errors
//
// The broker's errors are *protocol.Error values: test them with errors.Is against the protocol
// sentinels (protocol.ErrTopicNotFound, ...). IsRetryable reports whether an operation may
// succeed if tried again. The client's own errors are ErrClientClosed, ErrSubscriptionClosed,
// ErrConnectionLost, ErrAlreadySettled and ErrUnknownMessage. Bad arguments wrap
// protocol.ErrInvalidArgument.
//
// # Observability
//
// Logger takes a *slog.Logger (nil: discard); logs carry component=client. Hooks takes values
// implementing ConnectHook, DisconnectHook, PublishHook, HandleHook or SubscriptionEndedHook;
// metrics adapters (for example Prometheus) live outside this package, which imports none.
//
// # Goroutines and locks (design map)
//
// Every goroutine has an owner that stops it and waits for it:
//   - Client: the supervisor (connects, reconnects, resubscribes), the publisher loop (sends
//     PublishAsync messages, retries them, fails them after their timeout) and the callback loop
//     (runs PublishAsync callbacks in completion order, then frees their window slots);
//   - each connection (conn.go): a reader (matches answers to calls, routes deliveries, answers
//     the broker's heartbeats, detects silence, tears the connection down) and a writer
//     (coalesces queued frames into one write, encodes due acks, sends heartbeats);
//   - each Subscription: Concurrency handler goroutines.
//
// Client.Close stops them in order: wait for async publishes (Flush), close the subscriptions
// (each waits for its handlers, flushes their acks and unsubscribes), stop reconnecting, say
// Goodbye and wait for GoodbyeOK, close the connections, wait for the supervisor and the
// publisher loop, then let the callback loop drain and stop.
//
// Lock order: Client.mu -> Subscription.mu, and conn.smu -> conn.wmu -> conn.mu (smu is held by
// whoever writes to the socket, the writer or a caller writing directly, which only tries it); no
// lock is held across a network wait, a hook or a user callback. A request's fate is decided
// once, by whichever of the reader (answer), the teardown (connection lost) and the waiter (ctx
// ended: abandoned) first moves its state from pending (call.state). A Subscribe answer is attached to its Subscription on
// the reader goroutine before the next frame is read, so no delivery of a new handle is missed;
// an answer nobody waits for any more gives the handle back with an Unsubscribe.
//
// Files: client.go (Client, Dial, Close, supervisor), conn.go (connection, framing, acks,
// heartbeats), publish.go (Publish, PublishBatch, PublishAsync, Flush, retries), subscribe.go
// (Subscribe, Subscription, handlers, settlement), batch.go (SubscribeBatch: per-key batches of
// ordered members, gathered and settled as a unit), delivery.go (Delivery: Ack, Nack, Extend),
// options.go, errors.go, hooks.go.
package client
