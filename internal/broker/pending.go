package broker

import (
	"cmp"
	"slices"
	"time"
)

// PendingDelivery is a delivery a member of this broker holds: leased to it and not yet acked,
// nacked or expired (seed 002's GET /admin/pending).
type PendingDelivery struct {
	SubscriptionID int64     `json:"subscription_id"`
	Member         string    `json:"member"`
	Partition      int32     `json:"partition"`
	Offset         int64     `json:"offset"`
	Deadline       time.Time `json:"deadline"`
}

// Pending returns the deliveries the members of this broker hold, the limit with the earliest
// lease deadlines first, and how many there are in all. It reads the members' own accounting:
// no engine call. Deliveries held through other broker instances (PostgreSQL) are not listed.
func (b *Broker) Pending(limit int) ([]PendingDelivery, int) {
	b.mu.RLock()
	ms := make([]*Member, 0, len(b.members))
	for _, m := range b.members {
		ms = append(ms, m)
	}
	b.mu.RUnlock()
	now := b.clock.Now()
	var out []PendingDelivery
	for _, m := range ms {
		m.mu.Lock()
		m.pruneLocked(now)
		for k, deadline := range m.inflight {
			out = append(out, PendingDelivery{SubscriptionID: k.sub, Member: m.id, Partition: k.partition, Offset: k.offset, Deadline: deadline})
		}
		m.mu.Unlock()
	}
	slices.SortFunc(out, func(a, c PendingDelivery) int {
		return cmp.Or(a.Deadline.Compare(c.Deadline), cmp.Compare(a.SubscriptionID, c.SubscriptionID),
			cmp.Compare(a.Partition, c.Partition), cmp.Compare(a.Offset, c.Offset))
	})
	total := len(out)
	return out[:min(limit, total)], total
}
