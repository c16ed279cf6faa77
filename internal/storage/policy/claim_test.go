package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

const sec = int64(time.Second)

// entry is a leased or waiting message of the test store.
type entry struct {
	p       int32
	o       int64
	attempt int
	member  string
	leased  bool
	at      int64 // lease deadline, or due time
}

// store is the smallest engine that drives a Claim: slices instead of heaps or rows.
type store struct {
	msgs    [][]storage.Message // per partition, offset = index
	cursor  []int64
	entries []*entry
}

// outcome is what a claim did, as strings easy to compare: "p:o#attempt" deliveries in order,
// "p:o" DLQ entries, completed and delayed messages.
type outcome struct {
	delivered, dead, completed, delayed []string
	next                                int64
	hasNext                             bool
}

// claim runs one claim over s the way the engines do.
func (s *store) claim(in Input) (outcome, error) {
	var c Claim
	if err := c.Start(in); err != nil {
		return outcome{}, err
	}
	var out outcome
	// 1. Expired leases, in any order.
	kept := s.entries[:0]
	for _, e := range s.entries {
		if e.leased {
			switch x, due := c.Expire(e.at, e.attempt); x {
			case DeadLetter:
				out.dead = append(out.dead, fmt.Sprintf("%d:%d", e.p, e.o))
				continue
			case Wait:
				e.leased, e.at = false, due
			}
		}
		kept = append(kept, e)
	}
	s.entries = kept
	// 2. Waiting messages in order.
	waiting := []*entry{}
	for _, e := range s.entries {
		if !e.leased {
			waiting = append(waiting, e)
		}
	}
	slices.SortFunc(waiting, func(a, b *entry) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		if a.p != b.p {
			return int(a.p - b.p)
		}
		return int(a.o - b.o)
	})
	for _, e := range waiting {
		take, stop := c.Redeliver(e.at, e.p, e.member, 1)
		if stop {
			break
		}
		if take == 1 {
			e.attempt++
			e.leased, e.member, e.at = true, in.Params.Member, c.Deadline()
			out.delivered = append(out.delivered, fmt.Sprintf("%d:%d#%d", e.p, e.o, e.attempt))
		}
	}
	// 3. New messages.
	for k := 0; !c.Full(); k++ {
		p, ok := c.Partition(k)
		if !ok {
			break
		}
		for s.cursor[p] < int64(len(s.msgs[p])) {
			m := &s.msgs[p][s.cursor[p]]
			x := c.Take(m)
			if x == Stop {
				break
			}
			s.cursor[p]++
			ref := fmt.Sprintf("%d:%d", p, m.Offset)
			switch x {
			case Lease:
				s.entries = append(s.entries, &entry{p: p, o: m.Offset, attempt: 1, member: in.Params.Member, leased: true, at: c.Deadline()})
				out.delivered = append(out.delivered, ref+"#1")
			case Complete:
				out.completed = append(out.completed, ref)
			case Delay:
				s.entries = append(s.entries, &entry{p: p, o: m.Offset, at: m.NotBefore.UnixNano()})
				out.delayed = append(out.delayed, ref)
			}
		}
	}
	// 4. NextDue.
	for _, e := range s.entries {
		if e.leased {
			c.Leased(e.at)
		}
	}
	out.next, out.hasNext = c.NextDue()
	return out, nil
}

// msgs makes n plain messages of partition p.
func msgs(p int32, n int) []storage.Message {
	out := make([]storage.Message, n)
	for i := range out {
		out[i] = storage.Message{Partition: p, Offset: int64(i)}
	}
	return out
}

func at(ns int64) time.Time { return time.Unix(0, ns) }

