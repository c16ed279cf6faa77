package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/storage"
)

// rowQuerier is what planOf needs of a pool or a transaction.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// planOf runs query (rendered for e's schema) with EXPLAIN (ANALYZE, BUFFERS) on q and returns
// the rows it returned and the pages (shared buffers hit or read) it used.
func planOf(t *testing.T, e *Engine, q rowQuerier, query string, args ...any) (rows, pages int64) {
	t.Helper()
	var js []byte
	if err := q.QueryRow(t.Context(), "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+e.sql(query), args...).Scan(&js); err != nil {
		t.Fatal(err)
	}
	var plan []struct {
		Plan struct {
			Rows       int64 `json:"Actual Rows"`
			SharedHit  int64 `json:"Shared Hit Blocks"`
			SharedRead int64 `json:"Shared Read Blocks"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(js, &plan); err != nil || len(plan) != 1 {
		t.Fatalf("plan %s: %v", js, err)
	}
	return plan[0].Plan.Rows, plan[0].Plan.SharedHit + plan[0].Plan.SharedRead
}

// searchExpect returns, per partition of topic, the first retained offset published at or after
// at (or the high-water mark), computed from MessagesRead and TopicStats.
func searchExpect(t *testing.T, e *Engine, topic string, at time.Time) []int64 {
	t.Helper()
	st := must(e.TopicStats(t.Context(), topic))(t)
	out := make([]int64, len(st.Partitions))
	for i, p := range st.Partitions {
		out[i] = p.HighWater
		ms := must(e.MessagesRead(t.Context(), &storage.MessagesReadParams{Topic: topic, Partition: p.Partition, Limit: 1000}))(t)
		for _, m := range ms {
			if !m.PublishedAt.Before(at) {
				out[i] = m.Offset
				break
			}
		}
	}
	return out
}

// TestSubscriptionStartSearchBoundaries checks the start offsets of subscriptions from a time (the
// binary search of searchTimeSQL) and from a message id against a scan of the retained messages:
// runs of equal publish times (one batch, and a clock behind the partition's last publish time),
// an empty partition, times before the first and after the last retained message, exactly at and
// a microsecond around every publish time, and a prefix removed by retention.
func TestSubscriptionStartSearchBoundaries(t *testing.T) {
	t.Parallel()
	e, clock := logEngine(t)
	ctx := t.Context()
	const topic = "search"
	logTopic(t, e, topic, storage.TopicConfig{Semantics: storage.PubSub, Partitions: 3, MessageRetention: time.Hour,
		ZeroSubscriptionRetention: time.Hour, MaxRetention: 48 * time.Hour})
	// Partition 0: an old prefix that retention removes, then runs of equal times. Partition 1:
	// empty. Partition 2: one message per time step.
	logPublish(t, e, topic, 0, "old0", "old1", "old2")
	logPublish(t, e, topic, 2, "old")
	clock.Advance(2 * time.Hour)
	for i := range 12 {
		switch i % 3 {
		case 0:
			logPublish(t, e, topic, 0, "a", "b", "c") // one batch: one time
		case 1:
			logPublish(t, e, topic, 0, "d")
			clock.Advance(-time.Second) // behind the partition: the same time again
			logPublish(t, e, topic, 0, "e")
			clock.Advance(time.Second)
		}
		logPublish(t, e, topic, 2, fmt.Sprintf("m%d", i))
		clock.Advance(time.Duration(i+1) * time.Millisecond)
	}
	res := must(e.RetentionApply(ctx))(t)
	if res.MessagesDeleted != 4 {
		t.Fatalf("retention: %+v, want the 4 old messages deleted", *res)
	}
	st := must(e.TopicStats(ctx, topic))(t)
	if st.Partitions[0].LowOffset != 3 || st.Partitions[1].HighWater != 0 || st.Partitions[2].LowOffset != 1 {
		t.Fatalf("topic stats %+v: want partition 0 from 3, 1 empty, 2 from 1", st.Partitions)
	}

	var times []time.Time
	for p := range int32(3) {
		for _, m := range must(e.MessagesRead(ctx, &storage.MessagesReadParams{Topic: topic, Partition: p, Limit: 1000}))(t) {
			times = append(times, m.PublishedAt, m.PublishedAt.Add(-time.Microsecond), m.PublishedAt.Add(time.Microsecond))
		}
	}
	times = append(times, logBase.Add(-time.Hour), logBase, clock.Now().Add(time.Hour))
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	times = slices.CompactFunc(times, func(a, b time.Time) bool { return a.Equal(b) })

	group := 0
	starts := func(sp storage.StartPosition) []int64 {
		t.Helper()
		group++
		s := must(e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: topic, Group: fmt.Sprintf("g%d", group), Start: sp}))(t)
		return subStarts(t, e, s.ID)
	}
	for _, at := range times {
		want := searchExpect(t, e, topic, at)
		if got := starts(storage.StartPosition{Kind: storage.FromTimestamp, Time: at}); !slices.Equal(got, want) {
			t.Errorf("from time %s: starts %v, want %v", at.Format(time.RFC3339Nano), got, want)
		}
	}
	// From a message id: that offset in its partition (the first retained one below it), the
	// others from its publish time.
	ms := must(e.MessagesRead(ctx, &storage.MessagesReadParams{Topic: topic, Partition: 0, Limit: 1000}))(t)
	for o := int64(0); o <= st.Partitions[0].HighWater; o++ {
		want := searchExpect(t, e, topic, clock.Now())
		want[0] = max(o, st.Partitions[0].LowOffset)
		if i := want[0] - st.Partitions[0].LowOffset; i < int64(len(ms)) {
			want = searchExpect(t, e, topic, ms[i].PublishedAt)
			want[0] = ms[i].Offset
		}
		if got := starts(storage.StartPosition{Kind: storage.FromMessageID, Partition: 0, Offset: o}); !slices.Equal(got, want) {
			t.Errorf("from message 0:%d: starts %v, want %v", o, got, want)
		}
	}
}

// TestSearchTimeReadsLogarithmic checks that the time search reads a number of pages that grows
// with the log of the partition's length, wherever the time falls in a bucket: a scan in offset
// order filtered on the time read every message of the bucket before the first match (the whole
// bucket for a time near its end).
func TestSearchTimeReadsLogarithmic(t *testing.T) {
	t.Parallel()
	e, _ := logEngine(t)
	ctx := t.Context()
	const n = 200_000
	logTopic(t, e, "big", storage.TopicConfig{Semantics: storage.PubSub})
	id, t0 := loadMillis(t, e, "big", n)
	for _, o := range []int64{0, n / 2, n - 1} {
		at := t0.Add(time.Duration(o) * time.Millisecond)
		var got int64
		if err := e.pool.QueryRow(ctx, e.sql(`SELECT lo FROM (`+searchTimeSQL+`) s (partition, lo)`), id, []time.Time{at}).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != o {
			t.Fatalf("search %s: offset %d, want %d", at, got, o)
		}
		// About 18 steps of a few pages each; the scan read more than a thousand pages for the end.
		if _, pages := planOf(t, e, e.pool, searchTimeSQL, id, []time.Time{at}); pages > 200 {
			t.Errorf("search for offset %d of %d read %d pages, want O(log n)", o, n, pages)
		}
	}
}

// TestDLQReplayedReadsFewPages checks that what every delivery operation and SubscriptionStats
// read of a long DLQ stays small: the replayed entries (loadReplayedSQL, under the delivery
// transactions' enable_seqscan off) come from their partial index, not from a read of every entry
// of the subscription.
func TestDLQReplayedReadsFewPages(t *testing.T) {
	t.Parallel()
	e, _ := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "dlq", storage.TopicConfig{Semantics: storage.PubSub})
	s := logSub(t, e, "dlq", "g")
	const n = 20_000
	deadLetter(t, e, s.ID, n)
	scaleExec(t, e, `UPDATE spool.dlq SET replay = 'waiting', replay_due = $2 WHERE sub_id = $1 AND id IN (5, 500)`, s.ID, logBase)
	scaleExec(t, e, "ANALYZE spool.dlq")

	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	// A claim of 10 and an ack of the two replayed entries (the transaction's refs).
	rows, pages := planOf(t, e, tx, loadReplayedSQL, []int64{s.ID}, []int32{minLoadWaiting + 20}, []int64{s.ID, s.ID}, []int32{0, 0}, []int64{4, 499})
	if rows != 2 {
		t.Fatalf("replayed entries: %d rows, want 2", rows)
	}
	// A scan of the subscription's entries reads hundreds of pages.
	if pages > 20 {
		t.Errorf("loading 2 replayed entries of a DLQ of %d read %d pages", n, pages)
	}
	st := must(e.SubscriptionStats(ctx, s.ID))(t)
	if st.DeadLettered != n-2 || st.Redelivering != 2 {
		t.Fatalf("stats: %d dead-lettered, %d redelivering; want %d and 2", st.DeadLettered, st.Redelivering, n-2)
	}
}

// TestRetentionReadsLogarithmic checks that retention finds its cut points with the binary search:
// a group holding every message of a partition keeps 100,000 of them older than
// message_retention, and a run used to read all of those to find where message_retention starts,
// every run, for as long as the group held them. It also checks the cut once the group is gone.
func TestRetentionReadsLogarithmic(t *testing.T) {
	t.Parallel()
	e, clock := logEngine(t)
	ctx := t.Context()
	const n = 200_000
	logTopic(t, e, "held", storage.TopicConfig{Semantics: storage.PubSub, MessageRetention: time.Hour,
		ZeroSubscriptionRetention: time.Hour, MaxRetention: 48 * time.Hour})
	id, t0 := loadMillis(t, e, "held", n)
	s := logSub(t, e, "held", "g") // from the beginning: holds every message
	// message_retention and zero_subscription_retention start at the middle message.
	clock.Advance(t0.Add(time.Hour + n/2*time.Millisecond).Sub(clock.Now()))

	now := clock.Now()
	times := []time.Time{now.Add(-48 * time.Hour), now.Add(-time.Hour), now.Add(-time.Hour)}
	// Three searches of about 18 steps; the scans read some 1,400 pages for each middle time.
	_, pages := planOf(t, e, e.pool, retentionBoundsSQL, id, times)
	if pages > 600 {
		t.Errorf("retention bounds read %d pages, want O(log n)", pages)
	}
	t.Logf("retention bounds: %d pages", pages)

	must(e.RetentionApply(ctx))(t)
	if st := must(e.TopicStats(ctx, "held"))(t); st.Partitions[0].LowOffset != 0 {
		t.Fatalf("held by a group from the beginning: low offset %d, want 0", st.Partitions[0].LowOffset)
	}
	if err := e.SubscriptionDelete(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	must(e.RetentionApply(ctx))(t)
	if st := must(e.TopicStats(ctx, "held"))(t); st.Partitions[0].LowOffset != n/2 {
		t.Fatalf("no group: low offset %d, want %d (the first message within zero_subscription_retention)", st.Partitions[0].LowOffset, n/2)
	}
}

// TestDLQReplayOfManyEntries replays a DLQ of thousands of entries, as an operator does after an
// outage, and checks that a delivery transaction loads only the replayed entries it can need (a
// claim's worth of the waiting ones due first, the leased ones, those its refs name), not every
// replayed entry; that a late ack still completes an entry far down the waiting order; and that
// claims deliver every entry exactly once, with NextDue saying "now" while any is left.
func TestDLQReplayOfManyEntries(t *testing.T) {
	t.Parallel()
	e, _ := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "replay", storage.TopicConfig{Semantics: storage.PubSub})
	s := logSub(t, e, "replay", "g")
	const n = 5_000
	deadLetter(t, e, s.ID, n)
	if got := must(e.DLQReplay(ctx, &storage.DLQReplayParams{SubscriptionID: s.ID}))(t); got != n {
		t.Fatalf("replayed %d entries, want %d", got, n)
	}
	scaleExec(t, e, "ANALYZE spool.dlq")

	// What a claim of 100 and an ack of the last entry load.
	want := wantFor([]*dop{{sub: s.ID, claim: &storage.DeliveriesClaimParams{Max: 100}}, {sub: s.ID, refs: []storage.DeliveryRef{{Partition: 0, Offset: n - 1}}}})
	rows, _ := planOf(t, e, e.pool, loadReplayedSQL, []int64{s.ID}, []int32{int32(want.waiting)}, []int64{s.ID}, want.ps, want.os)
	if rows != int64(minLoadWaiting+200+1) {
		t.Errorf("a claim of 100 and an ack loaded %d of %d replayed entries, want %d", rows, n, minLoadWaiting+200+1)
	}

	// A late ack of the last entry in the waiting order completes its replayed copy.
	ack := must(e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: s.ID, Member: "m",
		Refs: []storage.DeliveryRef{{Partition: 0, Offset: n - 1}}}))(t)
	if ack.Acked != 1 {
		t.Fatalf("ack of the last replayed entry: %+v, want it acked", *ack)
	}
	if st := must(e.SubscriptionStats(ctx, s.ID))(t); st.Redelivering != n-1 {
		t.Fatalf("stats after the ack: %d redelivering, want %d", st.Redelivering, n-1)
	}

	seen := drainOnce(t, e, s.ID, n-1)
	if len(seen) != n-1 || seen[n-1] {
		t.Fatalf("delivered %d entries (the acked one: %v), want the other %d", len(seen), seen[n-1], n-1)
	}
	if st := must(e.SubscriptionStats(ctx, s.ID))(t); st.Redelivering != 0 || st.DeadLettered != 0 {
		t.Fatalf("stats at the end: %+v", *st)
	}
}

// TestNackedBacklogLoadsFewRows nacks a backlog with a delay, batch by batch, as consumers do
// while a downstream service is down, which leaves a waiting row of delivery state per batch. It
// checks that a claim loads the leased and acked rows and only a claim's worth of the waiting
// ones due first, not all of them; that a late ack still completes an offset of a waiting row the
// load left out; and that once due, claims deliver every other nacked offset exactly once, with
// NextDue saying "now" while any is left.
func TestNackedBacklogLoadsFewRows(t *testing.T) {
	t.Parallel()
	e, clock := logEngine(t)
	ctx := t.Context()
	logTopic(t, e, "nacked", storage.TopicConfig{Semantics: storage.PubSub, MaxDeliveries: 100})
	s := logSub(t, e, "nacked", "g")
	const n, batch = 3_000, 5
	msgs := make([]string, 100)
	for i := range msgs {
		msgs[i] = fmt.Sprintf("m%d", i)
	}
	for range n / len(msgs) {
		logPublish(t, e, "nacked", 0, msgs...)
	}
	var last storage.DeliveryRef
	for done := 0; done < n; done += batch {
		res := must(e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: s.ID, Member: "m", Max: batch}))(t)
		var refs []storage.DeliveryRef
		for _, d := range res.Deliveries {
			refs = append(refs, d.Ref())
		}
		if len(refs) != batch {
			t.Fatalf("claim at %d: %d deliveries, want %d", done, len(refs), batch)
		}
		// Due times one microsecond apart: the last batch is due last.
		clock.Advance(time.Microsecond)
		must(e.DeliveriesNack(ctx, &storage.DeliveriesNackParams{SubscriptionID: s.ID, Member: "m", Refs: refs, Delay: time.Hour}))(t)
		last = refs[batch-1]
	}
	scaleExec(t, e, "ANALYZE spool.deliveries")

	// What a claim of 10 loads: no leased or acked rows, the first 256+20 waiting ones.
	want := wantFor([]*dop{{sub: s.ID, claim: &storage.DeliveriesClaimParams{Max: 10}}})
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	e.queueLoad(b, []int64{s.ID}, loadDue, "", []loadWant{want})
	states, errs, err := e.readStates(tx.SendBatch(ctx, b), []int64{s.ID}, loadDue, []loadWant{want})
	_ = tx.Rollback(ctx)
	if err == nil {
		err = errs[0]
	}
	if err != nil {
		t.Fatal(err)
	}
	st := states[0]
	if len(st.rows) != minLoadWaiting+20 {
		t.Errorf("a claim of 10 loaded %d of the %d waiting rows, want %d", len(st.rows), n/batch, minLoadWaiting+20)
	}

	// A late ack of the last nacked offset (its row is due last: not loaded) completes it.
	ack := must(e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: s.ID, Member: "m", Refs: []storage.DeliveryRef{last}}))(t)
	if ack.Acked != 1 {
		t.Fatalf("late ack of %+v: %+v, want it acked", last, *ack)
	}

	clock.Advance(2 * time.Hour)
	seen := drainOnce(t, e, s.ID, n-1)
	if len(seen) != n-1 || seen[last.Offset] {
		t.Fatalf("redelivered %d offsets (the acked one: %v), want the other %d", len(seen), seen[last.Offset], n-1)
	}
}

// drainOnce claims (100 at a time) and acks the due messages of subscription id until a claim
// returns none, and returns the offsets delivered. It fails on an offset delivered twice, on a
// claim whose NextDue is later than now while fewer than want were delivered (the rest were
// due), and after more claims than want needs.
func drainOnce(t *testing.T, e *Engine, id int64, want int) map[int64]bool {
	t.Helper()
	ctx := t.Context()
	seen := make(map[int64]bool, want)
	for claims := 0; ; claims++ {
		if claims > want/100+2 {
			t.Fatalf("%d claims and %d of %d offsets delivered", claims, len(seen), want)
		}
		res := must(e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: id, Member: "m", Max: 100}))(t)
		if len(res.Deliveries) == 0 {
			return seen
		}
		var refs []storage.DeliveryRef
		for _, d := range res.Deliveries {
			if seen[d.Message.Offset] {
				t.Fatalf("offset %d delivered twice", d.Message.Offset)
			}
			seen[d.Message.Offset] = true
			refs = append(refs, d.Ref())
		}
		if left := want - len(seen); left > 0 && res.NextDue.After(e.now()) {
			t.Fatalf("after %d of %d deliveries: NextDue %s, want now (%d are due)", len(seen), want, res.NextDue, left)
		}
		if got := must(e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: id, Member: "m", Refs: refs}))(t); got.Acked != len(refs) {
			t.Fatalf("ack: %+v, want %d acked", *got, len(refs))
		}
	}
}

// loadMillis writes n messages into partition 0 of topic, one per millisecond from the start of
// logBase's bucket (the engine's bucket width is an hour: they all fit in it), as MessagesAppend
// would have, and returns the topic's id and the first message's time.
func loadMillis(t *testing.T, e *Engine, topic string, n int64) (int64, time.Time) {
	t.Helper()
	ctx := t.Context()
	var id int64
	if err := e.pool.QueryRow(ctx, e.sql("SELECT id FROM spool.topics WHERE name = $1"), topic).Scan(&id); err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(e.bucketStart(logBase), 0).UTC()
	if err := e.ensureBucket(ctx, t0); err != nil {
		t.Fatal(err)
	}
	scaleExec(t, e, `INSERT INTO spool.messages (topic_id, partition, "offset", published_at, payload, size)
		SELECT $1, 0, g, $2::timestamptz + g * interval '1 millisecond', '\x00'::bytea, 1 FROM generate_series(0, $3 - 1) g`, id, t0, n)
	scaleExec(t, e, `UPDATE spool.partitions SET next_offset = $2::bigint, low_published_at = $3,
		last_published_at = $3::timestamptz + ($2::bigint - 1) * interval '1 millisecond', bytes = $2::bigint * 65 WHERE topic_id = $1`, id, n, t0)
	scaleExec(t, e, "ANALYZE spool.messages")
	return id, t0
}

// deadLetter puts n entries (partition 0, offsets 0 to n-1, ids from the sequence) into the DLQ
// of subscription id, as dead-lettering at max_deliveries would have.
func deadLetter(t *testing.T, e *Engine, id int64, n int) {
	t.Helper()
	scaleExec(t, e, `INSERT INTO spool.dlq (sub_id, id, topic_id, partition, "offset", published_at, payload, reason, attempts, dead_at)
		SELECT $1, nextval('spool.dlq_ids'), (SELECT topic_id FROM spool.subscriptions WHERE id = $1), 0, g, $2, '\x00'::bytea,
			'max_deliveries', 5, $2
		FROM generate_series(0, $3::int - 1) g`, id, logBase, n)
}
