package storagetest

import (
	"context"
	"fmt"

	"github.com/spoolmq/spool/internal/storage"
)

// checkInvariants verifies the state the case left behind (package documentation). It runs as a
// cleanup, before the engine is closed, and reports with Errorf so that every broken invariant is
// listed.
func (x *env) checkInvariants() {
	t := x.t
	if x.closed {
		if !x.caps.Restart {
			t.Log("the case closed the engine; invariants not checked (no Restart capability)")
			return
		}
		eng, err := x.open(x.clock)
		if err != nil {
			t.Errorf("invariants: reopen engine: %v", err)
			return
		}
		x.rec.swap(eng)
		x.closed = false
	}
	x.rec.tr.checkAttemptSequences()

	ctx := context.Background()
	e := x.rec.engine()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("invariant violated: "+format, args...)
	}
	topics, err := e.TopicList(ctx)
	if err != nil {
		fail("TopicList: %v", err)
		return
	}
	highWater := map[string][]int64{}
	for i, tp := range topics {
		if i > 0 && topics[i-1].Name >= tp.Name {
			fail("TopicList not ordered by name: %q before %q", topics[i-1].Name, tp.Name)
		}
		hw, ok := x.checkTopicLog(ctx, e, tp, fail)
		if ok {
			highWater[tp.Name] = hw
		}
	}

	subs, err := e.SubscriptionList(ctx, &storage.SubscriptionListParams{})
	if err != nil {
		fail("SubscriptionList: %v", err)
		return
	}
	live := x.rec.tr.liveLeases(x.clock.Now())
	for i, s := range subs {
		if i > 0 && subs[i-1].ID >= s.ID {
			fail("SubscriptionList not ordered by ID: %d before %d", subs[i-1].ID, s.ID)
		}
		hw, ok := highWater[s.Topic]
		if !ok {
			fail("subscription %d (group %q) names topic %q, which TopicList does not list", s.ID, s.Group, s.Topic)
			continue
		}
		x.checkSubscription(ctx, e, s, hw, live[s.ID], fail)
	}
}

// checkTopicLog reads every retained message of a topic and returns its high-water marks.
func (x *env) checkTopicLog(ctx context.Context, e storage.Engine, tp *storage.Topic, fail func(string, ...any)) ([]int64, bool) {
	st, err := e.TopicStats(ctx, tp.Name)
	if err != nil {
		fail("TopicStats(%q): %v", tp.Name, err)
		return nil, false
	}
	if len(st.Partitions) != tp.Config.Partitions {
		fail("topic %q: TopicStats lists %d partitions, config says %d", tp.Name, len(st.Partitions), tp.Config.Partitions)
		return nil, false
	}
	hw := make([]int64, tp.Config.Partitions)
	seen := make([]bool, tp.Config.Partitions)
	var total, bytes int64
	for _, ps := range st.Partitions {
		if ps.Partition < 0 || int(ps.Partition) >= len(hw) || seen[ps.Partition] {
			fail("topic %q: TopicStats lists partition %d twice or out of range", tp.Name, ps.Partition)
			return nil, false
		}
		seen[ps.Partition] = true
		hw[ps.Partition] = ps.HighWater
		bytes += ps.Bytes
		if ps.LowOffset < 0 || ps.LowOffset > ps.HighWater || ps.Bytes < 0 {
			fail("topic %q partition %d: low offset %d, high water %d, bytes %d", tp.Name, ps.Partition, ps.LowOffset, ps.HighWater, ps.Bytes)
			continue
		}
		n, err := checkPartitionLog(ctx, e, tp.Name, ps)
		if err != nil {
			fail("%v", err)
		}
		total += n
	}
	if st.Messages != total {
		fail("topic %q: TopicStats.Messages is %d, MessagesRead returns %d", tp.Name, st.Messages, total)
	}
	if st.Bytes != bytes {
		fail("topic %q: TopicStats.Bytes is %d, the partitions sum to %d", tp.Name, st.Bytes, bytes)
	}
	return hw, true
}

// checkPartitionLog reads a partition from offset 0 (reading starts at the low offset) and checks
// that offsets are gapless from LowOffset to HighWater-1 and publish times never decrease.
func checkPartitionLog(ctx context.Context, e storage.Engine, topic string, ps storage.PartitionStats) (int64, error) {
	next := ps.LowOffset
	var n int64
	var last *storage.Message
	from := int64(0)
	for {
		page, err := e.MessagesRead(ctx, &storage.MessagesReadParams{Topic: topic, Partition: ps.Partition, Offset: from, Limit: 500})
		if err != nil {
			return n, fmt.Errorf("MessagesRead(%q, %d, %d): %w", topic, ps.Partition, from, err)
		}
		if len(page) == 0 {
			break
		}
		for _, m := range page {
			switch {
			case m.Offset != next:
				return n, fmt.Errorf("topic %q partition %d: offset %d read where %d was expected (low offset %d, high water %d): offsets must be gapless",
					topic, ps.Partition, m.Offset, next, ps.LowOffset, ps.HighWater)
			case m.Topic != topic || m.Partition != ps.Partition:
				return n, fmt.Errorf("topic %q partition %d offset %d: message says topic %q partition %d", topic, ps.Partition, m.Offset, m.Topic, m.Partition)
			case last != nil && m.PublishedAt.Before(last.PublishedAt):
				return n, fmt.Errorf("topic %q partition %d: offset %d published at %s, before offset %d (%s)",
					topic, ps.Partition, m.Offset, fmtTime(m.PublishedAt), last.Offset, fmtTime(last.PublishedAt))
			}
			last = m
			next++
			n++
		}
		from = next
		if next > ps.HighWater {
			return n, fmt.Errorf("topic %q partition %d: read offset %d at or above the high water %d", topic, ps.Partition, next-1, ps.HighWater)
		}
	}
	if next != ps.HighWater {
		return n, fmt.Errorf("topic %q partition %d: messages end before offset %d, high water is %d (low offset %d)",
			topic, ps.Partition, next, ps.HighWater, ps.LowOffset)
	}
	return n, nil
}

