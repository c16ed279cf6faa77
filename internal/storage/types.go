package storage

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Semantics says how a topic's messages reach consumers.
type Semantics string

const (
	// Queue: the topic has exactly one subscription that every consumer shares; each message goes to
	// one consumer.
	Queue Semantics = "QUEUE"
	// PubSub: each consumer group has its own subscription; each message goes to every group and to
	// one member inside each group.
	PubSub Semantics = "PUB_SUB"
)

// CompletionTracking selects how a topic decides that a message is done (BRIEF.md section 4).
type CompletionTracking string

const (
	// Watermark: per-subscription ack floors; retention below the minimum floor over subscriptions
	// that hold retention. The default.
	Watermark CompletionTracking = "watermark"
	// Refcount (strict): a message waits for the subscriptions live (ACTIVE, PAUSED) when it was
	// published; a group that goes DEAD or CANCELLED leaves the set of the messages still pending
	// for it, and a group that joins (created, or back from DEAD) is added to the pending ones
	// only: completed messages never get a group again. Each (message, group) completion is kept
	// with its time (CompletionAuditor). docs/storage.md "Completion tracking".
	Refcount CompletionTracking = "refcount"
)

// DefaultMessageRetention is the default of TopicConfig.MessageRetention (BRIEF section 5).
const DefaultMessageRetention = 24 * time.Hour

// DefaultZombieTTL is the default of TopicConfig.ZombieTTL (seed 000: 7 days).
const DefaultZombieTTL = 7 * 24 * time.Hour

// MinZombieTTL is the shortest TopicConfig.ZombieTTL.
const MinZombieTTL = time.Second

// Limits that are part of the contract.
const (
	// MaxTopicNameLen is the maximum length of a topic name or pattern in bytes.
	MaxTopicNameLen = 255
	// MaxGroupNameLen is the maximum length of a consumer group name in bytes.
	MaxGroupNameLen = 255
	// MaxPartitions bounds TopicConfig.Partitions.
	MaxPartitions = 4096
	// DefaultMaxMessageBytes is the default bound of key + headers + payload of one message.
	DefaultMaxMessageBytes = 1 << 20
	// MaxMessageBytesLimit is the largest max_message_bytes a topic may be configured with.
	MaxMessageBytesLimit = 8 << 20
	// ReadBatchBytes bounds the messages (key, headers and payload) one MessagesRead or DLQList
	// returns, at least one whatever its size: a Limit of 1,000 messages of 8 MiB is not 8 GB in
	// memory. Callers page on after the last one returned.
	ReadBatchBytes = 4 << 20
	// MaxProducerIDLen bounds the producer id of a message in bytes.
	MaxProducerIDLen = 1024
	// DefaultDedupWindow is the default dedup_window (BRIEF.md section 5).
	DefaultDedupWindow = 2 * time.Minute
	// MaxDedupWindow bounds dedup_window: the engines keep every producer id of the window (in
	// memory on the embedded engine), so the window bounds that memory.
	MaxDedupWindow = 24 * time.Hour
)

