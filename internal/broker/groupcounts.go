package broker

import (
	"sync"
	"sync/atomic"

	"github.com/spoolmq/spool/internal/storage"
)

// Seed 000's group counters (ConsumerGroupMetrics totalMessagesProcessed and
// totalMessagesFailed, §5's "filtered, failed, processed"). Neither engine keeps settlement
// totals (SubscriptionStats holds what is pending, not what was done, and keeping them durably
// would add a write to every ack), so the broker counts what it settles itself: since this broker
// process started, on this instance only. With a shared PostgreSQL engine each instance counts
// the acks and nacks it handled.

// GroupCounts are the settlement totals of one group on this broker instance since it started.
type GroupCounts struct {
	// Processed counts messages acks through this broker completed (an ack of a message already
	// done, or fenced by a force-complete or a rebalance, is not counted again).
	Processed int64 `json:"processed"`
	// Failed counts deliveries nacked through this broker: given back for redelivery or
	// dead-lettered by the nack (lease expiries are not nacks and are not counted).
	Failed int64 `json:"failed"`
	// Filtered counts messages this broker completed without a delivery because no member's
	// filter matched them.
	Filtered int64 `json:"filtered"`
}

// minCountsPrune is the entries of the counter map past which it is first pruned of deleted
// subscriptions; later prunes wait until it has doubled since (amortised: one engine listing per
// doubling, never on the settle path itself).
const minCountsPrune = 4096

// groupCounters holds GroupCounts by subscription ID.
type groupCounters struct {
	mu      sync.RWMutex
	bySub   map[int64]*groupCount
	pruneAt int  // the size at which the next prune starts
	pruning bool // a prune is running
}

type groupCount struct{ processed, failed, filtered atomic.Int64 }

// get returns the counters of subscription id, creating them; prune says the map reached its
// prune size and the caller must start pruneGroupCounts.
func (c *groupCounters) get(id int64) (cnt *groupCount, prune bool) {
	c.mu.RLock()
	cnt = c.bySub[id]
	c.mu.RUnlock()
	if cnt != nil {
		return cnt, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cnt = c.bySub[id]; cnt != nil {
		return cnt, false
	}
	if c.bySub == nil {
		c.bySub = make(map[int64]*groupCount)
	}
	if c.pruneAt == 0 {
		c.pruneAt = minCountsPrune
	}
	cnt = &groupCount{}
	c.bySub[id] = cnt
	if len(c.bySub) >= c.pruneAt && !c.pruning {
		c.pruning = true
		prune = true
	}
	return cnt, prune
}

// counts returns the counters of subscription id (zero when it settled nothing here).
func (c *groupCounters) counts(id int64) GroupCounts {
	c.mu.RLock()
	cnt := c.bySub[id]
	c.mu.RUnlock()
	if cnt == nil {
		return GroupCounts{}
	}
	return GroupCounts{Processed: cnt.processed.Load(), Failed: cnt.failed.Load(), Filtered: cnt.filtered.Load()}
}

// forget drops the counters of subscription id (removed).
func (c *groupCounters) forget(id int64) {
	c.mu.Lock()
	delete(c.bySub, id)
	c.mu.Unlock()
}

// countSettled adds processed, failed and filtered messages to subscription id's counters.
func (b *Broker) countSettled(id int64, processed, failed, filtered int) {
	if processed <= 0 && failed <= 0 && filtered <= 0 {
		return
	}
	cnt, prune := b.counts.get(id)
	cnt.processed.Add(int64(max(processed, 0)))
	cnt.failed.Add(int64(max(failed, 0)))
	cnt.filtered.Add(int64(max(filtered, 0)))
	if prune {
		b.mu.RLock()
		if b.state == stateRunning {
			b.goLocked(b.pruneGroupCounts)
		} else {
			b.counts.mu.Lock()
			b.counts.pruning = false
			b.counts.mu.Unlock()
		}
		b.mu.RUnlock()
	}
}

// groupCounts returns the settlement totals of subscription id on this broker instance since it
// started.
func (b *Broker) groupCounts(id int64) GroupCounts { return b.counts.counts(id) }

// pruneGroupCounts drops the counters of subscriptions that no longer exist (deleted by their
// retention, by their last ephemeral member leaving, or on another instance), and sets the next
// prune size to twice what is left. Only counters that existed before the listing are candidates:
// one created meanwhile may belong to a subscription the listing missed.
func (b *Broker) pruneGroupCounts() {
	c := &b.counts
	c.mu.RLock()
	before := make([]int64, 0, len(c.bySub))
	for id := range c.bySub {
		before = append(before, id)
	}
	c.mu.RUnlock()
	subs, err := b.engine.SubscriptionList(b.rootCtx, &storage.SubscriptionListParams{})
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pruning = false
	if err == nil {
		live := make(map[int64]bool, len(subs))
		for _, s := range subs {
			live[s.ID] = s.State != storage.Deleted
		}
		for _, id := range before {
			if !live[id] {
				delete(c.bySub, id)
			}
		}
	}
	c.pruneAt = max(minCountsPrune, 2*len(c.bySub))
}
