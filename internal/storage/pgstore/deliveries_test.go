package pgstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
	"github.com/spoolmq/spool/internal/testutil"
)

// openPair opens two Engines (two broker instances) on one fresh schema.
func openPair(t *testing.T) (*Engine, *Engine) {
	t.Helper()
	cfg := testConfig(t, nil)
	cfg.MaxConns = 8
	return logOpen(t, cfg), logOpen(t, cfg)
}

// leaseBook records live leases across members of both instances: a message may be held by one
// member at a time, and is acked once.
type leaseBook struct {
	mu        sync.Mutex
	holder    map[storage.DeliveryRef]string
	delivered map[storage.DeliveryRef]int
	acked     int64
	errs      []string
}

func (lb *leaseBook) lease(member string, ds []*storage.Delivery) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	for _, d := range ds {
		r := d.Ref()
		if h, ok := lb.holder[r]; ok && len(lb.errs) < 20 {
			lb.errs = append(lb.errs, fmt.Sprintf("%d:%d leased to %s while %s holds it", r.Partition, r.Offset, member, h))
		}
		lb.holder[r] = member
		lb.delivered[r]++
	}
}

// release forgets leases before they are acked (the ack may commit before the next claim of
// another member sees it, never after).
func (lb *leaseBook) release(refs []storage.DeliveryRef) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	for _, r := range refs {
		delete(lb.holder, r)
	}
}

// TestDeliveriesTwoInstances: members on two Engines sharing one schema claim and ack one QUEUE
// subscription while a publisher appends: no message is leased to two members at once, and every
// message is delivered and acked exactly once.
func TestDeliveriesTwoInstances(t *testing.T) {
	t.Parallel()
	a, b := openPair(t)
	ctx := t.Context()
	const total = 3000
	if _, err := a.TopicCreate(ctx, &storage.TopicCreateParams{Name: "shared.q", Config: storage.TopicConfig{Partitions: 3}}); err != nil {
		t.Fatal(err)
	}
	sub, err := b.SubscriptionGetByGroup(ctx, "shared.q", storage.QueueGroup)
	if err != nil {
		t.Fatal(err)
	}
	lb := &leaseBook{holder: map[storage.DeliveryRef]string{}, delivered: map[storage.DeliveryRef]int{}}
	giveUp := time.Now().Add(60 * time.Second)
	var wg sync.WaitGroup
	errc := make(chan error, 32)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < total; i += 50 {
			msgs := make([]storage.AppendMessage, 50)
			for j := range msgs {
				msgs[j] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: fmt.Appendf(nil, "m%d", i+j)}
			}
			eng := []*Engine{a, b}[i/50%2]
			if _, err := eng.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "shared.q", Messages: msgs}); err != nil {
				errc <- fmt.Errorf("publish: %w", err)
				return
			}
		}
	}()
	for m := range 6 {
		eng := []*Engine{a, b}[m%2]
		member := fmt.Sprintf("member-%d", m)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for atomic.LoadInt64(&lb.acked) < total {
				if time.Now().After(giveUp) {
					errc <- fmt.Errorf("%s: gave up with %d of %d acked", member, atomic.LoadInt64(&lb.acked), total)
					return
				}
				res, err := eng.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: member, Max: 1 + m*7})
				if err != nil {
					errc <- fmt.Errorf("%s: claim: %w", member, err)
					return
				}
				if len(res.Deliveries) == 0 {
					continue
				}
				lb.lease(member, res.Deliveries)
				refs := make([]storage.DeliveryRef, len(res.Deliveries))
				for i, d := range res.Deliveries {
					refs[i] = d.Ref()
				}
				lb.release(refs)
				ar, err := eng.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: sub.ID, Member: member, Refs: refs})
				if err != nil {
					errc <- fmt.Errorf("%s: ack: %w", member, err)
					return
				}
				if ar.Acked != len(refs) {
					errc <- fmt.Errorf("%s: ack of %d fresh leases: %+v", member, len(refs), *ar)
					return
				}
				atomic.AddInt64(&lb.acked, int64(ar.Acked))
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	for _, e := range lb.errs {
		t.Error(e)
	}
	if len(lb.delivered) != total {
		t.Errorf("%d distinct messages delivered, want %d", len(lb.delivered), total)
	}
	for r, n := range lb.delivered {
		if n != 1 {
			t.Errorf("%d:%d delivered %d times", r.Partition, r.Offset, n)
		}
	}
	if lb.acked != total {
		t.Errorf("acked %d, want %d", lb.acked, total)
	}
	st, err := a.SubscriptionStats(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != 0 || st.InFlight != 0 || st.Redelivering != 0 || st.Lag != 0 {
		t.Errorf("stats after acking everything: %+v", *st)
	}
	for _, ps := range st.Partitions {
		if ps.AckFloor != ps.HighWater || ps.Cursor != ps.HighWater {
			t.Errorf("partition %d: floor %d cursor %d high water %d", ps.Partition, ps.AckFloor, ps.Cursor, ps.HighWater)
		}
	}
	var rows int
	if err := a.pool.QueryRow(ctx, a.sql("SELECT count(*) FROM spool.deliveries")).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Errorf("%d delivery rows left after acking everything", rows)
	}
}

