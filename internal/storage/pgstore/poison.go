package pgstore

import (
	"encoding/json"
	"fmt"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/policy"
)

// Poison rules (storage.PoisonRules, seed 002 ACK-9). While a topic has a rule on, a nack adds
// itself to the failure history of each message it nacks (deliveries.failures, shared by the
// offsets of a row: offsets only share a row when they went through the same deliveries and
// nacks; a split keeps the history), and policy.Poison decides whether the message goes to the
// DLQ at once. Off (the default), histories stay NULL and nothing changes.

// encodeFailures is the JSON of a history for a jsonb column (nil: NULL).
func encodeFailures(fs []policy.Failure) *string {
	if len(fs) == 0 {
		return nil
	}
	b, err := json.Marshal(fs)
	if err != nil {
		panic(err) // strings and integers only
	}
	s := string(b)
	return &s
}

// decodeFailures reads a jsonb history (NULL: none), keeping the last
// storage.MaxFailureHistory.
func decodeFailures(b []byte, out *[]policy.Failure) error {
	*out = nil
	if len(b) == 0 {
		return nil
	}
	var fs []policy.Failure
	if err := json.Unmarshal(b, &fs); err != nil {
		return fmt.Errorf("%w: pgstore: failure history: %v", storage.ErrCorrupt, err)
	}
	for _, f := range fs {
		*out = policy.AddFailure(*out, f)
	}
	return nil
}

// poisonNack is one nack's view of the rules.
type poisonNack struct {
	rules storage.PoisonRules
	f     policy.Failure
}

// fail returns history with the nack added (a new slice; history is shared by a row's offsets)
// and the rule that fires, if any. With the rules off it returns history unchanged.
func (p poisonNack) fail(history []policy.Failure) ([]policy.Failure, storage.PoisonRule) {
	if !p.rules.On() {
		return history, ""
	}
	h := policy.AddFailure(append([]policy.Failure(nil), history...), p.f)
	return h, policy.Poison(p.rules, h, p.f.At)
}