// TopicConfig is the per-topic configuration. The zero value of a field means "the default" and
// is replaced by WithDefaults; the defaults are those of BRIEF.md section 5.
type TopicConfig struct {
	// Semantics is QUEUE or PUB_SUB. Defaults to QUEUE.
	Semantics Semantics `json:"semantics" yaml:"semantics"`
	// Partitions is the number of partitions, 1 to MaxPartitions. Defaults to 1. It may grow, never
	// shrink.
	Partitions int `json:"partitions" yaml:"partitions"`
	// AckWait is the lease of a delivered message. Defaults to 30 s.
	AckWait time.Duration `json:"ack_wait" yaml:"ack_wait"`
	// MaxDeliveries is the number of deliveries after which a message that is not acked goes to the
	// subscription's dead-letter queue. Defaults to 5.
	MaxDeliveries int `json:"max_deliveries" yaml:"max_deliveries"`
	// MessageRetention is how long completed messages are kept for replay. Defaults to 24 h.
	MessageRetention time.Duration `json:"message_retention" yaml:"message_retention"`
	// ZeroSubscriptionRetention is how long messages of a PUB_SUB topic without any subscription that
	// holds retention are kept. Defaults to 24 h.
	ZeroSubscriptionRetention time.Duration `json:"zero_subscription_retention" yaml:"zero_subscription_retention"`
	// BlockWritesOnZeroSubscriptions rejects publishes to a PUB_SUB topic without an ACTIVE
	// subscription with ErrNoSubscriptions. Defaults to false.
	BlockWritesOnZeroSubscriptions bool `json:"block_writes_on_zero_subscriptions" yaml:"block_writes_on_zero_subscriptions"`
	// CompletionTracking is watermark (the default) or refcount. It cannot change while the topic
	// holds messages (ErrCompletionTrackingChange).
	CompletionTracking CompletionTracking `json:"completion_tracking" yaml:"completion_tracking"`
	// MaxRetention is the hard cap on the age of any retained message, needed or not. Removals it
	// causes are counted. Defaults to 30 days.
	MaxRetention time.Duration `json:"max_retention" yaml:"max_retention"`
	// ZombieTTL is how long the ack floor of a subscription that holds retention (ACTIVE or
	// PAUSED) may stay stuck: once retention has seen a partition's floor at the same offset for
	// longer than this, the floor is force-advanced past the messages older than ZombieTTL
	// (Engine.RetentionApply, RetentionResult.Zombies). At least MinZombieTTL; an explicit value
	// above MaxRetention is refused (it could never fire). Defaults to 7 days, which simply does
	// nothing on a topic whose MaxRetention is shorter.
	ZombieTTL time.Duration `json:"zombie_ttl" yaml:"zombie_ttl"`
	// MaxMessageBytes bounds key + headers + payload of one message. Defaults to 1 MiB.
	MaxMessageBytes int `json:"max_message_bytes" yaml:"max_message_bytes"`
	// DedupWindow is how long the engine remembers a message's ProducerID: a second message with
	// the same ProducerID appended to the topic within that time is dropped and answered with the
	// first one's position (MessagePosition.Duplicate). 1 ms to MaxDedupWindow; defaults to
	// 2 min. There is no "off": messages without a ProducerID are never de-duplicated. Omitted
	// from JSON when zero, so configs stored before it existed keep their bytes.
	DedupWindow time.Duration `json:"dedup_window,omitempty" yaml:"dedup_window"`
	// MaxBacklogMessages bounds the topic's backlog: the messages its slowest ACTIVE subscription
	// has not done yet (pending). At the bound publishes are refused with ErrRateLimited and a
	// retry-after; with BacklogPolicy throttle they are slowed down before it. 0: no bound (the
	// default). The broker enforces it (publishers holding the priority permission are exempt).
	MaxBacklogMessages int64 `json:"max_backlog_messages,omitempty" yaml:"max_backlog_messages"`
	// MaxBacklogBytes is the same bound in bytes, estimated as the backlog's messages times the
	// mean size of the topic's retained messages. 0: no bound (the default).
	MaxBacklogBytes int64 `json:"max_backlog_bytes,omitempty" yaml:"max_backlog_bytes"`
	// BacklogPolicy is what happens as the backlog nears its bound: reject (the default, also
	// when empty: publishes are refused at the bound) or throttle (publishes are delayed more and
	// more from half the bound, and refused at it).
	BacklogPolicy BacklogPolicy `json:"backlog_policy,omitempty" yaml:"backlog_policy"`
	// MaxMessages bounds the messages the topic retains (TopicStats.Messages): retention removes
	// its oldest messages, across partitions, to get within it (Engine.RetentionApply). 0: no
	// bound (the default). With SizePolicy keep_needed (the default) a message an ACTIVE or
	// PAUSED subscription has not completed is never removed for it, so the topic may stay above
	// (SizeBoundExceeded). The embedded engine removes whole segments.
	MaxMessages int64 `json:"max_messages,omitempty" yaml:"max_messages"`
	// MaxBytes is the same bound on TopicStats.Bytes. 0: no bound (the default).
	MaxBytes int64 `json:"max_bytes,omitempty" yaml:"max_bytes"`
	// SizePolicy says what MaxMessages and MaxBytes may remove: keep_needed (the default, also
	// when empty: only messages every ACTIVE and PAUSED subscription completed) or drop_oldest
	// (the oldest messages whoever needs them, counted as expired with reason size).
	SizePolicy SizePolicy `json:"size_policy,omitempty" yaml:"size_policy"`
	// PoisonRules dead-letter a message early, before max_deliveries, when its failures look
	// like a poison message (seed 002 ACK-9). Off by default (the zero value). Omitted from
	// JSON when off, so configs stored before it existed keep their bytes.
	PoisonRules PoisonRules `json:"poison_rules,omitzero" yaml:"poison_rules"`
}

