package storage

import (
	"context"
	"time"
)

// Engine is the storage seam. Every method is safe for concurrent use. Methods are listed in
// alphabetical order.
//
// Time: every time-dependent decision (lease deadlines, backoff, retention, FROM_TIMESTAMP,
// PublishedAt) uses the engine's Clock, never a caller's.
type Engine interface {
	// BindingCreate registers a durable group on a topic pattern. It does not subscribe existing
	// topics (the broker does that with SubscriptionCreate, with the binding's start position); it
	// makes TopicCreate subscribe the group to every matching topic created afterwards, atomically
	// with the topic's creation and starting at its beginning.
	BindingCreate(ctx context.Context, params *BindingCreateParams) (*Binding, error)
	// BindingDelete removes a binding. Subscriptions it created stay.
	BindingDelete(ctx context.Context, params *BindingDeleteParams) error
	// BindingList lists all bindings, ordered by group then pattern.
	BindingList(ctx context.Context) ([]*Binding, error)

	// Close flushes and closes the engine: the appends queued before it (MessagesAppend and
	// MessagesAppendAsync) are completed and answered first. Later calls of any method return
	// ErrClosed. Close is safe to call twice.
	Close() error

	// DeliveriesAck completes messages for a subscription. Acks are idempotent: acking a message
	// that is already done is not an error. Any member of the subscription may ack a message
	// (a member whose lease expired and who finished the work anyway completes it). An acked
	// message is never delivered again to this subscription, also after a restart: the ack is
	// durable when the call returns.
	DeliveriesAck(ctx context.Context, params *DeliveriesAckParams) (*DeliveriesAckResult, error)
	// DeliveriesClaim leases up to Max messages of an ACTIVE subscription to a member. Messages due
	// for redelivery come first (oldest due first), then messages never delivered in offset order
	// per partition. Expired leases are processed on the way: the message becomes available after
	// the backoff of its attempt number (1 s, 4 s, 16 s, ... capped at 5 min), or goes to the DLQ if
	// it reached max_deliveries.
	DeliveriesClaim(ctx context.Context, params *DeliveriesClaimParams) (*DeliveriesClaimResult, error)
	// DeliveriesExtend pushes the lease deadlines of messages the member holds, and with NewMember
	// hands the leases over to another member.
	DeliveriesExtend(ctx context.Context, params *DeliveriesExtendParams) (*DeliveriesExtendResult, error)
	// DeliveriesNack gives messages the member holds back: available again after Delay (0: at
	// once), or straight to the DLQ with ToDLQ. A nack on the max_deliveries-th delivery
	// dead-letters the message.
	DeliveriesNack(ctx context.Context, params *DeliveriesNackParams) (*DeliveriesNackResult, error)
	// DeliveriesRelease gives back every lease a member holds on a subscription (the member left or
	// its connection died): the messages are available again at once, without backoff, keeping
	// their attempt counts; one that reached max_deliveries goes to the DLQ.
	DeliveriesRelease(ctx context.Context, params *DeliveriesReleaseParams) (*DeliveriesReleaseResult, error)

	// DLQList lists a subscription's dead-lettered messages in ID order, at most ReadBatchBytes
	// of them (at least one).
	DLQList(ctx context.Context, params *DLQListParams) ([]*DLQEntry, error)
	// DLQPurge removes DLQ entries (all of them when IDs is empty) and returns how many.
	DLQPurge(ctx context.Context, params *DLQPurgeParams) (int, error)
	// DLQRecovered returns, per subscription, the messages the engine dead-lettered while it
	// opened, and forgets them: a later call returns none. The embedded engine dead-letters there
	// the leases a restart lost on their max_deliveries-th delivery (reason max_deliveries); the
	// PostgreSQL engine none (its leases outlive a restart: expired, a claim dead-letters them).
	// The broker reports them once, when it starts (broker.Config.OnDeadLettered).
	DLQRecovered(ctx context.Context) ([]DeadLetterCount, error)
	// DLQReplay moves DLQ entries (all of them when IDs is empty) back to their subscription only,
	// as messages due for redelivery at once with a fresh attempt count. It returns how many.
	DLQReplay(ctx context.Context, params *DLQReplayParams) (int, error)

	// MessagesAppend appends a batch of messages to a topic. When it returns without error the
	// messages are durable (per the engine's durability setting) and visible, and the result gives
	// their positions in the order of the batch. A batch is all or nothing. It fails with
	// ErrTopicNotFound for an unknown topic: auto-creation is the broker's job.
	//
	// De-duplication: a message whose ProducerID the topic has seen within its dedup_window (an
	// earlier append, also before a restart, or an earlier message of the same batch) is not
	// stored; its position is the first message's, with Duplicate set. The check is atomic with the
	// append: of concurrent appends with the same ProducerID exactly one stores it. An append
	// whose messages are all duplicates stores nothing and still succeeds.
	MessagesAppend(ctx context.Context, params *MessagesAppendParams) (*MessagesAppendResult, error)
	// MessagesRead reads retained messages of one partition from an offset, without leasing them
	// (browsing, admin, audit), at most ReadBatchBytes of them (at least one).
	MessagesRead(ctx context.Context, params *MessagesReadParams) ([]*Message, error)

	// NotifyRegister registers fn to be called after messages were appended to a topic, a topic
	// was created or deleted, or a subscription's state or group changed, by this engine or
	// (PostgreSQL) by another broker instance. fn must not block. Notifications may be coalesced
	// and may be spurious; they are a wake-up, not a delivery.
	NotifyRegister(fn func(Notification)) (unregister func())

	// RetentionApply deletes what retention allows at the engine's current time: completed
	// messages older than message_retention, messages no subscription needs past
	// zero_subscription_retention, everything older than max_retention, and DLQ entries older
	// than max_retention. Every removed message a subscription had not completed is counted in
	// RetentionResult.Expired with its reason. Every duration is honoured, however short: an
	// engine that deletes whole segments seals a partition's active segment when its oldest
	// message may go. Safe to run concurrently and on several broker instances.
	//
	// Before that, it force-advances stuck floors (zombie_ttl): for each subscription holding
	// retention (ACTIVE, PAUSED) and each partition, the engine remembers (in memory, per
	// process) the ack floor it saw and since when; when a run finds the floor still where it was
	// more than zombie_ttl ago, the floor is moved to the first message published at or after
	// now minus zombie_ttl, and what the subscription had not completed below it is counted in
	// RetentionResult.Zombies. The "since" of a force-advanced floor is kept, so a subscription
	// that stays stuck holds at most zombie_ttl of messages; its own progress resets it. A floor
	// is first seen at the first run after a subscription or engine start: a restart postpones a
	// force-advance, never hastens it.
	RetentionApply(ctx context.Context) (*RetentionResult, error)

	// SubscriptionAssign replaces the partition assignment of an ORDERED subscription if its
	// generation is still params.Generation (compare-and-set; else ErrStaleGeneration, nothing
	// changed) and returns it with the generation incremented, durably (on PostgreSQL in the
	// database, so broker instances agree). The leases held in a partition whose owner changed
	// are dropped at once, like DeliveriesRelease (due at once, attempts kept; at max_deliveries
	// to the DLQ, counted in the result): its new owner starts at the partition's ack floor. A
	// shared subscription is refused with ErrInvalidArgument, a CANCELLED one with
	// ErrSubscriptionNotActive.
	SubscriptionAssign(ctx context.Context, params *SubscriptionAssignParams) (*SubscriptionAssignResult, error)
	// SubscriptionAssignment returns the current assignment of an ORDERED subscription
	// (generation 0 and no member before the first SubscriptionAssign).
	SubscriptionAssignment(ctx context.Context, id int64) (*Assignment, error)
	// SubscriptionMembersRenew records that the members params.Members of subscriptions are live
	// until params.TTL from now (member liveness: the broker instance they are connected to
	// renews them well within the TTL; on PostgreSQL "now" is the database's clock unless the
	// engine was given a Clock), with their filters and the renewing instance, forgets
	// params.Forget, and returns, for each subscription named, the members whose liveness has
	// not expired, renewed by this call or earlier by any broker instance, with their records.
	// Expired records are forgotten: a member never renewed or past its expiry counts as gone.
	// Subscriptions that are unknown or CANCELLED are skipped. See docs/storage.md.
	SubscriptionMembersRenew(ctx context.Context, params *SubscriptionMembersRenewParams) (*SubscriptionMembersRenewResult, error)
	// SubscriptionCreate creates a subscription on a topic at a start position. For a QUEUE topic
	// the subscription exists from the topic's creation and this fails with ErrSubscriptionExists.
	SubscriptionCreate(ctx context.Context, params *SubscriptionCreateParams) (*Subscription, error)
	// SubscriptionBackfill acts on a subscription's backfill (storage.BackfillAction): begin a new
	// range from its ack floors to the log end (cut to the newest max_backfill_messages; the cut
	// raises floors and cursors like a skip), cancel, resume, skip the rest, or record a failure.
	// Durable when it returns. A CANCELLED subscription is ErrSubscriptionNotActive; an action
	// its backfill state does not allow is ErrInvalidTransition and changes nothing.
	SubscriptionBackfill(ctx context.Context, params *SubscriptionBackfillParams) (*SubscriptionBackfillResult, error)
	// SubscriptionConfigure changes a durable subscription's heartbeat timeout and, while it has no
	// progress (every partition's ack floor and cursor still at the offset its start position
	// resolved to, nothing leased, waiting or dead-lettered), its start position, resolved again
	// now as SubscriptionCreate does. A new start after progress fails with
	// ErrSubscriptionHasProgress and changes nothing.
	SubscriptionConfigure(ctx context.Context, params *SubscriptionConfigureParams) (*Subscription, error)
	// SubscriptionDelete removes a subscription and all its state at once (an ephemeral member
	// left, or the cleanup of a CANCELLED subscription).
	SubscriptionDelete(ctx context.Context, id int64) error
	// SubscriptionGet returns a subscription by ID.
	SubscriptionGet(ctx context.Context, id int64) (*Subscription, error)
	// SubscriptionGetByGroup returns the newest subscription of (topic, group) that is not
	// DELETED.
	SubscriptionGetByGroup(ctx context.Context, topic, group string) (*Subscription, error)
	// SubscriptionList lists subscriptions, optionally of one topic, ordered by ID.
	SubscriptionList(ctx context.Context, params *SubscriptionListParams) ([]*Subscription, error)
	// SubscriptionStats returns a subscription's depth, lag, in-flight and DLQ figures.
	SubscriptionStats(ctx context.Context, id int64) (*SubscriptionStats, error)
	// SubscriptionUpdate changes a subscription's state (pause, resume, dead, cancel) following
	// CanTransition. Becoming ACTIVE restarts the heartbeat timeout (LastHeartbeatAt = now). A
	// DELETED subscription is final: its update is ErrInvalidTransition, like any other refused one.
	SubscriptionUpdate(ctx context.Context, params *SubscriptionUpdateParams) (*Subscription, error)
	// SubscriptionsHeartbeat records that the subscriptions IDs have a live member now: their
	// heartbeat timeout starts again, and a DEAD one becomes ACTIVE (resurrected, seed 000's
	// DEAD -> ACTIVE on a heartbeat). IDs that are unknown, ephemeral-gone, CANCELLED or DELETED
	// are skipped. On PostgreSQL "now" is the database's clock unless the engine was given a
	// Clock.
	SubscriptionsHeartbeat(ctx context.Context, params *SubscriptionsHeartbeatParams) (*SubscriptionsHeartbeatResult, error)
	// SubscriptionsMaintain runs the subscription lifecycle jobs at the engine's current time:
	// every ACTIVE subscription whose LastHeartbeatAt is more than its HeartbeatTimeout ago
	// becomes DEAD, and every CANCELLED subscription cancelled (UpdatedAt) more than
	// CancelledRetention ago becomes DELETED. Each transition is made once, also when several
	// broker instances run it at the same time; the result lists the transitions this call made.
	SubscriptionsMaintain(ctx context.Context, params *SubscriptionsMaintainParams) (*SubscriptionsMaintainResult, error)

	// TopicCreate creates a topic. A QUEUE topic gets its one subscription (group QueueGroup,
	// FROM_BEGINNING); a PUB_SUB topic gets one subscription per matching durable binding.
	TopicCreate(ctx context.Context, params *TopicCreateParams) (*Topic, error)
	// TopicDelete deletes a topic with its messages and subscriptions, and atomically with them the
	// bindings whose pattern is the topic's plain name (a durable group's Subscribe of a topic
	// that did not exist yet registers one): they were for this topic, and would otherwise
	// subscribe their groups to a topic created later under the name, without members. Wildcard
	// bindings stay (they bind topics created later by design). Without Force it fails with
	// ErrTopicHasSubscriptions while a durable PUB_SUB subscription is ACTIVE or PAUSED, or while
	// the queue subscription of a QUEUE topic has messages that are not done (an operator does not
	// lose unprocessed work by accident); ephemeral subscriptions never block it.
	TopicDelete(ctx context.Context, params *TopicDeleteParams) error
	// TopicGet returns a topic.
	TopicGet(ctx context.Context, name string) (*Topic, error)
	// TopicList lists all topics ordered by name.
	TopicList(ctx context.Context) ([]*Topic, error)
	// TopicStats describes a topic's partitions.
	TopicStats(ctx context.Context, name string) (*TopicStats, error)
	// TopicUpdate changes a topic's configuration. Partitions may only grow. Changing semantics
	// from QUEUE to PUB_SUB turns the queue subscription into the group QueueToGroup, so nothing
	// pending is lost; PUB_SUB to QUEUE is refused while more than one subscription is live. With
	// Expect set it is a compare-and-set on the configuration (ErrTopicChanged).
	TopicUpdate(ctx context.Context, params *TopicUpdateParams) (*Topic, error)
}

