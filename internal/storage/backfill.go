package storage

import (
	"fmt"
	"slices"
	"time"
)

// BackfillState is the state of a subscription's backfill (seed 000's backfill_status).
type BackfillState string

const (
	// BackfillNotStarted: the subscription has no backfill range (it started at the log end).
	BackfillNotStarted BackfillState = "NOT_STARTED"
	// BackfillInProgress: messages of the range are not all done yet; the broker delivers them at
	// an adaptive rate.
	BackfillInProgress BackfillState = "IN_PROGRESS"
	// BackfillCompleted: every message of the range is done (acked or dead-lettered). Derived
	// from the ack floors by Backfill.Progress, never stored.
	BackfillCompleted BackfillState = "COMPLETED"
	// BackfillCancelled: an operator stopped the backfill. The broker delivers nothing of the
	// range that is not yet delivered until it is resumed; with BackfillSkip the rest is given up.
	BackfillCancelled BackfillState = "CANCELLED"
	// BackfillFailed: the broker could not go on (a claim of the range failed with an error that
	// is not transient); resume retries.
	BackfillFailed BackfillState = "FAILED"
)

// Backfill bounds.
const (
	// DefaultMaxBackfillMessages is max_backfill_messages unless set (seed 000: 1,000,000).
	DefaultMaxBackfillMessages = 1_000_000
	// UnlimitedBackfill as max_backfill_messages keeps the whole range.
	UnlimitedBackfill = -1
)

// Backfill is the catch-up range of a subscription: the messages from its start position (a new
// subscription) or its ack floor (a resurrected one) up to the log end at that moment, cut to the
// newest MaxMessages. It is persisted with the subscription; the subscription's ack floors are
// its checkpoint (a message below a floor is done, and acked messages are never delivered again),
// so a crash resumes it where it was without a second delivery of anything acked. The one
// subscription of a QUEUE topic never has one: a queue's backlog is its work, never cut nor paced.
type Backfill struct {
	// State is the stored state: NOT_STARTED, IN_PROGRESS, CANCELLED or FAILED. Progress derives
	// COMPLETED.
	State BackfillState `json:"state"`
	// MaxMessages is the bound the range was cut to (UnlimitedBackfill: none).
	MaxMessages int64 `json:"max_messages"`
	// Start and End are the range per partition: offsets in [Start[i], End[i]).
	Start []int64 `json:"start,omitempty"`
	End   []int64 `json:"end,omitempty"`
	// Total counts the messages of the range.
	Total int64 `json:"total"`
	// Skipped counts messages the subscription will not get: cut by MaxMessages, or given up by
	// BackfillSkip.
	Skipped int64 `json:"skipped"`
	// StartedAt is when the range was set; UpdatedAt the last change of State.
	StartedAt time.Time `json:"started_at,omitzero"`
	UpdatedAt time.Time `json:"updated_at,omitzero"`
	// Error is why it FAILED.
	Error string `json:"error,omitempty"`
}

// Clone returns a deep copy (nil for nil).
func (b *Backfill) Clone() *Backfill {
	if b == nil {
		return nil
	}
	c := *b
	c.Start, c.End = slices.Clone(b.Start), slices.Clone(b.End)
	return &c
}

// BackfillProgress is a backfill's progress computed from the subscription's ack floors.
type BackfillProgress struct {
	State BackfillState `json:"state"`
	// Processed counts messages of the range that are done (below the ack floor).
	Processed int64 `json:"processed"`
	Total     int64 `json:"total"`
	Skipped   int64 `json:"skipped"`
	// Remaining is Total - Processed.
	Remaining int64 `json:"remaining"`
	// Pending lists, per partition, whether messages of the range are still undelivered there
	// (cursor below End): the partitions whose claims the broker rate-limits.
	Pending []bool `json:"-"`
}

// Progress computes the progress of b from the subscription's per-partition ack floors and
// cursors (SubscriptionStats.Partitions). An IN_PROGRESS backfill whose every partition's floor
// reached End is COMPLETED. A nil b is NOT_STARTED.
func (b *Backfill) Progress(parts []SubscriptionPartitionStats) BackfillProgress {
	if b == nil {
		return BackfillProgress{State: BackfillNotStarted}
	}
	out := BackfillProgress{State: b.State, Total: b.Total, Skipped: b.Skipped, Pending: make([]bool, len(b.End))}
	for _, ps := range parts {
		i := int(ps.Partition)
		if i < 0 || i >= len(b.End) || i >= len(b.Start) {
			continue
		}
		lo, hi := b.Start[i], b.End[i]
		out.Processed += min(max(ps.AckFloor, lo), hi) - lo
		out.Pending[i] = ps.Cursor < hi
	}
	out.Processed = min(out.Processed, out.Total)
	out.Remaining = out.Total - out.Processed
	if b.State == BackfillInProgress && out.Remaining == 0 {
		out.State = BackfillCompleted
	}
	return out
}

// CheckMaxBackfill refuses a max_backfill_messages that is not 0 (the default), UnlimitedBackfill
// or positive.
func CheckMaxBackfill(n int64) error {
	if n < UnlimitedBackfill {
		return Invalid("max_backfill_messages must be positive, 0 (default %d) or -1 (unlimited), got %d", DefaultMaxBackfillMessages, n)
	}
	return nil
}

// MaxBackfillOrDefault returns n, or DefaultMaxBackfillMessages for 0.
func MaxBackfillOrDefault(n int64) int64 {
	if n == 0 {
		return DefaultMaxBackfillMessages
	}
	return n
}