// tableWrites returns the rows inserted, updated and deleted in a table of the schema as the
// statistics report them.
func tableWrites(ctx context.Context, conn *pgx.Conn, schema, table string) (ins, upd, del int64, err error) {
	if _, err = conn.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
		return
	}
	err = conn.QueryRow(ctx, `SELECT n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`,
		schema, table).Scan(&ins, &upd, &del)
	return
}

// TestDeliveriesStateIsPerBatch: delivery state costs a row per claim batch, not per message, and
// acking N messages in batches writes a few rows per batch, not N: the tables do not bloat with the
// message rate.
func TestDeliveriesStateIsPerBatch(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, nil)
	e := logOpen(t, cfg)
	ctx := t.Context()
	const n, batch = 2000, 100
	if _, err := e.TopicCreate(ctx, &storage.TopicCreateParams{Name: "bloat.q"}); err != nil {
		t.Fatal(err)
	}
	msgs := make([]storage.AppendMessage, n)
	for i := range msgs {
		msgs[i] = storage.AppendMessage{Partition: 0, Payload: []byte("x")}
	}
	if _, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "bloat.q", Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	sub, err := e.SubscriptionGetByGroup(ctx, "bloat.q", storage.QueueGroup)
	if err != nil {
		t.Fatal(err)
	}
	var claimed [][]storage.DeliveryRef
	for range n / batch {
		res, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: "m", Max: batch})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Deliveries) != batch {
			t.Fatalf("claimed %d, want %d", len(res.Deliveries), batch)
		}
		refs := make([]storage.DeliveryRef, batch)
		for i, d := range res.Deliveries {
			refs[i] = d.Ref()
		}
		claimed = append(claimed, refs)
	}
	var rows int
	if err := e.pool.QueryRow(ctx, e.sql("SELECT count(*) FROM spool.deliveries")).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != n/batch {
		t.Errorf("%d messages leased in %d claims take %d delivery rows, want one per claim", n, n/batch, rows)
	}
	// Ack every batch in two halves, the second half first (out of order).
	for _, refs := range claimed {
		for _, half := range [][]storage.DeliveryRef{refs[batch/2:], refs[:batch/2]} {
			res, err := e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: sub.ID, Member: "m", Refs: half})
			if err != nil {
				t.Fatal(err)
			}
			if res.Acked != len(half) {
				t.Fatalf("acked %d, want %d", res.Acked, len(half))
			}
		}
	}
	if err := e.pool.QueryRow(ctx, e.sql("SELECT count(*) FROM spool.deliveries")).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Errorf("%d delivery rows left after acking everything", rows)
	}
	// Closing the engine ends its backends, which report their table statistics as they exit.
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, cfg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	ops := int64(n/batch) * 3 // a claim and two acks per batch
	var ins, upd, del int64
	testutil.Eventually(t, 30*time.Second, "table statistics of the exited backends", func() error {
		var err error
		ins, upd, del, err = tableWrites(ctx, conn, cfg.Schema, "deliveries")
		if err == nil && (ins < int64(n/batch) || del < int64(n/batch)) {
			err = fmt.Errorf("statistics report %d inserts and %d deletes, the test made at least %d of each", ins, del, n/batch)
		}
		return err
	})
	t.Logf("deliveries: %d inserts, %d updates, %d deletes for %d messages in %d operations", ins, upd, del, n, ops)
	if ins+upd+del > 2*ops {
		t.Errorf("deliveries: %d row writes for %d messages in %d operations, want at most 2 per operation", ins+upd+del, n, ops)
	}
	_, upd, _, err = tableWrites(ctx, conn, cfg.Schema, "sub_partitions")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sub_partitions: %d updates", upd)
	if upd > ops {
		t.Errorf("sub_partitions: %d updates for %d operations, want at most one per operation", upd, ops)
	}
}