// BindingCreateParams are the parameters of Engine.BindingCreate.
type BindingCreateParams struct {
	Group   string
	Pattern string
	Start   StartPosition
	// MaxBindings, when positive, bounds the bindings the engine keeps: creating one more fails
	// with ErrLimitExceeded (checked atomically with the creation, across instances on a shared
	// engine).
	MaxBindings int
}

// BindingDeleteParams are the parameters of Engine.BindingDelete.
type BindingDeleteParams struct {
	Group   string
	Pattern string
}

// DeliveriesAckParams are the parameters of Engine.DeliveriesAck.
type DeliveriesAckParams struct {
	SubscriptionID int64
	Member         string
	// Generation (ORDERED subscriptions) is the generation of the deliveries (Delivery.Generation):
	// every ref's partition must be owned by Member since that generation or earlier, else the
	// call fails with ErrStaleGeneration and changes nothing. Ignored by shared subscriptions.
	Generation int64
	Refs       []DeliveryRef
	// Batch acks whole batches (batches.go, CheckBatchRefs): in each partition of Refs, Refs
	// must name every message leased to Member, else the call fails with ErrBatchSplit and
	// changes nothing.
	Batch bool
}

// DeliveriesAckResult is the result of Engine.DeliveriesAck.
type DeliveriesAckResult struct {
	// Acked counts messages this call completed.
	Acked int
	// AlreadyDone counts messages that were already complete (acked, dead-lettered, or below the
	// ack floor).
	AlreadyDone int
	// Unknown lists refs above the high-water mark or in partitions that do not exist.
	Unknown []DeliveryRef
}