// PoisonRules is TopicConfig.PoisonRules. The engines keep each unsettled message's last
// MaxFailureHistory failures (nacks) while a rule is on; every rule looks at them after a nack.
type PoisonRules struct {
	// DistinctMembers dead-letters a message nacked with the same non-empty reason by more than
	// one member (rule same_reason_multiple_members).
	DistinctMembers bool `json:"distinct_members,omitempty" yaml:"distinct_members"`
	// MaxFailures, when positive, dead-letters a message with that many failures within Window
	// (rule failures_in_window). 1 to MaxFailureHistory; 0: off.
	MaxFailures int `json:"max_failures,omitempty" yaml:"max_failures"`
	// Window is MaxFailures' window, 1 ms to 24 h; DefaultPoisonWindow (30 s) when MaxFailures is
	// set and Window is not.
	Window time.Duration `json:"window,omitempty" yaml:"window"`
}

// On reports whether any poison rule is on (the engines then keep failure histories).
func (r PoisonRules) On() bool { return r.DistinctMembers || r.MaxFailures > 0 }

// Poison-rule bounds.
const (
	// MaxFailureHistory is how many failures of an unsettled message the engines keep (the
	// last ones); it bounds PoisonRules.MaxFailures and DLQEntry.Failures.
	MaxFailureHistory = 5
	// DefaultPoisonWindow is PoisonRules.Window when MaxFailures is set (seed 002: 3+ failures
	// within 30 s).
	DefaultPoisonWindow = 30 * time.Second
	// MaxFailureReasonBytes bounds the reason kept per failure (longer ones are cut).
	MaxFailureReasonBytes = 256
)

// BacklogPolicy is TopicConfig.BacklogPolicy.
type BacklogPolicy string

// Backlog policies. An empty policy is BacklogReject.
const (
	BacklogReject   BacklogPolicy = "reject"
	BacklogThrottle BacklogPolicy = "throttle"
)

// SizePolicy is TopicConfig.SizePolicy.
type SizePolicy string

// Size policies. An empty policy is SizeKeepNeeded.
const (
	SizeKeepNeeded SizePolicy = "keep_needed"
	SizeDropOldest SizePolicy = "drop_oldest"
)

// HasSizeBound reports whether the topic bounds its size (MaxMessages or MaxBytes).
func (c TopicConfig) HasSizeBound() bool { return c.MaxMessages > 0 || c.MaxBytes > 0 }

// OverSize reports whether a topic holding messages messages in bytes bytes is above a size
// bound of c.
func (c TopicConfig) OverSize(messages, bytes int64) bool {
	return (c.MaxMessages > 0 && messages > c.MaxMessages) || (c.MaxBytes > 0 && bytes > c.MaxBytes)
}

// SizeBoundExceeded reports whether a topic with these stats is above a size bound of c: after
// retention ran, what the bound could not remove because a subscription holding retention still
// needs it (SizePolicy keep_needed), or what came since.
func (c TopicConfig) SizeBoundExceeded(st *TopicStats) bool {
	return st != nil && c.OverSize(st.Messages, st.Bytes)
}

// HasBacklogBound reports whether the topic bounds its backlog.
func (c TopicConfig) HasBacklogBound() bool {
	return c.MaxBacklogMessages > 0 || c.MaxBacklogBytes > 0
}