// NewBackfill makes the backfill of a range from starts to ends (per partition, a start above
// its end counts as empty), cut to the newest maxMessages (0: the default; UnlimitedBackfill:
// no cut). It returns the backfill (nil when the range is empty and nothing was cut) with the
// cut starts: the engine raises the subscription's floors and cursors to them. The cut keeps, in
// each partition, the newest messages in proportion to the partition's share of the range, so
// that the kept messages add up to maxMessages exactly.
func NewBackfill(starts, ends []int64, maxMessages int64, now time.Time) (*Backfill, []int64) {
	maxMessages = MaxBackfillOrDefault(maxMessages)
	n := len(ends)
	b := &Backfill{State: BackfillInProgress, MaxMessages: maxMessages, Start: make([]int64, n), End: append([]int64(nil), ends...),
		StartedAt: now, UpdatedAt: now}
	sizes := make([]int64, n)
	for i := range n {
		b.Start[i] = min(starts[i], ends[i])
		sizes[i] = ends[i] - b.Start[i]
		b.Total += sizes[i]
	}
	if maxMessages != UnlimitedBackfill && b.Total > maxMessages {
		keep := cutShares(sizes, b.Total, maxMessages)
		for i := range n {
			b.Start[i] = ends[i] - keep[i]
		}
		b.Skipped = b.Total - maxMessages
		b.Total = maxMessages
	}
	if b.Total == 0 {
		return nil, b.Start
	}
	return b, b.Start
}

// cutShares splits keep (< total) over partitions of sizes in proportion: the floor of each
// share, then one more to the partitions in order until keep is reached.
func cutShares(sizes []int64, total, keep int64) []int64 {
	out := make([]int64, len(sizes))
	var given int64
	for i, s := range sizes {
		out[i] = min(s, int64(float64(s)*float64(keep)/float64(total)))
		given += out[i]
	}
	for given > keep { // float rounding up
		for i := range out {
			if given > keep && out[i] > 0 {
				out[i]--
				given--
			}
		}
	}
	for given < keep {
		for i := range out {
			if given < keep && out[i] < sizes[i] {
				out[i]++
				given++
			}
		}
	}
	return out
}

// BackfillAction is what Engine.SubscriptionBackfill does.
type BackfillAction string

const (
	// BackfillBegin sets a new range from the subscription's ack floors to the log end, cut to its
	// max_backfill_messages (a resurrected group catches up on what it missed while DEAD).
	BackfillBegin BackfillAction = "begin"
	// BackfillCancel stops an IN_PROGRESS backfill (CANCELLED); the rest of the range is kept.
	BackfillCancel BackfillAction = "cancel"
	// BackfillResume makes a CANCELLED or FAILED backfill IN_PROGRESS again.
	BackfillResume BackfillAction = "resume"
	// BackfillSkip gives up the rest of the range: the subscription's floors and cursors rise to
	// End (leases below it are dropped), the messages not done are counted in Skipped, and the
	// state becomes CANCELLED.
	BackfillSkip BackfillAction = "skip"
	// BackfillFail records that the broker could not go on (FAILED, with Error).
	BackfillFail BackfillAction = "fail"
)

// SubscriptionBackfillParams are the parameters of Engine.SubscriptionBackfill.
type SubscriptionBackfillParams struct {
	ID     int64
	Action BackfillAction
	// MaxMessages (BackfillBegin) overrides the subscription's max_backfill_messages when not 0.
	MaxMessages int64
	// Error (BackfillFail) is the reason, at most 1,024 bytes kept.
	Error string
}

// SubscriptionBackfillResult is the result of Engine.SubscriptionBackfill.
type SubscriptionBackfillResult struct {
	Subscription *Subscription
	// Skipped counts the messages this call gave up (BackfillBegin's cut, BackfillSkip).
	Skipped int64
}

// Check validates the parameters.
func (p *SubscriptionBackfillParams) Check() error {
	if p == nil {
		return nilParams()
	}
	switch p.Action {
	case BackfillBegin, BackfillCancel, BackfillResume, BackfillSkip, BackfillFail:
	default:
		return Invalid("backfill action must be begin, cancel, resume, skip or fail, got %q", p.Action)
	}
	if err := CheckMaxBackfill(p.MaxMessages); err != nil {
		return err
	}
	if len(p.Error) > 1024 {
		p.Error = p.Error[:1024]
	}
	return nil
}

// BackfillTransition applies a stored state change of action to b (not nil) at now, or returns
// ErrInvalidTransition naming the states. BackfillBegin and BackfillSkip change ranges and are
// the engines' business; this covers cancel, resume and fail, and the state part of skip.
func BackfillTransition(b *Backfill, action BackfillAction, errMsg string, now time.Time) error {
	if b == nil {
		return fmt.Errorf("%w: the subscription has no backfill (NOT_STARTED)", ErrInvalidTransition)
	}
	switch action {
	case BackfillCancel, BackfillSkip:
		if b.State != BackfillInProgress && b.State != BackfillFailed && !(action == BackfillSkip && b.State == BackfillCancelled) {
			return fmt.Errorf("%w: backfill is %s, only an IN_PROGRESS or FAILED one is cancelled", ErrInvalidTransition, b.State)
		}
		b.State = BackfillCancelled
	case BackfillResume:
		if b.State != BackfillCancelled && b.State != BackfillFailed {
			return fmt.Errorf("%w: backfill is %s, only a CANCELLED or FAILED one is resumed", ErrInvalidTransition, b.State)
		}
		b.State, b.Error = BackfillInProgress, ""
	case BackfillFail:
		if b.State != BackfillInProgress {
			return fmt.Errorf("%w: backfill is %s, only an IN_PROGRESS one fails", ErrInvalidTransition, b.State)
		}
		b.State, b.Error = BackfillFailed, errMsg
	}
	b.UpdatedAt = now
	return nil
}
