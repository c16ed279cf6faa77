package storage

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"
)

// ErrCompletionTrackingChange is returned by TopicUpdate for a change of completion_tracking on a
// topic that holds retained messages: their completion was decided under the old mode (refcount
// messages carry no ack-floor meaning of their own, and watermark messages have no completion
// record), so switching under them would rewrite what they wait for. Change it on an empty topic
// (after retention removed everything) or create a new topic. It wraps ErrInvalidArgument
// (the protocol's INVALID_ARGUMENT): nothing was changed.
var ErrCompletionTrackingChange = fmt.Errorf("%w: completion_tracking cannot change while the topic holds messages", ErrInvalidArgument)

// CompletionState is the state of one group in a message's completion record (refcount topics).
type CompletionState string

const (
	// CompletionPending: the group is in the message's set and has not acked or dead-lettered it.
	CompletionPending CompletionState = "pending"
	// CompletionAcked: the group acked the message.
	CompletionAcked CompletionState = "acked"
	// CompletionDeadLettered: the message went to the group's dead-letter queue.
	CompletionDeadLettered CompletionState = "dead_lettered"
	// CompletionRemoved: the group left the set while the message was pending for it (it became
	// DEAD or CANCELLED), or, coming back, skipped it because the other groups had completed it.
	CompletionRemoved CompletionState = "removed"
)

// GroupCompletion is one subscription's entry in a message's completion record.
type GroupCompletion struct {
	SubscriptionID int64           `json:"subscription_id"`
	Group          string          `json:"group"`
	State          CompletionState `json:"state"`
	// At is when the group acked or dead-lettered the message, or when it left the set (removed).
	// Zero for pending, and for a removal made when the group came back (skipped).
	At time.Time `json:"at,omitzero"`
}

// MessageCompletion is the completion record of one retained message of a refcount topic: the
// subscriptions it waits for or waited for (those live when it was published, plus those added
// while it was pending), each with its state.
type MessageCompletion struct {
	Topic       string    `json:"topic"`
	Partition   int32     `json:"partition"`
	Offset      int64     `json:"offset"`
	PublishedAt time.Time `json:"published_at"`
	// Complete: no group is pending and at least one acked or dead-lettered it. A message that no
	// group completed (its set is empty: published while no group was live, or every group of it
	// left) is not complete: it waits for a group to join, within zero_subscription_retention.
	Complete bool `json:"complete"`
	// Groups are ordered by subscription ID.
	Groups []GroupCompletion `json:"groups"`
}

// MessageCompletionParams are the parameters of CompletionAuditor.MessageCompletion.
type MessageCompletionParams struct {
	Topic     string
	Partition int32
	Offset    int64
}

// CompletionAuditor is implemented by engines that keep completion records for refcount topics
// (both engines).
type CompletionAuditor interface {
	// MessageCompletion returns the completion record of a retained message of a refcount topic.
	// A watermark topic is refused with ErrInvalidArgument (its messages have no such record), an
	// offset that is not retained with ErrOffsetOutOfRange.
	MessageCompletion(ctx context.Context, params *MessageCompletionParams) (*MessageCompletion, error)
}

// RefcountStart returns where a subscription that joins a refcount topic (created, or coming
// back from DEAD) starts in one partition: from want (its resolved start, or its ack floor when
// it comes back), past the messages that are already complete, so that a completed message never
// gets a group added. A message is complete here when every live (ACTIVE, PAUSED) other
// subscription has done it (it is below their ack floors) and some subscription acked or
// dead-lettered it (it lies in [start, floor) of one of them: done by it, not merely before it
// started). others are the (start, floor) pairs of the other subscriptions with state in this
// partition, live says which are live. This is the complete prefix; RefcountSkips finds the
// messages completed out of order above it.
func RefcountStart(want int64, starts, floors []int64, live []bool) int64 {
	limit := int64(-1) // lowest live floor; -1: no live subscription
	for i := range floors {
		if live[i] && (limit < 0 || floors[i] < limit) {
			limit = floors[i]
		}
	}
	s := want
	for {
		next := s
		for i := range floors {
			if starts[i] <= s && s < floors[i] && floors[i] > next {
				next = floors[i]
			}
		}
		if limit >= 0 && next > limit {
			next = limit
		}
		if next <= s {
			return s
		}
		s = next
	}
}

// RefcountOther is another subscription of the partition, as RefcountSkips sees it: where it
// started, whether it is live (ACTIVE, PAUSED), and the offsets it has done (acked or
// dead-lettered): those below Floor, and Above, sorted disjoint runs [lo, hi) at or above Floor
// (completed out of order).
type RefcountOther struct {
	Start, Floor int64
	Live         bool
	Above        [][2]int64
}

// RefcountSkips returns the offsets in [from, to) that are complete although RefcountStart did
// not skip them (completed out of order, above the lowest live ack floor), as sorted runs
// [lo, hi): done by every live other subscription, and done by at least one subscription at or
// above its start. A joiner marks them done for itself (it is not added to them). It works on
// runs: its cost is in the runs of the others (their out-of-order completions), not in the
// width of [from, to), the pending window the joiner lands in.
func RefcountSkips(from, to int64, others []RefcountOther) [][2]int64 {
	if len(others) == 0 || from >= to {
		return nil
	}
	all := [][2]int64{{from, to}} // done by every live other so far
	var someone [][2]int64        // done by one at or above its start
	for i := range others {
		h := &others[i]
		done := make([][2]int64, 0, len(h.Above)+1)
		if h.Floor > from {
			done = append(done, [2]int64{from, min(h.Floor, to)})
		}
		done = NormalizeRuns(append(done, clipRuns(h.Above, from, to)...))
		if h.Live {
			all = intersectRuns(all, done)
		}
		someone = append(someone, clipRuns(done, h.Start, to)...)
	}
	out := intersectRuns(all, NormalizeRuns(someone))
	if len(out) == 0 {
		return nil
	}
	return out
}

// clipRuns returns the parts of the sorted runs rs inside [lo, hi).
func clipRuns(rs [][2]int64, lo, hi int64) [][2]int64 {
	var out [][2]int64
	for _, r := range rs {
		if a, b := max(r[0], lo), min(r[1], hi); a < b {
			out = append(out, [2]int64{a, b})
		}
	}
	return out
}

// NormalizeRuns sorts rs (in place) and merges the runs [lo, hi) that overlap or touch; empty runs
// go.
func NormalizeRuns(rs [][2]int64) [][2]int64 {
	slices.SortFunc(rs, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	out := rs[:0]
	for _, r := range rs {
		if r[0] >= r[1] {
			continue
		}
		if n := len(out); n > 0 && r[0] <= out[n-1][1] {
			out[n-1][1] = max(out[n-1][1], r[1])
			continue
		}
		out = append(out, r)
	}
	return out
}

// intersectRuns returns the offsets in both a and b, normalized runs, as normalized runs.
func intersectRuns(a, b [][2]int64) [][2]int64 {
	var out [][2]int64
	for i, j := 0, 0; i < len(a) && j < len(b); {
		if lo, hi := max(a[i][0], b[j][0]), min(a[i][1], b[j][1]); lo < hi {
			out = append(out, [2]int64{lo, hi})
		}
		if a[i][1] < b[j][1] {
			i++
		} else {
			j++
		}
	}
	return out
}