// DeliveriesClaimParams are the parameters of Engine.DeliveriesClaim.
type DeliveriesClaimParams struct {
	SubscriptionID int64
	Member         string
	// Max is the most messages to lease, at least 1.
	Max int
	// AvoidMember skips messages whose last delivery went to Member and that are due for
	// redelivery (the broker sets it when another member of the group could take them).
	AvoidMember bool
	// Skip, Take and SkipFor: a due redelivery whose last member starts with Skip (the tags of
	// give-backs, DeliveriesNackParams.GiveBack) and is not Take is not taken by this claim
	// before SkipFor has passed since it became due; it counts for NextDue then. SkipFor is at
	// most MaxSkipFor. The broker addresses a give-back to an instance whose live member wants
	// the message (the tag names it): that instance's claims Take it at once, all others pass
	// it over for SkipFor, then any claims it and decides again (docs/ARCHITECTURE.md section 8).
	Skip    string
	Take    string
	SkipFor time.Duration
	// Partitions limits the claim to those partitions; nil means all (in an ORDERED
	// subscription: all the member owns).
	Partitions []int32
	// Generation (ORDERED subscriptions) must be the current generation of the assignment, else
	// the claim fails with ErrStaleGeneration. Ignored by shared subscriptions.
	Generation int64
	// LeaseDuration overrides the topic's ack_wait when positive.
	LeaseDuration time.Duration
	// BatchSize, when positive, makes the claim of an ORDERED subscription a batch claim
	// (batches.go): per partition one batch of consecutive messages, up to BatchSize and
	// extended past it so that a publish's run of a key is never split. At most MaxBatchSize;
	// refused with ErrInvalidArgument for a shared subscription.
	BatchSize int
}

