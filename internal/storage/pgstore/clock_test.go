package pgstore

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
)

// TestClockSkewedInstances: three instances on one schema, one with the database's clock, one a
// minute ahead of it, one a minute behind. Each one's leases and publish times follow the
// database's clock: a 30 s lease taken on one instance is not claimable on another before it
// expired by the database's clock (invariant 3), and a skewed instance publishes at the
// database's time. The skewed instances warn about their clocks, and their heartbeats correct a
// reading gone wrong.
func TestClockSkewedInstances(t *testing.T) {
	t.Parallel()
	const skew, ackWait = time.Minute, 30 * time.Second
	// slack bounds the estimate's error in this test: round trips to a local database (ms) on a
	// loaded machine; far below skew and ackWait.
	const slack = 2 * time.Second
	cfg := testConfig(t, nil)
	a := logOpen(t, cfg)
	var logs testutil.SyncBuffer
	skewed := func(d time.Duration) *Engine {
		c := cfg
		c.localClock = func() time.Time { return time.Now().Add(d) }
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		c.InstanceHeartbeat = 20 * time.Millisecond // refreshes the readings meanwhile
		return logOpen(t, c)
	}
	ahead, behind := skewed(skew), skewed(-skew)
	ctx := t.Context()
	dbNow := func() time.Time {
		t.Helper()
		var now time.Time
		if err := a.pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&now); err != nil {
			t.Fatal(err)
		}
		return now
	}
	// within fails the test unless at is within [from, to] give or take slack.
	within := func(what string, at, from, to time.Time) {
		t.Helper()
		if at.Before(from.Add(-slack)) || at.After(to.Add(slack)) {
			t.Errorf("%s at %s, want the database's time between %s and %s (±%s)", what, at.UTC(), from.UTC(), to.UTC(), slack)
		}
	}

	// (a) A lease taken on one instance, claimed for on another whose clock is ahead of the first's.
	for _, c := range []struct {
		name          string
		leaser, thief *Engine
	}{{"db-then-ahead", a, ahead}, {"behind-then-db", behind, a}, {"behind-then-ahead", behind, ahead}} {
		topic := "lease." + c.name
		if _, err := c.leaser.TopicCreate(ctx, &storage.TopicCreateParams{Name: topic, Config: storage.TopicConfig{AckWait: ackWait}}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.leaser.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: topic,
			Messages: []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("x")}}}); err != nil {
			t.Fatal(err)
		}
		sub, err := c.leaser.SubscriptionGetByGroup(ctx, topic, storage.QueueGroup)
		if err != nil {
			t.Fatal(err)
		}
		from := dbNow()
		res, err := c.leaser.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: "first", Max: 1})
		to := dbNow()
		if err != nil || len(res.Deliveries) != 1 {
			t.Fatalf("%s: first claim: %v, %+v", c.name, err, res)
		}
		within(c.name+": lease deadline", res.Deliveries[0].LeaseDeadline, from.Add(ackWait), to.Add(ackWait))
		res, err = c.thief.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: "second", Max: 1})
		if err != nil {
			t.Fatalf("%s: second claim: %v", c.name, err)
		}
		if len(res.Deliveries) != 0 {
			d := res.Deliveries[0]
			t.Errorf("%s: message %d leased to a second member %s after the first lease was taken (invariant 3): deadline %s",
				c.name, d.Offset, d.Member, d.LeaseDeadline.UTC())
		} else {
			within(c.name+": next due", res.NextDue, from.Add(ackWait), to.Add(ackWait))
		}
	}

	// (b) Publish times of skewed instances: the database's, on fresh partitions (nothing
	// published before to raise them).
	for _, c := range []struct {
		name string
		e    *Engine
	}{{"ahead", ahead}, {"behind", behind}} {
		topic := "publish." + c.name
		if _, err := c.e.TopicCreate(ctx, &storage.TopicCreateParams{Name: topic}); err != nil {
			t.Fatal(err)
		}
		from := dbNow()
		res, err := c.e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: topic,
			Messages: []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("x")}}})
		to := dbNow()
		if err != nil {
			t.Fatal(err)
		}
		within(c.name+": published_at returned", res.Positions[0].PublishedAt, from, to)
		var stored time.Time
		if err := a.pool.QueryRow(ctx, a.sql(`SELECT m.published_at FROM spool.messages m JOIN spool.topics t ON t.id = m.topic_id
			WHERE t.name = $1`), topic).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		within(c.name+": published_at stored", stored, from, to)
	}

	// (c) The heartbeat refreshes the reading: one gone wrong (as after a suspended host) is
	// replaced within a few heartbeats.
	wrong := *ahead.dbc.cur.Load()
	wrong.db, wrong.rtt = wrong.db.Add(10*time.Minute), 0
	ahead.dbc.cur.Store(&wrong)
	deadline := time.Now().Add(10 * time.Second)
	for {
		from := dbNow()
		at := ahead.now()
		to := dbNow()
		if !at.Before(from.Add(-slack)) && !at.After(to.Add(slack)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a wrong reading still in use after 10 s of heartbeats: %s, the database's clock %s", at, to)
		}
		time.Sleep(10 * time.Millisecond)
	}

	if n := strings.Count(logs.String(), "this instance's clock is off the database's"); n != 2 {
		t.Errorf("%d warnings about a skewed clock, want 2 (one per skewed instance):\n%s", n, logs.String())
	}
}

// TestClockReadings: which readings of the database's clock dbTime keeps.
func TestClockReadings(t *testing.T) {
	var logs testutil.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	base := time.Now()
	local := base
	c := dbTime{local: func() time.Time { return local }}
	if got := c.now(); !got.Equal(base) {
		t.Fatalf("before any reading: %s, want the local clock %s", got, base)
	}
	const off = 3 * time.Second // the database is ahead
	read := func(at time.Duration, rtt time.Duration, db time.Duration) bool {
		t1 := base.Add(at)
		return c.observe(log, t1, t1.Add(rtt), base.Add(at+rtt/2+off+db))
	}
	check := func(what string, want time.Duration) {
		t.Helper()
		if got := c.now().Sub(local); got != want {
			t.Errorf("%s: database minus local %s, want %s", what, got, want)
		}
	}
	if !read(0, 10*time.Millisecond, 0) {
		t.Fatal("first reading not kept")
	}
	check("first reading", off)
	if !strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("no warning for a local clock %s off:\n%s", off, logs.String())
	}
	// A less precise reading that agrees: ignored.
	if read(time.Second, 100*time.Millisecond, 30*time.Millisecond) {
		t.Error("less precise reading kept")
	}
	check("after a less precise reading", off)
	// A more precise one: taken, even if it moves the time back a little.
	if !read(2*time.Second, 2*time.Millisecond, -3*time.Millisecond) {
		t.Error("more precise reading ignored")
	}
	check("after a more precise reading", off-3*time.Millisecond)
	// The one in use ages: after 100 s (20 ms of drift) a reading of 30 ms round trip is as good.
	local = base.Add(100 * time.Second)
	if !read(100*time.Second, 30*time.Millisecond, 0) {
		t.Error("reading not taken over an aged one")
	}
	check("after ageing", off)
	// A reading that disagrees beyond both bounds (the database's clock stepped back, to within
	// clockSkewWarn of the local clock): taken, however imprecise, and said.
	if !read(101*time.Second, 400*time.Millisecond, -2500*time.Millisecond) {
		t.Error("disagreeing reading ignored")
	}
	check("after a step", off-2500*time.Millisecond)
	for _, want := range []string{"moved from this instance's estimate", "agrees with the database's again"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("not logged: %q:\n%s", want, logs.String())
		}
	}
}
