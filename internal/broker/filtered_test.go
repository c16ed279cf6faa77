package broker

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// filterCounter records Config.OnFiltered calls.
type filterCounter struct {
	mu sync.Mutex
	n  map[string]int // "topic/group" -> messages
}

func (c *filterCounter) observe(topic, group string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = make(map[string]int)
	}
	c.n[topic+"/"+group] += n
}

func (c *filterCounter) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

// publishRegions publishes one message per region, in order, with header region and payload
// "<region>-<i>" (i counts per region).
func (e *env) publishRegions(topic string, regions ...string) {
	e.t.Helper()
	seen := map[string]int{}
	for _, r := range regions {
		_, err := e.b.Publish(e.ctx(), topic, []storage.AppendMessage{{Partition: storage.PartitionAuto,
			Headers: map[string]string{"region": r}, Payload: fmt.Appendf(nil, "%s-%d", r, seen[r])}})
		if err != nil {
			e.t.Fatalf("Publish: %v", err)
		}
		seen[r]++
	}
}

func TestFilterRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("f", storage.TopicConfig{Semantics: storage.PubSub})
	for _, p := range []SubscribeParams{
		{Pattern: "f", Group: "g", Filter: "region="},
		{Pattern: "f", Group: "g", Filter: strings.Repeat("a", 2000)},
		{Pattern: "f", Group: "g", Filter: "region=eu", Mode: storage.ModeOrdered},
	} {
		_, err := e.b.Subscribe(e.ctx(), p)
		if !errors.Is(err, storage.ErrInvalidArgument) || !strings.Contains(err.Error(), "filter") {
			t.Errorf("Subscribe(filter %.20q, mode %q) = %v, want INVALID_ARGUMENT about the filter", p.Filter, p.Mode, err)
		}
	}
	if _, err := e.b.Subscribe(e.ctx(), SubscribeParams{Pattern: "f", Group: "g", Filter: "region=eu,"}); err == nil ||
		!strings.Contains(err.Error(), "at byte 10") {
		t.Errorf("error without the position: %v", err)
	}
	if len(e.b.Members()) != 0 {
		t.Fatalf("refused subscribes left members: %v", e.b.Members())
	}
	m := e.subscribe(SubscribeParams{Pattern: "f", Group: "g", Filter: "  "})
	if m.Filter() != "" {
		t.Fatalf("blank filter kept: %q", m.Filter())
	}

	// A shared engine takes filters (filtered_pg_test.go), ordered groups still do not.
	shared := newEnv(t, func(c *Config) { c.SharedEngine = true })
	shared.createTopic("f", storage.TopicConfig{Semantics: storage.PubSub})
	if _, err := shared.b.Subscribe(shared.ctx(), SubscribeParams{Pattern: "f", Group: "g", Filter: "region=eu"}); err != nil {
		t.Fatalf("filter with a shared engine: %v", err)
	}
	_, err := shared.b.Subscribe(shared.ctx(), SubscribeParams{Pattern: "f", Group: "o", Filter: "region=eu", Mode: storage.ModeOrdered})
	if !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("filter of an ordered member with a shared engine: %v, want INVALID_ARGUMENT", err)
	}
}

// TestFilterRoutesAndCompletes: members with different filters get only what they match, also
// what was claimed for another member (handed over, attempt 1), and what no member matches is
// completed for the group without a delivery and counted.
func TestFilterRoutesAndCompletes(t *testing.T) {
	t.Parallel()
	var fc filterCounter
	e := newEnv(t, func(c *Config) { c.OnFiltered = fc.observe })
	e.createTopic("orders", storage.TopicConfig{})
	eu := e.subscribe(SubscribeParams{Pattern: "orders", MemberID: "eu", MaxInFlight: 4, Filter: "region=eu"})
	us := e.subscribe(SubscribeParams{Pattern: "orders", MemberID: "us", MaxInFlight: 4, Filter: "region in (us, ca)"})
	var regions []string
	for range 10 {
		regions = append(regions, "eu", "us", "ap")
	}
	e.publishRegions("orders", regions...)
	gs := consumeAll(t, 20, eu, us)
	for _, g := range gs {
		want := map[string]string{"eu": "eu", "us": "us"}[g.member]
		if g.d.Headers["region"] != want {
			t.Errorf("member %s got %s (region %q)", g.member, g.d.Payload, g.d.Headers["region"])
		}
		if g.d.Attempt != 1 || g.d.Member != g.member {
			t.Errorf("member %s got %s with attempt %d, lease holder %q", g.member, g.d.Payload, g.d.Attempt, g.d.Member)
		}
	}
	if n := byMember(gs); n["eu"] != 10 || n["us"] != 10 {
		t.Fatalf("deliveries per member %v, want 10 each", n)
	}
	eventually(t, "ap messages filtered", func() error {
		if n := fc.get("orders/" + storage.QueueGroup); n != 10 {
			return fmt.Errorf("filtered %d, want 10", n)
		}
		if st := e.groupStats("orders", storage.QueueGroup); st.Pending != 0 {
			return fmt.Errorf("pending %d", st.Pending)
		}
		return nil
	})
	// The group's counters (groupcounts.go): the 20 acked, the 10 filtered.
	info, err := e.b.Group(e.ctx(), "orders", "")
	if err != nil {
		t.Fatal(err)
	}
	if c := info.Counts; c != (GroupCounts{Processed: 20, Filtered: 10}) {
		t.Errorf("group counts %+v, want 20 processed, 10 filtered", c)
	}
}