func TestClaim(t *testing.T) {
	const now = 100 * sec
	const wait = 30 * sec // ack_wait
	member := "m"
	params := func(max int) *storage.DeliveriesClaimParams {
		return &storage.DeliveriesClaimParams{Member: member, Max: max}
	}
	cases := []struct {
		name   string
		store  store
		params *storage.DeliveriesClaimParams
		rotor  uint64
		maxDel int
		want   outcome
	}{
		{
			name:   "nothing to claim: NextDue zero",
			store:  store{msgs: [][]storage.Message{nil}, cursor: []int64{0}},
			params: params(5),
		},
		{
			name:   "new messages in offset order, lease until now + ack_wait",
			store:  store{msgs: [][]storage.Message{msgs(0, 3)}, cursor: []int64{0}},
			params: params(2),
			want:   outcome{delivered: []string{"0:0#1", "0:1#1"}, next: now + wait, hasNext: true},
		},
		{
			name:   "lease duration overrides ack_wait",
			store:  store{msgs: [][]storage.Message{msgs(0, 1)}, cursor: []int64{0}},
			params: &storage.DeliveriesClaimParams{Member: member, Max: 1, LeaseDuration: 5 * time.Second},
			want:   outcome{delivered: []string{"0:0#1"}, next: now + 5*sec, hasNext: true},
		},
		{
			name: "lease not expired: held, its deadline is NextDue",
			store: store{msgs: [][]storage.Message{msgs(0, 1)}, cursor: []int64{1},
				entries: []*entry{{p: 0, o: 0, attempt: 1, member: "x", leased: true, at: now + sec}}},
			params: params(5),
			want:   outcome{next: now + sec, hasNext: true},
		},
		{
			name: "expired lease waits its deadline plus the backoff of its attempt",
			store: store{msgs: [][]storage.Message{msgs(0, 2)}, cursor: []int64{2},
				entries: []*entry{
					{p: 0, o: 0, attempt: 1, member: "x", leased: true, at: now},           // due now + 1 s
					{p: 0, o: 1, attempt: 2, member: "x", leased: true, at: now - 2*sec}}}, // due now + 2 s
			params: params(5),
			maxDel: 5,
			want:   outcome{next: now + sec, hasNext: true},
		},
		{
			name: "the backoff grows fourfold per attempt and stops at 5 minutes",
			store: store{msgs: [][]storage.Message{msgs(0, 2)}, cursor: []int64{2},
				entries: []*entry{
					{p: 0, o: 0, attempt: 3, member: "x", leased: true, at: now - 13*sec},    // 16 s: due now + 3 s
					{p: 0, o: 1, attempt: 9, member: "x", leased: true, at: now - 298*sec}}}, // 5 min: due now + 2 s
			params: params(5),
			maxDel: 10,
			want:   outcome{next: now + 2*sec, hasNext: true},
		},
		{
			name: "expired lease whose backoff passed is redelivered with the next attempt",
			store: store{msgs: [][]storage.Message{msgs(0, 2)}, cursor: []int64{1},
				entries: []*entry{{p: 0, o: 0, attempt: 2, member: "x", leased: true, at: now - 4*sec}}},
			params: params(5),
			maxDel: 5,
			want:   outcome{delivered: []string{"0:0#3", "0:1#1"}, next: now + wait, hasNext: true},
		},
		{
			name: "expired lease on the max_deliveries-th delivery goes to the DLQ",
			store: store{msgs: [][]storage.Message{msgs(0, 1)}, cursor: []int64{1},
				entries: []*entry{{p: 0, o: 0, attempt: 3, member: "x", leased: true, at: now - time.Hour.Nanoseconds()}}},
			params: params(5),
			maxDel: 3,
			want:   outcome{dead: []string{"0:0"}},
		},
		{
			name: "redeliveries first, oldest due first, then partition, then offset; then new messages",
			store: store{msgs: [][]storage.Message{msgs(0, 4), msgs(1, 4)}, cursor: []int64{2, 2},
				entries: []*entry{
					{p: 1, o: 1, attempt: 1, member: "x", at: now - sec},
					{p: 0, o: 1, attempt: 1, member: "x", at: now - 2*sec},
					{p: 1, o: 0, attempt: 2, member: "x", at: now - 2*sec},
					{p: 0, o: 0, attempt: 1, member: "x", at: now - 2*sec}}},
			params: params(5),
			want:   outcome{delivered: []string{"0:0#2", "0:1#2", "1:0#3", "1:1#2", "0:2#1"}, next: now + wait, hasNext: true},
		},
		{
			name: "max reached by redeliveries: no new message, NextDue now for the due one left",
			store: store{msgs: [][]storage.Message{msgs(0, 4)}, cursor: []int64{2},
				entries: []*entry{
					{p: 0, o: 0, attempt: 1, member: "x", at: now - 2*sec},
					{p: 0, o: 1, attempt: 1, member: "x", at: now - sec}}},
			params: params(1),
			want:   outcome{delivered: []string{"0:0#2"}, next: now, hasNext: true},
		},
		{
			name: "not due yet: waits, its due time is NextDue",
			store: store{msgs: [][]storage.Message{msgs(0, 1)}, cursor: []int64{1},
				entries: []*entry{{p: 0, o: 0, attempt: 1, member: "x", at: now + 3*sec}}},
			params: params(5),
			want:   outcome{next: now + 3*sec, hasNext: true},
		},
		{
			name: "AvoidMember skips what the member had last; the skipped do not make NextDue now",
			store: store{msgs: [][]storage.Message{msgs(0, 2)}, cursor: []int64{2},
				entries: []*entry{
					{p: 0, o: 0, attempt: 1, member: member, at: now - sec},
					{p: 0, o: 1, attempt: 1, member: "x", at: now - sec}}},
			params: &storage.DeliveriesClaimParams{Member: member, Max: 5, AvoidMember: true},
			want:   outcome{delivered: []string{"0:1#2"}, next: now + wait, hasNext: true},
		},
		{
			name: "without AvoidMember the member gets its own redelivery",
			store: store{msgs: [][]storage.Message{msgs(0, 1)}, cursor: []int64{1},
				entries: []*entry{{p: 0, o: 0, attempt: 1, member: member, at: now - sec}}},
			params: params(5),
			want:   outcome{delivered: []string{"0:0#2"}, next: now + wait, hasNext: true},
		},
		{
			name: "partition filter: redeliveries and new messages of the listed partitions only",
			store: store{msgs: [][]storage.Message{msgs(0, 2), msgs(1, 2), msgs(2, 2)}, cursor: []int64{1, 1, 0},
				entries: []*entry{
					{p: 0, o: 0, attempt: 1, member: "x", at: now - sec},
					{p: 1, o: 0, attempt: 1, member: "x", at: now - sec}}},
			params: &storage.DeliveriesClaimParams{Member: member, Max: 5, Partitions: []int32{2, 1, 2}},
			want:   outcome{delivered: []string{"1:0#2", "1:1#1", "2:0#1", "2:1#1"}, next: now + wait, hasNext: true},
		},
		{
			name:   "the partition read first rotates with the rotor",
			store:  store{msgs: [][]storage.Message{msgs(0, 2), msgs(1, 2), msgs(2, 2)}, cursor: []int64{0, 0, 0}},
			params: params(3),
			rotor:  4, // 4 mod 3: partition 1 first
			want:   outcome{delivered: []string{"1:0#1", "1:1#1", "2:0#1"}, next: now + wait, hasNext: true},
		},
		{
			name: "rotation among the listed partitions",
			store: store{msgs: [][]storage.Message{msgs(0, 2), msgs(1, 2), msgs(2, 2), msgs(3, 2)},
				cursor: []int64{0, 0, 0, 0}},
			params: &storage.DeliveriesClaimParams{Member: member, Max: 1, Partitions: []int32{3, 1}},
			rotor:  1, // of [1 3]: 3 first
			want:   outcome{delivered: []string{"3:0#1"}, next: now + wait, hasNext: true},
		},
		{
			name: "expired new messages are completed, delayed ones wait for NotBefore without a delivery",
			store: store{msgs: [][]storage.Message{{
				{Offset: 0, ExpiresAt: at(now)},
				{Offset: 1, NotBefore: at(now + 7*sec)},
				{Offset: 2, NotBefore: at(now), ExpiresAt: at(now + sec)},
			}}, cursor: []int64{0}},
			params: params(5),
			want: outcome{delivered: []string{"0:2#1"}, completed: []string{"0:0"}, delayed: []string{"0:1"},
				next: now + 7*sec, hasNext: true},
		},
		{
			name: "scan limit: a claim stops after ScanLimit messages it does not deliver, NextDue now",
			store: func() store {
				ms := msgs(0, ScanLimit+10)
				for i := range ms {
					ms[i].ExpiresAt = at(now - sec)
				}
				return store{msgs: [][]storage.Message{ms}, cursor: []int64{0}}
			}(),
			params: params(5),
			want:   outcome{completed: make([]string, ScanLimit), next: now, hasNext: true},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			maxDel := tc.maxDel
			if maxDel == 0 {
				maxDel = 5
			}
			tc.params.SubscriptionID = 1
			got, err := tc.store.claim(Input{Params: tc.params, Partitions: len(tc.store.msgs), AckWait: time.Duration(wait),
				MaxDeliveries: maxDel, Now: now, Rotor: tc.rotor})
			if err != nil {
				t.Fatal(err)
			}
			if len(tc.want.completed) == ScanLimit {
				if len(got.completed) != ScanLimit {
					t.Fatalf("completed %d, want %d", len(got.completed), ScanLimit)
				}
				got.completed = make([]string, ScanLimit)
			}
			if g, w := fmt.Sprint(got), fmt.Sprint(tc.want); g != w {
				t.Fatalf("got  %s\nwant %s", g, w)
			}
		})
	}
}