// DeliveriesClaimResult is the result of Engine.DeliveriesClaim.
type DeliveriesClaimResult struct {
	Deliveries []*Delivery
	// DeadLettered counts the messages this claim sent to the DLQ instead of delivering them:
	// expired leases on their max_deliveries-th delivery and, on the embedded engine,
	// redeliveries whose attempt would exceed max_deliveries after a crash (reason
	// max_deliveries).
	DeadLettered int
	// NextDue is the earliest time something not claimable now becomes claimable without a new
	// publish (a backoff elapses, a lease expires, a delayed message matures). Zero if nothing is
	// waiting.
	NextDue time.Time
}

// DeliveriesExtendParams are the parameters of Engine.DeliveriesExtend.
type DeliveriesExtendParams struct {
	SubscriptionID int64
	Member         string
	// Generation (ORDERED subscriptions) is the generation of the deliveries (Delivery.Generation):
	// every ref's partition must be owned by Member since that generation or earlier, else the
	// call fails with ErrStaleGeneration and changes nothing. Ignored by shared subscriptions.
	Generation int64
	Refs       []DeliveryRef
	// Duration is the new lease from now; 0 means the topic's ack_wait.
	Duration time.Duration
	// NewMember, when not empty, hands the extended leases over to that member of the
	// subscription: from then on it holds them (its nacks, extends and releases apply to them,
	// Member's no longer do), with the same attempt counts. The broker routes a message claimed
	// for one member to another whose filter matches this way. Shared subscriptions only: an
	// ORDERED subscription refuses it with ErrInvalidArgument (partitions have one owner).
	NewMember string
}