// WithDefaults returns c with every zero field set to its default.
func (c TopicConfig) WithDefaults() TopicConfig {
	if c.Semantics == "" {
		c.Semantics = Queue
	}
	if c.Partitions == 0 {
		c.Partitions = 1
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxDeliveries == 0 {
		c.MaxDeliveries = 5
	}
	if c.MessageRetention == 0 {
		c.MessageRetention = DefaultMessageRetention
	}
	if c.ZeroSubscriptionRetention == 0 {
		c.ZeroSubscriptionRetention = 24 * time.Hour
	}
	if c.CompletionTracking == "" {
		c.CompletionTracking = Watermark
	}
	if c.MaxRetention == 0 {
		c.MaxRetention = 30 * 24 * time.Hour
	}
	// The default message_retention follows a shorter max_retention (--max-retention 12h alone
	// is not refused for the 24 h default): max_retention caps it anyway. An explicit value
	// other than the default above max_retention stays an error (Validate); an explicit 24h
	// cannot be told from the default (an update reads it back stored) and follows too, as
	// zombie_ttl's default is let through.
	if c.MessageRetention == DefaultMessageRetention && c.MaxRetention >= time.Second && c.MaxRetention < c.MessageRetention {
		c.MessageRetention = c.MaxRetention
	}
	if c.ZombieTTL == 0 {
		c.ZombieTTL = DefaultZombieTTL
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.DedupWindow == 0 {
		c.DedupWindow = DefaultDedupWindow
	}
	if c.PoisonRules.MaxFailures > 0 && c.PoisonRules.Window == 0 {
		c.PoisonRules.Window = DefaultPoisonWindow
	}
	return c
}

// Validate reports the first invalid field of a config that WithDefaults was applied to. The error
// wraps ErrInvalidArgument and names the field.
func (c TopicConfig) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s %s", ErrInvalidArgument, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Semantics != Queue && c.Semantics != PubSub:
		return bad("semantics", "must be QUEUE or PUB_SUB, got %q", c.Semantics)
	case c.Partitions < 1 || c.Partitions > MaxPartitions:
		return bad("partitions", "must be between 1 and %d, got %d", MaxPartitions, c.Partitions)
	case c.AckWait < time.Millisecond || c.AckWait > 24*time.Hour:
		return bad("ack_wait", "must be between 1ms and 24h, got %s", c.AckWait)
	case c.MaxDeliveries < 1 || c.MaxDeliveries > 1000:
		return bad("max_deliveries", "must be between 1 and 1000, got %d", c.MaxDeliveries)
	case c.MessageRetention < 0:
		return bad("message_retention", "must not be negative, got %s", c.MessageRetention)
	case c.ZeroSubscriptionRetention < 0:
		return bad("zero_subscription_retention", "must not be negative, got %s", c.ZeroSubscriptionRetention)
	case c.CompletionTracking != Watermark && c.CompletionTracking != Refcount:
		return bad("completion_tracking", "must be watermark or refcount, got %q", c.CompletionTracking)
	case c.MaxRetention < time.Second:
		return bad("max_retention", "must be at least 1s, got %s", c.MaxRetention)
	case c.MessageRetention > c.MaxRetention:
		return bad("message_retention", "(%s) must not exceed max_retention (%s)", c.MessageRetention, c.MaxRetention)
	case c.ZombieTTL < MinZombieTTL:
		return bad("zombie_ttl", "must be at least %s, got %s", MinZombieTTL, c.ZombieTTL)
	case c.ZombieTTL > c.MaxRetention && c.ZombieTTL != DefaultZombieTTL:
		// The default is let through: it merely never fires on topics capped below 7 days.
		return bad("zombie_ttl", "(%s) must not exceed max_retention (%s): max_retention would remove the messages first",
			c.ZombieTTL, c.MaxRetention)
	case c.MaxMessageBytes < 1 || c.MaxMessageBytes > MaxMessageBytesLimit:
		return bad("max_message_bytes", "must be between 1 and %d, got %d", MaxMessageBytesLimit, c.MaxMessageBytes)
	case c.DedupWindow < time.Millisecond || c.DedupWindow > MaxDedupWindow:
		return bad("dedup_window", "must be between 1ms and %s, got %s", MaxDedupWindow, c.DedupWindow)
	case c.MaxBacklogMessages < 0:
		return bad("max_backlog_messages", "must not be negative (0: no bound), got %d", c.MaxBacklogMessages)
	case c.MaxBacklogBytes < 0:
		return bad("max_backlog_bytes", "must not be negative (0: no bound), got %d", c.MaxBacklogBytes)
	case c.BacklogPolicy != "" && c.BacklogPolicy != BacklogReject && c.BacklogPolicy != BacklogThrottle:
		return bad("backlog_policy", "must be reject or throttle, got %q", c.BacklogPolicy)
	case c.MaxMessages < 0:
		return bad("max_messages", "must not be negative (0: no bound), got %d", c.MaxMessages)
	case c.MaxBytes < 0:
		return bad("max_bytes", "must not be negative (0: no bound), got %d", c.MaxBytes)
	case c.SizePolicy != "" && c.SizePolicy != SizeKeepNeeded && c.SizePolicy != SizeDropOldest:
		return bad("size_policy", "must be keep_needed or drop_oldest, got %q", c.SizePolicy)
	case c.PoisonRules.MaxFailures < 0 || c.PoisonRules.MaxFailures > MaxFailureHistory:
		return bad("poison_rules.max_failures", "must be between 0 (off) and %d, got %d", MaxFailureHistory, c.PoisonRules.MaxFailures)
	case c.PoisonRules.MaxFailures > 0 && (c.PoisonRules.Window < time.Millisecond || c.PoisonRules.Window > 24*time.Hour):
		return bad("poison_rules.window", "must be between 1ms and 24h, got %s", c.PoisonRules.Window)
	case c.PoisonRules.MaxFailures == 0 && c.PoisonRules.Window != 0:
		return bad("poison_rules.window", "needs poison_rules.max_failures, got %s without it", c.PoisonRules.Window)
	}
	return nil
}

