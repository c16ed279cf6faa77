package pgstore

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
)

// The scale tests measure operations whose cost could grow with the size of a topic's log or of a
// DLQ, on data loaded with direct SQL shaped like what the engine writes, and check their results.
// By default (CI) they run on small data sets; the measurements of docs/benchmarks.md use the full
// sizes, with SPOOL_PG_SCALE=1 (and a database, see testURL):
//
//	SPOOL_PG_SCALE=1 SPOOL_TEST_REQUIRE_PG=1 TEST_DATABASE_URL=... \
//	    go test -count=1 -v -timeout 30m -run 'TestScale' ./internal/storage/pgstore/
//
// SPOOL_PG_SCALE_MESSAGES (full 5000000, small 20000) is the number of messages of each test
// topic, SPOOL_PG_SCALE_SPAN_SECONDS (7200) the time they span (bucket width 1h: messages per
// bucket = messages / span hours), SPOOL_PG_SCALE_DLQ (full 1000000, small 10000) the DLQ length,
// SPOOL_PG_SCALE_NACKED (full 200000, small 2000) the nacked backlog. Timings and plans are logged
// (-v).

// scaleBase is the fake clock of the scale tests: the messages end just before it.
var scaleBase = time.Date(2031, time.March, 14, 12, 0, 0, 0, time.UTC)

// scaleEnv returns the integer environment variable name, or by default full with SPOOL_PG_SCALE=1
// and small without.
func scaleEnv(t *testing.T, name string, full, small int64) int64 {
	t.Helper()
	v := os.Getenv(name)
	switch {
	case v != "":
	case os.Getenv("SPOOL_PG_SCALE") == "1":
		return full
	default:
		return small
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// scaleEngine opens an engine on a fresh schema with a fake clock at scaleBase.
func scaleEngine(t *testing.T) *Engine {
	t.Helper()
	cfg := testConfig(t, storagetest.NewFakeClock(scaleBase))
	cfg.MaxConns = 4
	return logOpen(t, cfg)
}

// timed runs fn n times and returns the durations, sorted.
func timed(t *testing.T, n int, fn func(i int) error) []time.Duration {
	t.Helper()
	var ds []time.Duration
	for i := range n {
		t0 := time.Now()
		if err := fn(i); err != nil {
			t.Fatal(err)
		}
		ds = append(ds, time.Since(t0))
	}
	slices.Sort(ds)
	return ds
}

// fmtDur formats sorted durations as min / median / max in milliseconds.
func fmtDur(ds []time.Duration) string {
	ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 2, 64) }
	return fmt.Sprintf("min %s ms, median %s ms, max %s ms (n=%d)", ms(ds[0]), ms(ds[len(ds)/2]), ms(ds[len(ds)-1]), len(ds))
}

// explain logs the EXPLAIN (ANALYZE, BUFFERS) of query (spool.-qualified) with args.
func explain(t *testing.T, e *Engine, what, query string, args ...any) {
	t.Helper()
	rows, err := e.pool.Query(t.Context(), "EXPLAIN (ANALYZE, BUFFERS) "+e.sql(query), args...) // JIT as configured
	if err != nil {
		t.Fatalf("explain %s: %v", what, err)
	}
	var lines []string
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("explain %s: %v", what, err)
	}
	t.Logf("plan of %s:\n%s", what, strings.Join(lines, "\n"))
}

