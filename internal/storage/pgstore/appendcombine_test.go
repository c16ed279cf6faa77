package pgstore

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
	"github.com/spoolmq/spool/internal/testutil"
)

// awaitAppendsQueued polls until n appends queue on topic's lane.
func awaitAppendsQueued(t *testing.T, e *Engine, topic string, n int) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, fmt.Sprintf("%d appends queued on %s", n, topic), func() error {
		e.appends.mu.Lock()
		defer e.appends.mu.Unlock()
		if l := e.appends.lanes[topic]; l == nil || len(l.pending) != n {
			return errors.New("not yet")
		}
		return nil
	})
}

type appendOut struct {
	res *storage.MessagesAppendResult
	err error
}

// goAppend runs MessagesAppend in a goroutine.
func goAppend(t *testing.T, e *Engine, topic string, msgs ...storage.AppendMessage) <-chan appendOut {
	ch := make(chan appendOut, 1)
	go func() {
		res, err := e.MessagesAppend(t.Context(), &storage.MessagesAppendParams{Topic: topic, Messages: msgs})
		ch <- appendOut{res, err}
	}()
	return ch
}

func msg(part int32, payload, producerID string) storage.AppendMessage {
	return storage.AppendMessage{Partition: part, Payload: []byte(payload), ProducerID: producerID}
}

// TestAppendsCombined: publishes of one topic that arrive while a transaction of the topic runs
// are appended together by the next one (one transaction for all of them), each with the answer it
// would have got alone: its own positions in its own order, the keyless messages of a call on one
// partition and those of the next call on the next one, a producer id of an earlier call of the
// batch answered as a duplicate of it; a call that fails on its own (a message too large) fails
// alone and the others are stored; offsets stay gapless.
func TestAppendsCombined(t *testing.T) {
	t.Parallel()
	e := openConns(t, 8)
	ctx := t.Context()
	const topic = "pub.c"
	logTopic(t, e, topic, storage.TopicConfig{Partitions: 2, MaxMessageBytes: 16})
	for round, bad := range []bool{false, true} {
		// Hold partition 0's row from outside: the first publish's transaction waits for it.
		b := lockRows(t, e.sql(`SELECT 1 FROM spool.partitions p JOIN spool.topics t ON t.id = p.topic_id
			WHERE t.name = $1 AND p.partition = 0 FOR UPDATE OF p`), topic)
		first := goAppend(t, e, topic, msg(0, "a", ""))
		awaitBlockedBy(t, e, b.pid())
		id := fmt.Sprintf("id-%d", round)
		outs := []<-chan appendOut{
			goAppend(t, e, topic, msg(0, "b1", ""), msg(1, "b2", ""), msg(0, "b3", "")),
		}
		awaitAppendsQueued(t, e, topic, 1)
		if bad {
			outs = append(outs, goAppend(t, e, topic, msg(0, "this one is too large", "")))
			awaitAppendsQueued(t, e, topic, len(outs))
		}
		outs = append(outs, goAppend(t, e, topic, msg(storage.PartitionAuto, "k1", ""), msg(storage.PartitionAuto, "k2", "")))
		awaitAppendsQueued(t, e, topic, len(outs))
		outs = append(outs, goAppend(t, e, topic, msg(storage.PartitionAuto, "k3", "")))
		awaitAppendsQueued(t, e, topic, len(outs))
		outs = append(outs, goAppend(t, e, topic, msg(1, "p", id)))
		awaitAppendsQueued(t, e, topic, len(outs))
		outs = append(outs, goAppend(t, e, topic, msg(0, "p-again", id)))
		awaitAppendsQueued(t, e, topic, len(outs))
		txs0 := e.appendTxs.Load()
		b.release()

		if o := <-first; o.err != nil {
			t.Fatalf("first publish: %v", o.err)
		}
		var got []appendOut
		for _, ch := range outs {
			got = append(got, <-ch)
		}
		if txs := e.appendTxs.Load() - txs0; txs != 1 {
			t.Errorf("round %d: %d publish transactions after the blocked one, want 1 for the %d queued calls", round, txs, len(outs))
		}
		if bad {
			if !errors.Is(got[1].err, storage.ErrMessageTooLarge) {
				t.Errorf("the call with a message too large: %+v, want ErrMessageTooLarge", got[1])
			}
			got = append(got[:1], got[2:]...)
		}
		for i, o := range got {
			if o.err != nil {
				t.Fatalf("round %d: call %d: %v", round, i, o.err)
			}
		}
		pos := got[0].res.Positions
		if len(pos) != 3 || pos[0].Partition != 0 || pos[1].Partition != 1 || pos[2].Partition != 0 || pos[2].Offset != pos[0].Offset+1 {
			t.Errorf("round %d: positions of b1, b2, b3: %+v", round, pos)
		}
		if k := got[1].res.Positions; k[0].Partition != k[1].Partition || k[1].Offset != k[0].Offset+1 {
			t.Errorf("round %d: the keyless messages of one call were split: %+v", round, k)
		}
		if k3 := got[2].res.Positions[0]; k3.Partition == got[1].res.Positions[0].Partition {
			t.Errorf("round %d: two keyless calls went to partition %d, want the next in round-robin order", round, k3.Partition)
		}
		orig, dup := got[3].res.Positions[0], got[4].res.Positions[0]
		if orig.Duplicate || !dup.Duplicate || dup.Partition != orig.Partition || dup.Offset != orig.Offset {
			t.Errorf("round %d: producer id %s: first %+v, second %+v, want the second a duplicate of the first", round, id, orig, dup)
		}
	}

	// Gapless, and every message stored once: per round a, b1, b2, b3, k1, k2, k3, p.
	st := must(e.TopicStats(ctx, topic))(t)
	if st.Messages != 16 {
		t.Errorf("topic holds %d messages, want 16", st.Messages)
	}
	for p := range int32(2) {
		ms := must(e.MessagesRead(ctx, &storage.MessagesReadParams{Topic: topic, Partition: p, Limit: 100}))(t)
		for i, m := range ms {
			if m.Offset != int64(i) {
				t.Fatalf("partition %d: offset %d at index %d", p, m.Offset, i)
			}
			if string(m.Payload) == "this one is too large" || string(m.Payload) == "p-again" {
				t.Errorf("partition %d: %q stored", p, m.Payload)
			}
		}
	}
}

