// Package server is Spool's TCP server: the binary protocol and the text mode on one port
// (docs/protocol.md), in front of a *broker.Broker.
//
// # Connections
//
// The accept loop hands every connection to its own reader goroutine, which peeks at the first
// byte (within Config.HandshakeTimeout): 0x00 starts a binary session (the preamble), anything
// else a text session. The reader then starts the connection's writer goroutine. A binary
// session that publishes also gets a third goroutine, its publish stage's worker (started on the
// first Publish, stopped by the reader when the session ends), and a publish lane per topic
// whose throttle (backlog_policy throttle) delays one of its publishes: the lane waits for the
// throttle and appends that topic's publishes in order while the worker goes on with the other
// topics (started by the worker, ended when no publish of its topic is queued; at most as many
// as publishes the connection may have queued). All are counted in the server's WaitGroup.
//
//	              accept loop (1)
//	                   │ one per connection
//	   ┌───────────────┼─────────────────────┐
//	reader           publish worker         writer
//	reads requests;  (binary, from the      takes the queued responses, then drains the
//	queues Publish   first Publish) takes   channels of the connection's members (woken
//	to the publish   every queued Publish,  through SubscribeParams.Notify, shared by the
//	stage, runs the  one engine call per    members), packs Deliver frames or MESSAGE lines,
//	others against   topic for the whole    sends Heartbeat when silent, flushes; never
//	the broker in    queue (one fsync);     blocks on the broker
//	order; owns the  the engine's
//	members          completion answers
//
// Ordering (docs/protocol.md section 6): a connection's publishes to one topic are appended in
// the order received (one worker, a FIFO queue, engine calls queued one after the other; while a
// topic has a lane, all its publishes go through the lane, in order); every other request
// runs on the reader, in the order received, and never waits behind a publish's fsync, except
// that consecutive Acks read one after the other without waiting for the socket (at most 64) run
// at the same time, so that they share the engine's commits, and so do consecutive Nacks
// (binarySession.runGroup: a group holds one kind and runs before the next request; inside it
// only requests naming the same delivery can tell the order); each publish is
// answered after it is durable. The worker does not wait for its engine calls on the embedded
// engine (broker.PublishAsync: the completion answers, on the engine's committing goroutine); it
// groups the publishes that arrived meanwhile, so many synchronous publishers sharing one
// connection share fsyncs and the next round follows the last at once (a request with an
// invalid message is appended again alone, so that it fails without failing its neighbours; see
// publish.go). The reader wakes the worker once it
// has taken the frames already received, so that a burst goes in one round. One shortcut: when
// nothing is queued, no other frame has arrived and the connection has no subscription, the
// reader appends a Publish itself (a hand-off less for a connection that publishes one request
// at a time; what arrives meanwhile waits in the socket, and nothing of the connection can be
// an ack waiting behind the fsync). A client Goodbye waits for the queued publishes to be
// answered before GoodbyeOK. Text sessions run every command on the reader, one at a time, since
// their replies must come in command order.
//
// Backpressure: the reader stops reading (TCP pushes back) while the responses queued for the
// writer plus the publishes queued or being appended reach Config.MaxQueuedResponses, or the
// queued publishes reach Config.MaxPipelinedBytes. Throughput per connection comes from the
// publish stage and from batching (a Publish carries up to 10,000 messages); many connections
// share the engine's group commit.
//
// A response is queued before its handle is registered with the writer, so SubscribeOK precedes
// the handle's first Deliver; a handle is unregistered before its member closes, so no Deliver for
// it follows UnsubscribeOK (deliveries already on the wire may precede it).
//
// Who writes to the socket: the writer, except that the goroutine that has an answer (the reader,
// or the publish worker for the publishes it appended) writes it itself when the writer is idle,
// nothing is queued for it and the connection has no subscription (binarySession.answer; a
// consumer's answers, acks mostly, go to the writer, which sends them in one write with the
// deliveries they make room for). Such a write never waits (a raw non-blocking write): what the
// socket does not take at once is kept and the writer is woken to write it before anything else;
// a write error breaks the connection, as the writer's would. The writer holds the session's
// write lock (binarySession.wmu) for a whole flush and the others only try it, so responses leave
// in the order they were produced, and the rules above hold as before. This saves one goroutine
// hand-off per request on a connection with one request at a time. Deliveries and heartbeats are
// always written by the writer; a direct write counts as a write for the heartbeat (silence is
// measured from the last write, whoever made it). A socket without a raw connection (net.Pipe in
// tests) leaves everything to the writer.
//
// # Binary sessions
//
//   - Handshake: preamble (a wrong one closes without an answer), Hello with a non-zero
//     correlation id, version negotiation, heartbeat clamped to [MinHeartbeatInterval,
//     MaxHeartbeatInterval] with a session timeout of the same ratio as HeartbeatInterval :
//     SessionTimeout (10 s : 30 s). The server's preamble precedes its first frame.
//   - Session timeout: no frame for the session timeout closes the connection with Error
//     SESSION_TIMEOUT; its members leave and their leases are released at once. The writer sends a
//     Heartbeat after a heartbeat interval of silence; a write stalled for the session timeout
//     breaks the connection too.
//   - Errors: a bad header or an oversize frame (checked before the body is read) gets an Error
//     frame and closes only that connection; a bad body, an unknown opcode or a request in the
//     wrong state gets an Error with the request's correlation id and the session goes on. Broker
//     and engine errors are mapped to protocol codes by errmap.ErrorFrom, shared with the HTTP API.
//   - Subscribe: one broker member per handle, with the handle's credit (Subscribe.max_in_flight,
//     capped by Config.MaxCredit) and lease (Subscribe.lease_duration); Credit raises it. The
//     member's queue limit keeps what waits for the writer within Config.MaxConnBufferBytes
//     (window.go). ORDERED is refused with INVALID_ARGUMENT ("ordered groups are not implemented
//     yet").
//   - Ack goes through Broker.AckBatch (any member may ack, also for a handle closed since);
//     refs of subscriptions the connection never joined are reported unknown without touching the
//     engine. Nack and Extend need the lease holder: each handle attached to the subscription is
//     tried in turn with the refs the previous ones did not hold. A request's refs of several
//     subscriptions are settled one subscription at a time, each whatever befell the others' refs:
//     a gone subscription's refs are unknown (not held), another failure answers an Error after
//     all of them; a storage failure (unavailable, full, timeout) answers it at once, the
//     subscriptions after it not tried (docs/protocol.md section 8.4).
//   - SubscriptionEnded is pushed when the broker detached a handle's member from a subscription
//     (cancelled group, deleted topic), or with subscription id 0 when the broker closed the member.
//   - Goodbye from the client: deliveries stop, the members leave (leases released), GoodbyeOK,
//     close. Goodbye from the server (Stop): deliveries stop (the members keep their leases with
//     credit 0), acks, nacks and extends still work until GoodbyeOK or Config.GoodbyeGrace.
//
// # Text sessions
//
// One command per line, each answered by exactly one OK or ERR line in command order; delivery
// lines are written between replies, never inside one. SUBSCRIBE makes a member with credit
// Config.TextMaxInFlight and lease Config.TextAckWait (24 h): deliveries stay with the session
// until ACK, NACK, UNSUBSCRIBE, QUIT or the end of the connection, which releases them at once.
// A session that holds deliveries and acks or nacks none for Config.TextAckTimeout (5 min) is
// closed with SESSION_TIMEOUT: a forgotten nc gives its deliveries back to the group.
// The n-th delivery line has tag n; ACK and NACK name tags, settled one subscription at a time
// by the binary Ack's and Nack's code (settle.go): a failed subscription's tags stay held. A
// session that only published is closed after Config.TextPublisherIdle without input, so
// `echo "PUBLISH ..." | nc` ends with every nc. When the input ends (nc -N, ncat, or nc killed),
// a session without subscription ends; one with a subscription writes an information line and
// keeps delivering while empty writes succeed: a killed nc answers that line with a reset, and
// its leases are released at once.
//
// # Limits and shutdown
//
// Over Config.MaxConnections a connection is answered OVERLOADED (retry_after 1 s: an Error frame
// after the preamble, or an ERR line) and closed. A connection the server ends is closed
// gracefully: half-close, then its input is drained for up to a second, so that the last frames
// (Error, GoodbyeOK, ERR CLOSED) are not destroyed by a reset.
//
// Stop: close the listener, say goodbye to every session, wait for the grace period, interrupt the
// rest (their readers return, members leave, writers flush, sockets close), then wait for every
// goroutine. The broker and the engine are stopped by their owner afterwards (spool serve).
//
// # Authentication
//
// With Config.Auth (package auth; nil: off) a binary session authenticates in its handshake
// (Hello.token, else the verified client certificate's CN; NOT_AUTHENTICATED closes) and a text
// session with AUTH or its certificate (NOT_AUTHENTICATED answers, the session stays). The
// principal is the reader goroutine's (conn.principal): Publish and Subscribe are authorized
// there before anything reaches the broker (PERMISSION_DENIED changes nothing), and a wildcard
// Subscribe passes the broker a filter (SubscribeParams.Allow) so that it binds only the topics
// the principal may consume. Denials are logged at WARN and counted (auth.go).
//
// # Lock order
//
//	Server.mu (never held while calling a connection) ;
//	binarySession.wmu -> conn.mu -> broker locks ; pubStage.mu (leaf)
//
// binarySession.wmu is held by the writer for a whole flush; every other goroutine only tries it
// (TryLock), so nothing waits for it. conn.mu guards the response queue, the handles and the
// session fields the goroutines share;
// pubStage.mu guards the publish queue and is never held while calling anything;
// Member.SetMaxInFlight, Member.SetQueueLimit and the writer's Member.TakeQueued are called under it
// (Credit, Goodbye, the windows of window.go, also from the writer's stalled write under wmu), so it
// comes before the broker's
// locks. The broker never calls back into a connection: it only signals the Notify channel. The
// completion of an asynchronous append answers on the engine's goroutine (wmu by TryLock,
// conn.mu, pubStage.mu); no goroutine of the connection calls the engine holding one of them.
//
// # Metrics
//
// Config.Metrics (package metrics; nil records nothing) counts connections by mode, publishes
// (with their latency or error code), deliveries, acks, nacks and dead-lettering by topic and
// group, and authentication denials by reason.
//
// # Not yet
//
// Ordered groups, concurrent appends of one connection's publishes to different topics (one round
// appends its topics one after the other). (TLS is built: Config.TLSConfig.)
package server