// DeliveriesExtendResult is the result of Engine.DeliveriesExtend.
type DeliveriesExtendResult struct {
	// Deadline is the new lease deadline of every extended message.
	Deadline time.Time
	// Extended counts the messages whose lease was extended.
	Extended int
	// NotHeld lists refs the member does not hold.
	NotHeld []DeliveryRef
}

// DeliveriesNackParams are the parameters of Engine.DeliveriesNack.
type DeliveriesNackParams struct {
	SubscriptionID int64
	Member         string
	// Generation (ORDERED subscriptions) is the generation of the deliveries (Delivery.Generation):
	// every ref's partition must be owned by Member since that generation or earlier, else the
	// call fails with ErrStaleGeneration and changes nothing. Ignored by shared subscriptions.
	Generation int64
	Refs       []DeliveryRef
	// Delay before the messages are available again. 0 means at once.
	Delay time.Duration
	// ToDLQ dead-letters the messages at once.
	ToDLQ bool
	// Reason is recorded as the DLQ entry's last error.
	Reason string
	// Batch nacks whole batches, as DeliveriesAckParams.Batch.
	Batch bool
	// GiveBack, when not empty, gives the messages back as if this delivery had not been made
	// (member filters on a shared engine: no member of this broker instance wants them, one of
	// another instance does): the attempt count goes back to its value before the claim, nothing
	// is dead-lettered or recorded as a failure, and GiveBack is recorded as the messages' last
	// member in place of Member (a claim whose Skip is a prefix of GiveBack, unless its Take is
	// GiveBack, passes them over for its SkipFor).
	// Refused with ToDLQ or Batch; at most MaxGroupNameLen bytes.
	GiveBack string
}

// DeliveriesNackResult is the result of Engine.DeliveriesNack.
type DeliveriesNackResult struct {
	// Nacked counts messages given back for redelivery.
	Nacked int
	// DeadLettered counts messages that went to the DLQ.
	DeadLettered int
	// NotHeld lists refs the member does not hold.
	NotHeld []DeliveryRef
}

// DeliveriesReleaseParams are the parameters of Engine.DeliveriesRelease.
type DeliveriesReleaseParams struct {
	SubscriptionID int64
	Member         string
}

// DeliveriesReleaseResult is the result of Engine.DeliveriesRelease: Released the messages given
// back for redelivery, DeadLettered those that went to the DLQ (one on its max_deliveries-th
// delivery that could not go, such as one in a damaged partition, is in neither).
type DeliveriesReleaseResult struct {
	Released     int
	DeadLettered int
}

// DeadLetterCount counts the messages of one subscription (group, on topic) that the engine
// dead-lettered (Engine.DLQRecovered).
type DeadLetterCount struct {
	SubscriptionID int64
	Topic          string
	Group          string
	Messages       int
}

// DLQListParams are the parameters of Engine.DLQList.
type DLQListParams struct {
	SubscriptionID int64
	// AfterID lists entries with a larger ID (paging).
	AfterID int64
	// Limit is the most entries to return; 0 means 100.
	Limit int
}

// DLQPurgeParams are the parameters of Engine.DLQPurge.
type DLQPurgeParams struct {
	SubscriptionID int64
	IDs            []int64
}

// DLQReplayParams are the parameters of Engine.DLQReplay.
type DLQReplayParams struct {
	SubscriptionID int64
	IDs            []int64
}

// AppendMessage is one message to append.
type AppendMessage struct {
	// Partition is the target partition; -1 (PartitionAuto) picks hash(Key) mod partitions when a
	// key is given and spreads keyless messages otherwise.
	Partition int32
	Key       []byte
	Headers   map[string]string
	Payload   []byte
	// ProducerID is the producer's own id of the message, for de-duplication (see
	// Engine.MessagesAppend); empty: never a duplicate. At most MaxProducerIDLen bytes.
	ProducerID string
	NotBefore  time.Time
	ExpiresAt  time.Time
}

// PartitionAuto lets the engine choose the partition of an AppendMessage.
const PartitionAuto int32 = -1

// AsyncAppender is implemented by an engine that can append without a goroutine waiting for the
// commit (both engines): a connection's publish worker then hands its appends over and
// goes on with the publishes that arrived meanwhile, and the engine's completion answers them
// (broker.PublishAsync).
type AsyncAppender interface {
	// MessagesAppendAsync validates the batch and queues it like Engine.MessagesAppend. It returns
	// an error, and done is never called, when nothing was queued (the same errors as
	// MessagesAppend: invalid batch, unknown topic, closed or failed engine). Otherwise done is
	// called exactly once, with MessagesAppend's outcome, when the batch is durable or failed
	// (or, when the engine is closing, with ErrClosed, possibly before MessagesAppendAsync
	// returns; or, for a batch of duplicates only whose originals are durable, before it returns).
	// done runs on a goroutine of the engine that commits other appends meanwhile: it
	// must not block and must not call the engine. Batches queued one after the other by one
	// goroutine keep that order in each partition.
	MessagesAppendAsync(params *MessagesAppendParams, done func(*MessagesAppendResult, error)) error
}

