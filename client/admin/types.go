package admin

import (
	"encoding/json"
	"fmt"
	"time"
)

// The JSON bodies of the admin REST API (/api/v1). The server (internal/admin) writes and reads
// these very types, so a field here is a field on the wire; JSON names never change.

// Duration is a time.Duration in JSON: written as a Go duration string ("30s", "1h0m0s"), read
// from such a string or from a number of milliseconds.
type Duration time.Duration

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON reads a duration string or a number of milliseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration %q: want a Go duration such as \"30s\" or a number of milliseconds", s)
		}
		*d = Duration(v)
		return nil
	}
	var ms float64
	if err := json.Unmarshal(b, &ms); err != nil {
		return fmt.Errorf("duration %s: want a Go duration such as \"30s\" or a number of milliseconds", b)
	}
	*d = Duration(time.Duration(ms * float64(time.Millisecond)))
	return nil
}

// Semantics says how a topic's messages reach consumers.
type Semantics string

const (
	// Queue: one subscription (group QueueGroup) that every consumer shares.
	Queue Semantics = "QUEUE"
	// PubSub: one subscription per consumer group; each message goes to every group.
	PubSub Semantics = "PUB_SUB"
)

// CompletionTracking selects how a topic decides that a message is done.
type CompletionTracking string

const (
	// Watermark completes per group through ack floors (the default).
	Watermark CompletionTracking = "watermark"
	// Refcount makes a message wait for the groups live when it was published and keeps a
	// completion record per message (Client.MessageCompletion).
	Refcount CompletionTracking = "refcount"
)

// BacklogPolicy is what a topic does to publishers over its backlog bound.
type BacklogPolicy string

// Backlog policies; empty means BacklogReject.
const (
	BacklogReject   BacklogPolicy = "reject"
	BacklogThrottle BacklogPolicy = "throttle"
)

// SizePolicy is what a topic over max_messages or max_bytes removes.
type SizePolicy string

// Size policies; empty means SizeKeepNeeded.
const (
	SizeKeepNeeded SizePolicy = "keep_needed"
	SizeDropOldest SizePolicy = "drop_oldest"
)

// SubscriptionState is the lifecycle state of a group's subscription.
type SubscriptionState string

const (
	// Active groups receive messages and hold retention.
	Active SubscriptionState = "ACTIVE"
	// Paused groups receive nothing and keep holding retention.
	Paused SubscriptionState = "PAUSED"
	// Dead groups had no live consumer for their heartbeat timeout; they hold no retention
	// until a consumer comes back or Client.ResurrectGroup.
	Dead SubscriptionState = "DEAD"
	// Cancelled groups release everything; terminal.
	Cancelled SubscriptionState = "CANCELLED"
	// Deleted is the final state of a cancelled group.
	Deleted SubscriptionState = "DELETED"
)

// StartKind says where a new group starts.
type StartKind string

const (
	// FromNow starts after the last message published before the group was created (default).
	FromNow StartKind = "FROM_NOW"
	// FromBeginning starts at the first retained message.
	FromBeginning StartKind = "FROM_BEGINNING"
	// FromTimestamp starts at the first message published at or after StartPosition.Time.
	FromTimestamp StartKind = "FROM_TIMESTAMP"
	// FromMessageID starts at (Partition, Offset), and in the other partitions at the first
	// message published at or after that message.
	FromMessageID StartKind = "FROM_MESSAGE_ID"
)

// StartPosition is where a new group starts. The zero value means FROM_NOW.
type StartPosition struct {
	Kind      StartKind `json:"kind"`
	Time      time.Time `json:"time,omitzero"`
	Partition int32     `json:"partition,omitempty"`
	Offset    int64     `json:"offset,omitempty"`
}

// BackfillState is the state of a group's backfill.
type BackfillState string

const (
	// BackfillNotStarted: the group has no backfill range (it started at the log end).
	BackfillNotStarted BackfillState = "NOT_STARTED"
	// BackfillInProgress: the broker delivers the range at an adaptive rate.
	BackfillInProgress BackfillState = "IN_PROGRESS"
	// BackfillCompleted: every message of the range is done.
	BackfillCompleted BackfillState = "COMPLETED"
	// BackfillCancelled: stopped by Client.CancelBackfill; the rest is held back until
	// Client.ResumeBackfill (or given up with skip).
	BackfillCancelled BackfillState = "CANCELLED"
	// BackfillFailed: the broker could not go on; Client.ResumeBackfill retries.
	BackfillFailed BackfillState = "FAILED"
)