// TestAppendsAsyncCombined: appends queued with MessagesAppendAsync by one goroutine (a
// connection's publish worker) while the topic's transaction waits share the next transaction,
// keep their queue order in the partition, and each done is called once; one whose topic
// configuration refuses it is refused before queueing.
func TestAppendsAsyncCombined(t *testing.T) {
	t.Parallel()
	e := openConns(t, 8)
	const topic = "pub.async"
	logTopic(t, e, topic, storage.TopicConfig{MaxMessageBytes: 16})
	b := lockRows(t, e.sql(`SELECT 1 FROM spool.partitions p JOIN spool.topics t ON t.id = p.topic_id
		WHERE t.name = $1 FOR UPDATE OF p`), topic)
	const n = 50
	type out struct {
		i   int
		res *storage.MessagesAppendResult
		err error
	}
	outs := make(chan out, 2*n)
	txs0 := e.appendTxs.Load()
	for i := range n {
		err := e.MessagesAppendAsync(&storage.MessagesAppendParams{Topic: topic, Messages: []storage.AppendMessage{msg(0, fmt.Sprint(i), "")}},
			func(res *storage.MessagesAppendResult, err error) { outs <- out{i, res, err} })
		if err != nil {
			t.Fatalf("async append %d: %v", i, err)
		}
		if i == 0 {
			awaitBlockedBy(t, e, b.pid())
		}
	}
	err := e.MessagesAppendAsync(&storage.MessagesAppendParams{Topic: topic, Messages: []storage.AppendMessage{msg(0, "far too large for the topic", "")}},
		func(*storage.MessagesAppendResult, error) { t.Error("done called for a refused append") })
	if !errors.Is(err, storage.ErrMessageTooLarge) {
		t.Fatalf("async append too large: %v, want ErrMessageTooLarge", err)
	}
	awaitAppendsQueued(t, e, topic, n-1)
	b.release()
	for range n {
		o := <-outs
		if o.err != nil {
			t.Fatalf("async append %d: %v", o.i, o.err)
		}
		if off := o.res.Positions[0].Offset; off != int64(o.i) {
			t.Fatalf("async append %d at offset %d, want %d (queue order)", o.i, off, o.i)
		}
	}
	if txs := e.appendTxs.Load() - txs0; txs != 2 {
		t.Errorf("%d publish transactions for %d async appends, want 2 (the blocked one, then the rest together)", txs, n)
	}
	select {
	case o := <-outs:
		t.Fatalf("a done called twice: %+v", o)
	default:
	}
}

