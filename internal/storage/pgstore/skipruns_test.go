package pgstore

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// TestRefcountJoinSkipsByRuns: a group joining a refcount topic skips what every other group
// completed out of order as runs (sub_partitions.skips), not one delivery-row offset per skipped
// message: a join over a window of 100,000 messages that group a completed but for offset 0
// writes one run, the joiner's claims get offset 0 and jump the run, a second joiner counts the
// first one's run as done, and the audit answers as before (the joiners are not in the skipped
// messages' sets). The log line gives the join's duration and the delivery state it wrote.
func TestRefcountJoinSkipsByRuns(t *testing.T) {
	t.Parallel()
	const n = 100_000
	ctx := t.Context()
	e := logOpen(t, testConfig(t, nil))
	outOfOrderWindow(t, e, "runs", n)

	t0 := time.Now()
	b := logSub(t, e, "runs", "b")
	took := time.Since(t0)
	var offsets, bytes int64
	if err := e.pool.QueryRow(ctx, e.sql(`SELECT coalesce(sum(cardinality(offsets)), 0), coalesce(sum(pg_column_size(d.*)), 0)
		FROM spool.deliveries d WHERE sub_id = $1`), b.ID).Scan(&offsets, &bytes); err != nil {
		t.Fatal(err)
	}
	skips := func(id int64) []int64 {
		t.Helper()
		var s []int64
		if err := e.pool.QueryRow(ctx, e.sql(`SELECT skips FROM spool.sub_partitions WHERE sub_id = $1`), id).Scan(&s); err != nil {
			t.Logf("skips of %d: %v", id, err)
		}
		return s
	}
	skipsB := skips(b.ID)
	// A second joiner counts b's run as done (b has done everything but offset 0 too).
	c := logSub(t, e, "runs", "c")
	skipsC := skips(c.ID)
	st := must(e.SubscriptionStats(ctx, b.ID))(t)
	// An ack of a skipped offset is already done.
	ack := must(e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: b.ID, Member: "m",
		Refs: []storage.DeliveryRef{{Partition: 0, Offset: 7}}}))(t)
	t1 := time.Now()
	got := must(e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: b.ID, Member: "m", Max: 10}))(t)
	claimTook := time.Since(t1)
	t.Logf("refcount join over a window of %d messages: %s, delivery rows %d offsets (%d bytes); the joiner's first claim %s",
		n, took.Round(time.Millisecond), offsets, bytes, claimTook.Round(time.Millisecond))
	if offsets != 0 {
		t.Fatalf("the join wrote delivery rows of %d offsets, want none (one skip run)", offsets)
	}
	if !slices.Equal(skipsB, []int64{1, n}) {
		t.Fatalf("b's skip runs: %v, want [1 %d]", skipsB, n)
	}
	if !slices.Equal(skipsC, []int64{1, n}) {
		t.Fatalf("c's skip runs: %v, want [1 %d]", skipsC, n)
	}
	if st.Pending != 1 {
		t.Fatalf("b's pending: %d, want 1 (offset 0)", st.Pending)
	}
	if ack.AlreadyDone != 1 || ack.Acked != 0 {
		t.Fatalf("b's ack of a skipped offset: %+v, want already done", ack)
	}
	if len(got.Deliveries) != 1 || got.Deliveries[0].Offset != 0 {
		t.Fatalf("b's claim: %+v, want offset 0 alone", got.Deliveries)
	}
	var cursor int64
	var left []int64
	if err := e.pool.QueryRow(ctx, e.sql(`SELECT cursor, skips FROM spool.sub_partitions WHERE sub_id = $1`), b.ID).Scan(&cursor, &left); err != nil {
		t.Fatal(err)
	}
	if cursor != n || left != nil {
		t.Fatalf("b after its claim: cursor %d, skips %v; want %d and none (the cursor passed the run)", cursor, left, n)
	}
	must(e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: b.ID, Member: "m", Refs: []storage.DeliveryRef{got.Deliveries[0].Ref()}}))(t)
	if st := must(e.SubscriptionStats(ctx, b.ID))(t); st.Pending != 0 || st.Lag != 0 {
		t.Fatalf("b after acking offset 0: %+v, want nothing pending", st)
	}

	// The audit: offset 0 is in every set; a skipped one only in a's.
	for _, tc := range []struct {
		offset int64
		groups []string
	}{{0, []string{"a", "b", "c"}}, {5, []string{"a"}}, {n - 1, []string{"a"}}} {
		rec := must(e.MessageCompletion(ctx, &storage.MessageCompletionParams{Topic: "runs", Partition: 0, Offset: tc.offset}))(t)
		var groups []string
		for _, g := range rec.Groups {
			groups = append(groups, g.Group)
		}
		if !slices.Equal(groups, tc.groups) {
			t.Errorf("completion of offset %d: groups %v, want %v", tc.offset, groups, tc.groups)
		}
	}
}