// MessagesAppendParams are the parameters of Engine.MessagesAppend.
type MessagesAppendParams struct {
	Topic    string
	Messages []AppendMessage
	// Prompt is a hint: the caller came back with this batch right after its previous one was
	// acknowledged, and will again (a synchronous publisher in a loop). An engine that commits in
	// groups may wait briefly after a round for such callers, so that they share the next sync
	// (the embedded engine does; PostgreSQL ignores it). It changes nothing else.
	Prompt bool
}

// MessagePosition is where an appended message was stored.
type MessagePosition struct {
	Partition   int32
	Offset      int64
	PublishedAt time.Time
	// Duplicate: the message was not stored because an earlier message with the same ProducerID
	// was appended to the topic within its dedup_window; the position is that message's.
	Duplicate bool
}

// MessagesAppendResult is the result of Engine.MessagesAppend.
type MessagesAppendResult struct {
	Positions []MessagePosition
}

// MessagesReadParams are the parameters of Engine.MessagesRead.
type MessagesReadParams struct {
	Topic     string
	Partition int32
	// Offset is the first offset to read; below the first retained offset reading starts there.
	Offset int64
	// Limit is the most messages to return; 0 means 100.
	Limit int
}

// NotificationKind says what a Notification is about.
type NotificationKind uint8

const (
	// NotifyMessages: messages were appended to Topic.
	NotifyMessages NotificationKind = iota + 1
	// NotifyTopicCreated: Topic was created.
	NotifyTopicCreated
	// NotifyTopicDeleted: Topic was deleted.
	NotifyTopicDeleted
	// NotifySubscription: subscription SubscriptionID of Topic changed state (SubscriptionUpdate:
	// paused, resumed, made DEAD, cancelled, deleted; SubscriptionsHeartbeat resurrecting it;
	// SubscriptionsMaintain making it DEAD or DELETED; SubscriptionDelete) or group (a
	// semantics change by TopicUpdate renamed it). One per change, never per delivery: a
	// broker rereads the subscription at once instead of at its periodic reread. Not sent for
	// subscriptions created (their members create them) nor for those a topic deletion took
	// (NotifyTopicDeleted says so).
	NotifySubscription
)

// Notification is a wake-up from the engine.
type Notification struct {
	Kind  NotificationKind
	Topic string
	// SubscriptionID is the subscription of a NotifySubscription; 0 for the other kinds.
	SubscriptionID int64
}

// RetentionResult is the result of Engine.RetentionApply.
type RetentionResult struct {
	// MessagesDeleted counts messages removed that every subscription with state (ACTIVE, PAUSED,
	// DEAD) had completed, or that no subscription ever needed.
	MessagesDeleted int64
	// MessagesExpired counts messages removed while a subscription with state had not completed
	// them: the removals invariant 1 requires to count. Expired breaks it down.
	MessagesExpired int64
	// Expired is MessagesExpired by topic and reason, without zero counts, in the order they were
	// counted (topics by name). Add to it with AddExpired.
	Expired []ExpiredCount
	// DLQEntriesExpired counts DLQ entries removed by max_retention.
	DLQEntriesExpired int64
	// BytesDeleted is the storage reclaimed.
	BytesDeleted int64
	// SizeRemoved is, by topic (in the order counted), what max_messages and max_bytes removed:
	// completed messages (also in MessagesDeleted) and, by size_policy, needed ones (also in
	// Expired with reason size). Add to it with AddSizeRemoved.
	SizeRemoved []SizeRemoval
	// Zombies are the subscriptions whose stuck ack floors zombie_ttl force-advanced in this run,
	// by topic and subscription, in the order they were counted. Add to it with AddZombie.
	Zombies []ZombieCount
	// Backlog is the retention backlog after the run (seed 000's cleanupBacklog): the messages
	// still stored in whole removal units (embedded engine: segments; PostgreSQL: buckets) every
	// message of which retention allows to remove now, i.e. what the next run would remove if it
	// ran at once. 0 after a run that removed everything it could; above 0 when a removal failed
	// or was blocked (a segment that could not be sealed, a bucket whose drop waits for a lock or
	// failed). Computed cheaply from what the engine knows of its units (PostgreSQL: an estimate
	// from each bucket's lowest and highest offset per partition).
	Backlog int64
}