// Topic is a stored topic.
type Topic struct {
	Name      string      `json:"name"`
	Config    TopicConfig `json:"config"`
	CreatedAt time.Time   `json:"created_at"`
}

// Message is one stored message. Its identity is (Topic, Partition, Offset).
type Message struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Offset is gapless and increases by one inside a partition in the order messages become
	// visible.
	Offset  int64             `json:"offset"`
	Key     []byte            `json:"key,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	Payload []byte            `json:"payload"`
	// PublishedAt is the broker's clock at append time, never the client's. Non-decreasing inside a
	// partition.
	PublishedAt time.Time `json:"published_at"`
	// ProducerID is the producer's own message id, used for de-duplication. Empty if none.
	ProducerID string `json:"producer_id,omitempty"`
	// NotBefore delays delivery until that time (zero: deliver at once).
	NotBefore time.Time `json:"not_before,omitzero"`
	// ExpiresAt drops the message undelivered after that time (zero: never).
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// Linked is set by the engine at append time (batches.go, LinkRuns): the next offset of the
	// partition was written by the same publish and a batch must not end between the two (a key
	// of that publish's messages in the partition so far comes again after this one).
	Linked bool `json:"linked,omitempty"`
}

// Size is the number of bytes MaxMessageBytes bounds: key, header names and values, and payload.
func (m *Message) Size() int {
	n := len(m.Key) + len(m.Payload)
	for k, v := range m.Headers {
		n += len(k) + len(v)
	}
	return n
}

// MessageID formats the id shown to users (BRIEF.md 2b): the offset when the topic has one
// partition, "partition:offset" otherwise.
func MessageID(partitions int, partition int32, offset int64) string {
	if partitions <= 1 {
		return strconv.FormatInt(offset, 10)
	}
	return strconv.FormatInt(int64(partition), 10) + ":" + strconv.FormatInt(offset, 10)
}

// ParseMessageID parses an id made by MessageID. A bare offset means partition 0.
func ParseMessageID(id string) (partition int32, offset int64, err error) {
	p, o, found := strings.Cut(id, ":")
	if !found {
		o, p = p, "0"
	}
	pp, err1 := strconv.ParseInt(p, 10, 32)
	oo, err2 := strconv.ParseInt(o, 10, 64)
	if err1 != nil || err2 != nil || pp < 0 || oo < 0 {
		return 0, 0, fmt.Errorf("%w: message id %q: want OFFSET or PARTITION:OFFSET", ErrInvalidArgument, id)
	}
	return int32(pp), oo, nil
}

// SubscriptionState is the lifecycle state of a subscription (seed 000).
type SubscriptionState string

const (
	// Active subscriptions receive messages and hold retention.
	Active SubscriptionState = "ACTIVE"
	// Paused subscriptions receive nothing and keep holding retention (bounded by max_retention).
	Paused SubscriptionState = "PAUSED"
	// Dead subscriptions had no live member for the heartbeat timeout; they stop holding retention
	// and are resurrected when a member comes back.
	Dead SubscriptionState = "DEAD"
	// Cancelled subscriptions release everything at once; terminal.
	Cancelled SubscriptionState = "CANCELLED"
	// Deleted is the final state the cleanup job moves cancelled subscriptions to.
	Deleted SubscriptionState = "DELETED"
)

// CanTransition reports whether seed 000 allows a subscription to move from one state to another:
// ACTIVE to PAUSED (pause), DEAD (heartbeat timeout) or CANCELLED; PAUSED to ACTIVE (resume) or
// CANCELLED; DEAD to ACTIVE (a member came back) or CANCELLED; CANCELLED to DELETED (after
// subscription_retention). CANCELLED is terminal otherwise and DELETED is final. A PAUSED
// subscription never goes DEAD: pausing is an operator's decision, heartbeats do not judge it.
func CanTransition(from, to SubscriptionState) bool {
	switch from {
	case Active:
		return to == Paused || to == Dead || to == Cancelled
	case Paused:
		return to == Active || to == Cancelled
	case Dead:
		return to == Active || to == Cancelled
	case Cancelled:
		return to == Deleted
	}
	return false
}

// HoldsRetention reports whether a subscription in this state keeps messages it has not completed.
func (s SubscriptionState) HoldsRetention() bool { return s == Active || s == Paused }

// StartKind says where a new subscription starts.
type StartKind string

const (
	// FromNow starts after the last message published before the subscription was created. Default.
	FromNow StartKind = "FROM_NOW"
	// FromBeginning starts at the first retained message.
	FromBeginning StartKind = "FROM_BEGINNING"
	// FromTimestamp starts at the first message published at or after Time (broker clock).
	FromTimestamp StartKind = "FROM_TIMESTAMP"
	// FromMessageID starts at (Partition, Offset) in that partition and, in the other partitions, at
	// the first message published at or after that message's publish time.
	FromMessageID StartKind = "FROM_MESSAGE_ID"
)

// StartPosition is where a new subscription starts. The zero value means FROM_NOW.
type StartPosition struct {
	Kind      StartKind `json:"kind"`
	Time      time.Time `json:"time,omitzero"`
	Partition int32     `json:"partition,omitempty"`
	Offset    int64     `json:"offset,omitempty"`
}

// Subscription is a durable (or ephemeral) registration of a consumer group on one topic.
type Subscription struct {
	// ID is assigned by the engine, unique over the engine's lifetime, never reused.
	ID    int64  `json:"id"`
	Topic string `json:"topic"`
	// Group is the consumer group. The one subscription of a QUEUE topic has the group QueueGroup.
	Group string `json:"group"`
	// Pattern is the binding pattern that created this subscription, empty if it was created
	// directly.
	Pattern string `json:"pattern,omitempty"`
	// Ephemeral subscriptions are not persisted: they end with their member and hold no retention
	// afterwards. An engine restart forgets them.
	Ephemeral bool              `json:"ephemeral,omitempty"`
	State     SubscriptionState `json:"state"`
	Start     StartPosition     `json:"start"`
	// Mode is ModeShared ("") or ModeOrdered; it never changes (ErrModeConflict).
	Mode SubscriptionMode `json:"mode,omitempty"`
	// MaxInFlightPerPartition (ordered only) bounds the unsettled deliveries of one partition.
	MaxInFlightPerPartition int `json:"max_in_flight_per_partition,omitempty"`
	// Strategy (ordered only) is the assignment strategy the broker runs; the current one is
	// Assignment.Strategy (SubscriptionAssign may change it).
	Strategy  string    `json:"strategy,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// UpdatedAt is the time of the last change of State (or Start); for a CANCELLED subscription
	// the time it was cancelled, from which subscription_retention counts.
	UpdatedAt time.Time `json:"updated_at"`
	// HeartbeatTimeout is how long an ACTIVE subscription may go without a heartbeat (a live
	// member) before it becomes DEAD. Engines store DefaultHeartbeatTimeout for zero.
	HeartbeatTimeout time.Duration `json:"heartbeat_timeout,omitempty"`
	// LastHeartbeatAt is the last heartbeat (Engine.SubscriptionsHeartbeat), or when the
	// subscription was created or last became ACTIVE, whichever is later. The embedded engine
	// keeps it in memory: at Open every subscription gets a fresh timeout.
	LastHeartbeatAt time.Time `json:"last_heartbeat_at,omitzero"`
	// StartOffsets is engine bookkeeping that callers always get as nil: the offsets Start resolved
	// to per partition when it was last set, kept by the embedded engine in its metadata (a
	// subscription has progress once an ack floor or cursor left them: SubscriptionConfigure).
	StartOffsets []int64 `json:"start_offsets,omitempty"`
	// MaxBackfillMessages is the bound of its backfill ranges as created (0: the default,
	// DefaultMaxBackfillMessages; UnlimitedBackfill: none).
	MaxBackfillMessages int64 `json:"max_backfill_messages,omitempty"`
	// Backfill is the current backfill range, nil when the subscription never had one (it
	// started at the log end). See Backfill.Progress for its progress.
	Backfill *Backfill `json:"backfill,omitempty"`
}