func TestClaimPartitionOutOfRange(t *testing.T) {
	for _, p := range []int32{-1, 3} {
		var c Claim
		err := c.Start(Input{Params: &storage.DeliveriesClaimParams{Member: "m", Max: 1, Partitions: []int32{0, p}},
			Topic: "t", Partitions: 3, AckWait: time.Second, MaxDeliveries: 1})
		if !errors.Is(err, storage.ErrInvalidArgument) || !strings.Contains(err.Error(), fmt.Sprintf("partition %d out of range", p)) {
			t.Fatalf("partition %d: %v", p, err)
		}
	}
}

func TestClaimDeadlineResolution(t *testing.T) {
	var c Claim
	now := 100*sec + 1234 // ns
	if err := c.Start(Input{Params: &storage.DeliveriesClaimParams{Member: "m", Max: 1, LeaseDuration: 1500 * time.Nanosecond},
		Partitions: 1, AckWait: time.Second, MaxDeliveries: 1, Now: now, Resolution: time.Microsecond}); err != nil {
		t.Fatal(err)
	}
	if got, want := c.Deadline(), 100*sec+2000; got != want {
		t.Fatalf("deadline %d, want %d (truncated to microseconds)", got, want)
	}
}

// TestRedeliverRun: a run of n messages (a PostgreSQL row) is taken up to the room left; the rest
// is due now and makes NextDue now.
func TestRedeliverRun(t *testing.T) {
	var c Claim
	now := 50 * sec
	if err := c.Start(Input{Params: &storage.DeliveriesClaimParams{Member: "m", Max: 3}, Partitions: 1, AckWait: time.Second,
		MaxDeliveries: 5, Now: now}); err != nil {
		t.Fatal(err)
	}
	if take, stop := c.Redeliver(now-sec, 0, "x", 5); take != 3 || stop {
		t.Fatalf("take %d stop %v, want 3 false", take, stop)
	}
	if take, stop := c.Redeliver(now-sec, 0, "x", 1); take != 0 || !stop {
		t.Fatalf("full claim: take %d stop %v, want 0 true", take, stop)
	}
	if next, ok := c.NextDue(); !ok || next != now {
		t.Fatalf("NextDue %d %v, want now", next, ok)
	}
}

