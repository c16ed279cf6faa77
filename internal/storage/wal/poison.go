package wal

import (
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/policy"
	"github.com/spoolmq/spool/internal/storage/wal/substate"
)

// poisonNack applies a topic's poison rules (storage.PoisonRules) to the messages of one nack:
// while a rule is on, each nacked message's failure history (substate.Entry.Failures) gets the
// nack, and the failures of the messages that stay are recorded (recFailure) so that a restart
// keeps them. Off (the default), it does nothing and nothing is recorded.
type poisonNack struct {
	rules  storage.PoisonRules
	member string
	reason string
	now    int64
	items  []failureItem
}

// fail adds the nack to en's history and returns the rule that fires, if any.
func (p *poisonNack) fail(s *sub, en *substate.Entry) storage.PoisonRule {
	if !p.rules.On() {
		return ""
	}
	s.st.Fail(en, policy.Failure{Member: p.member, Reason: p.reason, At: p.now})
	return policy.Poison(p.rules, en.Failures, p.now)
}

// keep queues the failure fail added to en (which stays, waiting) for the failure record.
func (p *poisonNack) keep(en *substate.Entry) {
	if p.rules.On() && len(en.Failures) > 0 {
		p.items = append(p.items, failureItem{partition: en.Partition, offset: en.Offset, replayed: en.Replayed(), f: en.Failures[len(en.Failures)-1]})
	}
}

// failureItem is one failure of a recFailure record.
type failureItem struct {
	partition int32
	offset    int64
	replayed  bool
	f         policy.Failure
}

// encodeFailures: type | uvarint sub | uvarint n | n x (uvarint partition, uvarint offset, u8
// replayed, str member, str reason, varint at unix ns). Replay adds each failure to its message's
// history (substate.RestoreFailure), after the nack record of the same batch.
func encodeFailures(subID int64, items []failureItem) []byte {
	return encodeSubItems(recFailure, subID, items, 32, func(e *enc, it *failureItem) {
		e.uvarint(uint64(it.partition))
		e.uvarint(uint64(it.offset))
		e.flag(it.replayed)
		e.str(it.f.Member)
		e.str(it.f.Reason)
		e.varint(it.f.At)
	})
}

func decodeFailures(b []byte) (subID int64, items []failureItem, err error) {
	return decodeSubItems(b, "failure record", 6, func(d *dec) (it failureItem) {
		it.partition = int32(d.uvarint())
		it.offset = int64(d.uvarint())
		it.replayed = d.u8() == 1
		it.f.Member = d.str()
		it.f.Reason = d.str()
		it.f.At = d.varint()
		return it
	})
}
