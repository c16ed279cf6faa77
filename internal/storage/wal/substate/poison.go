package substate

import "github.com/spoolmq/spool/internal/storage/policy"

// Fail adds failure f to the history of entry e (a nack while the topic has a poison rule on).
func (s *Sub) Fail(e *Entry, f policy.Failure) {
	e.Failures = policy.AddFailure(e.Failures, f)
}

// Pull takes a waiting entry out of the heaps so that the caller can dead-letter it
// (DeadLetter) after a poison rule fired on its nack.
func (s *Sub) Pull(e *Entry) {
	s.unheap(e)
	e.Leased = false
}

// RestoreFailure replays a failure record item: offset o of partition p (or its replayed copy)
// failed with f.
func (s *Sub) RestoreFailure(p int32, o int64, replayed bool, f policy.Failure) {
	pt := s.part(p)
	if pt == nil {
		return
	}
	e := pt.pending[o]
	if replayed {
		e = pt.replayed[o]
	}
	if e != nil {
		s.Fail(e, f)
	}
}