// TestDeliveriesAckCombining: concurrent acks of one subscription, combined into shared
// transactions, each get the answer they would have got alone: every message is acked by exactly
// one of the calls that ack it, the others find it done; a call whose context ends while it queues
// returns without disturbing the others.
func TestDeliveriesAckCombining(t *testing.T) {
	t.Parallel()
	e := openConns(t, 8)
	ctx := t.Context()
	const n, copies = 200, 4
	if _, err := e.TopicCreate(ctx, &storage.TopicCreateParams{Name: "combine.q", Config: storage.TopicConfig{Partitions: 2}}); err != nil {
		t.Fatal(err)
	}
	msgs := make([]storage.AppendMessage, n)
	for i := range msgs {
		msgs[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: []byte("x")}
	}
	if _, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "combine.q", Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	sub, err := e.SubscriptionGetByGroup(ctx, "combine.q", storage.QueueGroup)
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: "m", Max: n})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Deliveries) != n {
		t.Fatalf("claimed %d, want %d", len(res.Deliveries), n)
	}
	var acked, done, cancelled atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for c := range copies {
		for i, d := range res.Deliveries {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if (i+c)%37 == 0 {
					// An extra call with an ended context: it acks or fails with the context's error.
					cctx, cancel := context.WithCancel(ctx)
					cancel()
					if r, err := e.DeliveriesAck(cctx, &storage.DeliveriesAckParams{SubscriptionID: sub.ID, Member: "m", Refs: []storage.DeliveryRef{d.Ref()}}); err != nil {
						cancelled.Add(1)
					} else {
						acked.Add(int64(r.Acked))
						done.Add(int64(r.AlreadyDone))
					}
				}
				r, err := e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: sub.ID, Member: "m", Refs: []storage.DeliveryRef{d.Ref()}})
				if err != nil {
					t.Error(err)
					return
				}
				acked.Add(int64(r.Acked))
				done.Add(int64(r.AlreadyDone))
			}()
		}
	}
	close(start)
	wg.Wait()
	if acked.Load() != n {
		t.Errorf("Acked sums to %d, want %d: each message acked exactly once", acked.Load(), n)
	}
	calls := int64(n*copies) + countCancelled(n, copies) - cancelled.Load()
	if acked.Load()+done.Load() != calls {
		t.Errorf("Acked %d + AlreadyDone %d, want %d calls answered", acked.Load(), done.Load(), calls)
	}
	t.Logf("%d calls with an ended context failed", cancelled.Load())
	st, err := e.SubscriptionStats(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != 0 || st.InFlight != 0 {
		t.Errorf("stats after acking everything: %+v", *st)
	}
}

// countCancelled counts the extra calls TestDeliveriesAckCombining makes with an ended context.
func countCancelled(n, copies int) int64 {
	var k int64
	for c := range copies {
		for i := range n {
			if (i+c)%37 == 0 {
				k++
			}
		}
	}
	return k
}

// BenchmarkClaimAck measures claiming and acking a QUEUE subscription (4 partitions, 100-byte
// payloads) in batches of 100, one member; one op is one message.
func BenchmarkClaimAck(b *testing.B) { benchClaimAck(b, storage.Watermark) }

// BenchmarkClaimAckRefcount is BenchmarkClaimAck on a refcount topic: each ack transaction also
// inserts the completion records.
func BenchmarkClaimAckRefcount(b *testing.B) { benchClaimAck(b, storage.Refcount) }