// TestTooManyUnlease: a delivery beyond max_deliveries is refused and its place given back.
func TestTooManyUnlease(t *testing.T) {
	var c Claim
	if err := c.Start(Input{Params: &storage.DeliveriesClaimParams{Member: "m", Max: 1}, Partitions: 1, AckWait: time.Second,
		MaxDeliveries: 1, Now: sec}); err != nil {
		t.Fatal(err)
	}
	if c.Take(&storage.Message{}) != Lease || !c.Full() {
		t.Fatal("first message not leased, or the claim is not full")
	}
	if c.TooMany(1) || !c.TooMany(2) {
		t.Fatal("TooMany: attempt 1 of 1 allowed, 2 not")
	}
	c.Unlease()
	if c.Full() || c.Remaining() != 1 {
		t.Fatalf("after Unlease: %s", c.String())
	}
}

// TestClaimAllocs: planning a claim over every partition, or over a sorted list of partitions,
// allocates nothing.
func TestClaimAllocs(t *testing.T) {
	for _, parts := range [][]int32{nil, {1, 3}} {
		if n := claimAllocs(parts); n != 0 {
			t.Fatalf("partitions %v: %v allocations per claim, want 0", parts, n)
		}
	}
	if n := claimAllocs([]int32{3, 1, 3}); n != 1 {
		t.Fatalf("unsorted partitions: %v allocations per claim, want 1 (the sorted copy)", n)
	}
}

func claimAllocs(parts []int32) float64 {
	m := &storage.Message{}
	p := &storage.DeliveriesClaimParams{Member: "m", Max: 10, Partitions: parts}
	return testing.AllocsPerRun(100, func() {
		var c Claim
		_ = c.Start(Input{Params: p, Partitions: 4, AckWait: time.Second, MaxDeliveries: 3, Now: sec})
		c.Expire(0, 1)
		c.Redeliver(0, 1, "x", 2)
		for k := 0; ; k++ {
			if _, ok := c.Partition(k); !ok {
				break
			}
			c.Take(m)
		}
		c.Leased(2 * sec)
		c.NextDue()
	})
}