// TestRefcountJoinFragmentedRuns: runs between pending messages (group a completed every odd
// offset) are skipped one by one: a joiner's claim gets exactly the pending messages, in one
// call, and its skip runs are gone once its cursor passed them.
func TestRefcountJoinFragmentedRuns(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := logOpen(t, testConfig(t, nil))
	logTopic(t, e, "frag", storage.TopicConfig{Semantics: storage.PubSub, CompletionTracking: storage.Refcount})
	a := logSub(t, e, "frag", "a")
	var payloads []string
	for i := range 20 {
		payloads = append(payloads, fmt.Sprint(i))
	}
	logPublish(t, e, "frag", 0, payloads...)
	got := must(e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: a.ID, Member: "m", Max: 20}))(t)
	var odd []storage.DeliveryRef
	for _, d := range got.Deliveries {
		if d.Offset%2 == 1 {
			odd = append(odd, d.Ref())
		}
	}
	must(e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: a.ID, Member: "m", Refs: odd}))(t)
	b := logSub(t, e, "frag", "b")
	c := logSub(t, e, "frag", "c") // counts b's runs as done
	for _, id := range []int64{b.ID, c.ID} {
		got := must(e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: id, Member: "m", Max: 20}))(t)
		var offs []int64
		for _, d := range got.Deliveries {
			offs = append(offs, d.Offset)
		}
		if want := []int64{0, 2, 4, 6, 8, 10, 12, 14, 16, 18}; !slices.Equal(offs, want) {
			t.Fatalf("claim of joiner %d: %v, want %v", id, offs, want)
		}
		var cursor int64
		var left []int64
		if err := e.pool.QueryRow(ctx, e.sql(`SELECT cursor, skips FROM spool.sub_partitions WHERE sub_id = $1`), id).Scan(&cursor, &left); err != nil {
			t.Fatal(err)
		}
		if cursor != 20 || left != nil {
			t.Fatalf("joiner %d after its claim: cursor %d, skips %v; want 20 and none", id, cursor, left)
		}
	}
}

// outOfOrderWindow makes refcount topic name with n messages in one partition and group a,
// which holds offset 0 (leased) and completed the others, out of order.
func outOfOrderWindow(tb testing.TB, e *Engine, name string, n int) {
	ctx := tb.Context()
	must(e.TopicCreate(ctx, &storage.TopicCreateParams{Name: name,
		Config: storage.TopicConfig{Semantics: storage.PubSub, CompletionTracking: storage.Refcount}}))(tb)
	a := must(e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: name, Group: "a",
		Start: storage.StartPosition{Kind: storage.FromBeginning}}))(tb)
	for i := 0; i < n; i += 5000 {
		msgs := make([]storage.AppendMessage, min(5000, n-i))
		for j := range msgs {
			msgs[j] = storage.AppendMessage{Partition: 0, Payload: []byte{'x'}}
		}
		must(e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: name, Messages: msgs}))(tb)
	}
	got := must(e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: a.ID, Member: "m", Max: 1}))(tb)
	if len(got.Deliveries) != 1 || got.Deliveries[0].Offset != 0 {
		tb.Fatalf("a's claim: %+v, want offset 0", got.Deliveries)
	}
	refs := make([]storage.DeliveryRef, 0, n-1)
	for o := int64(1); o < int64(n); o++ {
		refs = append(refs, storage.DeliveryRef{Partition: 0, Offset: o})
	}
	must(e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: a.ID, Member: "m", Refs: refs}))(tb)
}

// BenchmarkRefcountJoinSkips: a group joining a refcount topic whose group a completed a window
// of messages out of order but for its first: the join skips the window as one run (it wrote an
// acked delivery row listing every offset before). Each iteration is one SubscriptionCreate and
// its delete.
//
//	go test -run '^$' -bench RefcountJoinSkips -benchtime 10x ./internal/storage/pgstore/
func BenchmarkRefcountJoinSkips(b *testing.B) {
	for _, window := range []int{10_000, 1_000_000} {
		b.Run(fmt.Sprintf("window=%d", window), func(b *testing.B) {
			e := logOpen(b, testConfig(b, nil))
			outOfOrderWindow(b, e, "rc", window)
			ctx := b.Context()
			b.ResetTimer()
			for i := range b.N {
				s := must(e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "rc", Group: fmt.Sprintf("j%d", i),
					Start: storage.StartPosition{Kind: storage.FromBeginning}}))(b)
				if err := e.SubscriptionDelete(ctx, s.ID); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestSkipRuns: the run helpers of sub_partitions.skips.
func TestSkipRuns(t *testing.T) {
	t.Parallel()
	if got := runsFrom([]int64{1, 3, 5, 9, 12, 14}, 6); !slices.Equal(got, [][2]int64{{6, 9}, {12, 14}}) {
		t.Errorf("runsFrom from 6: %v", got)
	}
	if got := runsFrom(nil, 0); got != nil {
		t.Errorf("runsFrom(nil): %v", got)
	}
	if got := flatRuns(nil); got != nil {
		t.Errorf("flatRuns(nil): %v, want nil (NULL)", got)
	}
	got := mergeRuns([][2]int64{{10, 20}, {1, 3}}, [][2]int64{{3, 5}, {15, 25}, {30, 31}, {7, 7}})
	if !slices.Equal(got, [][2]int64{{1, 5}, {10, 25}, {30, 31}}) {
		t.Errorf("mergeRuns: %v", got)
	}
	runs := [][2]int64{{1, 5}, {10, 25}, {30, 31}}
	for o, want := range map[int64]bool{0: false, 1: true, 4: true, 5: false, 9: false, 10: true, 24: true, 25: false, 30: true, 31: false} {
		if inRun(runs, o) != want {
			t.Errorf("inRun(%d): %v, want %v", o, !want, want)
		}
	}
}