const (
	// DefaultHeartbeatTimeout is a subscription's heartbeat timeout unless set (seed 000: 300 s).
	DefaultHeartbeatTimeout = 300 * time.Second
	// MinHeartbeatTimeout and MaxHeartbeatTimeout bound a subscription's heartbeat timeout. 5 s
	// keeps seed 000's rule (detection interval at most 20% of the timeout) with the broker's
	// shortest detection interval, 1 s.
	MinHeartbeatTimeout = 5 * time.Second
	MaxHeartbeatTimeout = 7 * 24 * time.Hour
	// DefaultSubscriptionRetention is how long a CANCELLED subscription is kept before it becomes
	// DELETED (seed 000: 30 days).
	DefaultSubscriptionRetention = 30 * 24 * time.Hour
)

// QueueGroup is the group name of the one subscription of a QUEUE topic.
const QueueGroup = "$queue"

// Binding is a durable group's registration on a topic pattern: every topic that matches it, now or
// created later, gets a subscription for the group (PUB_SUB topics) or shares the queue subscription
// (QUEUE topics). A binding on a plain topic name is deleted with that topic (Engine.TopicDelete);
// a wildcard binding lives until BindingDelete.
type Binding struct {
	Group     string        `json:"group"`
	Pattern   string        `json:"pattern"`
	Start     StartPosition `json:"start"`
	CreatedAt time.Time     `json:"created_at"`
}