// CompletionState is the state of one group in a message's completion record.
type CompletionState string

const (
	// CompletionPending: the group has not acked or dead-lettered the message.
	CompletionPending CompletionState = "pending"
	// CompletionAcked: the group acked it.
	CompletionAcked CompletionState = "acked"
	// CompletionDeadLettered: it went to the group's dead-letter queue.
	CompletionDeadLettered CompletionState = "dead_lettered"
	// CompletionRemoved: the group left (DEAD or CANCELLED) while the message was pending for it.
	CompletionRemoved CompletionState = "removed"
)

// ErrorBody is the JSON body of every error answer; Client turns it into an *APIError.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the error of an ErrorBody.
type ErrorDetail struct {
	// Code is the protocol error name (docs/protocol.md section 9.2: TOPIC_NOT_FOUND,
	// INVALID_ARGUMENT, ...), or one of the HTTP-only names NOT_FOUND, METHOD_NOT_ALLOWED.
	Code      string `json:"code"`
	Message   string `json:"message"`
	Retryable bool   `json:"retryable"`
}

// Status is the body of the probes /healthz and /readyz.
type Status struct {
	Status string `json:"status"`
	// Detail says what is degraded while the broker stays ready: the cleanup jobs that fall
	// behind or whose backlog exceeds 1,000,000 messages (Client.Cleanup has the figures).
	Detail string `json:"detail,omitempty"`
}

// TopicConfig is a topic's configuration. Zero fields mean the default when creating a topic.
type TopicConfig struct {
	Semantics                      Semantics          `json:"semantics,omitempty"`
	Partitions                     int                `json:"partitions,omitempty"`
	AckWait                        Duration           `json:"ack_wait,omitempty"`
	MaxDeliveries                  int                `json:"max_deliveries,omitempty"`
	MessageRetention               Duration           `json:"message_retention,omitempty"`
	ZeroSubscriptionRetention      Duration           `json:"zero_subscription_retention,omitempty"`
	BlockWritesOnZeroSubscriptions bool               `json:"block_writes_on_zero_subscriptions"`
	CompletionTracking             CompletionTracking `json:"completion_tracking,omitempty"`
	MaxRetention                   Duration           `json:"max_retention,omitempty"`
	ZombieTTL                      Duration           `json:"zombie_ttl,omitempty"`
	MaxMessageBytes                int                `json:"max_message_bytes,omitempty"`
	DedupWindow                    Duration           `json:"dedup_window,omitempty"`
	MaxBacklogMessages             int64              `json:"max_backlog_messages,omitempty"`
	MaxBacklogBytes                int64              `json:"max_backlog_bytes,omitempty"`
	BacklogPolicy                  BacklogPolicy      `json:"backlog_policy,omitempty"`
	MaxMessages                    int64              `json:"max_messages,omitempty"`
	MaxBytes                       int64              `json:"max_bytes,omitempty"`
	SizePolicy                     SizePolicy         `json:"size_policy,omitempty"`
	// PoisonRules is shown only when a rule is on; null in an update turns them off.
	PoisonRules *PoisonRules `json:"poison_rules,omitempty"`
}

// PoisonRules dead-letter a message early: when the same nack reason comes from more than one
// member (distinct_members), or after max_failures nacks within window (default 30s).
type PoisonRules struct {
	DistinctMembers bool     `json:"distinct_members"`
	MaxFailures     int      `json:"max_failures"`
	Window          Duration `json:"window,omitempty"`
}

// Topic is a topic with its configuration, statistics and backpressure state.
type Topic struct {
	Name      string      `json:"name"`
	Config    TopicConfig `json:"config"`
	CreatedAt time.Time   `json:"created_at"`
	Stats     *TopicStats `json:"stats,omitempty"`
	// Subscriptions counts the topic's subscriptions that are not DELETED.
	Subscriptions int `json:"subscriptions"`
	// Members counts the members of the answering broker attached to the topic.
	Members int `json:"members"`
	// Backpressure is the state of a topic with a backlog bound.
	Backpressure *Backpressure `json:"backpressure,omitempty"`
	// SizeBoundExceeded: the topic holds more than its max_messages or max_bytes.
	SizeBoundExceeded bool `json:"size_bound_exceeded,omitempty"`
}

