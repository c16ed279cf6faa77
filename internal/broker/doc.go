// Package broker is Spool's in-process broker: the layer between connections (the TCP server, the
// HTTP admin API, Go programs embedding Spool) and a storage.Engine.
//
// # Who owns what
//
// The engine owns everything durable or shared between broker instances: topics, messages,
// subscriptions and their state, leases, acks, redelivery backoff, dead-letter queues, start
// positions and pattern bindings. On PostgreSQL many broker instances share one database and the
// members of one group may be connected to different instances, so "one lease at a time" can only
// be enforced there. The broker owns what belongs to this process: members (connected consumers),
// their credit, the subscription owners that claim messages for them, and wake-ups.
//
// # Topics and subscriptions
//
// Publish validates the topic name and appends; an unknown topic is auto-created (QUEUE unless
// Config.AutoCreateConfig says otherwise) and the members whose pattern matches it are attached
// before the first append. A QUEUE topic has one subscription (group storage.QueueGroup) that every
// member shares, with or without a group. A PUB_SUB topic has one durable subscription per group,
// created by the first member of the group at its start position; a member without a group gets an
// ephemeral subscription (its group named by the engine) that only it consumes and that is deleted
// when it leaves. A semantics change (UpdateTopic) moves the topic's members to the subscriptions
// they belong to then; one made without this broker (another broker instance on the same
// database) renames the subscription they are on, which its owner finds when the engine notifies
// the rename (storage.NotifySubscription: it rereads the subscription at once; else at its
// once-a-minute reread), and they move the same way (followSemantics). A member that
// cannot join the subscription it belongs to is told that the one it was on ended, with the
// reason, and closed (moveFailed): never left open without it. PUB_SUB to QUEUE is refused while
// the subscription it would make the queue's is an ordered group's (checkToQueue).
//
// A Member is one Subscribe call: a topic name or wildcard pattern, an optional group and a credit
// (MaxInFlight). It is attached to one subscription per matching topic. A durable group also
// registers an engine binding for a wildcard pattern, or for a topic name that does not exist yet,
// so that the engine subscribes the group atomically when a matching topic is created (a topic
// name's binding is deleted with that topic: a topic created again under the name gets no
// subscription for a group that has no member left). Live
// members join new topics when the engine notifies storage.NotifyTopicCreated (a topic created by
// an admin call, an auto-create, or another broker instance); subscriptions this creates start at
// the topic's beginning, so the first message of a new topic is not missed. A member that cannot
// join a new topic's subscription (a limit, a mode conflict, the storage unavailable) is told why,
// for that topic (Member.TakeEnded, SubscriptionID 0), and closed (attachFailed), as after a
// failed move: never left open without the topic.
//
// Leaving (Member.Close, or Member.Leave, which also counts the leases released) is not cancelling:
// the member's leases are released and redelivered to the other members at once, and the durable
// subscription stays. Only ephemeral subscriptions end with their member. When a subscription ends
// under a member for another reason (CancelGroup, DeleteTopic, a subscription deleted or cancelled
// elsewhere), the member is detached from it and told so (Member.TakeEnded); it stays open for its
// other subscriptions and for matching topics created later.
//
// # What connections need
//
// A member is the handle a connection holds, and binary sessions, text sessions and HTTP pull
// sessions use it the same way. A connection serves many members with one writer goroutine:
// SubscribeParams.Notify (a channel of capacity 1, shared by the members of a connection)
// receives a send that never blocks after deliveries were put in a member's channel, moved to a
// larger one, or a subscription ended, and the writer then takes what each member has with
// Member.TakeEnded and Member.Take (which never blocks and says when the member closed);
// Member.Waiting and Member.InFlight tell a pull session how much credit to ask for.
// SubscribeParams.LeaseDuration
// overrides the topics' ack_wait for one member's claims (text sessions hold deliveries until they
// ack). Member.SetMaxInFlight changes the credit at runtime (the protocol's Credit frame; 0 stops
// deliveries while the member keeps its leases, for a server draining its connections).
// Broker.AckBatch acks for any member of the subscription, also one whose connection closed the
// handle, and gives the credit back to whichever member of this broker held the deliveries;
// Member.NackBatch and Member.ExtendBatch return the engine's counts and the refs the member does
// not hold instead of failing.
//
// # One owner per subscription
//
// Every subscription with at least one member here has one owner (owner.go): a goroutine that is
// the single writer of the subscription's runtime state on this broker, its membership, the
// round-robin position, the dispatch passes with their timers, and its end. Others talk to it
// through its inbox: events handled in order (a member joined, a member left, the subscription
// ended) and wake-ups, which coalesce. A member's Subscribe returns once the owner took the join;
// a member leaving waits until the owner forgot it, which is the fence that no claim for it is in
// progress any more (what a claim brought it before is dropped and its lease released). Readers
// that must not wait (acks looking for the members that held the deliveries, listings) read the
// membership the owner last published. The owner ends when its last member left (it unregisters
// under Broker.mu, where joins are queued, so a join never reaches an owner that ended) or when the
// subscription ended; a later member starts a new one.
//
// It makes a dispatch pass when woken by
//   - the engine notifying storage.NotifyMessages for its topic,
//   - a member whose credit it found used up gaining credit (Ack, Nack, a larger MaxInFlight, a
//     detach dropping its deliveries of another subscription, another owner returning credit it
//     had reserved for a claim that came back short): only the owners that found the member
//     without credit are woken, not every subscription of a wildcard member,
//   - an ack or nack of its own deliveries (a nacked message is claimable again), a member
//     joining, or one leaving and its leases being released,
//   - an admin call resuming the subscription or replaying its DLQ,
//   - a timer: at the NextDue of the last claim (a backoff elapses, a lease expires, a delayed
//     message matures), at the earliest lease deadline of its members (an expired lease gives credit
//     back), and when it has not looked for a while: after Config.PollInterval, then, while these
//     polls deliver nothing, twice as long each time up to 16 poll intervals (wake-ups that cannot
//     reach this process: a lost database notification, clock skew). A delivery starts over; a
//     wake-up makes a pass at once but does not (a returned credit may wake it for nothing).
//
// Extend wakes it only when it makes a lease end earlier than the member's earliest deadline. A dispatch pass picks the members with credit in
// round-robin order, starting after the last one that received deliveries (so messages published
// one at a time go to the members in turn), and calls Engine.DeliveriesClaim with Max = the
// member's whole credit, LeaseDuration = the member's, and AvoidMember set when another member has
// credit too (so a nack goes to a different member where one can take it, else back to the same
// one). The deliveries go from the claim straight to the member's channel, on the owner's
// goroutine: no hop per message. The pass ends when no member has credit, when a claim without
// AvoidMember comes back short, when two claims in a row by different members come back short
// (what the first left behind was last delivered to it, and the second would have taken it), or
// when events wait in the inbox (they are handled, then a new pass starts).
// A claim that fails with storage.ErrSubscriptionNotActive leaves the owner idle until woken or
// polled while the subscription is PAUSED or DEAD (it reads the subscription when its claims start
// failing so, and then, while a member has credit, reads it in place of each claim, which would be
// refused the same way: stillInactive); a CANCELLED one, and storage.ErrSubscriptionNotFound, end
// it: the members are detached and told as by CancelGroup or DeleteTopic (pattern members join
// again if the topic comes back). So a subscription paused, then cancelled elsewhere (another
// broker instance on the same database, the engine directly) ends its members here within the
// poll interval. Both engines notify every change of a subscription's state or group
// (storage.NotifySubscription; PostgreSQL carries it to the other instances by NOTIFY, one per
// change, none while an instance is alone), on which the owner here rereads the subscription at
// once (rereadSubscription, refresh): a pause, resume, cancel or delete made elsewhere reaches it
// at once even when none of its members claims (no credit). The owner also rereads its
// subscription once a minute while it has members (refreshBackfill), which bounds it when a
// notification is lost (an older instance made the change, the listener was reconnecting).
//
// While a member of a shared subscription has a filter (SubscribeParams.Filter), the owner routes
// what each claim brings (filtered.go): to the member it was claimed for when its filter matches,
// else handed over to a member here whose filter does (parked while that member has no credit),
// else completed as filtered. Members are charged credit only for what they receive.
//
// The owner of an ORDERED subscription also keeps its partition assignment (ordered.go): joins
// and leaves schedule a rebalance (debounced by Config.RebalanceDelay), an admin call asks for
// one (a rebalance event), and its claims carry the generation. Later work adds to the owner the
// same way, without new locks: a backfill's progress.
//
// # Credit
//
// A member may hold at most MaxInFlight unacknowledged deliveries across all its subscriptions. The
// member counts the deliveries it holds (with their lease deadlines) and the deliveries being
// claimed for it (reserved); an ack or nack forgets a delivery, and so does its lease deadline
// passing (the engine may give it to another member; a late ack still works). The deliveries
// channel has capacity at least MaxInFlight and credit = MaxInFlight - reserved - max(held,
// len(channel)), so a send never blocks even when expired deliveries still sit in the channel.
// A queue limit (SetQueueLimit, -1 for none) further bounds reserved + len(channel) whatever
// the credit: acks and expiries free credit, only the consumer taking deliveries frees queue room
// (Take wakes the waiting owners then), or with TakeQueued only the consumer raising the limit
// again (what it took still counts until it handed it on). A server bounds a connection's memory
// with it.
// Channels cannot grow: SetMaxInFlight above the capacity moves the channel's contents, in order,
// to a new channel at least twice as large (at most MaxInFlightLimit) under Member.mu (deliver
// sends under it too), and Deliveries returns the new one from then on. Credit freed by the
// consumer taking such an expired delivery with Member.Take wakes the owners waiting for it; one
// received from the channel of Deliveries is noticed at the next wake-up or poll (a receive has
// no hook).
//
// # Goroutines
//
// Every goroutine is owned by the Broker and counted in its WaitGroup: one notifier (topic created
// and deleted notifications, which need engine calls; the engine's callback itself never blocks),
// one retention job (Engine.RetentionApply every Config.RetentionInterval, reported to
// Config.OnRetention, logged at INFO when it removed something and at WARN per topic and reason
// when it removed messages a subscription had not completed), one subscription lifecycle job
// (lifecycle.go: heartbeats of the subscriptions with members here, dead detection, CANCELLED ->
// DELETED; reported to Config.OnLifecycle, every transition logged), and one owner per
// subscription with members. Stop unregisters from the engine, closes every member, closes the
// quit channel and waits for the WaitGroup. The engine is closed by its owner after Stop.
//
// # Lock order
//
//	Broker.mu -> Member.mu
//
// owner.qmu (an owner's inbox), eventQueue.mu and bp.mu are leaves. No lock is held across an
// engine call but bp.refreshMu, which serializes backpressure refreshes and which no callback
// takes, so the engine may call the notification callback (which takes Broker.mu for reading) from
// inside its own locks. A subscription's state has no lock: its owner's goroutine is its only
// writer. A member's attachments (Member.subs) grow only under Broker.mu, in the section that
// queues the join, and whoever reads them to queue leaves (Close, a semantics change) does so
// under Broker.mu too: an owner always gets a member's join before its leave. Attaching resolves
// the subscription with engine calls before that section and gives up there if the member closed
// meanwhile (deleting an ephemeral subscription it created for nothing). Waiting for an owner (a
// join, a leave, an end) is done with no lock held, and an owner never waits for anyone but the
// engine (a claim), Broker.mu and Member.mu. tracer.mu (correlation ids of
// leased deliveries) is a leaf too. Broker.moveMu serializes the moves after semantics changes
// (reattachTopic) and is held across engine calls and waits for owners: it is taken before any
// other lock and never by an owner or a callback.
//
// # Tracing
//
// At DEBUG the broker logs each message published, delivered, acked and nacked, with the
// correlation_id attribute when the message has the CorrelationHeader header (remembered from
// delivery to ack, at most 65,536 leases); any publish, claim, ack, nack, read or retention run
// slower than Config.SlowOperation (100 ms) is logged at WARN (seed 002 M4-13).
package broker