// Delivery is a message leased to a member of a subscription.
type Delivery struct {
	Message
	SubscriptionID int64 `json:"subscription_id"`
	// Attempt is 1 for the first delivery and grows by one with every redelivery.
	Attempt int `json:"attempt"`
	// Member holds the lease until LeaseDeadline.
	Member        string    `json:"member"`
	LeaseDeadline time.Time `json:"lease_deadline"`
	// Generation is, in an ORDERED subscription, the generation of the claim (the member's acks,
	// nacks and extends carry it); 0 in a shared one.
	Generation int64 `json:"generation,omitempty"`
	// Batch is, for a batch claim (DeliveriesClaimParams.BatchSize), the batch the delivery
	// belongs to; zero otherwise.
	Batch BatchID `json:"batch,omitzero"`
}

// Ref returns the reference used to ack, nack or extend this delivery.
func (d *Delivery) Ref() DeliveryRef {
	return DeliveryRef{Partition: d.Partition, Offset: d.Offset}
}

// DeliveryRef names a message inside a subscription.
type DeliveryRef struct {
	Partition int32 `json:"partition"`
	Offset    int64 `json:"offset"`
}

// DLQEntry is a dead-lettered message of one subscription. It holds a copy of the message, so that
// retention of the topic's log never removes it; it lives until replayed, purged, or older than the
// topic's max_retention.
type DLQEntry struct {
	// ID is unique inside the subscription's DLQ and increases with time.
	ID             int64     `json:"id"`
	SubscriptionID int64     `json:"subscription_id"`
	Message        Message   `json:"message"`
	Reason         DLQReason `json:"reason"`
	Attempts       int       `json:"attempts"`
	LastError      string    `json:"last_error,omitempty"`
	DeadAt         time.Time `json:"dead_at"`
	// Rule is the poison rule that dead-lettered the message (Reason DLQPoison), else empty.
	Rule PoisonRule `json:"rule,omitempty"`
	// Failures are the message's last failures (at most MaxFailureHistory, oldest first), kept
	// while its topic had a poison rule on; empty otherwise.
	Failures []DeliveryFailure `json:"failures,omitempty"`
}