// TopicStats describes a topic's log.
type TopicStats struct {
	Topic      string           `json:"topic"`
	Messages   int64            `json:"messages"`
	Bytes      int64            `json:"bytes"`
	Partitions []PartitionStats `json:"partitions"`
}

// PartitionStats describes one partition of a topic.
type PartitionStats struct {
	Partition int32 `json:"partition"`
	// LowOffset is the first retained offset; HighWater is the offset the next message gets.
	LowOffset int64 `json:"low_offset"`
	HighWater int64 `json:"high_water"`
	Bytes     int64 `json:"bytes"`
	// Damaged reports a partition the embedded engine found damaged: unavailable until repaired.
	Damaged bool `json:"damaged,omitempty"`
}

// Backpressure is the state of a topic with a backlog bound: normal, throttled or rejecting, the
// backlog, and the publishes throttled and rejected since the broker started.
type Backpressure struct {
	State              string        `json:"state"`
	Policy             BacklogPolicy `json:"policy"`
	BacklogMessages    int64         `json:"backlog_messages"`
	BacklogBytes       int64         `json:"backlog_bytes"`
	MaxBacklogMessages int64         `json:"max_backlog_messages,omitempty"`
	MaxBacklogBytes    int64         `json:"max_backlog_bytes,omitempty"`
	Delay              Duration      `json:"delay"`
	RetryAfter         Duration      `json:"retry_after"`
	Throttled          int64         `json:"throttled"`
	Rejected           int64         `json:"rejected"`
	UpdatedAt          time.Time     `json:"updated_at"`
}

// CreateTopicRequest is the body of POST /api/v1/topics (Client.CreateTopic): the name and the
// configuration fields (zero or absent fields take the defaults). retention_policy.max_age
// (seconds) is seed 002's spelling of message_retention.
type CreateTopicRequest struct {
	Name string `json:"name"`
	TopicConfig
	RetentionPolicy *RetentionPolicy `json:"retention_policy,omitempty"`
}

// RetentionPolicy is seed 002's retention object.
type RetentionPolicy struct {
	// MaxAge is message_retention in seconds.
	MaxAge float64 `json:"max_age"`
}

// TopicList is the answer of GET /api/v1/topics (Client.Topics).
type TopicList struct {
	Topics []Topic `json:"topics"`
	// Total counts the topics that match the pattern, before paging.
	Total  int `json:"total"`
	Limit  int `json:"limit"`
	Offset int `json:"offset"`
}

// Member is a live consumer connected to the answering broker.
type Member struct {
	// ID is the member's ID.
	ID string `json:"id"`
	// Pattern is the topic name or pattern it subscribed with.
	Pattern string `json:"pattern"`
	// Group is its consumer group, empty if none.
	Group string `json:"group,omitempty"`
	// Filter is its member filter, empty if none.
	Filter string `json:"filter,omitempty"`
	// MaxInFlight is its credit.
	MaxInFlight int `json:"max_in_flight"`
	// InFlight counts the deliveries the member holds.
	InFlight int `json:"in_flight"`
	// Delivered counts the deliveries handed to the member since it subscribed.
	Delivered int64 `json:"delivered"`
	// SubscriptionCount is the number of subscriptions the member is attached to.
	SubscriptionCount int `json:"subscription_count"`
	// Subscriptions are the IDs of those subscriptions; left out in the group listings.
	Subscriptions []int64 `json:"subscriptions,omitempty"`
}

// SubscriptionPartitionStats is a group's position in one partition.
type SubscriptionPartitionStats struct {
	Partition int32 `json:"partition"`
	// AckFloor: every offset below it is done (acked or dead-lettered).
	AckFloor int64 `json:"ack_floor"`
	// Cursor: the next offset never delivered to this group.
	Cursor    int64 `json:"cursor"`
	HighWater int64 `json:"high_water"`
}