// TestAppendsCombinedStorageFailure: a combined publish transaction that fails for the database
// (here its connection is terminated while it waits for a partition row) fails every call with
// that failure and runs none of them again: after a connection lost during the COMMIT the
// outcome is unknown, and running the calls again could store their messages twice.
func TestAppendsCombinedStorageFailure(t *testing.T) {
	t.Parallel()
	e := openConns(t, 8)
	ctx := t.Context()
	const topic = "pub.f"
	logTopic(t, e, topic, storage.TopicConfig{Partitions: 2})
	b := lockRows(t, e.sql(`SELECT 1 FROM spool.partitions p JOIN spool.topics t ON t.id = p.topic_id
		WHERE t.name = $1 AND p.partition = 0 FOR UPDATE OF p`), topic)
	terminateWaiter := func() {
		t.Helper()
		awaitBlockedBy(t, e, b.pid())
		must(e.pool.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))", b.pid()))(t)
	}
	first := goAppend(t, e, topic, msg(0, "a", ""))
	awaitBlockedBy(t, e, b.pid())
	c1 := goAppend(t, e, topic, msg(0, "c1", ""))
	awaitAppendsQueued(t, e, topic, 1)
	c2 := goAppend(t, e, topic, msg(1, "c2", ""))
	awaitAppendsQueued(t, e, topic, 2)
	terminateWaiter()
	if o := <-first; !errors.Is(o.err, storage.ErrUnavailable) {
		t.Fatalf("the first publish, its connection terminated: %v, want ErrUnavailable", o.err)
	}
	// The combined transaction of c1 and c2 now waits for the row, and is terminated too. Calls
	// that end before it waits (its connection refused on a loaded machine: a storage failure as
	// well) are checked the same way, and the log says so (a full run failed once here, not
	// reproduced since: no backend waited for the row within 10 s).
	chans := []<-chan appendOut{c1, c2}
	outs := make([]*appendOut, len(chans))
	ended := func() bool {
		for i, ch := range chans {
			if outs[i] != nil {
				continue
			}
			select {
			case o := <-ch:
				outs[i] = &o
			default:
			}
		}
		return outs[0] != nil || outs[1] != nil
	}
	testutil.Eventually(t, 10*time.Second, "the combined transaction waiting for the row, or its calls ended", func() error {
		if n, err := waitersOf(t, e, b.pid()); err != nil || n > 0 || ended() {
			return err
		}
		return errors.New("none yet")
	})
	if outs[0] == nil && outs[1] == nil {
		terminateWaiter()
	} else {
		t.Logf("the combined transaction ended before it waited for the row: %+v, %+v", outs[0], outs[1])
	}
	b.release()
	for i, ch := range chans {
		o := outs[i]
		if o == nil {
			v := <-ch
			o = &v
		}
		if !errors.Is(o.err, storage.ErrUnavailable) {
			t.Errorf("call %d of the combined transaction: %+v, want ErrUnavailable", i+1, *o)
		}
	}
	if st := must(e.TopicStats(ctx, topic))(t); st.Messages != 0 {
		t.Errorf("topic holds %d messages, want 0", st.Messages)
	}

	// Which failures let the calls run again alone.
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("%w: message 0 is too large", storage.ErrMessageTooLarge), true},
		{invalid("partition 9 out of range"), true},
		{fmt.Errorf("pgstore: append: %w", &pgconn.PgError{Code: "23505"}), true},
		{&storage.IOError{Reason: "database connection lost during COMMIT", Err: errors.New("EOF")}, false},
		{&storage.IOError{Kind: storage.ErrUnavailable, Reason: "database connection lost", Err: errors.New("EOF")}, false},
		{&storage.IOError{Kind: storage.ErrFull, Reason: "database out of disk space", Err: errors.New("53100")}, false},
		{errors.New("conn busy"), false},
	} {
		if got := rerunAlone(c.err); got != c.want {
			t.Errorf("rerunAlone(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestAppendRememberedTopicChanged: an instance plans an append from the topic it remembers (one
// round trip, takeOffsetsSQL checks the gen); when another instance changed the topic meanwhile, the append is
// planned again from the topic as it is: a message the new configuration refuses is refused, an
// append to a topic deleted and created again under the same name lands in the new topic, and one
// to a deleted topic fails with ErrTopicNotFound.
func TestAppendRememberedTopicChanged(t *testing.T) {
	t.Parallel()
	es := openEngines(t, 2)
	a, b := es[0], es[1]
	ctx := t.Context()
	const topic = "pub.guard"
	logTopic(t, a, topic, storage.TopicConfig{Partitions: 1, MaxMessageBytes: 64})
	appendA := func(m storage.AppendMessage) (*storage.MessagesAppendResult, error) {
		return a.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: topic, Messages: []storage.AppendMessage{m}})
	}
	must(appendA(msg(0, "first", "")))(t)
	if a.rememberedTopic(topic) == nil {
		t.Fatal("the append did not remember the topic")
	}
	must(b.TopicUpdate(ctx, &storage.TopicUpdateParams{Name: topic, Config: storage.TopicConfig{Partitions: 1, MaxMessageBytes: 8}}))(t)
	if _, err := appendA(msg(0, "more than eight", "")); !errors.Is(err, storage.ErrMessageTooLarge) {
		t.Fatalf("append of 15 bytes after max_message_bytes became 8: %v, want ErrMessageTooLarge", err)
	}
	must(b.TopicUpdate(ctx, &storage.TopicUpdateParams{Name: topic, Config: storage.TopicConfig{Partitions: 4, MaxMessageBytes: 8}}))(t)
	must(appendA(msg(0, "x", "")))(t) // remembers the 4 partitions
	if err := b.TopicDelete(ctx, &storage.TopicDeleteParams{Name: topic, Force: true}); err != nil {
		t.Fatal(err)
	}
	logTopic(t, b, topic, storage.TopicConfig{Partitions: 4, MaxMessageBytes: 8})
	res := must(appendA(msg(3, "new", "")))(t)
	if p := res.Positions[0]; p.Partition != 3 || p.Offset != 0 {
		t.Fatalf("append to the topic created again: %+v, want partition 3 offset 0", p)
	}
	got := must(b.MessagesRead(ctx, &storage.MessagesReadParams{Topic: topic, Partition: 3}))(t)
	if len(got) != 1 || string(got[0].Payload) != "new" {
		t.Fatalf("partition 3 of the new topic holds %d messages, want the one appended", len(got))
	}
	if err := b.TopicDelete(ctx, &storage.TopicDeleteParams{Name: topic, Force: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := appendA(msg(0, "gone", "")); !errors.Is(err, storage.ErrTopicNotFound) {
		t.Fatalf("append to a deleted topic: %v, want ErrTopicNotFound", err)
	}
}

// TestAppendRememberedTopicChangedWhileWaiting: an append planned from the remembered topic waits
// for its partition row while another session changes the topic's config (any writer: here plain
// SQL); once that commits, the append finds the row with another gen, is planned again from the
// topic as it is now and refused by it, writing nothing.
func TestAppendRememberedTopicChangedWhileWaiting(t *testing.T) {
	t.Parallel()
	e := logOpen(t, testConfig(t, nil))
	const topic = "pub.gen"
	logTopic(t, e, topic, storage.TopicConfig{Partitions: 1, MaxMessageBytes: 64})
	logPublish(t, e, topic, 0, "first") // the topic is remembered
	change := lockRows(t, e.sql("UPDATE spool.topics SET config = jsonb_set(config, '{max_message_bytes}', '8') WHERE name = $1"), topic)
	out := goAppend(t, e, topic, msg(0, "more than eight", ""))
	awaitBlockedBy(t, e, change.pid()) // the trigger of 0018 holds the partition row
	change.commit()
	if o := <-out; !errors.Is(o.err, storage.ErrMessageTooLarge) {
		t.Fatalf("append of 15 bytes that waited for max_message_bytes to become 8: %+v, want ErrMessageTooLarge", o)
	}
	if got := must(e.MessagesRead(t.Context(), &storage.MessagesReadParams{Topic: topic, Partition: 0}))(t); len(got) != 1 {
		t.Fatalf("partition 0 holds %d messages, want only the first", len(got))
	}
}

// TestAppendLanePipelinedAfterFailure: a lane's next transaction starts once the one before took
// its offsets and waits for it in PostgreSQL; when the one before fails after taking them and its
// calls run again alone, the next one must not commit first (takeOffsetsSQL's expected
// next_offset, errLaneBroken): its calls queue again and get the offsets after them.
func TestAppendLanePipelinedAfterFailure(t *testing.T) {
	t.Parallel()
	clock := storagetest.NewFakeClock(logBase)
	cfg := testConfig(t, clock)
	cfg.MaxConns = 8
	e := logOpen(t, cfg)
	e.predict.off = true // x's INSERT must wait after x took its offsets
	ctx := t.Context()
	const topic = "pub.pipe"
	logTopic(t, e, topic, storage.TopicConfig{Partitions: 1})
	logTopic(t, e, "pub.other", storage.TopicConfig{Partitions: 1})
	logPublish(t, e, topic, 0, "w") // offset 0; the topic is remembered
	// x waits for the partition's row; y1 and y2 queue behind it and will share a transaction.
	b0 := lockRows(t, e.sql("SELECT 1 FROM spool.partitions p JOIN spool.topics t ON t.id = p.topic_id WHERE t.name = $1 FOR UPDATE OF p"), topic)
	x := goAppend(t, e, topic, msg(0, "x", ""))
	awaitBlockedBy(t, e, b0.pid())
	y1 := goAppend(t, e, topic, msg(0, "y1", ""))
	awaitAppendsQueued(t, e, topic, 1)
	y2 := goAppend(t, e, topic, msg(0, "y2", ""))
	awaitAppendsQueued(t, e, topic, 2)
	// y's transaction inserts into the next bucket (x took its time before), held in SHARE mode.
	clock.Advance(e.bucket.width)
	logPublish(t, e, "pub.other", 0, "makes the bucket")
	b1 := lockRows(t, "LOCK TABLE "+pgx.Identifier{cfg.Schema, bucketName(e.bucketStart(clock.Now()))}.Sanitize()+" IN SHARE MODE")
	b0.release()
	if o := <-x; o.err != nil || o.res.Positions[0].Offset != 1 {
		t.Fatalf("x: %+v", o)
	}
	awaitBlockedBy(t, e, b1.pid()) // y1 and y2 took offsets 2 and 3, their INSERT waits
	var ypid int
	must(0, e.pool.QueryRow(ctx, "SELECT pid FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))", b1.pid()).Scan(&ypid))(t)
	// c starts at once (a transaction starts early only for minEarlyBytes), waits for y's rows.
	c := goAppend(t, e, topic, msg(0, "c"+strings.Repeat("-", minEarlyBytes), ""))
	awaitBlockedBy(t, e, ypid)
	must(e.pool.Exec(ctx, "SELECT pg_cancel_backend($1)", ypid))(t) // y fails; y1, y2 run again alone
	b1.release()
	want := map[string]int64{"y1": 2, "y2": 3, "c": 4}
	for name, ch := range map[string]<-chan appendOut{"y1": y1, "y2": y2, "c": c} {
		o := <-ch
		if o.err != nil || o.res.Positions[0].Offset != want[name] {
			t.Errorf("%s: %+v, err %v; want offset %d", name, o.res, o.err, want[name])
		}
	}
	got := must(e.MessagesRead(ctx, &storage.MessagesReadParams{Topic: topic, Partition: 0}))(t)
	var order []string
	for _, m := range got {
		order = append(order, strings.TrimRight(string(m.Payload), "-"))
	}
	if fmt.Sprint(order) != "[w x y1 y2 c]" {
		t.Fatalf("partition 0 holds %v, want [w x y1 y2 c]", order)
	}
}

// TestAppendLaneGathersSmallCalls: while a lane's transaction that took its offsets runs, small
// calls wait for its end (so that calls gather into fewer transactions) instead of starting the
// next transaction at once; once they add up to minEarlyMessages messages, or a call brings
// minEarlyBytes bytes, the next transaction starts early with all of them.
func TestAppendLaneGathersSmallCalls(t *testing.T) {
	t.Parallel()
	for name, last := range map[string]storage.AppendMessage{
		"messages": msg(0, "last", ""), // the 4th message
		"bytes":    msg(0, "last"+strings.Repeat("-", minEarlyBytes), ""),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			clock := storagetest.NewFakeClock(logBase)
			cfg := testConfig(t, clock)
			e := logOpen(t, cfg)
			e.predict.off = true // x's INSERT must wait after x took its offsets
			const topic = "pub.gather"
			logTopic(t, e, topic, storage.TopicConfig{Partitions: 1})
			logPublish(t, e, topic, 0, "w") // offset 0; the topic is remembered
			// x takes its offset, then its INSERT waits for the bucket.
			b := lockRows(t, "LOCK TABLE "+pgx.Identifier{cfg.Schema, bucketName(e.bucketStart(clock.Now()))}.Sanitize()+" IN SHARE MODE")
			x := goAppend(t, e, topic, msg(0, "x", ""))
			awaitBlockedBy(t, e, b.pid())
			s := goAppend(t, e, topic, msg(0, "s", ""))
			awaitAppendsQueued(t, e, topic, 1) // stays queued: an early start would have taken it at once
			if minEarlyMessages != 4 {
				t.Fatalf("minEarlyMessages is %d: make the calls below add up to it", minEarlyMessages)
			}
			pair := goAppend(t, e, topic, msg(0, "p1", ""), msg(0, "p2", ""))
			awaitAppendsQueued(t, e, topic, 2) // 3 messages: still gathering
			end := goAppend(t, e, topic, last)
			awaitAppendsQueued(t, e, topic, 0) // all three started together, before x ended
			b.release()
			want := map[string]int64{"x": 1, "s": 2, "pair": 3, "last": 5}
			for name, ch := range map[string]<-chan appendOut{"x": x, "s": s, "pair": pair, "last": end} {
				if o := <-ch; o.err != nil || o.res.Positions[0].Offset != want[name] {
					t.Errorf("%s: %+v, err %v; want offset %d", name, o.res, o.err, want[name])
				}
			}
		})
	}
}

// TestAppendLanesTwoInstancesAsync: two instances publish asynchronously to one partition, each
// from several connections that queue their publishes one after the other (their lanes pipeline
// transactions, and each instance's appends break the other's expected next_offset): every
// message is stored once, each connection's messages in its order, and each callback has the
// position stored.
func TestAppendLanesTwoInstancesAsync(t *testing.T) {
	t.Parallel()
	es := openEngines(t, 2)
	const topic, conns, per = "pub.two", 3, 150
	logTopic(t, es[0], topic, storage.TopicConfig{Partitions: 1})
	type result struct {
		name string
		pos  storage.MessagePosition
		err  error
	}
	results := make(chan result, 2*conns*per)
	var wg sync.WaitGroup
	for ei, e := range es {
		for c := range conns {
			wg.Go(func() {
				window := make(chan struct{}, 4) // a few in flight per connection: many transactions
				for i := range per {
					window <- struct{}{}
					name := fmt.Sprintf("%d-%d-%03d", ei, c, i)
					p := &storage.MessagesAppendParams{Topic: topic, Messages: []storage.AppendMessage{msg(0, name, "")}}
					if err := e.MessagesAppendAsync(p, func(res *storage.MessagesAppendResult, err error) {
						<-window
						r := result{name: name, err: err}
						if err == nil {
							r.pos = res.Positions[0]
						}
						results <- r
					}); err != nil {
						<-window
						results <- result{name: name, err: err}
					}
				}
			})
		}
	}
	wg.Wait()
	at := map[string]int64{}
	for range 2 * conns * per {
		r := <-results
		if r.err != nil {
			t.Fatalf("%s: %v", r.name, r.err)
		}
		at[r.name] = r.pos.Offset
	}
	stored := readAll(t, es[1], topic, 0)
	if len(stored) != 2*conns*per {
		t.Fatalf("partition holds %d messages, want %d", len(stored), 2*conns*per)
	}
	last := map[string]string{}
	for i, m := range stored {
		name := string(m.Payload)
		if m.Offset != int64(i) || at[name] != m.Offset {
			t.Fatalf("offset %d holds %s (callback said %d)", m.Offset, name, at[name])
		}
		conn := name[:3]
		if prev, ok := last[conn]; ok && prev >= name {
			t.Fatalf("connection %s: %s stored after %s", conn, name, prev)
		}
		last[conn] = name
	}
	t.Logf("transactions %d + %d, requeued %d + %d, guessed %d + %d (wrong %d + %d)", es[0].appendTxs.Load(), es[1].appendTxs.Load(),
		es[0].appendRequeues.Load(), es[1].appendRequeues.Load(), es[0].appendGuesses.Load(), es[1].appendGuesses.Load(),
		es[0].appendMisses.Load(), es[1].appendMisses.Load())
}

// TestCloseCompletesQueuedAppends: appends queued when Close is called (MessagesAppendAsync
// batches on a lane waiting for a partition row, and a MessagesAppend call behind them) are
// appended and answered before Close returns, as the embedded engine's Close completes queued
// appends; appends after Close began are refused with ErrClosed.
func TestCloseCompletesQueuedAppends(t *testing.T) {
	t.Parallel()
	e := openConns(t, 8)
	const topic = "pub.close"
	logTopic(t, e, topic, storage.TopicConfig{})
	b := lockRows(t, e.sql(`SELECT 1 FROM spool.partitions p JOIN spool.topics t ON t.id = p.topic_id
		WHERE t.name = $1 FOR UPDATE OF p`), topic)
	const n = 20
	var mu sync.Mutex
	var answered []error
	for i := range n {
		err := e.MessagesAppendAsync(&storage.MessagesAppendParams{Topic: topic, Messages: []storage.AppendMessage{msg(0, fmt.Sprint(i), "")}},
			func(_ *storage.MessagesAppendResult, err error) {
				mu.Lock()
				answered = append(answered, err)
				mu.Unlock()
			})
		if err != nil {
			t.Fatalf("async append %d: %v", i, err)
		}
		if i == 0 {
			awaitBlockedBy(t, e, b.pid())
		}
	}
	sync := goAppend(t, e, topic, msg(0, "sync", ""))
	awaitAppendsQueued(t, e, topic, n)
	closed := make(chan error, 1)
	go func() { closed <- e.Close() }()
	testutil.Eventually(t, 10*time.Second, "Close began", func() error {
		if !e.closing.Load() {
			return errors.New("not yet")
		}
		return nil
	})
	if _, err := e.enqueue(newAppendOp(&storage.MessagesAppendParams{Topic: topic, Messages: []storage.AppendMessage{msg(0, "late", "")}},
		func(*storage.MessagesAppendResult, error) {})); !errors.Is(err, storage.ErrClosed) {
		t.Fatalf("an append queued after Close began: %v, want ErrClosed", err)
	}
	b.release()
	if err := <-closed; err != nil {
		t.Fatalf("close: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(answered) != n {
		t.Fatalf("%d of %d queued async appends answered when Close returned", len(answered), n)
	}
	for i, err := range answered {
		if err != nil {
			t.Fatalf("queued async append answered with %v (answer %d)", err, i)
		}
	}
	select {
	case o := <-sync:
		if o.err != nil {
			t.Fatalf("queued MessagesAppend: %v", o.err)
		}
	default:
		t.Fatal("the queued MessagesAppend had not returned when Close returned")
	}
}
