package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/errmap"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
	"github.com/spoolmq/spool/internal/testutil"
	"github.com/spoolmq/spool/protocol"
)

// laneSubs creates PUB_SUB subscriptions of topic until n of them share a lane, and returns those.
func laneSubs(t *testing.T, e *Engine, topic string, n int) []*storage.Subscription {
	t.Helper()
	var out []*storage.Subscription
	for i := 0; len(out) < n; i++ {
		s := logSub(t, e, topic, fmt.Sprintf("g%d", i))
		if s.ID%deliveryLanes == 0 {
			out = append(out, s)
		}
	}
	return out
}

// awaitPending polls until n operations queue on lane.
func awaitPending(t *testing.T, lane *opLane, n int) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, fmt.Sprintf("%d operations queued on the lane", n), func() error {
		lane.mu.Lock()
		defer lane.mu.Unlock()
		if len(lane.pending) != n {
			return fmt.Errorf("%d queued", len(lane.pending))
		}
		return nil
	})
}

type claimOut struct {
	res *storage.DeliveriesClaimResult
	err error
}

// TestDeliveriesCombinedAcrossSubscriptions: claims and acks of different subscriptions that
// queue while their lane's transaction waits run together in the next transaction, each with the
// answer it would have got alone: a claim of a cancelled subscription fails alone, and a
// subscription whose state cannot be read (a corrupt topic configuration fails the whole
// transaction) fails alone too, the others running again one by one.
func TestDeliveriesCombinedAcrossSubscriptions(t *testing.T) {
	t.Parallel()
	e := openConns(t, 8)
	ctx := t.Context()
	logTopic(t, e, "fan.t", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2})
	logTopic(t, e, "bad.t", storage.TopicConfig{Semantics: storage.PubSub})
	subs := laneSubs(t, e, "fan.t", 4)
	blocked, claimed, acked, cancelled := subs[0], subs[1], subs[2], subs[3]
	var corrupt *storage.Subscription
	for i := 0; corrupt == nil; i++ {
		if s := logSub(t, e, "bad.t", fmt.Sprintf("b%d", i)); s.ID%deliveryLanes == 0 {
			corrupt = s
		}
	}
	logPublish(t, e, "fan.t", 0, "a", "b", "c")
	logPublish(t, e, "fan.t", 1, "d")
	logPublish(t, e, "bad.t", 0, "x")
	// The acked subscription holds two leases to ack.
	pre := claimN(t, e, acked.ID, "m", 2)
	must(e.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: cancelled.ID, State: storage.Paused}))(t)

	run := func(block bool) {
		// Hold the blocked subscription's rows from outside, so that the lane's transaction waits.
		tx := must(e.pool.Begin(ctx))(t)
		defer func() { _ = tx.Rollback(context.Background()) }()
		must(tx.Exec(ctx, e.sql(`SELECT 1 FROM spool.sub_partitions WHERE sub_id = $1 FOR UPDATE`), blocked.ID))(t)
		first := make(chan claimOut, 1)
		go func() {
			res, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: blocked.ID, Member: "m", Max: 10})
			first <- claimOut{res, err}
		}()
		awaitBlockedBy(t, e, backendPID(t, tx))
		lane := &e.lanes[0]
		txs0 := e.laneTxs.Load()

		outs := make([]chan claimOut, 3)
		for i, s := range []*storage.Subscription{claimed, cancelled, corrupt} {
			outs[i] = make(chan claimOut, 1)
			go func() {
				res, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: s.ID, Member: "m", Max: 10})
				outs[i] <- claimOut{res, err}
			}()
			awaitPending(t, lane, i+1)
		}
		ackOut := make(chan error, 1)
		go func() {
			res, err := e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: acked.ID, Member: "m",
				Refs: []storage.DeliveryRef{pre[0].Ref(), pre[1].Ref(), {Partition: 7, Offset: 0}}})
			if err == nil && (res.Acked != 2 || len(res.Unknown) != 1) {
				err = fmt.Errorf("ack result %+v, want 2 acked and partition 7 unknown", *res)
			}
			ackOut <- err
		}()
		awaitPending(t, lane, 4)
		if block {
			// Corrupt the configuration of bad.t now: the combined transaction fails on it.
			must(e.pool.Exec(ctx, e.sql(`UPDATE spool.topics SET config = '{"partitions": "two"}' WHERE name = 'bad.t'`)))(t)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}

		if o := <-first; o.err != nil || len(o.res.Deliveries) != 4 {
			t.Errorf("blocked claim: %v, %v", o.res, o.err)
		}
		if o := <-outs[0]; o.err != nil || len(o.res.Deliveries) != 4 {
			t.Errorf("claim of %d: %+v, %v; want 4 deliveries", claimed.ID, o.res, o.err)
		}
		if o := <-outs[1]; !errors.Is(o.err, storage.ErrSubscriptionNotActive) {
			t.Errorf("claim of the paused subscription: %+v, %v; want ErrSubscriptionNotActive", o.res, o.err)
		}
		o := <-outs[2]
		if block {
			if !errors.Is(o.err, storage.ErrCorrupt) {
				t.Errorf("claim of the corrupt subscription: %+v, %v; want ErrCorrupt", o.res, o.err)
			}
		} else if o.err != nil || len(o.res.Deliveries) != 1 {
			t.Errorf("claim of %d: %+v, %v; want 1 delivery", corrupt.ID, o.res, o.err)
		}
		if err := <-ackOut; err != nil {
			t.Error(err)
		}
		// The four queued operations shared one transaction (the blocked claim had its own).
		if n := e.laneTxs.Load() - txs0; n != 1 {
			t.Errorf("the queued operations ran in %d lane transactions, want 1", n)
		}
	}
	run(false)
	// Again from the start, with bad.t's configuration corrupt: the others still get their answers.
	for _, s := range []*storage.Subscription{blocked, claimed} {
		must(e.DeliveriesRelease(ctx, &storage.DeliveriesReleaseParams{SubscriptionID: s.ID, Member: "m"}))(t)
	}
	pre = claimN(t, e, acked.ID, "m", 2)
	run(true)
}