// BackfillInfo is a group's backfill (its catch-up range) with its progress.
type BackfillInfo struct {
	State     BackfillState `json:"state"`
	Processed int64         `json:"processed"`
	Total     int64         `json:"total"`
	Remaining int64         `json:"remaining"`
	// Skipped counts messages the group will not get (cut by the bound, or skipped).
	Skipped     int64 `json:"skipped"`
	MaxMessages int64 `json:"max_messages,omitempty"`
	// Rate is the processed messages per second the answering broker measured (0 when it has
	// no consumer of the group); RateLimit is its current claim rate limit.
	Rate      float64 `json:"rate"`
	RateLimit float64 `json:"rate_limit,omitempty"`
	// ETASeconds is Remaining / Rate (0 when unknown).
	ETASeconds float64   `json:"eta_seconds,omitempty"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	UpdatedAt  time.Time `json:"updated_at,omitzero"`
	Error      string    `json:"error,omitempty"`
}

// Group is a subscription (a consumer group on a topic) with its health.
type Group struct {
	Topic          string            `json:"topic"`
	Group          string            `json:"group"`
	SubscriptionID int64             `json:"subscription_id"`
	State          SubscriptionState `json:"state"`
	Pattern        string            `json:"pattern,omitempty"`
	Ephemeral      bool              `json:"ephemeral"`
	Start          StartPosition     `json:"start"`
	CreatedAt      time.Time         `json:"created_at"`
	UpdatedAt      time.Time         `json:"updated_at"`
	// HeartbeatTimeout: without a live member for this long the group becomes DEAD.
	HeartbeatTimeout Duration `json:"heartbeat_timeout"`
	// LastHeartbeatAt is the last time a broker saw a member of the group (or it became ACTIVE).
	LastHeartbeatAt time.Time `json:"last_heartbeat_at"`
	// Backfill is the group's catch-up range and its progress.
	Backfill    *BackfillInfo `json:"backfill,omitempty"`
	MemberCount int           `json:"member_count"`
	// Members describe the members of the answering broker attached to the group. In the group
	// listings they carry subscription_count but not their subscription IDs.
	Members      []Member                     `json:"members"`
	Pending      int64                        `json:"pending"`
	Lag          int64                        `json:"lag"`
	InFlight     int64                        `json:"in_flight"`
	Redelivering int64                        `json:"redelivering"`
	DeadLettered int64                        `json:"dead_lettered"`
	Partitions   []SubscriptionPartitionStats `json:"partitions"`
	// Processed, Failed and Filtered are seed 000's group counters, counted by the broker
	// instance that answers, since it started (the engines keep no such totals): messages acks
	// through this instance completed (an ack of a message already done is not counted again),
	// deliveries nacked through it (given back or dead-lettered by the nack; lease expiries are
	// not counted), and messages it completed without a delivery because no member's filter
	// matched. With a shared PostgreSQL engine each instance counts its own; a restart zeroes them.
	Processed int64 `json:"processed"`
	Failed    int64 `json:"failed"`
	Filtered  int64 `json:"filtered"`
	// OldestUnackedAt is the publish time of the oldest message the group has not completed, and
	// OldestUnackedAge its age; absent when none is left, and in ListGroups.
	OldestUnackedAt  *time.Time `json:"oldest_unacked_at,omitempty"`
	OldestUnackedAge *Duration  `json:"oldest_unacked_age,omitempty"`
	// Health is OK, WARN (receives, but see reasons) or FAIL (DEAD, PAUSED or CANCELLED: receives
	// nothing); Reasons say why, empty when OK.
	Health  string   `json:"health"`
	Reasons []string `json:"reasons"`
	// Mode is "shared" or "ordered"; the fields below are for ordered groups only: the
	// assignment strategy, the unsettled bound per partition, the generation (incremented by
	// every rebalance) and the assignment (member name to partitions, on every broker instance).
	Mode                    string             `json:"mode"`
	Strategy                string             `json:"strategy,omitempty"`
	MaxInFlightPerPartition int                `json:"max_in_flight_per_partition,omitempty"`
	Generation              int64              `json:"generation,omitempty"`
	Assignment              map[string][]int32 `json:"assignment,omitempty"`
}

// GroupList is the answer of the group listings (Client.ListGroups, Client.TopicGroups).
type GroupList struct {
	Groups []Group `json:"groups"`
	// NextAfterID is the after_id of the next page of either listing (GET /api/v1/groups, GET
	// /api/v1/topics/{topic}/groups: pages of at most 1000); absent on the last page.
	NextAfterID *int64 `json:"next_after_id,omitempty"`
}

// CreateGroupRequest is the body of POST /api/v1/topics/{topic}/groups: a consumer group created
// ahead of its consumers on a PUB_SUB topic.
type CreateGroupRequest struct {
	// Group is the consumer group. Required.
	Group string `json:"group"`
	// Start is where the group starts (FROM_NOW by default).
	Start StartPosition `json:"start"`
	// HeartbeatTimeout is how long the group may have no live consumer before it becomes DEAD
	// (default 300s, 5s to 168h).
	HeartbeatTimeout Duration `json:"heartbeat_timeout,omitempty"`
	// MaxBackfillMessages bounds the group's backfill ranges (the messages from its start to the
	// log end at creation, and what it missed while DEAD): only the newest are kept, the others
	// are counted in spool_backfill_missed_messages_total. 0: 1,000,000 (default); -1: no bound.
	MaxBackfillMessages int64 `json:"max_backfill_messages,omitempty"`
	// Mode is "shared" (the default: any consumer gets any message) or "ordered" (each partition
	// is owned by one consumer at a time and delivered in offset order; its consumers subscribe
	// ordered).
	Mode string `json:"mode,omitempty"`
	// Strategy assigns an ordered group's partitions to its consumers: "round-robin" (default)
	// or "sticky".
	Strategy string `json:"strategy,omitempty"`
	// MaxInFlightPerPartition is how many messages of one partition an ordered group leaves
	// unsettled at a time (default 1, at most 1000).
	MaxInFlightPerPartition int `json:"max_in_flight_per_partition,omitempty"`
}

// UpdateGroupRequest is the body of PUT /api/v1/topics/{topic}/groups/{group}/config: what to
// change (absent fields keep their values).
type UpdateGroupRequest struct {
	// Start is the new start position, accepted only while the group has delivered nothing
	// (409 INVALID_TRANSITION otherwise).
	Start *StartPosition `json:"start,omitempty"`
	// HeartbeatTimeout is the new heartbeat timeout.
	HeartbeatTimeout Duration `json:"heartbeat_timeout,omitempty"`
}

// ResurrectRequest is the optional body of POST .../groups/{group}/resurrect.
type ResurrectRequest struct {
	// Backfill delivers what the group missed while DEAD, from its ack floors to the log end,
	// bounded to its newest max_backfill_messages (what a consumer subscribing does too). Without
	// it the group gives all of that up (counted in spool_backfill_missed_messages_total).
	Backfill bool `json:"backfill,omitempty"`
}

// RebalanceRequest is the optional body of POST .../groups/{group}/rebalance.
type RebalanceRequest struct {
	// Strategy, when set, becomes the group's assignment strategy: round-robin or sticky.
	Strategy string `json:"strategy,omitempty"`
	// DropForeign leaves out the members other broker instances listed (PostgreSQL): an
	// operator's way to take the partitions of an instance that crashed.
	DropForeign bool `json:"drop_foreign,omitempty"`
}

// BackfillActionRequest is the optional body of POST .../groups/{group}/backfill/cancel.
type BackfillActionRequest struct {
	// Skip gives up the rest of the range at once (counted in
	// spool_backfill_missed_messages_total{reason="skipped"}); without it the rest is kept and
	// held back until resume.
	Skip bool `json:"skip,omitempty"`
}

// ForceCompleteRequest is the body of POST .../groups/{group}/force-complete and of
// POST /api/v1/topics/{topic}/force-complete.
type ForceCompleteRequest struct {
	// OlderThan: the group's messages published more than this ago are completed. Required, at
	// least 1s.
	OlderThan Duration `json:"older_than"`
	// Limit is the most messages one call completes or scans (default 100000, at most 1000000);
	// truncated in the answer says to call again.
	Limit int `json:"limit,omitempty"`
}

// ForceCompleteResult is the answer of POST .../groups/{group}/force-complete.
type ForceCompleteResult struct {
	Topic string `json:"topic"`
	Group string `json:"group"`
	// Completed counts the messages this call completed for the group (also counted in
	// spool_messages_force_completed_total{topic,group}).
	Completed int `json:"completed"`
	// AlreadyDone counts scanned messages the group had already completed.
	AlreadyDone int `json:"already_done"`
	// Before is the cutoff: messages published before it were completed.
	Before time.Time `json:"before"`
	// Truncated: the call stopped at its limit; call again for the rest.
	Truncated bool `json:"truncated"`
}

// ForceCompleteTopicResult is the answer of POST /api/v1/topics/{topic}/force-complete.
type ForceCompleteTopicResult struct {
	Topic string `json:"topic"`
	// Completed counts the messages completed over all the groups.
	Completed int `json:"completed"`
	// Before is the cutoff: messages published before it were completed.
	Before time.Time `json:"before"`
	// Truncated: the call stopped at its limit (which spans the groups); call again for the rest.
	Truncated bool `json:"truncated"`
	// Groups are the topic's groups (CANCELLED ones left out), each with its counts, or skipped
	// with the reason (an ORDERED group, or the limit reached before it).
	Groups []GroupForceComplete `json:"groups"`
}

// GroupForceComplete is one group's part of a ForceCompleteTopicResult.
type GroupForceComplete struct {
	Group string `json:"group"`
	// Completed and AlreadyDone are as in ForceCompleteResult; Truncated: the limit stopped the
	// call inside or before this group.
	Completed   int  `json:"completed"`
	AlreadyDone int  `json:"already_done"`
	Truncated   bool `json:"truncated"`
	// Skipped says why the group was not scanned (an ORDERED group, or the limit was reached
	// before it); empty when it was.
	Skipped string `json:"skipped,omitempty"`
}

// CleanupJob is one cleanup job of the answering broker: the retention job (message cleanup) or
// the subscription lifecycle job (dead detection, CANCELLED -> DELETED).
type CleanupJob struct {
	Job          string    `json:"job"`
	Interval     Duration  `json:"interval"`
	Runs         int64     `json:"runs"`
	Failures     int64     `json:"failures"`
	Removed      int64     `json:"removed"`
	LastRun      time.Time `json:"last_run,omitzero"`
	LastSuccess  time.Time `json:"last_success,omitzero"`
	LastDuration Duration  `json:"last_duration"`
	LastError    string    `json:"last_error,omitempty"`
	// Backlog is what the job could remove now and has not, after its last successful run
	// (retention: messages; seed 000's cleanupBacklog).
	Backlog int64 `json:"backlog"`
	// Behind is seed 000's CRITICAL rule: the job falls behind production (no successful run
	// for 3 intervals, a run longer than its interval, or a backlog that grew at each of the
	// last 3 runs). Warning is its WARNING rule: a backlog above 1,000,000 messages. Reason says
	// which rules fired, with the figures.
	Behind  bool   `json:"behind"`
	Warning bool   `json:"warning"`
	Reason  string `json:"reason,omitempty"`
}

// CleanupList is the answer of GET /api/v1/cleanup (Client.Cleanup).
type CleanupList struct {
	// Healthy is false when a job falls behind or has a warning (seed 000's isHealthy).
	Healthy bool         `json:"healthy"`
	Jobs    []CleanupJob `json:"jobs"`
}

// MessageCompletion is the completion record of a message of a refcount topic: the groups it
// waits or waited for, each with its state.
type MessageCompletion struct {
	// ID is the message id (the offset, or partition:offset on a topic with several partitions).
	ID          string    `json:"id"`
	Topic       string    `json:"topic"`
	Partition   int32     `json:"partition"`
	Offset      int64     `json:"offset"`
	PublishedAt time.Time `json:"published_at"`
	// Complete: no group is pending and at least one acked or dead-lettered it.
	Complete bool `json:"complete"`
	// Groups are ordered by subscription ID.
	Groups []GroupCompletion `json:"groups"`
}

// GroupCompletion is one group's entry in a message's completion record.
type GroupCompletion struct {
	SubscriptionID int64           `json:"subscription_id"`
	Group          string          `json:"group"`
	State          CompletionState `json:"state"`
	// At is when the group acked or dead-lettered the message, or left the set (removed). Zero
	// for pending, and for a removal made when the group came back (skipped).
	At time.Time `json:"at,omitzero"`
}