// TestFilterCreditNotConsumed: a member with credit 1 whose filter matches one message in a
// hundred receives it; the others are completed without taking its credit or its place in the
// round robin, and the member never held more than its credit.
func TestFilterCreditNotConsumed(t *testing.T) {
	t.Parallel()
	var fc filterCounter
	e := newEnv(t, func(c *Config) { c.OnFiltered = fc.observe })
	e.createTopic("ev", storage.TopicConfig{Semantics: storage.PubSub})
	m := e.subscribe(SubscribeParams{Pattern: "ev", Group: "g", MemberID: "m", MaxInFlight: 1, Filter: "region=eu"})
	var regions []string
	for range 99 {
		regions = append(regions, "us")
	}
	e.publishRegions("ev", append(regions, "eu")...)
	ds := recv(t, m, 1)
	if string(ds[0].Payload) != "eu-0" {
		t.Fatalf("got %s, want eu-0", ds[0].Payload)
	}
	if n := m.InFlight(); n != 1 {
		t.Fatalf("in flight %d, want 1", n)
	}
	if n := fc.get("ev/g"); n != 99 {
		t.Fatalf("filtered %d, want 99", n)
	}
	// Without credit nothing is claimed, so nothing is filtered either until the ack.
	e.publishRegions("ev", "us", "eu")
	ack(t, m, ds[0])
	ds = recv(t, m, 1)
	if string(ds[0].Payload) != "eu-0" || ds[0].Offset != 101 {
		t.Fatalf("got %s at %d, want the second eu message at offset 101", ds[0].Payload, ds[0].Offset)
	}
	eventually(t, "us filtered", func() error {
		if n := fc.get("ev/g"); n != 100 {
			return fmt.Errorf("filtered %d, want 100", n)
		}
		return nil
	})
}

// TestFilterHandOverWaitsForCredit: messages claimed for a member that another member's filter
// wants wait in the owner while that member has no credit, without taking the claiming member's
// credit, and reach it when its credit comes back, with attempt 1 and a lease it holds (its nack
// works).
func TestFilterHandOverWaitsForCredit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("q", storage.TopicConfig{})
	eu := e.subscribe(SubscribeParams{Pattern: "q", MemberID: "eu", MaxInFlight: 1, Filter: "region=eu"})
	us := e.subscribe(SubscribeParams{Pattern: "q", MemberID: "us", MaxInFlight: 10, Filter: "region=us"})
	e.publishRegions("q", "eu", "eu", "eu")
	first := recv(t, eu, 1)
	if string(first[0].Payload) != "eu-0" {
		t.Fatalf("eu got %s first", first[0].Payload)
	}
	e.waitIdle()
	o := e.b.subs[first[0].SubscriptionID]
	if len(o.parked) != 2 || us.InFlight() != 0 {
		t.Fatalf("parked %d (want 2), us in flight %d (want 0)", len(o.parked), us.InFlight())
	}
	ack(t, eu, first[0])
	ds := recv(t, eu, 1)
	if string(ds[0].Payload) != "eu-1" || ds[0].Attempt != 1 || ds[0].Member != "eu" {
		t.Fatalf("got %s attempt %d holder %q, want eu-1 attempt 1 held by eu", ds[0].Payload, ds[0].Attempt, ds[0].Member)
	}
	if err := eu.Nack(e.ctx(), ds[0].SubscriptionID, []storage.DeliveryRef{ds[0].Ref()}, NackOptions{}); err != nil {
		t.Fatalf("nack of a handed-over delivery: %v", err)
	}
	rest := consumeAll(t, 2, eu, us)
	for _, g := range rest {
		if g.member != "eu" {
			t.Fatalf("%s got %s", g.member, g.d.Payload)
		}
	}
	if have := payloads(rest); !slices.Equal(have, []string{"eu-1", "eu-2"}) {
		t.Fatalf("after the nack eu got %v, want eu-1 (again) and eu-2", have)
	}
}