// TestDeliveriesCombinedLoadsPerSubscription: the subscriptions of one lane transaction are
// loaded by shared statements, each with what its own operations need: an ack-only subscription
// (no waiting rows) loaded before a claiming one whose due messages are all waiting rows (nacked)
// does not make the claim miss them, and the claim's rows do not reach the acker.
func TestDeliveriesCombinedLoadsPerSubscription(t *testing.T) {
	t.Parallel()
	e := openConns(t, 8)
	ctx := t.Context()
	logTopic(t, e, "per.t", storage.TopicConfig{Semantics: storage.PubSub})
	subs := laneSubs(t, e, "per.t", 3)
	blocked, acker, claimer := subs[0], subs[1], subs[2] // id order: the acker loads first
	logPublish(t, e, "per.t", 0, "a", "b", "c")
	held := claimN(t, e, acker.ID, "m", 1)
	var refs []storage.DeliveryRef
	for _, d := range claimN(t, e, claimer.ID, "m", 3) {
		refs = append(refs, d.Ref())
	}
	must(e.DeliveriesNack(ctx, &storage.DeliveriesNackParams{SubscriptionID: claimer.ID, Member: "m", Refs: refs}))(t)

	b := lockSub(t, e, blocked.ID)
	first := goOp("claim of the blocked subscription", func() (*storage.DeliveriesClaimResult, error) {
		return e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: blocked.ID, Member: "m", Max: 10})
	})
	awaitBlockedBy(t, e, b.pid())
	lane := &e.lanes[0]
	txs0 := e.laneTxs.Load()
	ack := goOp("ack", func() (*storage.DeliveriesAckResult, error) {
		return e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: acker.ID, Member: "m", Refs: []storage.DeliveryRef{held[0].Ref()}})
	})
	awaitPending(t, lane, 1)
	claim := goOp("claim of the nacked messages", func() (*storage.DeliveriesClaimResult, error) {
		return e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: claimer.ID, Member: "m2", Max: 10})
	})
	awaitPending(t, lane, 2)
	b.release()

	if o := <-first; o.err != nil || len(o.res.(*storage.DeliveriesClaimResult).Deliveries) != 3 {
		t.Errorf("%s: %+v, %v; want 3 deliveries", o.what, o.res, o.err)
	}
	if o := <-ack; o.err != nil || o.res.(*storage.DeliveriesAckResult).Acked != 1 {
		t.Errorf("%s: %+v, %v; want 1 acked", o.what, o.res, o.err)
	}
	o := <-claim
	if o.err != nil {
		t.Fatalf("%s: %v", o.what, o.err)
	}
	ds := o.res.(*storage.DeliveriesClaimResult).Deliveries
	if got := storagetest.OffsetsOf(ds); !slices.Equal(got, []int64{0, 1, 2}) {
		t.Errorf("%s: offsets %v, want [0 1 2] (the nacked ones)", o.what, got)
	}
	for _, d := range ds {
		if d.Attempt != 2 {
			t.Errorf("%s: offset %d attempt %d, want 2", o.what, d.Offset, d.Attempt)
		}
	}
	if n := e.laneTxs.Load() - txs0; n != 1 {
		t.Errorf("the queued operations ran in %d lane transactions, want 1", n)
	}
	// The acker's other messages are still its own to claim, once each.
	if got := storagetest.OffsetsOf(claimN(t, e, acker.ID, "m", 2)); !slices.Equal(got, []int64{1, 2}) {
		t.Errorf("acker's next claim: offsets %v, want [1 2]", got)
	}
}