func benchClaimAck(b *testing.B, mode storage.CompletionTracking) {
	e := logOpen(b, testConfig(b, nil))
	ctx := b.Context()
	if _, err := e.TopicCreate(ctx, &storage.TopicCreateParams{Name: "bench.q", Config: storage.TopicConfig{Partitions: 4, CompletionTracking: mode}}); err != nil {
		b.Fatal(err)
	}
	sub, err := e.SubscriptionGetByGroup(ctx, "bench.q", storage.QueueGroup)
	if err != nil {
		b.Fatal(err)
	}
	msgs := make([]storage.AppendMessage, 500)
	for i := range msgs {
		msgs[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Payload: make([]byte, 100)}
	}
	for n := 0; n < b.N; n += len(msgs) {
		if _, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "bench.q", Messages: msgs}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for done := 0; done < b.N; {
		res, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: "m", Max: min(100, b.N-done)})
		if err != nil {
			b.Fatal(err)
		}
		refs := make([]storage.DeliveryRef, len(res.Deliveries))
		for i, d := range res.Deliveries {
			refs[i] = d.Ref()
		}
		if _, err := e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: sub.ID, Member: "m", Refs: refs}); err != nil {
			b.Fatal(err)
		}
		done += len(refs)
	}
}

// BenchmarkAckCombined measures acks of one message per call from many goroutines on one
// subscription (the calls are combined into shared transactions); one op is one message.
func BenchmarkAckCombined(b *testing.B) {
	e := openConns(b, 16)
	ctx := b.Context()
	if _, err := e.TopicCreate(ctx, &storage.TopicCreateParams{Name: "bench.q"}); err != nil {
		b.Fatal(err)
	}
	sub, err := e.SubscriptionGetByGroup(ctx, "bench.q", storage.QueueGroup)
	if err != nil {
		b.Fatal(err)
	}
	msgs := make([]storage.AppendMessage, 500)
	for i := range msgs {
		msgs[i] = storage.AppendMessage{Partition: 0, Payload: make([]byte, 100)}
	}
	var refs []storage.DeliveryRef
	for len(refs) < b.N {
		if _, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "bench.q", Messages: msgs}); err != nil {
			b.Fatal(err)
		}
		res, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: "m", Max: len(msgs)})
		if err != nil {
			b.Fatal(err)
		}
		for _, d := range res.Deliveries {
			refs = append(refs, d.Ref())
		}
	}
	var next atomic.Int64
	b.SetParallelism(64)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r := refs[next.Add(1)-1]
			if _, err := e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: sub.ID, Member: "m", Refs: []storage.DeliveryRef{r}}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// TestDLQTimeout: DLQ operations whose transaction waits for a lock another session holds fail
// after Config.TxTimeout with a retryable TIMEOUT and change nothing. A replay and a purge wait for
// the subscription's sub_partitions rows, a list for the DLQ table (an ACCESS EXCLUSIVE lock, as
// an ALTER TABLE or a VACUUM FULL takes). Once the session lets go, both entries are still in the
// DLQ, and a replay delivers them again.
func TestDLQTimeout(t *testing.T) {
	t.Parallel()
	e, sub, pre := openHeld(t, "dead.t", "a", "b")
	ctx := t.Context()
	must(e.DeliveriesNack(ctx, &storage.DeliveriesNackParams{SubscriptionID: sub.ID, Member: "m", Refs: storagetest.RefsOf(pre), ToDLQ: true}))(t)
	list := func() ([]*storage.DLQEntry, error) {
		return e.DLQList(ctx, &storage.DLQListParams{SubscriptionID: sub.ID})
	}
	if n := len(must(list())(t)); n != 2 {
		t.Fatalf("DLQ after the nack: %d entries, want 2", n)
	}

	b := lockSub(t, e, sub.ID)
	t0 := time.Now()
	checkTimeoutErr(t, awaitOut(t, goOp("replay", func() (int, error) {
		return e.DLQReplay(ctx, &storage.DLQReplayParams{SubscriptionID: sub.ID})
	}), t0, "the replay"))
	t0 = time.Now()
	checkTimeoutErr(t, awaitOut(t, goOp("purge", func() (int, error) {
		return e.DLQPurge(ctx, &storage.DLQPurgeParams{SubscriptionID: sub.ID})
	}), t0, "the purge"))
	checkPoolIdle(t, e)
	b.release()
	if n := len(must(list())(t)); n != 2 {
		t.Fatalf("DLQ after the timed-out replay and purge: %d entries, want 2", n)
	}
	if res := must(e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: "m", Max: 10}))(t); len(res.Deliveries) != 0 {
		t.Fatalf("claim after the timed-out replay: offsets %v, want none", storagetest.OffsetsOf(res.Deliveries))
	}

	b = lockRows(t, e.sql(`LOCK TABLE spool.dlq IN ACCESS EXCLUSIVE MODE`))
	t0 = time.Now()
	checkTimeoutErr(t, awaitOut(t, goOp("list", list), t0, "the list"))
	checkPoolIdle(t, e)
	b.release()

	if n := must(e.DLQReplay(ctx, &storage.DLQReplayParams{SubscriptionID: sub.ID}))(t); n != 2 {
		t.Fatalf("replay after the blockers let go: %d entries, want 2", n)
	}
	res := must(e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: "m", Max: 10}))(t)
	if got := storagetest.OffsetsOf(res.Deliveries); len(got) != 2 {
		t.Fatalf("claim after the replay: offsets %v, want the 2 replayed messages", got)
	}
}

