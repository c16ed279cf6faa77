package storagetest_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
	"github.com/spoolmq/spool/internal/storage/wal"
)

// Throwaway mutation check: wraps the real engine and injects one fault (MUTANT=name); the suite
// must fail for each.
type mutant struct {
	storage.Engine
	name string
	mu   sync.Mutex
	last map[int64]*storage.Delivery
}

func (m *mutant) DeliveriesClaim(ctx context.Context, p *storage.DeliveriesClaimParams) (*storage.DeliveriesClaimResult, error) {
	res, err := m.Engine.DeliveriesClaim(ctx, p)
	if err != nil {
		return res, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch m.name {
	case "double_lease": // hand the last delivery of the subscription out again when nothing is claimable
		if len(res.Deliveries) == 0 && m.last[p.SubscriptionID] != nil {
			d := *m.last[p.SubscriptionID]
			d.Member = p.Member
			d.Attempt++
			res.Deliveries = []*storage.Delivery{&d}
			m.last[p.SubscriptionID] = nil
		}
		if len(res.Deliveries) > 0 {
			m.last[p.SubscriptionID] = res.Deliveries[len(res.Deliveries)-1]
		}
	case "lease_plus_1s":
		for _, d := range res.Deliveries {
			d.LeaseDeadline = d.LeaseDeadline.Add(time.Second)
		}
	case "attempt_stuck":
		for _, d := range res.Deliveries {
			if d.Attempt > 1 {
				d.Attempt--
			}
		}
	case "drop_last_delivery":
		if len(res.Deliveries) > 1 {
			res.Deliveries = res.Deliveries[:len(res.Deliveries)-1]
		}
	case "reverse_order":
		for i, j := 0, len(res.Deliveries)-1; i < j; i, j = i+1, j-1 {
			res.Deliveries[i], res.Deliveries[j] = res.Deliveries[j], res.Deliveries[i]
		}
	case "nextdue_zero":
		res.NextDue = time.Time{}
	}
	return res, nil
}

func (m *mutant) DeliveriesAck(ctx context.Context, p *storage.DeliveriesAckParams) (*storage.DeliveriesAckResult, error) {
	if m.name == "ack_lies" && len(p.Refs) > 1 { // pretend to ack the last ref
		res, err := m.Engine.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: p.SubscriptionID, Member: p.Member, Refs: p.Refs[:len(p.Refs)-1]})
		if res != nil {
			res.Acked++
		}
		return res, err
	}
	return m.Engine.DeliveriesAck(ctx, p)
}

func (m *mutant) DeliveriesNack(ctx context.Context, p *storage.DeliveriesNackParams) (*storage.DeliveriesNackResult, error) {
	if m.name == "nack_delay_ignored" {
		q := *p
		q.Delay = 0
		return m.Engine.DeliveriesNack(ctx, &q)
	}
	return m.Engine.DeliveriesNack(ctx, p)
}

func (m *mutant) MessagesRead(ctx context.Context, p *storage.MessagesReadParams) ([]*storage.Message, error) {
	ms, err := m.Engine.MessagesRead(ctx, p)
	if m.name == "read_gap" {
		var out []*storage.Message
		for _, x := range ms {
			if x.Offset != 3 {
				out = append(out, x)
			}
		}
		return out, err
	}
	return ms, err
}

func (m *mutant) SubscriptionStats(ctx context.Context, id int64) (*storage.SubscriptionStats, error) {
	st, err := m.Engine.SubscriptionStats(ctx, id)
	if err == nil && m.name == "pending_plus_1" && st.Pending > 0 {
		st.Pending++
	}
	if err == nil && m.name == "floor_above_hw" {
		for i := range st.Partitions {
			st.Partitions[i].AckFloor = st.Partitions[i].HighWater + 1
			st.Partitions[i].Cursor = st.Partitions[i].HighWater + 1
		}
	}
	return st, err
}

func (m *mutant) MessagesAppend(ctx context.Context, p *storage.MessagesAppendParams) (*storage.MessagesAppendResult, error) {
	if m.name == "publishedat_wrong" {
		res, err := m.Engine.MessagesAppend(ctx, p)
		if res != nil {
			for i := range res.Positions {
				res.Positions[i].PublishedAt = res.Positions[i].PublishedAt.Add(time.Millisecond)
			}
		}
		return res, err
	}
	return m.Engine.MessagesAppend(ctx, p)
}

func (m *mutant) RetentionApply(ctx context.Context) (*storage.RetentionResult, error) {
	res, err := m.Engine.RetentionApply(ctx)
	if m.name == "expired_uncounted" && res != nil {
		res.MessagesDeleted += res.MessagesExpired
		res.MessagesExpired = 0
	}
	return res, err
}

func (m *mutant) DLQReplay(ctx context.Context, p *storage.DLQReplayParams) (int, error) {
	if m.name == "replay_noop" {
		return 0, nil
	}
	return m.Engine.DLQReplay(ctx, p)
}

func TestMutant(t *testing.T) {
	name := os.Getenv("MUTANT")
	if name == "" {
		t.Skip("MUTANT not set")
	}
	storagetest.Run(t, storagetest.Capabilities{Restart: true}, func(t *testing.T) storagetest.OpenFunc {
		dir := t.TempDir()
		return func(clock storage.Clock) (storage.Engine, error) {
			e, err := wal.Open(dir, wal.Config{Clock: clock, SegmentBytes: 64 << 10})
			if err != nil {
				return nil, err
			}
			return &mutant{Engine: e, name: name, last: map[int64]*storage.Delivery{}}, nil
		}
	})
}