func (x *env) checkSubscription(ctx context.Context, e storage.Engine, s *storage.Subscription, hw []int64, liveLeases int64, fail func(string, ...any)) {
	st, err := e.SubscriptionStats(ctx, s.ID)
	if err != nil {
		fail("SubscriptionStats(%d): %v", s.ID, err)
		return
	}
	name := fmt.Sprintf("subscription %d (topic %q group %q %s)", s.ID, s.Topic, s.Group, s.State)
	if st.SubscriptionID != s.ID {
		fail("%s: stats name subscription %d", name, st.SubscriptionID)
	}
	if st.Pending < 0 || st.Lag < 0 || st.InFlight < 0 || st.Redelivering < 0 || st.DeadLettered < 0 {
		fail("%s: negative figure in %+v", name, *st)
	}
	if len(st.Partitions) != len(hw) && (s.State != storage.Cancelled || len(st.Partitions) != 0) {
		// A CANCELLED subscription has released its state and may list no partitions.
		fail("%s: stats list %d partitions, the topic has %d", name, len(st.Partitions), len(hw))
		return
	}
	var lag int64
	seen := map[int32]bool{}
	for _, ps := range st.Partitions {
		if ps.Partition < 0 || int(ps.Partition) >= len(hw) || seen[ps.Partition] {
			fail("%s: partition %d listed twice or out of range", name, ps.Partition)
			continue
		}
		seen[ps.Partition] = true
		if ps.HighWater != hw[ps.Partition] {
			fail("%s partition %d: high water %d, the topic's is %d", name, ps.Partition, ps.HighWater, hw[ps.Partition])
		}
		if ps.AckFloor < 0 || ps.AckFloor > ps.Cursor || ps.Cursor > ps.HighWater {
			fail("%s partition %d: want 0 <= ack floor (%d) <= cursor (%d) <= high water (%d)", name, ps.Partition, ps.AckFloor, ps.Cursor, ps.HighWater)
		}
		lag += ps.HighWater - ps.Cursor
	}
	if len(st.Partitions) == 0 && st.Lag != 0 {
		fail("%s: lag %d without partitions", name, st.Lag)
	}
	if len(st.Partitions) > 0 && st.Lag != lag {
		fail("%s: lag %d, but high water minus cursor sums to %d", name, st.Lag, lag)
	}
	x.rec.tr.mu.Lock()
	undeliveredAcks := x.rec.tr.undeliveredAcks[s.ID]
	x.rec.tr.mu.Unlock()
	sum := st.Lag + st.InFlight + st.Redelivering
	if undeliveredAcks {
		// Acked messages above the cursor are not pending but still in Lag.
		if st.Pending > sum || st.Pending < st.InFlight+st.Redelivering {
			fail("%s: pending %d outside [in_flight+redelivering, lag+in_flight+redelivering] = [%d, %d]", name, st.Pending, st.InFlight+st.Redelivering, sum)
		}
	} else if st.Pending != sum {
		fail("%s: pending %d != lag %d + in_flight %d + redelivering %d", name, st.Pending, st.Lag, st.InFlight, st.Redelivering)
	}
	if (s.State == storage.Active || s.State == storage.Paused) && st.InFlight < liveLeases {
		fail("%s: in_flight %d, but %d leases handed out by claims are unexpired and were never acked, nacked or released", name, st.InFlight, liveLeases)
	}
	var dlq int64
	var after int64
	for {
		page, err := e.DLQList(ctx, &storage.DLQListParams{SubscriptionID: s.ID, AfterID: after, Limit: 100})
		if err != nil {
			fail("DLQList(%d): %v", s.ID, err)
			return
		}
		if len(page) == 0 {
			break
		}
		for _, en := range page {
			if en.ID <= after {
				fail("%s: DLQ IDs not increasing (%d after %d)", name, en.ID, after)
				return
			}
			after = en.ID
			if en.SubscriptionID != s.ID {
				fail("%s: DLQ entry %d names subscription %d", name, en.ID, en.SubscriptionID)
			}
			dlq++
		}
	}
	if st.DeadLettered != dlq {
		fail("%s: dead_lettered %d, the DLQ lists %d entries", name, st.DeadLettered, dlq)
	}
}