// TestDeliveriesNackExtendCombined: nacks and extends of several subscriptions that queue while
// their lane's transaction waits run together in the next transaction, with claims, each with the
// answer it would have got alone, in arrival order within a subscription (an extend of a message
// nacked just before finds it not held): a nack with a delay, a nack ToDLQ that dead-letters, an
// extend with the topic's ack wait and one with a duration, a nack by a member that does not hold
// the message, a nack listing a ref twice. Afterwards the state is what they said: the nacked
// message comes back after its delay, the dead-lettered ones are in the DLQ, the extended leases
// have their new deadlines.
func TestDeliveriesNackExtendCombined(t *testing.T) {
	t.Parallel()
	clock := storagetest.NewFakeClock(logBase)
	cfg := testConfig(t, clock)
	cfg.MaxConns = 8
	e := logOpen(t, cfg)
	ctx := t.Context()
	const ackWait = 30 * time.Second
	logTopic(t, e, "nx.t", storage.TopicConfig{Semantics: storage.PubSub, AckWait: ackWait, MaxDeliveries: 5})
	subs := laneSubs(t, e, "nx.t", 5)
	blocked, nacker, dlqer, extender, stranger := subs[0], subs[1], subs[2], subs[3], subs[4]
	logPublish(t, e, "nx.t", 0, "a", "b", "c")
	t0 := clock.Now()
	for _, s := range subs[1:] {
		if res := must(e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: s.ID, Member: "m", Max: 3}))(t); len(res.Deliveries) != 3 {
			t.Fatalf("claim of %d: %d deliveries, want 3", s.ID, len(res.Deliveries))
		}
	}
	ref := func(o int64) storage.DeliveryRef { return storage.DeliveryRef{Partition: 0, Offset: o} }
	refs := func(os ...int64) []storage.DeliveryRef {
		out := make([]storage.DeliveryRef, len(os))
		for i, o := range os {
			out[i] = ref(o)
		}
		return out
	}
	nack := func(p storage.DeliveriesNackParams) func() (*storage.DeliveriesNackResult, error) {
		return func() (*storage.DeliveriesNackResult, error) { return e.DeliveriesNack(ctx, &p) }
	}
	extend := func(p storage.DeliveriesExtendParams) func() (*storage.DeliveriesExtendResult, error) {
		return func() (*storage.DeliveriesExtendResult, error) { return e.DeliveriesExtend(ctx, &p) }
	}

	// Hold the blocked subscription's rows from outside, so that the lane's transaction waits.
	b := lockSub(t, e, blocked.ID)
	first := goOp("claim of the blocked subscription", func() (*storage.DeliveriesClaimResult, error) {
		return e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: blocked.ID, Member: "m", Max: 10})
	})
	awaitBlockedBy(t, e, b.pid())
	lane := &e.lanes[0]
	txs0, ops0 := e.laneTxs.Load(), e.laneOps.Load()
	type queuedOp struct {
		ch    <-chan opOut
		check func(res any) error
	}
	var queued []queuedOp
	add := func(ch <-chan opOut, check func(res any) error) {
		queued = append(queued, queuedOp{ch, check})
		awaitPending(t, lane, len(queued)) // one at a time: the arrival order is known
	}
	wantNack := func(nacked, dead int, notHeld ...int64) func(any) error {
		return func(res any) error {
			r := res.(*storage.DeliveriesNackResult)
			if r.Nacked != nacked || r.DeadLettered != dead || !slices.Equal(r.NotHeld, refs(notHeld...)) {
				return fmt.Errorf("got %+v, want %d nacked, %d dead-lettered, not held %v", *r, nacked, dead, notHeld)
			}
			return nil
		}
	}
	wantExtend := func(extended int, deadline time.Time, notHeld ...int64) func(any) error {
		return func(res any) error {
			r := res.(*storage.DeliveriesExtendResult)
			if r.Extended != extended || !r.Deadline.Equal(deadline) || !slices.Equal(r.NotHeld, refs(notHeld...)) {
				return fmt.Errorf("got %+v, want %d extended until %s, not held %v", *r, extended, deadline, notHeld)
			}
			return nil
		}
	}
	add(goOp("nack with a delay", nack(storage.DeliveriesNackParams{SubscriptionID: nacker.ID, Member: "m",
		Refs: refs(0), Delay: 10 * time.Second, Reason: "later"})), wantNack(1, 0))
	add(goOp("extend after the nack, ack wait", extend(storage.DeliveriesExtendParams{SubscriptionID: nacker.ID, Member: "m",
		Refs: refs(0, 1)})), wantExtend(1, t0.Add(ackWait), 0))
	add(goOp("nack ToDLQ", nack(storage.DeliveriesNackParams{SubscriptionID: dlqer.ID, Member: "m",
		Refs: refs(0, 1), ToDLQ: true, Reason: "bad"})), wantNack(0, 2))
	add(goOp("extend by 2m", extend(storage.DeliveriesExtendParams{SubscriptionID: extender.ID, Member: "m",
		Refs: refs(0, 1, 2), Duration: 2 * time.Minute})), wantExtend(3, t0.Add(2*time.Minute)))
	add(goOp("nack by a member that holds nothing", nack(storage.DeliveriesNackParams{SubscriptionID: stranger.ID, Member: "other",
		Refs: refs(0)})), wantNack(0, 0, 0))
	add(goOp("nack listing a ref twice", nack(storage.DeliveriesNackParams{SubscriptionID: stranger.ID, Member: "m",
		Refs: refs(1, 1)})), wantNack(1, 0, 1))
	add(goOp("claim after the nacks", func() (*storage.DeliveriesClaimResult, error) {
		return e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: stranger.ID, Member: "m2", Max: 10})
	}), func(res any) error {
		if got := storagetest.OffsetsOf(res.(*storage.DeliveriesClaimResult).Deliveries); !slices.Equal(got, []int64{1}) {
			return fmt.Errorf("offsets %v, want [1] (nacked just before, no delay)", got)
		}
		return nil
	})
	b.release()

	if o := <-first; o.err != nil || len(o.res.(*storage.DeliveriesClaimResult).Deliveries) != 3 {
		t.Errorf("%s: %+v, %v; want 3 deliveries", o.what, o.res, o.err)
	}
	for _, q := range queued {
		o := <-q.ch
		if o.err != nil {
			t.Errorf("%s: %v", o.what, o.err)
			continue
		}
		if err := q.check(o.res); err != nil {
			t.Errorf("%s: %v", o.what, err)
		}
	}
	if n := e.laneTxs.Load() - txs0; n != 1 {
		t.Errorf("the queued operations ran in %d lane transactions, want 1", n)
	}
	if n := e.laneOps.Load() - ops0; n != int64(len(queued)) {
		t.Errorf("%d operations ran on the lane, want the %d queued", n, len(queued))
	}

	// The state afterwards. The nacked message is not due before its delay, then comes back.
	claim := func(s *storage.Subscription) []*storage.Delivery {
		t.Helper()
		return must(e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: s.ID, Member: "m3", Max: 10}))(t).Deliveries
	}
	if ds := claim(nacker); len(ds) != 0 {
		t.Errorf("claim of the nacker before the delay: offsets %v, want none", storagetest.OffsetsOf(ds))
	}
	dead := must(e.DLQList(ctx, &storage.DLQListParams{SubscriptionID: dlqer.ID, Limit: 10}))(t)
	if len(dead) != 2 {
		t.Fatalf("DLQ of %d: %d entries, want 2", dlqer.ID, len(dead))
	}
	for i, d := range dead {
		if d.Message.Offset != int64(i) || d.Reason != storage.DLQRejected || d.LastError != "bad" || d.Attempts != 1 {
			t.Errorf("DLQ entry %d: offset %d, reason %s, last error %q, attempts %d; want offset %d, rejected, \"bad\", 1",
				i, d.Message.Offset, d.Reason, d.LastError, d.Attempts, i)
		}
	}
	if ds := claim(dlqer); len(ds) != 0 {
		t.Errorf("claim of the dead-lettering subscription: offsets %v, want none", storagetest.OffsetsOf(ds))
	}
	// The leases as stored: the extended ones with their new deadlines.
	type lease struct {
		offsets []int64
		state   string
		due     time.Time
	}
	leases := func(s *storage.Subscription) []lease {
		t.Helper()
		rows := must(e.pool.Query(ctx, e.sql(`SELECT offsets, state, due FROM spool.deliveries WHERE sub_id = $1 ORDER BY lo`), s.ID))(t)
		var out []lease
		for rows.Next() {
			var l lease
			if err := rows.Scan(&l.offsets, &l.state, &l.due); err != nil {
				t.Fatal(err)
			}
			l.due = l.due.UTC()
			out = append(out, l)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	wantLeases := func(s *storage.Subscription, what string, want ...lease) {
		t.Helper()
		got := leases(s)
		ok := len(got) == len(want)
		for i := 0; ok && i < len(got); i++ {
			ok = slices.Equal(got[i].offsets, want[i].offsets) && got[i].state == want[i].state && got[i].due.Equal(want[i].due)
		}
		if !ok {
			t.Errorf("delivery rows of the %s: %+v, want %+v", what, got, want)
		}
	}
	wantLeases(extender, "extender", lease{[]int64{0, 1, 2}, stLeased, t0.Add(2 * time.Minute)})
	wantLeases(nacker, "nacker",
		lease{[]int64{0}, stWaiting, t0.Add(10 * time.Second)},
		lease{[]int64{1}, stLeased, t0.Add(ackWait)},
		lease{[]int64{2}, stLeased, t0.Add(ackWait)})
	clock.Advance(10 * time.Second)
	if ds := claim(nacker); len(ds) != 1 || ds[0].Offset != 0 || ds[0].Attempt != 2 {
		t.Errorf("claim of the nacker after the delay: offsets %v, want [0] on its second attempt", storagetest.OffsetsOf(ds))
	}
}

// testTxTimeout is the TxTimeout of the timeout tests: long enough for a claim, an ack, a publish
// or a DLQ operation on an idle test database under -race, short enough to keep the tests fast.
const testTxTimeout = 500 * time.Millisecond

// openTxTimeout opens an engine whose transactions time out after testTxTimeout.
func openTxTimeout(t *testing.T, conns int32) *Engine {
	t.Helper()
	cfg := testConfig(t, nil)
	cfg.MaxConns = conns
	cfg.TxTimeout = testTxTimeout
	return logOpen(t, cfg)
}

// blocker is a session of its own (outside the engine's pool) that holds row locks until it rolls
// back, like another instance or an administrator's forgotten transaction.
type blocker struct {
	t    *testing.T
	conn *pgx.Conn
	tx   pgx.Tx
}

// lockRows begins a transaction on a fresh connection and runs query (a SELECT ... FOR UPDATE).
func lockRows(t *testing.T, query string, args ...any) *blocker {
	t.Helper()
	conn := must(pgx.Connect(t.Context(), testURL(t)))(t)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	tx := must(conn.Begin(t.Context()))(t)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) }) // a failed test releases the rows too
	must(tx.Exec(t.Context(), query, args...))(t)
	return &blocker{t: t, conn: conn, tx: tx}
}

