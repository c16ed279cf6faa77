package broker

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/pgstore"
	"github.com/spoolmq/spool/internal/testutil"
)

// pgInstance is a broker instance on its own pgstore engine; several share one schema.
type pgInstance struct {
	eng *pgstore.Engine
	b   *Broker
	fc  *filterCounter
}

// pgPair starts two broker instances on one PostgreSQL schema made for the test (prefix names
// it) with one fake clock: a (with opts) holds the members under test, other makes changes
// elsewhere.
func pgPair(t *testing.T, prefix string, opts ...func(*Config)) (a, other *pgInstance) {
	t.Helper()
	url := testutil.DatabaseURL(t)
	schema := testutil.PGSchema(t, url, prefix)
	clock := newFakeClock()
	return startPGInstance(t, url, schema, clock, opts...), startPGInstance(t, url, schema, clock)
}

// startPGInstance opens an engine on schema with clock and starts a SharedEngine broker on it
// whose liveness renewals the test runs by hand (renewLiveness).
func startPGInstance(t *testing.T, url, schema string, clock *fakeClock, opts ...func(*Config)) *pgInstance {
	t.Helper()
	eng, err := pgstore.Open(context.Background(), pgstore.Config{URL: url, Schema: schema, Migrate: true, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	in := &pgInstance{eng: eng, fc: &filterCounter{}}
	cfg := Config{Engine: eng, Clock: clock, Logger: testLogger(t), RetentionInterval: -1, PollInterval: time.Hour,
		SharedEngine: true, LifecycleInterval: time.Hour, OnFiltered: in.fc.observe}
	for _, o := range opts {
		o(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.livenessInterval = time.Hour
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	in.b = b
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		_ = b.Stop(ctx) // the test may have closed the engine first (a dead instance)
		_ = eng.Close()
	})
	return in
}

// givenBack sums the give-backs of the instance's owners.
func (in *pgInstance) givenBack() int64 {
	in.b.mu.RLock()
	defer in.b.mu.RUnlock()
	var n int64
	for _, o := range in.b.subs {
		n += o.givenBack.Load()
	}
	return n
}

func (in *pgInstance) renew(t *testing.T) {
	t.Helper()
	if err := in.b.renewLiveness(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestFilterSharedEngineTwoInstances: two broker instances on one PostgreSQL schema, member
// region=eu on A, region=us on B, max_deliveries 2. Each member gets exactly its own messages,
// each on its first attempt however often the other instance gave it back; only the messages no
// member wants are completed as filtered; nothing is dead-lettered. Then B dies (its engine
// closes, its records are no longer renewed): within the member timeout A still gives a us
// message back; once B's records expired A completes it as filtered.
func TestFilterSharedEngineTwoInstances(t *testing.T) {
	url := testutil.DatabaseURL(t)
	schema := testutil.PGSchema(t, url, "t_bfilter_")
	clock := newFakeClock()
	a := startPGInstance(t, url, schema, clock)
	bi := startPGInstance(t, url, schema, clock)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := a.b.CreateTopic(ctx, "orders", storage.TopicConfig{Partitions: 2, MaxDeliveries: 2, AckWait: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// Each instance records its member when it joins (its owner handled the join once idle)
	// and reads the others' records then: B learns of eu at its join; A, whose member joined
	// first, learns of us from the liveness loop's renewal.
	eu, err := a.b.Subscribe(ctx, SubscribeParams{Pattern: "orders", MemberID: "eu", MaxInFlight: 100, Filter: "region=eu"})
	if err != nil {
		t.Fatal(err)
	}
	(&env{t: t, b: a.b}).waitIdle()
	us, err := bi.b.Subscribe(ctx, SubscribeParams{Pattern: "orders", MemberID: "us", MaxInFlight: 100, Filter: "region=us"})
	if err != nil {
		t.Fatal(err)
	}
	(&env{t: t, b: bi.b}).waitIdle()
	a.renew(t)

	publish := func(regions ...string) {
		t.Helper()
		for i, r := range regions {
			if _, err := a.b.Publish(ctx, "orders", []storage.AppendMessage{{Partition: storage.PartitionAuto,
				Headers: map[string]string{"region": r}, Payload: fmt.Appendf(nil, "%s-%d", r, i)}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var regions []string
	for range 10 {
		regions = append(regions, "eu", "us", "ap")
	}
	publish(regions...)
	gs := consumeAll(t, 20, eu, us)
	for _, g := range gs {
		if want := map[string]string{"eu": "eu", "us": "us"}[g.member]; g.d.Headers["region"] != want {
			t.Errorf("member %s got %s (region %q)", g.member, g.d.Payload, g.d.Headers["region"])
		}
		if g.d.Attempt != 1 {
			t.Errorf("member %s got %s with attempt %d, want 1 (give-backs do not count)", g.member, g.d.Payload, g.d.Attempt)
		}
	}
	if n := byMember(gs); n["eu"] != 10 || n["us"] != 10 {
		t.Fatalf("deliveries per member %v, want 10 each", n)
	}
	// No ping-pong: an instance passes over what it gave back (Skip; the fake clock stands
	// still), so each message is given back at most once, by the instance that does not want it.
	for name, in := range map[string]*pgInstance{"A": a, "B": bi} {
		if n := in.givenBack(); n > 10 {
			t.Errorf("instance %s gave %d messages back, want at most 10", name, n)
		}
	}
	key := "orders/" + storage.QueueGroup
	stats := func() *storage.SubscriptionStats {
		info, err := a.b.Group(ctx, "orders", storage.QueueGroup)
		if err != nil {
			t.Fatal(err)
		}
		return info.Stats
	}
	eventually(t, "ap messages filtered", func() error {
		if n := a.fc.get(key) + bi.fc.get(key); n != 10 {
			return fmt.Errorf("filtered %d (A %d, B %d), want 10", n, a.fc.get(key), bi.fc.get(key))
		}
		if st := stats(); st.Pending != 0 || st.DeadLettered != 0 {
			return fmt.Errorf("pending %d, dead-lettered %d", st.Pending, st.DeadLettered)
		}
		return nil
	})

	// B dies: nothing renews its records and it claims nothing any more.
	if err := bi.eng.Close(); err != nil {
		t.Fatal(err)
	}
	filteredA, backA := a.fc.get(key), a.givenBack()
	publish("us")
	eventually(t, "the us message given back by A", func() error {
		if st := stats(); st.Pending != 1 || st.InFlight != 0 || st.Redelivering != 1 {
			return fmt.Errorf("pending %d in flight %d redelivering %d, want 1, 0, 1", st.Pending, st.InFlight, st.Redelivering)
		}
		return nil
	})
	if n := a.fc.get(key); n != filteredA {
		t.Fatalf("A completed %d messages as filtered while B's us member was live", n-filteredA)
	}
	// A gave it back once and then passes it over: its owner goes idle.
	(&env{t: t, b: a.b}).waitIdle()
	if n := a.givenBack() - backA; n != 1 {
		t.Fatalf("A gave the us message back %d times, want once", n)
	}
	// Past the member timeout B's records expired; the next claim, woken by a publish, rereads
	// the records before completing (its view is older than othersFresh; a read only: A's own
	// records are renewed by its liveness loop, at an hour here) and finds no live member that
	// wants either us message.
	clock.Advance(DefaultMemberTimeout)
	publish("us")
	eventually(t, "the us messages filtered once B expired", func() error {
		if n := a.fc.get(key) - filteredA; n != 2 {
			return fmt.Errorf("A filtered %d, want 2", n)
		}
		if st := stats(); st.Pending != 0 || st.DeadLettered != 0 {
			return fmt.Errorf("pending %d, dead-lettered %d", st.Pending, st.DeadLettered)
		}
		return nil
	})
	if st := stats(); st.DeadLettered != 0 {
		t.Fatalf("dead-lettered %d", st.DeadLettered)
	}
	// The rereads wrote nothing: A's own record expired with B's (no owner renewed it).
	res, err := a.eng.SubscriptionMembersRenew(ctx, &storage.SubscriptionMembersRenewParams{
		Subscriptions: []int64{gs[0].d.SubscriptionID}, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if recs := res.Records[gs[0].d.SubscriptionID]; len(recs) != 0 {
		t.Fatalf("records after the member timeout %+v, want none (a reread renewed them)", recs)
	}
}

// TestFilterSharedEngineSameMemberID: member IDs are unique per instance only. w1 with filter
// x=1 on A and another w1 with x=2 on B keep a record each (A renewing last must not overwrite
// B's): every x=2 message reaches B's w1, none is completed as filtered by A.
func TestFilterSharedEngineSameMemberID(t *testing.T) {
	url := testutil.DatabaseURL(t)
	schema := testutil.PGSchema(t, url, "t_bfsame_")
	clock := newFakeClock()
	a := startPGInstance(t, url, schema, clock)
	bi := startPGInstance(t, url, schema, clock)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := a.b.CreateTopic(ctx, "jobs", storage.TopicConfig{Partitions: 2, MaxDeliveries: 2, AckWait: time.Hour}); err != nil {
		t.Fatal(err)
	}
	wa, err := a.b.Subscribe(ctx, SubscribeParams{Pattern: "jobs", MemberID: "w1", MaxInFlight: 100, Filter: "x=1"})
	if err != nil {
		t.Fatal(err)
	}
	(&env{t: t, b: a.b}).waitIdle()
	wb, err := bi.b.Subscribe(ctx, SubscribeParams{Pattern: "jobs", MemberID: "w1", MaxInFlight: 100, Filter: "x=2"})
	if err != nil {
		t.Fatal(err)
	}
	(&env{t: t, b: bi.b}).waitIdle()
	a.renew(t) // A writes its w1 last
	for i := range 20 {
		if _, err := a.b.Publish(ctx, "jobs", []storage.AppendMessage{{Partition: storage.PartitionAuto,
			Headers: map[string]string{"x": "2"}, Payload: fmt.Appendf(nil, "m%d", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	key := "jobs/" + storage.QueueGroup
	gs := make(chan int, 1)
	go func() {
		n := 0
		for n < 20 {
			select {
			case d, ok := <-wb.Deliveries():
				if !ok {
					gs <- n
					return
				}
				_ = wb.Ack(context.Background(), d.SubscriptionID, d.Ref()) // counted by n and the stats
				n++
			case <-ctx.Done():
				gs <- n
				return
			}
		}
		gs <- n
	}()
	var n int
	eventually(t, "all x=2 messages at B's w1 or filtered", func() error {
		select {
		case n = <-gs:
			return nil
		default:
		}
		if f := a.fc.get(key) + bi.fc.get(key); f > 0 {
			n = -1
			return nil
		}
		return fmt.Errorf("waiting")
	})
	if f := a.fc.get(key) + bi.fc.get(key); f != 0 || n != 20 {
		t.Fatalf("B's w1 got %d of 20 x=2 messages; %d completed as filtered (A %d, B %d)", n, f, a.fc.get(key), bi.fc.get(key))
	}
	select {
	case d := <-wa.Deliveries():
		t.Fatalf("A's w1 (x=1) got %s", d.Payload)
	default:
	}
}

// TestFilterSharedEngineThreeInstances: only C's member wants x=2 messages and has no credit.
// The instance that claims one (A or B) gives it back addressed to C, and neither A nor B takes
// it again (no ping-pong from A to B and back at database speed; the fake clock stands still);
// once C's member has credit, C takes it at once, on its first attempt.
func TestFilterSharedEngineThreeInstances(t *testing.T) {
	url := testutil.DatabaseURL(t)
	schema := testutil.PGSchema(t, url, "t_bf3_")
	clock := newFakeClock()
	ins := []*pgInstance{startPGInstance(t, url, schema, clock), startPGInstance(t, url, schema, clock), startPGInstance(t, url, schema, clock)}
	a, bi, c := ins[0], ins[1], ins[2]
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := a.b.CreateTopic(ctx, "jobs", storage.TopicConfig{Partitions: 2, MaxDeliveries: 2, AckWait: time.Hour}); err != nil {
		t.Fatal(err)
	}
	var members []*Member
	for i, p := range []SubscribeParams{{MemberID: "a", MaxInFlight: 100, Filter: "x=1"},
		{MemberID: "b", MaxInFlight: 100, Filter: "x=1"}, {MemberID: "c", MaxInFlight: 1, Filter: "x=2"}} {
		p.Pattern = "jobs"
		m, err := ins[i].b.Subscribe(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		(&env{t: t, b: ins[i].b}).waitIdle()
		members = append(members, m)
	}
	for _, in := range ins {
		in.renew(t) // each reads the others' records
	}
	publish := func(payload string) {
		t.Helper()
		if _, err := a.b.Publish(ctx, "jobs", []storage.AppendMessage{{Partition: 0,
			Headers: map[string]string{"x": "2"}, Payload: []byte(payload)}}); err != nil {
			t.Fatal(err)
		}
	}
	next := func() *storage.Delivery {
		t.Helper()
		select {
		case d := <-members[2].Deliveries():
			return d
		case <-ctx.Done():
			t.Fatal("c got nothing")
			return nil
		}
	}
	publish("first")
	first := next() // c holds it: no credit left
	for _, in := range ins {
		(&env{t: t, b: in.b}).waitIdle()
	}
	back := a.givenBack() + bi.givenBack()
	publish("second")
	eventually(t, "second given back", func() error {
		if n := a.givenBack() + bi.givenBack() - back; n == 0 {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	(&env{t: t, b: a.b}).waitIdle()
	(&env{t: t, b: bi.b}).waitIdle()
	if n := a.givenBack() + bi.givenBack() - back; n != 1 {
		t.Fatalf("A and B gave the second message back %d times, want once", n)
	}
	if err := members[2].Ack(ctx, first.SubscriptionID, first.Ref()); err != nil {
		t.Fatal(err)
	}
	if d := next(); string(d.Payload) != "second" || d.Attempt != 1 {
		t.Fatalf("c got %s attempt %d, want second attempt 1", d.Payload, d.Attempt)
	}
	key := "jobs/" + storage.QueueGroup
	if f := a.fc.get(key) + bi.fc.get(key) + c.fc.get(key); f != 0 {
		t.Fatalf("%d completed as filtered", f)
	}
}

// TestFilterSharedEngineJoinCountsAtOnce: a member that joins another instance counts for every
// message claimed after its Subscribe returned, whether it has a filter or not (no filter wants
// everything). A read its view of B's members before they joined and the fake clock stands
// still (no reread by age). B's member us (region=us) joins, its Subscribe returns, a us message
// is published and A, the only instance with credit, claims it at once: A gives it back to B
// instead of completing it as filtered. The same for an ap message once B's unfiltered member
// all joined. Given credit, B's members get them on their first attempt.
func TestFilterSharedEngineJoinCountsAtOnce(t *testing.T) {
	url := testutil.DatabaseURL(t)
	schema := testutil.PGSchema(t, url, "t_bfjoin_")
	clock := newFakeClock()
	a := startPGInstance(t, url, schema, clock)
	bi := startPGInstance(t, url, schema, clock)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := a.b.CreateTopic(ctx, "orders", storage.TopicConfig{Partitions: 1, MaxDeliveries: 2, AckWait: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.b.Subscribe(ctx, SubscribeParams{Pattern: "orders", MemberID: "eu", MaxInFlight: 100, Filter: "region=eu"}); err != nil {
		t.Fatal(err)
	}
	(&env{t: t, b: a.b}).waitIdle()
	key := "orders/" + storage.QueueGroup

	// step joins member id with filter flt on B, takes its credit (B's members have none: only
	// A claims), publishes a message of region and checks that A gives it back rather than
	// completing it. Then the member gets credit and the message, on its first attempt.
	step := func(id, flt, region string) {
		t.Helper()
		back := a.givenBack()
		m, err := bi.b.Subscribe(ctx, SubscribeParams{Pattern: "orders", MemberID: id, MaxInFlight: 1, Filter: flt})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.SetMaxInFlight(0); err != nil {
			t.Fatal(err)
		}
		(&env{t: t, b: bi.b}).waitIdle() // B's pass after the join claimed before the publish
		if _, err := a.b.Publish(ctx, "orders", []storage.AppendMessage{{Partition: 0,
			Headers: map[string]string{"region": region}, Payload: []byte(region)}}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "A settles the "+region+" message", func() error {
			if a.givenBack() == back && a.fc.get(key) == 0 {
				return fmt.Errorf("not yet")
			}
			return nil
		})
		if n := a.fc.get(key); n != 0 {
			t.Fatalf("A completed the %s message as filtered although %s (filter %q) had joined B", region, id, flt)
		}
		if n := a.givenBack() - back; n != 1 {
			t.Fatalf("A gave %d messages back, want 1", n)
		}
		if err := m.SetMaxInFlight(1); err != nil {
			t.Fatal(err)
		}
		select {
		case d := <-m.Deliveries():
			if string(d.Payload) != region || d.Attempt != 1 {
				t.Fatalf("%s got %s attempt %d, want %s attempt 1", id, d.Payload, d.Attempt, region)
			}
			if err := m.Ack(ctx, d.SubscriptionID, d.Ref()); err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatalf("%s got nothing", id)
		}
		if err := m.SetMaxInFlight(0); err != nil { // B claims nothing in the next step either
			t.Fatal(err)
		}
	}
	step("us", "region=us", "us")
	step("all", "", "ap")
	if n := a.fc.get(key) + bi.fc.get(key); n != 0 {
		t.Fatalf("%d completed as filtered", n)
	}
}

// TestFilterSharedEngineJoinWaitsForRecord: with a shared engine Subscribe returns only once the
// member's record (with its filter) is stored. While the test holds a lock that keeps B's
// owner from writing it, Subscribe waits; its ctx ending then fails it and changes nothing (the
// member is closed and forgotten, its ID free). Without the lock the record is there when
// Subscribe returns.
func TestFilterSharedEngineJoinWaitsForRecord(t *testing.T) {
	url := testutil.DatabaseURL(t)
	schema := testutil.PGSchema(t, url, "t_bfrec_")
	clock := newFakeClock()
	bi := startPGInstance(t, url, schema, clock)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := bi.b.CreateTopic(ctx, "jobs", storage.TopicConfig{}); err != nil {
		t.Fatal(err)
	}
	sub, err := bi.b.lookup(ctx, "jobs", storage.QueueGroup)
	if err != nil {
		t.Fatal(err)
	}
	records := func() []storage.MemberRecord {
		t.Helper()
		res, err := bi.eng.SubscriptionMembersRenew(ctx, &storage.SubscriptionMembersRenewParams{
			Subscriptions: []int64{sub.ID}, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return res.Records[sub.ID]
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	table := pgx.Identifier{schema, "sub_members"}.Sanitize()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }() // a no-op once released below
	// Reads pass the lock, writes (B's record) wait for it.
	if _, err := tx.Exec(ctx, "LOCK TABLE "+table+" IN SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	p := SubscribeParams{Pattern: "jobs", MemberID: "w", Filter: "x=1"}
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	type result struct {
		m   *Member
		err error
	}
	res := make(chan result, 1)
	go func() {
		m, err := bi.b.Subscribe(sctx, p)
		res <- result{m, err}
	}()
	obs, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close(context.Background())
	eventually(t, "B's record write waits for the lock", func() error {
		var n int
		if err := obs.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::text::regclass", table).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("no waiter")
		}
		return nil
	})
	scancel() // Subscribe is still waiting for the record: it fails
	r := <-res
	if r.err == nil {
		t.Fatalf("Subscribe returned member %s while its record could not be written", r.m.ID())
	}
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("Subscribe: %v, want context.Canceled", r.err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// The failed member's close follows its join: its record is written, then forgotten.
	eventually(t, "the failed member forgotten", func() error {
		bi.b.mu.RLock()
		_, there := bi.b.members["w"]
		bi.b.mu.RUnlock()
		if recs := records(); there || len(recs) != 0 {
			return fmt.Errorf("member listed %v, records %+v", there, recs)
		}
		return nil
	})
	if _, err := bi.b.Subscribe(ctx, p); err != nil {
		t.Fatal(err)
	}
	if recs := records(); len(recs) != 1 || recs[0].Member != "w" || recs[0].Filter != "x=1" || recs[0].Instance != bi.b.instance {
		t.Fatalf("records when Subscribe returned: %+v, want w with filter x=1", recs)
	}
}

// failingRenew wraps the engine at the broker boundary: while fail is set, member record writes
// (SubscriptionMembersRenew with members) fail, counted.
type failingRenew struct {
	storage.Engine
	fail   atomic.Bool
	failed atomic.Int64
}

func (f *failingRenew) SubscriptionMembersRenew(ctx context.Context, p *storage.SubscriptionMembersRenewParams) (*storage.SubscriptionMembersRenewResult, error) {
	if f.fail.Load() && len(p.Members) > 0 {
		f.failed.Add(1)
		return nil, fmt.Errorf("%w: injected", storage.ErrUnavailable)
	}
	return f.Engine.SubscriptionMembersRenew(ctx, p)
}

// A pattern member joined to a topic created after it subscribed keeps the join when its record
// write fails (no Subscribe waits for it), and its owner writes the record again before its next
// pass: other instances see the member then, not only at the next liveness renewal (an hour
// here), during which they would complete the messages it wants as filtered.
func TestFilterRecordWrittenAgainAfterFailure(t *testing.T) {
	url := testutil.DatabaseURL(t)
	schema := testutil.PGSchema(t, url, "t_brec_")
	fr := &failingRenew{}
	in := startPGInstance(t, url, schema, newFakeClock(), func(c *Config) { fr.Engine = c.Engine; c.Engine = fr })
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	m, err := in.b.Subscribe(ctx, SubscribeParams{Pattern: "orders.*", MemberID: "eu", MaxInFlight: 10, Filter: "region=eu"})
	if err != nil {
		t.Fatal(err)
	}
	fr.fail.Store(true)
	if _, err := in.b.CreateTopic(ctx, "orders.new", storage.TopicConfig{}); err != nil {
		t.Fatal(err)
	}
	var sub int64
	eventually(t, "the member attached to the new topic, its record write failed", func() error {
		for _, a := range m.Subscriptions() {
			if a.Topic == "orders.new" {
				sub = a.SubscriptionID
			}
		}
		if sub == 0 || fr.failed.Load() == 0 {
			return fmt.Errorf("subscription %d, %d failed writes", sub, fr.failed.Load())
		}
		return nil
	})
	fr.fail.Store(false)
	if _, err := in.b.Publish(ctx, "orders.new", []storage.AppendMessage{{Partition: storage.PartitionAuto,
		Headers: map[string]string{"region": "eu"}, Payload: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	recv(t, m, 1) // the owner makes passes
	// The pass that delivered may have begun before the injected failures stopped; the next
	// one writes the record (the liveness renewal would take an hour of the fake clock).
	eventually(t, "the record of member eu written again", func() error {
		var filter string
		err := in.eng.Pool().QueryRow(ctx, fmt.Sprintf("SELECT filter FROM %s.sub_members WHERE sub_id = $1 AND member = 'eu'", schema), sub).Scan(&filter)
		if err != nil || filter != "region=eu" {
			return fmt.Errorf("record of member eu on subscription %d: %q, %v", sub, filter, err)
		}
		return nil
	})
}