// SizeRemoval is what a topic's size bound removed in one retention run.
type SizeRemoval struct {
	Topic    string
	Messages int64
	Bytes    int64
}

// AddSizeRemoved counts n > 0 messages of bytes bytes of topic removed by its size bound,
// merged into the last entry when it is the same topic.
func (r *RetentionResult) AddSizeRemoved(topic string, n, bytes int64) {
	if n <= 0 {
		return
	}
	if k := len(r.SizeRemoved) - 1; k >= 0 && r.SizeRemoved[k].Topic == topic {
		r.SizeRemoved[k].Messages += n
		r.SizeRemoved[k].Bytes += bytes
		return
	}
	r.SizeRemoved = append(r.SizeRemoved, SizeRemoval{Topic: topic, Messages: n, Bytes: bytes})
}

// ZombieCount is a subscription whose ack floor zombie_ttl force-advanced (TopicConfig.ZombieTTL)
// and the number of messages it gave up: those it had not completed (acked or dead-lettered)
// below the new floors, over its partitions. They are never delivered to it; they are not
// removed by this (retention removes them later like any completed message).
type ZombieCount struct {
	Topic          string
	Group          string
	SubscriptionID int64
	Messages       int64
}

// AddZombie counts n > 0 messages given up by subscription id (group, on topic); a force-advance
// over messages all completed already gives up nothing and is not listed. n is merged into the
// last entry when it is the same subscription, else appended.
func (r *RetentionResult) AddZombie(topic, group string, id, n int64) {
	if n <= 0 {
		return
	}
	if k := len(r.Zombies) - 1; k >= 0 && r.Zombies[k].SubscriptionID == id {
		r.Zombies[k].Messages += n
		return
	}
	r.Zombies = append(r.Zombies, ZombieCount{Topic: topic, Group: group, SubscriptionID: id, Messages: n})
}

// ExpiryReason is the retention rule that removed messages a subscription had not completed: the
// reason label of spool_messages_expired_total. When several rules allow a removal, the first
// one listed here is the reason.
type ExpiryReason string

const (
	// ExpiredMaxRetention: the messages were older than max_retention, the cap on everything.
	ExpiredMaxRetention ExpiryReason = "max_retention"
	// ExpiredZeroSubscription: no subscription held retention (those left were DEAD; on a QUEUE
	// topic, its queue subscription was DEAD) and the messages were older than
	// zero_subscription_retention.
	ExpiredZeroSubscription ExpiryReason = "zero_subscription"
	// ExpiredDeadSubscription: every subscription holding retention (ACTIVE, PAUSED) had completed
	// the messages and they were older than message_retention, but a DEAD subscription had not.
	ExpiredDeadSubscription ExpiryReason = "dead_subscription"
	// ExpiredSize: the topic was above max_messages or max_bytes and the messages were its
	// oldest: with size_policy keep_needed only a DEAD subscription had not completed them, with
	// drop_oldest any subscription.
	ExpiredSize ExpiryReason = "size"
	// ExpiredTopicDeleted: the messages were committed but not yet in the log when their topic
	// was deleted (a forced delete, or a delete by an instance that does not know them): on
	// PostgreSQL, transactional publishes waiting in spool.staged for the sequencer. The engine
	// reports them with its next retention run.
	ExpiredTopicDeleted ExpiryReason = "topic_deleted"
)

// ExpiredCount is a number of messages of one topic that retention removed for one reason while
// a subscription had not completed them.
type ExpiredCount struct {
	Topic    string
	Reason   ExpiryReason
	Messages int64
}

// AddExpired counts n > 0 messages of topic expired for reason, in MessagesExpired and Expired.
// Engines count topic by topic: n is merged into an entry of the same topic and reason among the
// last entries of that topic, else appended.
func (r *RetentionResult) AddExpired(topic string, reason ExpiryReason, n int64) {
	if n <= 0 {
		return
	}
	r.MessagesExpired += n
	for i := len(r.Expired) - 1; i >= 0 && r.Expired[i].Topic == topic; i-- {
		if r.Expired[i].Reason == reason {
			r.Expired[i].Messages += n
			return
		}
	}
	r.Expired = append(r.Expired, ExpiredCount{Topic: topic, Reason: reason, Messages: n})
}

