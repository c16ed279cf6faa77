package broker

import "time"

// Per-key transactional batches (issue 17 item 4), the broker's part. A member of an ordered
// group that subscribed with SubscribeParams.BatchSize claims batches (storage/batches.go): per
// partition it owns, consecutive messages up to BatchSize, extended past it while the last one is
// Linked (the rest of one publish's run of one key), never cut by the claim's Max.
//
// Credit. A batch claim may return more deliveries than the member's free credit, so the owner
// does not pass the whole credit k as Max: with t = min(BatchSize, MaxInFlight, the queue limit
// when set), it claims only when k >= t, with Max = k - t + 1 (reserveBatch). The engine starts a
// batch only while Max has room, and every batch before the last one stayed within Max; the last
// one starts with r >= 1 of Max left, that is with r + t - 1 >= t of the member's credit, so its
// first t messages fit. The member's holdings therefore exceed its credit by at most the last
// batch's length past t: its extension past BatchSize (the rest of one publish's run of one key),
// plus BatchSize - t when the credit or the queue limit is below BatchSize; at most
// storage.MaxBatchMessages - 1. deliver ends the reservation of k whatever the claim returned and
// grows the channel for a batch past it; creditLocked counts what the member holds, so its credit
// is 0 (never negative) until enough is settled, and nothing leaks. A server's queue limit (the
// connection window) is exceeded the same way, by at most one batch.
//
// Settling. Every ack and nack of a batch member (whichever connection sends it) is a batch
// settle (storage.DeliveriesAckParams.Batch): refs that leave out a message of a partition where
// the member holds a batch fail with storage.ErrBatchSplit (INVALID_ARGUMENT) and change nothing.

// reserveBatch is reserve for a batch member: it reserves the member's free credit k only when k
// is at least t = min(BatchSize, MaxInFlight, the queue limit when set), else nothing (o waits for
// the member's credit), and returns k and the claim's Max, k - t + 1 (see above). t is never above
// what the member gets back once it settled and the consumer took everything, so it cannot wait
// for ever.
func (m *Member) reserveBatch(now time.Time, o *owner) (k, limit int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := max(1, min(m.batchSize, m.maxInFlight))
	if m.queueLimit >= 0 {
		t = max(1, min(t, m.queueLimit))
	}
	k = m.creditLocked(now)
	if k < t {
		k = 0
		if !m.closed {
			if m.waiting == nil {
				m.waiting = map[*owner]struct{}{}
			}
			m.waiting[o] = struct{}{}
		}
		return 0, 0
	}
	m.reserved += k
	return k, k - t + 1
}

// batchSettle reports whether acks and nacks of subscription subID by member are batch settles:
// the member is one of this broker's batch members attached to it.
func (b *Broker) batchSettle(subID int64, member string) bool {
	b.mu.RLock()
	m := b.members[member]
	b.mu.RUnlock()
	return m != nil && m.batchSize > 0 && m.AttachedTo(subID)
}

// BatchSize returns the member's SubscribeParams.BatchSize (0: no batches).
func (m *Member) BatchSize() int { return m.batchSize }