// TestFilterParkedBound: while the member a filter routes messages to has no credit, the owner
// parks at most maxParked of them and claims no more (the rest stays in the engine, unleased);
// each credit that comes back takes one.
func TestFilterParkedBound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("pb", storage.TopicConfig{})
	eu := e.subscribe(SubscribeParams{Pattern: "pb", MemberID: "eu", MaxInFlight: 1, Filter: "region=eu"})
	e.subscribe(SubscribeParams{Pattern: "pb", MemberID: "us", MaxInFlight: 1000, Filter: "region=us"})
	// One batch: a claim for us may bring them all at once.
	msgs := make([]storage.AppendMessage, maxParked+45)
	for i := range msgs {
		msgs[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Headers: map[string]string{"region": "eu"},
			Payload: fmt.Appendf(nil, "eu-%d", i)}
	}
	if _, err := e.b.Publish(e.ctx(), "pb", msgs); err != nil {
		t.Fatal(err)
	}
	first := recv(t, eu, 1)
	e.waitIdle()
	o := e.b.subs[first[0].SubscriptionID]
	if len(o.parked) != maxParked {
		t.Fatalf("parked %d, want the bound %d", len(o.parked), maxParked)
	}
	if st := e.groupStats("pb", storage.QueueGroup); st.InFlight != maxParked+1 {
		t.Fatalf("leased %d, want %d (one delivered, the parked ones)", st.InFlight, maxParked+1)
	}
	ack(t, eu, first...)
	next := recv(t, eu, 1)
	if string(next[0].Payload) != "eu-1" {
		t.Fatalf("got %s after the ack, want eu-1 (parked first)", next[0].Payload)
	}
}

// TestFilterParkedLeasesRenewed: deliveries parked for a member without credit keep their leases
// (the owner renews them) over several ack_wait periods, so parking costs no delivery attempt:
// nothing is dead-lettered and the member gets them all, at attempt 1, once it acks.
func TestFilterParkedLeasesRenewed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("pr", storage.TopicConfig{AckWait: 5 * time.Second, MaxDeliveries: 3})
	eu := e.subscribe(SubscribeParams{Pattern: "pr", MemberID: "eu", MaxInFlight: 1, Filter: "region=eu"})
	us := e.subscribe(SubscribeParams{Pattern: "pr", MemberID: "us", MaxInFlight: 10, Filter: "region=us"})
	e.publishRegions("pr", "eu", "eu", "eu")
	first := recv(t, eu, 1)
	e.waitIdle()
	// Five lease periods in steps shorter than half a lease; eu's own lease is extended too.
	for range 13 {
		e.clock.Advance(2 * time.Second)
		if _, err := eu.Extend(e.ctx(), first[0].SubscriptionID, []storage.DeliveryRef{first[0].Ref()}, 0); err != nil {
			t.Fatalf("extend: %v", err)
		}
		e.b.wakeAll()
		e.waitIdle()
	}
	if st := e.groupStats("pr", storage.QueueGroup); st.DeadLettered != 0 {
		t.Fatalf("dead-lettered %d while parked, want 0", st.DeadLettered)
	}
	ack(t, eu, first[0])
	rest := consumeAll(t, 2, eu, us)
	for _, g := range rest {
		if g.member != "eu" || g.d.Attempt != 1 {
			t.Fatalf("%s got %s at attempt %d, want eu at attempt 1", g.member, g.d.Payload, g.d.Attempt)
		}
	}
	if have := payloads(rest); !slices.Equal(have, []string{"eu-1", "eu-2"}) {
		t.Fatalf("eu got %v, want eu-1 eu-2", have)
	}
}
