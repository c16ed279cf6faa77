package policy

import (
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Failure is one failed delivery of an unsettled message (storage.DeliveryFailure with the time
// in unix ns; PostgreSQL keeps it as JSON with these short names): the engines keep the last storage.MaxFailureHistory of them per message while the
// topic has a poison rule on.
type Failure struct {
	Member string `json:"m"`
	Reason string `json:"r,omitempty"`
	At     int64  `json:"t"`
}

// AddFailure appends f to history, keeping the last storage.MaxFailureHistory failures (oldest
// first) and at most storage.MaxFailureReasonBytes of its reason. It may reuse history's array.
func AddFailure(history []Failure, f Failure) []Failure {
	if len(f.Reason) > storage.MaxFailureReasonBytes {
		f.Reason = f.Reason[:storage.MaxFailureReasonBytes]
	}
	if len(history) >= storage.MaxFailureHistory {
		n := copy(history, history[len(history)-storage.MaxFailureHistory+1:])
		history = history[:n]
	}
	return append(history, f)
}

// Poison decides, after a failure that history ends with, whether the message is poison under
// the rules: it returns the rule that fires (same_reason_multiple_members before
// failures_in_window), or "" to retry it normally. now is the time of the decision.
//
//   - same_reason_multiple_members: the last failure's reason is not empty and an earlier
//     failure by another member has the same reason (one member repeating itself is not enough).
//   - failures_in_window: at least MaxFailures failures at or after now - Window.
func Poison(r storage.PoisonRules, history []Failure, now int64) storage.PoisonRule {
	if len(history) == 0 {
		return ""
	}
	last := history[len(history)-1]
	if r.DistinctMembers && last.Reason != "" {
		for _, f := range history[:len(history)-1] {
			if f.Reason == last.Reason && f.Member != last.Member {
				return storage.RuleSameReason
			}
		}
	}
	if r.MaxFailures > 0 {
		from, n := now-int64(r.Window), 0
		for _, f := range history {
			if f.At >= from {
				n++
			}
		}
		if n >= r.MaxFailures {
			return storage.RuleFailuresInWindow
		}
	}
	return ""
}

// Failures converts a history to the DLQ entry's form (nil for none).
func Failures(history []Failure) []storage.DeliveryFailure {
	if len(history) == 0 {
		return nil
	}
	out := make([]storage.DeliveryFailure, len(history))
	for i, f := range history {
		out[i] = storage.DeliveryFailure{Member: f.Member, Reason: f.Reason, At: time.Unix(0, f.At).UTC()}
	}
	return out
}