// DeliveryFailure is one failed delivery of a message: a nack by Member with Reason at At.
type DeliveryFailure struct {
	Member string    `json:"member"`
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at"`
}

// PoisonRule names a poison rule (TopicConfig.PoisonRules) in DLQ entries.
type PoisonRule string

const (
	// RuleSameReason: the same nack reason from more than one member.
	RuleSameReason PoisonRule = "same_reason_multiple_members"
	// RuleFailuresInWindow: max_failures failures within the window.
	RuleFailuresInWindow PoisonRule = "failures_in_window"
)

// DLQReason says why a message was dead-lettered.
type DLQReason string

const (
	// DLQMaxDeliveries: the lease expired or the message was nacked on its max_deliveries-th
	// delivery.
	DLQMaxDeliveries DLQReason = "max_deliveries"
	// DLQRejected: a member nacked the message straight to the DLQ.
	DLQRejected DLQReason = "rejected"
	// DLQPoison: a poison rule fired (DLQEntry.Rule says which).
	DLQPoison DLQReason = "poison"
)

// PartitionStats describes one partition of a topic.
type PartitionStats struct {
	Partition int32 `json:"partition"`
	// LowOffset is the first retained offset; HighWater is the offset the next message gets.
	LowOffset int64 `json:"low_offset"`
	HighWater int64 `json:"high_water"`
	Bytes     int64 `json:"bytes"`
	// Damaged reports a partition the embedded engine found damaged (storage.ErrPartitionDamaged):
	// it is unavailable until repaired. When it was damaged at Open, the offsets and size are 0
	// (unknown).
	Damaged bool `json:"damaged,omitempty"`
}

// TopicStats describes a topic's log.
type TopicStats struct {
	Topic      string           `json:"topic"`
	Messages   int64            `json:"messages"`
	Bytes      int64            `json:"bytes"`
	Partitions []PartitionStats `json:"partitions"`
}

// SubscriptionPartitionStats is a subscription's position in one partition.
type SubscriptionPartitionStats struct {
	Partition int32 `json:"partition"`
	// AckFloor: every offset below it is done (acked or dead-lettered).
	AckFloor int64 `json:"ack_floor"`
	// Cursor: the next offset never delivered to this subscription.
	Cursor    int64 `json:"cursor"`
	HighWater int64 `json:"high_water"`
}

// SubscriptionStats is the health of a subscription.
type SubscriptionStats struct {
	SubscriptionID int64 `json:"subscription_id"`
	// Pending counts messages not yet done: never delivered, leased, or waiting for redelivery.
	Pending int64 `json:"pending"`
	// Lag counts messages never delivered (high-water mark minus cursor, over partitions).
	Lag int64 `json:"lag"`
	// InFlight counts leased messages.
	InFlight int64 `json:"in_flight"`
	// Redelivering counts messages waiting for their redelivery backoff or ready for redelivery.
	Redelivering int64 `json:"redelivering"`
	// DeadLettered counts entries in the subscription's DLQ.
	DeadLettered int64                        `json:"dead_lettered"`
	Partitions   []SubscriptionPartitionStats `json:"partitions"`
}

// Clock is the time seam: engines read the time only through it, so tests can drive leases,
// backoff and retention without sleeping.
type Clock interface {
	Now() time.Time
}

// SystemClock is the real clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }
