package pgpublish_test

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
	"github.com/spoolmq/spool/pgpublish"
)

// envInt reads an integer knob of the load test.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// txRecord is one committed application transaction of the load test.
type txRecord struct {
	id                   uint64
	partition            int32
	published, committed time.Time
}

// TestLoadTransactionalPublishers (opt-in: SPOOL_PG_TXLOAD=1, a load run for the lead, not the
// suite) measures issue 20's application transactions: SPOOL_PG_TXLOAD_WORKERS (16) transactions
// at a time, each publishing one message with pgpublish.Publish and holding its transaction open
// SPOOL_PG_TXLOAD_HOLD_MS (50) before committing, for SPOOL_PG_TXLOAD_SECONDS (20), on a topic of
// SPOOL_PG_TXLOAD_PARTITIONS (1). It reports committed transactions/s (and fails under
// SPOOL_PG_TXLOAD_MIN, 250), then consumes everything through the engine and checks that every
// committed message is delivered once and, per partition, in staging order among committed
// messages: no message has a higher offset than one whose transaction began publishing after it
// had committed.
func TestLoadTransactionalPublishers(t *testing.T) {
	if os.Getenv("SPOOL_PG_TXLOAD") != "1" {
		t.Skip("load run: set SPOOL_PG_TXLOAD=1")
	}
	workers := envInt(t, "SPOOL_PG_TXLOAD_WORKERS", 16)
	hold := time.Duration(envInt(t, "SPOOL_PG_TXLOAD_HOLD_MS", 50)) * time.Millisecond
	dur := time.Duration(envInt(t, "SPOOL_PG_TXLOAD_SECONDS", 20)) * time.Second
	parts := envInt(t, "SPOOL_PG_TXLOAD_PARTITIONS", 1)
	minRate := envInt(t, "SPOOL_PG_TXLOAD_MIN", 250)

	eng, _, schema := setup(t)
	ctx := t.Context()
	if _, err := eng.TopicCreate(ctx, &storage.TopicCreateParams{Name: "txload",
		Config: storage.TopicConfig{Partitions: parts}}); err != nil {
		t.Fatal(err)
	}
	pcfg, err := pgxpool.ParseConfig(testutil.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = int32(workers + 2)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	var mu sync.Mutex
	var recs []txRecord
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(dur)
	for w := range workers {
		wg.Go(func() {
			for seq := uint64(0); time.Now().Before(deadline); seq++ {
				id := uint64(w)<<40 | seq
				payload := binary.BigEndian.AppendUint64(nil, id)
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				published := time.Now()
				pos, err := pgpublish.PublishSchema(ctx, tx, schema, "txload", pgpublish.Message{Key: payload, Payload: payload})
				if err != nil {
					_ = tx.Rollback(ctx)
					t.Error(err)
					return
				}
				time.Sleep(hold) // the application's work
				if err := tx.Commit(ctx); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				recs = append(recs, txRecord{id: id, partition: pos[0].Partition, published: published, committed: time.Now()})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	rate := float64(len(recs)) / el.Seconds()
	t.Logf("%d workers, %s held: %d transactions committed in %s: %.0f committed transactions/s (at most %.0f with no wait)",
		workers, hold, len(recs), el.Round(time.Millisecond), rate, float64(workers)/hold.Seconds())

	// Consume everything, once.
	q, err := eng.SubscriptionGetByGroup(ctx, "txload", storage.QueueGroup)
	if err != nil {
		t.Fatal(err)
	}
	offsets := map[uint64]int64{}
	drainBy := time.Now().Add(60 * time.Second)
	for len(offsets) < len(recs) && time.Now().Before(drainBy) {
		res, err := eng.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m", Max: 1000})
		if err != nil {
			t.Fatal(err)
		}
		var refs []storage.DeliveryRef
		for _, d := range res.Deliveries {
			id := binary.BigEndian.Uint64(d.Payload)
			if _, dup := offsets[id]; dup {
				t.Fatalf("message %x delivered twice", id)
			}
			offsets[id] = d.Offset
			refs = append(refs, d.Ref())
		}
		if len(refs) == 0 {
			time.Sleep(10 * time.Millisecond) // the sequencer's turn
			continue
		}
		if _, err := eng.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: q.ID, Member: "m", Refs: refs}); err != nil {
			t.Fatal(err)
		}
	}
	if len(offsets) != len(recs) {
		t.Fatalf("delivered %d of %d committed messages", len(offsets), len(recs))
	}

	// Order per partition: walking down the offsets, the earliest commit among the higher
	// offsets must not precede this message's publish.
	byPart := map[int32][]txRecord{}
	for _, r := range recs {
		byPart[r.partition] = append(byPart[r.partition], r)
	}
	for p, rs := range byPart {
		slices.SortFunc(rs, func(a, b txRecord) int { return cmp.Compare(offsets[b.id], offsets[a.id]) })
		var earliest time.Time
		for i, r := range rs {
			if i > 0 && earliest.Before(r.published) {
				t.Fatalf("partition %d: message %x at offset %d published after a message at a higher offset committed (%s)",
					p, r.id, offsets[r.id], fmt.Sprint(r.published.Sub(earliest)))
			}
			if i == 0 || r.committed.Before(earliest) {
				earliest = r.committed
			}
		}
	}
	t.Logf("all %d messages delivered once, in order per partition", len(recs))
	if rate < float64(minRate) {
		t.Errorf("%.0f committed transactions/s, want at least %d", rate, minRate)
	}
}