// TestDeliveryRowsGoWithTheirSubscription: a subscription partition's delivery rows go with it
// (migration 0021's trigger, which replaced the foreign key's cascade): when the subscription is
// deleted through the engine, and when its row is deleted and the cascade removes its partitions
// (as the removal of a dead instance's ephemeral subscriptions and a topic's deletion do). The
// other subscription's rows stay.
func TestDeliveryRowsGoWithTheirSubscription(t *testing.T) {
	t.Parallel()
	e := logOpen(t, testConfig(t, nil))
	ctx := t.Context()
	if _, err := e.TopicCreate(ctx, &storage.TopicCreateParams{Name: "gone.t",
		Config: storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2}}); err != nil {
		t.Fatal(err)
	}
	var subs []*storage.Subscription
	for _, g := range []string{"a", "b", "c"} {
		s, err := e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "gone.t", Group: g})
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s)
	}
	msgs := []storage.AppendMessage{{Partition: 0, Payload: []byte("x")}, {Partition: 1, Payload: []byte("y")}}
	if _, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "gone.t", Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	rows := func(id int64) int {
		t.Helper()
		var n int
		if err := e.pool.QueryRow(ctx, e.sql("SELECT count(*) FROM spool.deliveries WHERE sub_id = $1"), id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, s := range subs {
		res, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: s.ID, Member: "m", Max: 10})
		if err != nil || len(res.Deliveries) != 2 {
			t.Fatalf("claim of %s: %v %v", s.Group, res, err)
		}
		if n := rows(s.ID); n != 2 {
			t.Fatalf("group %s holds %d delivery rows after its claim, want 2 (one per partition)", s.Group, n)
		}
	}
	if err := e.SubscriptionDelete(ctx, subs[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, e.sql("DELETE FROM spool.subscriptions WHERE id = $1"), subs[1].ID); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{0, 0, 2} {
		if n := rows(subs[i].ID); n != want {
			t.Errorf("group %s: %d delivery rows left, want %d", subs[i].Group, n, want)
		}
	}
}

// TestTopicConfigsDecode: a configuration text decodes once and is answered from the cache
// after; another text (a changed configuration) decodes anew; the cache starts over past
// maxTopicConfigs texts; a bad text fails.
func TestTopicConfigsDecode(t *testing.T) {
	var c topicConfigs
	a, err := c.decode([]byte(`{"max_deliveries": 3}`))
	if err != nil || a.MaxDeliveries != 3 {
		t.Fatalf("decode: %+v %v", a, err)
	}
	c.m[`{"max_deliveries": 3}`] = storage.TopicConfig{MaxDeliveries: 7} // what a second decode answers
	if got, _ := c.decode([]byte(`{"max_deliveries": 3}`)); got.MaxDeliveries != 7 {
		t.Fatalf("second decode of the same text: %+v, want the cached configuration", got)
	}
	if got, _ := c.decode([]byte(`{"max_deliveries": 1}`)); got.MaxDeliveries != 1 {
		t.Fatalf("decode of a changed text: %+v", got)
	}
	for i := range maxTopicConfigs {
		if _, err := c.decode(fmt.Appendf(nil, `{"max_deliveries": %d}`, 100+i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(c.m); n > maxTopicConfigs {
		t.Fatalf("%d texts cached, at most %d", n, maxTopicConfigs)
	}
	if _, err := c.decode([]byte(`{"max_deliveries": "x"}`)); err == nil {
		t.Fatal("a bad text decoded")
	}
}