// openHeld opens an engine whose transactions time out after testTxTimeout, with a PUB_SUB
// topic, one subscription of it, the payloads published to partition 0, and two of them held by
// member "m".
func openHeld(t *testing.T, topic string, payloads ...string) (*Engine, *storage.Subscription, []*storage.Delivery) {
	t.Helper()
	e := openTxTimeout(t, 4)
	logTopic(t, e, topic, storage.TopicConfig{Semantics: storage.PubSub})
	sub := logSub(t, e, topic, "g")
	logPublish(t, e, topic, 0, payloads...)
	return e, sub, claimN(t, e, sub.ID, "m", 2)
}

// claimN claims n deliveries of subscription id for member, failing the test unless it gets
// exactly n.
func claimN(t *testing.T, e *Engine, id int64, member string, n int) []*storage.Delivery {
	t.Helper()
	res := must(e.DeliveriesClaim(t.Context(), &storage.DeliveriesClaimParams{SubscriptionID: id, Member: member, Max: n}))(t)
	if len(res.Deliveries) != n {
		t.Fatalf("claimed %d deliveries of subscription %d, want %d", len(res.Deliveries), id, n)
	}
	return res.Deliveries
}

// lockSub locks the sub_partitions rows of subscription id from a session of its own, as every
// delivery transaction of that subscription needs them first.
func lockSub(t *testing.T, e *Engine, id int64) *blocker {
	t.Helper()
	return lockRows(t, e.sql(`SELECT 1 FROM spool.sub_partitions WHERE sub_id = $1 FOR UPDATE`), id)
}