// SubscriptionCreateParams are the parameters of Engine.SubscriptionCreate.
type SubscriptionCreateParams struct {
	Topic     string
	Group     string
	Pattern   string
	Ephemeral bool
	Start     StartPosition
	// Mode is ModeShared (also "" or "shared") or ModeOrdered; MaxInFlightPerPartition (default
	// 1) and Strategy (default round-robin) are for ordered subscriptions only.
	Mode                    SubscriptionMode
	MaxInFlightPerPartition int
	Strategy                string
	// HeartbeatTimeout is the subscription's heartbeat timeout, MinHeartbeatTimeout to
	// MaxHeartbeatTimeout; zero means DefaultHeartbeatTimeout.
	HeartbeatTimeout time.Duration
	// MaxBackfillMessages bounds the subscription's backfill ranges (Subscription.Backfill): 0
	// means DefaultMaxBackfillMessages, UnlimitedBackfill none. When a range is longer, only its
	// newest messages are kept: the start rises past the others (counted in Backfill.Skipped).
	MaxBackfillMessages int64
	// MaxSubscriptions, when positive, bounds the durable subscriptions (not ephemeral, not
	// DELETED) the engine keeps: creating one more fails with ErrLimitExceeded (checked
	// atomically with the creation, across instances on a shared engine). Ephemeral
	// subscriptions live as long as their member's connection and are not counted.
	MaxSubscriptions int
}

// SubscriptionConfigureParams are the parameters of Engine.SubscriptionConfigure.
type SubscriptionConfigureParams struct {
	ID int64
	// Start, when not nil, is the new start position.
	Start *StartPosition
	// HeartbeatTimeout, when not zero, is the new heartbeat timeout (MinHeartbeatTimeout to
	// MaxHeartbeatTimeout).
	HeartbeatTimeout time.Duration
}

// SubscriptionListParams are the parameters of Engine.SubscriptionList.
type SubscriptionListParams struct {
	// Topic filters by topic when not empty.
	Topic string
	// IncludeDeleted lists DELETED subscriptions too.
	IncludeDeleted bool
}

// SubscriptionsHeartbeatParams are the parameters of Engine.SubscriptionsHeartbeat.
type SubscriptionsHeartbeatParams struct {
	// IDs are the subscriptions with a live member, at most MaxHeartbeatIDs.
	IDs []int64
}

// MaxHeartbeatIDs bounds the IDs of one SubscriptionsHeartbeat call.
const MaxHeartbeatIDs = 10000

// SubscriptionsHeartbeatResult is the result of Engine.SubscriptionsHeartbeat.
type SubscriptionsHeartbeatResult struct {
	// Beats counts the subscriptions whose heartbeat was recorded.
	Beats int
	// Resurrected are the subscriptions that were DEAD and are ACTIVE again, ordered by ID.
	Resurrected []*Subscription
}

// SubscriptionsMaintainParams are the parameters of Engine.SubscriptionsMaintain.
type SubscriptionsMaintainParams struct {
	// CancelledRetention is how long a CANCELLED subscription stays before it becomes DELETED
	// (subscription_retention); zero means DefaultSubscriptionRetention.
	CancelledRetention time.Duration
}

// SubscriptionsMaintainResult is the result of Engine.SubscriptionsMaintain.
type SubscriptionsMaintainResult struct {
	// Dead are the subscriptions this call moved from ACTIVE to DEAD, ordered by ID.
	Dead []*Subscription
	// Deleted are the subscriptions this call moved from CANCELLED to DELETED, ordered by ID.
	Deleted []*Subscription
}

// SubscriptionUpdateParams are the parameters of Engine.SubscriptionUpdate.
type SubscriptionUpdateParams struct {
	ID    int64
	State SubscriptionState
}

// TopicCreateParams are the parameters of Engine.TopicCreate.
type TopicCreateParams struct {
	Name string
	// Config is completed with TopicConfig.WithDefaults and validated.
	Config TopicConfig
	// MaxTopics, when positive, refuses the creation with ErrLimitExceeded if the engine already
	// holds that many topics; checked atomically with the creation (on PostgreSQL across broker
	// instances too).
	MaxTopics int
}

// TopicDeleteParams are the parameters of Engine.TopicDelete.
type TopicDeleteParams struct {
	Name string
	// Force deletes even with live subscriptions or pending queue messages, cancelling them.
	Force bool
}

// TopicUpdateParams are the parameters of Engine.TopicUpdate.
type TopicUpdateParams struct {
	Name string
	// Config replaces the topic's configuration (completed with defaults and validated).
	Config TopicConfig
	// QueueToGroup names the group the queue subscription becomes when Semantics changes from
	// QUEUE to PUB_SUB. Required for that change.
	QueueToGroup string
	// Expect, when set, makes the update a compare-and-set: it is applied only if the topic's
	// stored configuration equals Expect (both completed with TopicConfig.WithDefaults, so the
	// Config of a TopicGet is the usual value), checked atomically with the write (on PostgreSQL
	// under the topic row's lock, in the update's transaction). Otherwise TopicUpdate fails with
	// ErrTopicChanged and changes nothing. A caller that read the configuration, changed some
	// fields and writes the whole of it back passes what it read, so that it cannot overwrite
	// another update that landed in between. Nil: no check (the last update wins).
	Expect *TopicConfig
}