// scaleExec runs a spool.-qualified statement.
func scaleExec(t *testing.T, e *Engine, query string, args ...any) {
	t.Helper()
	if _, err := e.pool.Exec(t.Context(), e.sql(query), args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// scaleTopic creates topic name with parts partitions and loads n messages spread evenly over
// them, published evenly over [t0, t0+span) in each partition (microseconds, non-decreasing with
// the offset), with the partition rows the engine would have written. It returns the topic id.
func scaleTopic(t *testing.T, e *Engine, name string, parts int, n int64, t0 time.Time, span time.Duration) int64 {
	t.Helper()
	ctx := t.Context()
	logTopic(t, e, name, storage.TopicConfig{Semantics: storage.PubSub, Partitions: parts})
	var id int64
	if err := e.pool.QueryRow(ctx, e.sql("SELECT id FROM spool.topics WHERE name = $1"), name).Scan(&id); err != nil {
		t.Fatal(err)
	}
	for at := t0; at.Before(t0.Add(span + e.bucket.width)); at = at.Add(e.bucket.width) {
		if err := e.ensureBucket(ctx, at); err != nil {
			t.Fatal(err)
		}
	}
	np := n / int64(parts)
	us := span.Microseconds()
	const payload = 100
	start := time.Now()
	for p := range parts {
		scaleExec(t, e, `INSERT INTO spool.messages (topic_id, partition, "offset", published_at, payload, size)
			SELECT $1, $2, g, $3::timestamptz + (g * $4::bigint / $5::bigint) * interval '1 microsecond', $6::bytea, $7
			FROM generate_series(0::bigint, $5::bigint - 1) g`, id, p, t0, us, np, make([]byte, payload), payload)
		scaleExec(t, e, `UPDATE spool.partitions SET next_offset = $3, low_offset = 0, low_published_at = $4,
			last_published_at = $4::timestamptz + (($3::bigint - 1) * $5::bigint / $3::bigint) * interval '1 microsecond',
			bytes = $3::bigint * $6::bigint WHERE topic_id = $1 AND partition = $2`, id, p, np, t0, us, payload+messageOverhead)
	}
	t.Logf("topic %s: %d messages in %d partitions over %s loaded in %s", name, np*int64(parts), parts, span, time.Since(start).Round(time.Millisecond))
	return id
}

// scaleOffset is the first offset of a partition of scaleTopic (np messages over span from t0)
// published at or after at.
func scaleOffset(np int64, t0 time.Time, span time.Duration, at time.Time) int64 {
	d := at.Sub(t0).Microseconds()
	if d <= 0 {
		return 0
	}
	us := span.Microseconds()
	o := (d*np + us - 1) / us // ceil(d*np/us): the first g with floor(g*us/np) >= d
	return min(o, np)
}

// subStarts returns a subscription's cursors, by partition.
func subStarts(t *testing.T, e *Engine, id int64) []int64 {
	t.Helper()
	rows, err := e.pool.Query(t.Context(), e.sql("SELECT cursor FROM spool.sub_partitions WHERE sub_id = $1 ORDER BY partition"), id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var c int64
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestScaleSubscriptionCreateFromTime measures SubscriptionCreate from a time and from a message
// id near the start, the middle and the end of a topic of millions of messages (1 and 4
// partitions), checks the start offsets, and logs the plans of the time search.
func TestScaleSubscriptionCreateFromTime(t *testing.T) {
	e := scaleEngine(t)
	ctx := t.Context()
	n := scaleEnv(t, "SPOOL_PG_SCALE_MESSAGES", 5_000_000, 20_000)
	span := time.Duration(scaleEnv(t, "SPOOL_PG_SCALE_SPAN_SECONDS", 7200, 7200)) * time.Second
	t0 := scaleBase.Add(-span)
	topics := []struct {
		name  string
		parts int
		id    int64
	}{{name: "scale1", parts: 1}, {name: "scale4", parts: 4}}
	for i := range topics {
		topics[i].id = scaleTopic(t, e, topics[i].name, topics[i].parts, n, t0, span)
	}
	start := time.Now()
	scaleExec(t, e, "VACUUM (ANALYZE) spool.messages")
	t.Logf("VACUUM (ANALYZE) spool.messages: %s", time.Since(start).Round(time.Millisecond))

	points := []struct {
		name string
		frac float64
	}{{"start", 0.0001}, {"middle", 0.5}, {"end", 0.9999}, {"after the last", 2}}
	const runs = 5
	group := 0
	for _, tp := range topics {
		np := n / int64(tp.parts)
		for _, pt := range points {
			at := t0.Add(time.Duration(float64(span) * pt.frac)).Truncate(time.Microsecond)
			want := scaleOffset(np, t0, span, at)
			ds := timed(t, runs, func(int) error {
				group++
				s, err := e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: tp.name, Group: fmt.Sprintf("g%d", group),
					Start: storage.StartPosition{Kind: storage.FromTimestamp, Time: at}})
				if err != nil {
					return err
				}
				for p, got := range subStarts(t, e, s.ID) {
					if got != want {
						return fmt.Errorf("%s partition %d from %s: start %d, want %d", tp.name, p, at, got, want)
					}
				}
				return nil
			})
			t.Logf("%s (%d partitions, %d messages each) SubscriptionCreate FromTimestamp %s (offset %d): %s",
				tp.name, tp.parts, np, pt.name, want, fmtDur(ds))
			if pt.frac <= 1 {
				off := want
				ds = timed(t, runs, func(int) error {
					group++
					s, err := e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: tp.name, Group: fmt.Sprintf("g%d", group),
						Start: storage.StartPosition{Kind: storage.FromMessageID, Partition: 0, Offset: off}})
					if err != nil {
						return err
					}
					for p, got := range subStarts(t, e, s.ID) {
						if got != off {
							return fmt.Errorf("%s partition %d from message %d: start %d, want %d", tp.name, p, off, got, off)
						}
					}
					return nil
				})
				t.Logf("%s SubscriptionCreate FromMessageID %s (offset %d): %s", tp.name, pt.name, off, fmtDur(ds))
			}
			explain(t, e, fmt.Sprintf("searchTimeSQL %s %s", tp.name, pt.name), searchTimeSQL, tp.id, []time.Time{at})
		}
	}
}

