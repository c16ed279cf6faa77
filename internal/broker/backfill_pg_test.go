package broker

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
)

// TestBackfillPacerFollowsPostgreSQL: on the PostgreSQL engine the backfill's rate limit follows
// the database's latency, as the group's backfill reports it while the range is claimed.
//   - fast: a member whose credit holds the whole range and that acks as it goes (no pass ends
//     for lack of credit) sees the reported rate limit rise before the range is all delivered:
//     the owner's passes are bounded, so its refresh reports the pacer between them.
//   - slow: a statement trigger makes every update of sub_partitions (each claim moves a
//     cursor) sleep 20 ms: the rate limit goes down below its start; once the trigger is gone
//     the rest of the range is delivered, each message once, and the backfill COMPLETES.
func TestBackfillPacerFollowsPostgreSQL(t *testing.T) {
	url := testutil.DatabaseURL(t)
	schema := testutil.PGSchema(t, url, "t_bfpace_")
	const maxRate = 1e6
	in := startPGInstance(t, url, schema, newFakeClock(), func(c *Config) {
		// A target of 50 ms (the slow database below takes 100 ms per claim) and a floor of 5,000
		// a second: on a loaded machine (the race detector, packages tested side by side) claims
		// took more than the default 10 ms with the database fast, and at the default floor of
		// 100 the rest of the range took longer than the test waits.
		c.Backfill = BackfillConfig{Batch: 50, MaxRate: maxRate, MinRate: 5000, TargetP95: 50 * time.Millisecond, Refresh: 5 * time.Millisecond}
	})
	initial := newPacer(in.b.backfill.cfg, time.Now()).rate
	ctx, cancel := context.WithTimeout(context.Background(), 5*waitTimeout)
	defer cancel()
	if _, err := in.b.CreateTopic(ctx, "history", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	const total = 20_000
	for i := 0; i < total; i += 1000 {
		msgs := make([]storage.AppendMessage, 1000)
		for j := range msgs {
			msgs[j] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: fmt.Appendf(nil, "m-%d", i+j)}
		}
		if _, err := in.b.Publish(ctx, "history", msgs); err != nil {
			t.Fatal(err)
		}
	}
	backfill := func(group string) *BackfillInfo {
		t.Helper()
		info, err := in.b.GroupBackfill(ctx, "history", group)
		if err != nil {
			t.Fatal(err)
		}
		return info
	}
	start := func(group string) *Member {
		t.Helper()
		if _, err := in.b.CreateGroup(ctx, CreateGroupParams{Topic: "history", Group: group,
			Start: storage.StartPosition{Kind: storage.FromBeginning}, MaxBackfillMessages: storage.UnlimitedBackfill}); err != nil {
			t.Fatal(err)
		}
		m, err := in.b.Subscribe(ctx, SubscribeParams{Pattern: "history", Group: group, MemberID: group, MaxInFlight: MaxInFlightLimit})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}

	t.Run("fast", func(t *testing.T) {
		m := start("fast")
		defer m.Close(ctx)
		// The consumer acks in batches as it goes: the delivery rows stay few, so claims stay
		// cheap (a claim reads its partitions' rows), and its credit never runs out.
		var got atomic.Int64
		var ackErr atomic.Pointer[error]
		done := make(chan struct{})
		go func() {
			defer close(done)
			var refs []storage.DeliveryRef
			for d := range m.Deliveries() {
				refs = append(refs, d.Ref())
				n := got.Add(1)
				if len(refs) == 200 || n == total {
					if err := m.Ack(ctx, d.SubscriptionID, refs...); err != nil {
						ackErr.Store(&err)
						return
					}
					refs = refs[:0]
				}
				if n == total {
					return
				}
			}
		}()
		risen := false
		for !risen {
			select {
			case <-done:
				t.Fatalf("all %d range messages delivered before the reported rate limit rose above %v (the last: %v)",
					total, initial, backfill("fast").RateLimit)
			case <-ctx.Done():
				t.Fatalf("%d of %d delivered", got.Load(), total)
			case <-time.After(10 * time.Millisecond):
			}
			if info := backfill("fast"); info.RateLimit > initial && got.Load() < total {
				risen = true
			}
		}
		<-done
		if err := ackErr.Load(); err != nil {
			t.Fatalf("ack: %v", *err)
		}
	})

	t.Run("slow", func(t *testing.T) {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		exec := func(sql string) {
			t.Helper()
			if _, err := conn.Exec(ctx, sql); err != nil {
				t.Fatal(err)
			}
		}
		exec(fmt.Sprintf(`CREATE FUNCTION %[1]s.slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.1); RETURN NULL; END $$;
			CREATE TRIGGER slow AFTER UPDATE ON %[1]s.sub_partitions FOR EACH STATEMENT EXECUTE FUNCTION %[1]s.slow()`, schema))
		m := start("slow")
		defer m.Close(ctx)
		seen := map[string]int{}
		var ds []*storage.Delivery
		take := func() {
			ds = ds[:0]
			ds, _ = m.Take(ds)
			if len(ds) == 0 {
				return
			}
			refs := make([]storage.DeliveryRef, len(ds))
			for i, d := range ds {
				seen[string(d.Payload)]++
				refs[i] = d.Ref()
			}
			if err := m.Ack(ctx, ds[0].SubscriptionID, refs...); err != nil {
				t.Fatal(err)
			}
		}
		eventually(t, "the rate limit below its start while the database is slow", func() error {
			take()
			// RateLimit is 0 until the group's owner reports its pacer.
			if info := backfill("slow"); info.State != storage.BackfillInProgress || info.RateLimit <= 0 || info.RateLimit >= initial {
				return fmt.Errorf("backfill %s, rate limit %v (start %v), %d delivered", info.State, info.RateLimit, initial, len(seen))
			}
			return nil
		})
		if len(seen) >= total {
			t.Fatalf("the whole range was delivered while the database was slow")
		}
		exec(fmt.Sprintf(`DROP TRIGGER slow ON %s.sub_partitions`, schema))
		testutil.Eventually(t, 3*waitTimeout, "the backfill COMPLETED", func() error {
			take()
			if info := backfill("slow"); info.State != storage.BackfillCompleted {
				return fmt.Errorf("backfill %s, %d of %d processed, %d delivered", info.State, info.Processed, info.Total, len(seen))
			}
			return nil
		})
		for i := range total {
			if n := seen[fmt.Sprintf("m-%d", i)]; n != 1 {
				t.Fatalf("m-%d delivered %d times, want once", i, n)
			}
		}
	})
}