func (b *blocker) pid() int { return int(b.conn.PgConn().PID()) }

func (b *blocker) release() {
	b.t.Helper()
	if err := b.tx.Rollback(b.t.Context()); err != nil {
		b.t.Fatal(err)
	}
}

// commit commits the blocker's transaction (a change that other sessions waited for).
func (b *blocker) commit() {
	b.t.Helper()
	if err := b.tx.Commit(b.t.Context()); err != nil {
		b.t.Fatal(err)
	}
}

// opOut is the outcome of an operation run in a goroutine.
type opOut struct {
	what string
	res  any
	err  error
}

// goOp runs op in a goroutine and returns the channel of its outcome.
func goOp[T any](what string, op func() (T, error)) <-chan opOut {
	ch := make(chan opOut, 1)
	go func() {
		res, err := op()
		ch <- opOut{what, res, err}
	}()
	return ch
}

// awaitOut returns the outcome of ch, failing the test if it has not come 10 transaction
// deadlines after start (without the deadline, the operation would wait as long as the blocker
// holds its rows; the margin is for a loaded machine, since one deadline is the expected wait).
func awaitOut(t *testing.T, ch <-chan opOut, start time.Time, what string) opOut {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(time.Until(start.Add(10 * testTxTimeout))):
		t.Fatalf("%s: no answer %s after the start (the transaction deadline is %s): it waits for the blocked rows",
			what, 10*testTxTimeout, testTxTimeout)
		return opOut{}
	}
}

// checkTimeoutErr checks that err is the error of a transaction that exceeded testTxTimeout,
// and that the protocol reports it as TIMEOUT, retryable.
func checkTimeoutErr(t *testing.T, o opOut) {
	t.Helper()
	t.Logf("%s: %v", o.what, o.err)
	if o.err == nil {
		t.Errorf("%s: got %+v, want the transaction timeout", o.what, o.res)
		return
	}
	if !errors.Is(o.err, context.DeadlineExceeded) || !strings.Contains(o.err.Error(), "transaction exceeded tx_timeout "+testTxTimeout.String()) {
		t.Errorf("%s: got %v, want a transaction timeout wrapping context.DeadlineExceeded", o.what, o.err)
	}
	if pe := errmap.ErrorFrom(o.err); pe.Code != protocol.CodeTimeout || !pe.Retryable {
		t.Errorf("%s: protocol error %s (code %d, retryable %v), want TIMEOUT, retryable", o.what, pe.Name, pe.Code, pe.Retryable)
	}
}

// checkPoolIdle checks that no pooled connection was left inside a transaction.
func checkPoolIdle(t *testing.T, e *Engine) {
	t.Helper()
	conns := e.pool.AcquireAllIdle(t.Context())
	for _, c := range conns {
		if st := c.Conn().PgConn().TxStatus(); st != 'I' {
			t.Errorf("pooled connection in transaction status %q", st)
		}
		c.Release()
	}
}

// TestDeliveriesLaneTimeout: a claim and an ack whose lane transaction waits for rows another
// session holds fail after Config.TxTimeout with a retryable TIMEOUT instead of waiting
// for that session; once it lets go, the same subscription claims and acks normally, and nothing
// of the timed-out transactions was applied. The blocked rows are first the subscription's
// sub_partitions rows (the transaction waits in its first batch) and then its delivery rows (an
// ack waits in its last batch, the one carrying the COMMIT, whose outcome is then unknown).
func TestDeliveriesLaneTimeout(t *testing.T) {
	t.Parallel()
	e, sub, pre := openHeld(t, "slow.t", "a", "b", "c", "d")
	ctx := t.Context()
	claim := func() (*storage.DeliveriesClaimResult, error) {
		return e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: "m", Max: 10})
	}

	// The subscription's sub_partitions rows are held: a claim, then an ack, time out.
	b := lockSub(t, e, sub.ID)
	t0 := time.Now()
	checkTimeoutErr(t, awaitOut(t, goOp("claim", claim), t0, "the claim"))
	t0 = time.Now()
	ack := goOp("ack", func() (*storage.DeliveriesAckResult, error) {
		return e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: sub.ID, Member: "m", Refs: storagetest.RefsOf(pre)})
	})
	checkTimeoutErr(t, awaitOut(t, ack, t0, "the ack"))
	checkPoolIdle(t, e)
	b.release()

	// The lane works again, and the timed-out transactions left nothing: the claim gets the two
	// messages not leased before (the timed-out claim leased none), and the ack below completes
	// all four (the timed-out ack completed none).
	res := must(claim())(t)
	if got := storagetest.OffsetsOf(res.Deliveries); !slices.Equal(got, []int64{2, 3}) {
		t.Fatalf("claim after the blocker let go: offsets %v, want [2 3]", got)
	}
	all := append(storagetest.RefsOf(pre), storagetest.RefsOf(res.Deliveries)...)

	// The delivery rows are held: the ack's last batch (its DELETEs and the COMMIT) waits.
	b = lockRows(t, e.sql(`SELECT 1 FROM spool.deliveries WHERE sub_id = $1 FOR UPDATE`), sub.ID)
	t0 = time.Now()
	ack = goOp("ack", func() (*storage.DeliveriesAckResult, error) {
		return e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: sub.ID, Member: "m", Refs: all})
	})
	checkTimeoutErr(t, awaitOut(t, ack, t0, "the ack waiting in its COMMIT batch"))
	checkPoolIdle(t, e)
	b.release()

	// The client retries the ack: whether or not the timed-out one committed (PostgreSQL may have
	// run its COMMIT before the cancel request arrived), every message ends acked exactly once,
	// and nothing is delivered again.
	ar := must(e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: sub.ID, Member: "m", Refs: all}))(t)
	if ar.Acked+ar.AlreadyDone != 4 || len(ar.Unknown) != 0 {
		t.Fatalf("retried ack: %+v, want the 4 messages acked or already done", *ar)
	}
	if ar.Acked != 4 {
		t.Logf("the timed-out ack had committed: %d acked now, %d already done", ar.Acked, ar.AlreadyDone)
	}
	if res := must(claim())(t); len(res.Deliveries) != 0 {
		t.Fatalf("claim after every message was acked: offsets %v, want none", storagetest.OffsetsOf(res.Deliveries))
	}
	logPublish(t, e, "slow.t", 0, "e")
	res = must(claim())(t)
	if got := storagetest.OffsetsOf(res.Deliveries); !slices.Equal(got, []int64{4}) {
		t.Fatalf("claim of a new message: offsets %v, want [4]", got)
	}
	if ar := must(e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: sub.ID, Member: "m", Refs: storagetest.RefsOf(res.Deliveries)}))(t); ar.Acked != 1 {
		t.Fatalf("ack of the new message: %+v, want 1 acked", *ar)
	}
}

// TestDeliveriesLaneTimeoutNackExtend: a nack and an extend whose lane transaction waits for rows
// another session holds fail after Config.TxTimeout with a retryable TIMEOUT, like claims
// and acks; nothing of them was applied: once the session lets go, the member still holds the
// messages (an extend finds them held), and a nack gives them back.
func TestDeliveriesLaneTimeoutNackExtend(t *testing.T) {
	t.Parallel()
	e, sub, pre := openHeld(t, "slow.t", "a", "b")
	ctx := t.Context()
	held := storagetest.RefsOf(pre)

	b := lockSub(t, e, sub.ID)
	t0 := time.Now()
	checkTimeoutErr(t, awaitOut(t, goOp("nack", func() (*storage.DeliveriesNackResult, error) {
		return e.DeliveriesNack(ctx, &storage.DeliveriesNackParams{SubscriptionID: sub.ID, Member: "m", Refs: held, ToDLQ: true})
	}), t0, "the nack"))
	t0 = time.Now()
	checkTimeoutErr(t, awaitOut(t, goOp("extend", func() (*storage.DeliveriesExtendResult, error) {
		return e.DeliveriesExtend(ctx, &storage.DeliveriesExtendParams{SubscriptionID: sub.ID, Member: "m", Refs: held, Duration: time.Hour})
	}), t0, "the extend"))
	checkPoolIdle(t, e)
	b.release()

	if n := must(e.DLQList(ctx, &storage.DLQListParams{SubscriptionID: sub.ID, Limit: 10}))(t); len(n) != 0 {
		t.Fatalf("the timed-out nack (ToDLQ) dead-lettered %d messages", len(n))
	}
	xr := must(e.DeliveriesExtend(ctx, &storage.DeliveriesExtendParams{SubscriptionID: sub.ID, Member: "m", Refs: held, Duration: time.Minute}))(t)
	if xr.Extended != 2 || len(xr.NotHeld) != 0 {
		t.Fatalf("extend after the blocker let go: %+v, want both still held and extended", *xr)
	}
	nr := must(e.DeliveriesNack(ctx, &storage.DeliveriesNackParams{SubscriptionID: sub.ID, Member: "m", Refs: held}))(t)
	if nr.Nacked != 2 || len(nr.NotHeld) != 0 {
		t.Fatalf("nack after the blocker let go: %+v, want both nacked", *nr)
	}
	res := must(e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: "m", Max: 10}))(t)
	if got := storagetest.OffsetsOf(res.Deliveries); !slices.Equal(got, []int64{0, 1}) || res.Deliveries[0].Attempt != 2 {
		t.Fatalf("claim after the nack: offsets %v, want [0 1] on their second attempt", got)
	}
}

// TestDeliveriesLaneTimeoutBatch: operations that queue on a lane behind a transaction waiting for
// rows another session holds run together in the next transaction, which waits for the same rows:
// every one of them (those of other subscriptions too) fails with the timeout once, together,
// within a few timeouts, instead of running again one by one (a timeout each). Once the session
// lets go, every subscription of the lane gets all its messages.
func TestDeliveriesLaneTimeoutBatch(t *testing.T) {
	t.Parallel()
	e := openTxTimeout(t, 8)
	ctx := t.Context()
	logTopic(t, e, "fan.t", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2})
	subs := laneSubs(t, e, "fan.t", 3)
	blocked, other, acker := subs[0], subs[1], subs[2]
	logPublish(t, e, "fan.t", 0, "a", "b", "c")
	logPublish(t, e, "fan.t", 1, "d")
	pre := claimN(t, e, acker.ID, "m", 2)
	claim := func(s *storage.Subscription, member string) func() (*storage.DeliveriesClaimResult, error) {
		return func() (*storage.DeliveriesClaimResult, error) {
			return e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: s.ID, Member: member, Max: 10})
		}
	}
	ack := func(s *storage.Subscription, refs []storage.DeliveryRef) func() (*storage.DeliveriesAckResult, error) {
		return func() (*storage.DeliveriesAckResult, error) {
			return e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: s.ID, Member: "m", Refs: refs})
		}
	}

	b := lockSub(t, e, blocked.ID)
	t0 := time.Now()
	outs := []<-chan opOut{goOp("first claim of the blocked subscription", claim(blocked, "m"))}
	awaitBlockedBy(t, e, b.pid())
	txs0 := e.laneTxs.Load()
	lane := &e.lanes[0]
	queued := []<-chan opOut{
		goOp("claim of another subscription", claim(other, "m")),
		goOp("second claim of the blocked subscription", claim(blocked, "m2")),
		goOp("ack of another subscription", ack(acker, storagetest.RefsOf(pre))),
		goOp("claim of another subscription", claim(acker, "m2")),
		goOp("ack of the blocked subscription", ack(blocked, []storage.DeliveryRef{{Partition: 0, Offset: 0}})),
	}
	awaitPending(t, lane, len(queued))
	outs = append(outs, queued...)
	// Two transactions of a timeout each (the first one's, then the one of the queued
	// operations); 5 leaves room for a loaded machine, and one by one they would take 5 more.
	for i, ch := range outs {
		checkTimeoutErr(t, awaitOut(t, ch, t0, fmt.Sprintf("operation %d", i)))
	}
	if n := e.laneTxs.Load() - txs0; n != 1 {
		t.Errorf("the queued operations ran in %d lane transactions, want 1", n)
	}
	checkPoolIdle(t, e)
	b.release()

	// Nothing was applied: every subscription gets every message it had not leased before.
	for _, s := range []*storage.Subscription{blocked, other} {
		if res := must(claim(s, "m")())(t); len(res.Deliveries) != 4 {
			t.Errorf("claim of %d after the blocker let go: %d deliveries, want 4", s.ID, len(res.Deliveries))
		}
	}
	if res := must(claim(acker, "m")())(t); len(res.Deliveries) != 2 {
		t.Errorf("claim of %d after the blocker let go: %d deliveries, want the 2 not leased before", acker.ID, len(res.Deliveries))
	}
	if ar := must(ack(acker, storagetest.RefsOf(pre))())(t); ar.Acked != 2 {
		t.Errorf("ack after the blocker let go: %+v, want 2 acked", *ar)
	}
}

// TestConfigTxTimeout: zero takes the default; a negative or too small TxTimeout is
// an invalid argument, at Validate and at Open (before connecting).
func TestConfigTxTimeout(t *testing.T) {
	t.Parallel()
	cfg := Config{URL: "postgres://spool@127.0.0.1:1/none"}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("zero TxTimeout: %v", err)
	}
	if d := cfg.withDefaults().TxTimeout; d != DefaultTxTimeout {
		t.Fatalf("default TxTimeout %s, want %s", d, DefaultTxTimeout)
	}
	for _, d := range []time.Duration{-time.Second, time.Millisecond, 2 * time.Hour} {
		cfg.TxTimeout = d
		if err := cfg.Validate(); !errors.Is(err, storage.ErrInvalidArgument) || !strings.Contains(err.Error(), "tx_timeout") {
			t.Errorf("TxTimeout %s: Validate: %v, want an invalid argument naming tx_timeout", d, err)
		}
		if e, err := Open(t.Context(), cfg); !errors.Is(err, storage.ErrInvalidArgument) {
			if e != nil {
				_ = e.Close()
			}
			t.Errorf("TxTimeout %s: Open: %v, want an invalid argument", d, err)
		}
	}
}

// TestDeliveriesReleaseTimeout: a release (a member leaving), which runs in a transaction of its
// own, is bounded by Config.TxTimeout too: while another session holds the subscription's
// rows it fails with the retryable timeout, having changed nothing, and works once the rows are
// free.
func TestDeliveriesReleaseTimeout(t *testing.T) {
	t.Parallel()
	e, sub, pre := openHeld(t, "leave.t", "a", "b")
	ctx := t.Context()

	b := lockSub(t, e, sub.ID)
	t0 := time.Now()
	checkTimeoutErr(t, awaitOut(t, goOp("release", func() (*storage.DeliveriesReleaseResult, error) {
		return e.DeliveriesRelease(ctx, &storage.DeliveriesReleaseParams{SubscriptionID: sub.ID, Member: "m"})
	}), t0, "the release"))
	checkPoolIdle(t, e)
	b.release()

	// The member still holds both: the timed-out release changed nothing.
	xr := must(e.DeliveriesExtend(ctx, &storage.DeliveriesExtendParams{SubscriptionID: sub.ID, Member: "m", Refs: storagetest.RefsOf(pre), Duration: time.Minute}))(t)
	if xr.Extended != 2 {
		t.Fatalf("extend after the timed-out release: %+v, want both still held", *xr)
	}
	rr := must(e.DeliveriesRelease(ctx, &storage.DeliveriesReleaseParams{SubscriptionID: sub.ID, Member: "m"}))(t)
	if rr.Released != 2 {
		t.Fatalf("release after the blocker let go: %+v, want 2 released", *rr)
	}
	res := must(e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: "n", Max: 10}))(t)
	if got := storagetest.OffsetsOf(res.Deliveries); !slices.Equal(got, []int64{0, 1}) {
		t.Fatalf("claim after the release: offsets %v, want [0 1]", got)
	}
}