// TestScaleDLQ measures DLQList (first and last page), SubscriptionStats and a claim and ack of
// a subscription whose DLQ holds a million entries (a few of them replayed), and logs the plans.
func TestScaleDLQ(t *testing.T) {
	e := scaleEngine(t)
	ctx := t.Context()
	n := scaleEnv(t, "SPOOL_PG_SCALE_DLQ", 1_000_000, 10_000)
	logTopic(t, e, "dlq", storage.TopicConfig{Semantics: storage.PubSub})
	s := logSub(t, e, "dlq", "g")
	var topicID int64
	if err := e.pool.QueryRow(ctx, e.sql("SELECT id FROM spool.topics WHERE name = 'dlq'")).Scan(&topicID); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	scaleExec(t, e, `INSERT INTO spool.dlq (sub_id, id, topic_id, partition, "offset", published_at, payload, reason, attempts,
			last_error, dead_at)
		SELECT $1, nextval('spool.dlq_ids'), $2, 0, g, $3, $4::bytea, 'max_deliveries', 5, 'lease expired', $3
		FROM generate_series(0::bigint, $5::bigint - 1) g`, s.ID, topicID, scaleBase.Add(-time.Hour), make([]byte, 100), n)
	// A few replayed entries, waiting for redelivery, as DLQReplay leaves them.
	scaleExec(t, e, `UPDATE spool.dlq SET replay = 'waiting', replay_due = $2 WHERE sub_id = $1 AND id IN (10, 20, 30)`, s.ID, scaleBase)
	scaleExec(t, e, "VACUUM (ANALYZE) spool.dlq")
	t.Logf("DLQ: %d entries loaded and vacuumed in %s", n, time.Since(start).Round(time.Millisecond))
	logPublish(t, e, "dlq", 0, "a", "b", "c", "d", "e", "f", "g", "h", "i", "j")

	var maxID int64
	if err := e.pool.QueryRow(ctx, e.sql("SELECT max(id) FROM spool.dlq")).Scan(&maxID); err != nil {
		t.Fatal(err)
	}
	const runs = 5
	for _, page := range []struct {
		name  string
		after int64
	}{{"first page", 0}, {"middle page", maxID / 2}, {"last page", maxID - 50}} {
		ds := timed(t, runs, func(int) error {
			es, err := e.DLQList(ctx, &storage.DLQListParams{SubscriptionID: s.ID, AfterID: page.after, Limit: 100})
			if err == nil && len(es) == 0 {
				err = fmt.Errorf("DLQList after %d: empty", page.after)
			}
			return err
		})
		t.Logf("DLQList %s (after %d, limit 100) of %d entries: %s", page.name, page.after, n, fmtDur(ds))
	}
	ds := timed(t, runs, func(int) error {
		st, err := e.SubscriptionStats(ctx, s.ID)
		if err == nil && st.DeadLettered != n-3 {
			err = fmt.Errorf("stats: %d dead-lettered, want %d", st.DeadLettered, n-3)
		}
		return err
	})
	t.Logf("SubscriptionStats with %d DLQ entries: %s", n, fmtDur(ds))
	ds = timed(t, runs, func(int) error { return claimAck(ctx, e, s.ID, 2) })
	t.Logf("DeliveriesClaim (max 2) + DeliveriesAck with %d DLQ entries: %s", n, fmtDur(ds))

	explain(t, e, "DLQList first page", `SELECT m.id, m.reason, m.attempts, m.last_error, m.dead_at, m.partition, m."offset", `+msgCols+`
		FROM spool.dlq m WHERE m.sub_id = $1 AND m.replay IS NULL AND m.id > $2 ORDER BY m.id LIMIT $3`, s.ID, 0, 100)
	explain(t, e, "DLQList last page", `SELECT m.id, m.reason, m.attempts, m.last_error, m.dead_at, m.partition, m."offset", `+msgCols+`
		FROM spool.dlq m WHERE m.sub_id = $1 AND m.replay IS NULL AND m.id > $2 ORDER BY m.id LIMIT $3`, s.ID, maxID-50, 100)
	explain(t, e, "SubscriptionStats", statsSQL, s.ID, topicID)
	explain(t, e, "delivery load: replayed DLQ entries (a claim of 2)", loadReplayedSQL, []int64{s.ID}, []int32{minLoadWaiting + 4}, []int64{}, []int32{}, []int64{})

	// The operator replays the whole DLQ: every entry is replayed, waiting for redelivery.
	start = time.Now()
	replayed := must(e.DLQReplay(ctx, &storage.DLQReplayParams{SubscriptionID: s.ID}))(t)
	t.Logf("DLQReplay of all %d entries: %s", replayed, time.Since(start).Round(time.Millisecond))
	ds = timed(t, runs, func(int) error { return claimAck(ctx, e, s.ID, 100) })
	t.Logf("DeliveriesClaim (max 100) + DeliveriesAck with %d replayed DLQ entries: %s", replayed, fmtDur(ds))
}

// TestScaleNackedBacklog measures the delivery operations of a subscription whose consumers nacked
// a large backlog with a delay (a downstream outage: every claim batch comes back, due later):
// SPOOL_PG_SCALE_NACKED messages (default 200,000), claimed 100 at a time and nacked for an
// hour, which leaves one waiting row of delivery state per claim batch.
func TestScaleNackedBacklog(t *testing.T) {
	e := scaleEngine(t)
	ctx := t.Context()
	n := scaleEnv(t, "SPOOL_PG_SCALE_NACKED", 200_000, 2_000)
	logTopic(t, e, "nacked", storage.TopicConfig{Semantics: storage.PubSub, MaxDeliveries: 100})
	s := logSub(t, e, "nacked", "g")
	start := time.Now()
	batch := make([]storage.AppendMessage, 1000)
	for i := range batch {
		batch[i] = storage.AppendMessage{Partition: 0, Payload: make([]byte, 16)}
	}
	for sent := int64(0); sent < n+1000; sent += int64(len(batch)) {
		must(e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "nacked", Messages: batch}))(t)
	}
	t.Logf("%d messages published in %s", n+1000, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	for done := int64(0); done < n; done += 100 {
		res := must(e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: s.ID, Member: "m", Max: 100}))(t)
		var refs []storage.DeliveryRef
		for _, d := range res.Deliveries {
			refs = append(refs, d.Ref())
		}
		must(e.DeliveriesNack(ctx, &storage.DeliveriesNackParams{SubscriptionID: s.ID, Member: "m", Refs: refs, Delay: time.Hour}))(t)
	}
	var rows int64
	if err := e.pool.QueryRow(ctx, e.sql("SELECT count(*) FROM spool.deliveries WHERE sub_id = $1"), s.ID).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d messages claimed and nacked (1 h) 100 at a time in %s: %d delivery rows", n, time.Since(start).Round(time.Millisecond), rows)
	ds := timed(t, 5, func(int) error { return claimAck(ctx, e, s.ID, 100) })
	t.Logf("DeliveriesClaim (max 100) + DeliveriesAck of new messages behind %d nacked ones: %s", n, fmtDur(ds))
	ds = timed(t, 5, func(int) error {
		_, err := e.SubscriptionStats(ctx, s.ID)
		return err
	})
	t.Logf("SubscriptionStats with %d nacked messages in %d rows: %s", n, rows, fmtDur(ds))
}

// claimAck claims up to max messages of subscription id for member "m" and acks them; it fails
// when the claim returns none.
func claimAck(ctx context.Context, e *Engine, id int64, max int) error {
	res, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: id, Member: "m", Max: max})
	if err != nil {
		return err
	}
	var refs []storage.DeliveryRef
	for _, d := range res.Deliveries {
		refs = append(refs, d.Ref())
	}
	if len(refs) == 0 {
		return fmt.Errorf("claim of %d: nothing", max)
	}
	_, err = e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: id, Member: "m", Refs: refs})
	return err
}
