package substate

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/policy"
)

const sec = int64(time.Second)

// claimAt returns the plan of a claim at now by member (up to max, AvoidMember avoid, limited
// to parts when not nil, leasing until deadline) over the partitions of s.
func claimAt(s *Sub, now int64, member string, avoid bool, parts []int32, max, maxDel int, deadline int64) *policy.Claim {
	c := &policy.Claim{}
	p := &storage.DeliveriesClaimParams{Member: member, Max: max, AvoidMember: avoid, Partitions: parts}
	if err := c.Start(policy.Input{Params: p, Partitions: s.Partitions(), AckWait: time.Duration(deadline - now),
		MaxDeliveries: maxDel, Now: now}); err != nil {
		panic(err)
	}
	return c
}

// expire runs ExpireLeases at now with maxDel.
func expire(s *Sub, now int64, maxDel int) []*Entry {
	return s.ExpireLeases(claimAt(s, now, "x", false, nil, 1, maxDel, now))
}

// takeDue runs TakeDue for a claim (see claimAt) and returns its redeliveries and the due time it
// reports for NextDue.
func takeDue(s *Sub, now int64, member string, avoid bool, parts []int32, max int, deadline int64) ([]*Entry, int64, bool) {
	c := claimAt(s, now, member, avoid, parts, max, 100, deadline)
	got := s.TakeDue(c)
	next, ok := c.NextDue()
	return got, next, ok
}

// checkInvariants verifies the structural invariants documented in doc.go.
func checkInvariants(t *testing.T, s *Sub) {
	t.Helper()
	inHeap := map[*Entry]bool{}
	for i, e := range s.leases {
		if e.idx != i || !e.Leased {
			t.Fatalf("lease heap entry %d: idx %d leased %v", i, e.idx, e.Leased)
		}
		inHeap[e] = true
	}
	for i, e := range s.waiting {
		if e.idx != i || e.Leased {
			t.Fatalf("waiting heap entry %d: idx %d leased %v", i, e.idx, e.Leased)
		}
		inHeap[e] = true
	}
	n := 0
	for p, pt := range s.parts {
		if pt.floor > pt.cursor {
			t.Fatalf("partition %d: floor %d > cursor %d", p, pt.floor, pt.cursor)
		}
		if pt.done.test(pt.floor) {
			t.Fatalf("partition %d: floor %d is done", p, pt.floor)
		}
		if got := pt.done.count(); got != pt.doneN {
			t.Fatalf("partition %d: doneN %d, count %d", p, pt.doneN, got)
		}
		if pt.done.countRange(0, pt.floor) != 0 {
			t.Fatalf("partition %d: done bits below floor", p)
		}
		for o := pt.floor; o < pt.cursor; o++ {
			_, pend := pt.pending[o]
			if pend == pt.done.test(o) {
				t.Fatalf("partition %d offset %d: pending=%v done=%v", p, o, pend, pt.done.test(o))
			}
		}
		for o, e := range pt.pending {
			if o < pt.floor || o >= pt.cursor || e.Offset != o || e.Partition != int32(p) || e.DLQ != 0 {
				t.Fatalf("partition %d: bad pending entry %d %+v", p, o, e)
			}
			if !inHeap[e] {
				t.Fatalf("partition %d: pending %d in no heap", p, o)
			}
			n++
		}
		for o, e := range pt.replayed {
			if e.Offset != o || e.DLQ == 0 || !inHeap[e] {
				t.Fatalf("partition %d: bad replayed entry %d %+v", p, o, e)
			}
			n++
		}
	}
	if n != len(inHeap) {
		t.Fatalf("%d entries in maps, %d in heaps", n, len(inHeap))
	}
	if got := s.dlqLive.count(); got != s.dlqN {
		t.Fatalf("dlqN %d, count %d", s.dlqN, got)
	}
	if s.dlqN > 0 && !s.dlqLive.test(s.dlqLow) {
		t.Fatalf("dlqLow %d is not in the DLQ", s.dlqLow)
	}
	if s.dlqLive.countRange(0, s.dlqLow) != 0 || s.dlqLive.countRange(s.nextDLQ, s.nextDLQ+1<<20) != 0 {
		t.Fatal("DLQ IDs outside [dlqLow, nextDLQ)")
	}
}

// dlqPositions stands for the engine's DLQ log in these tests: the position of each DLQ entry.
var dlqPositions = struct {
	sync.Mutex
	m map[*Sub]map[int64][2]int64
}{m: map[*Sub]map[int64][2]int64{}}

// deadLetter dead-letters e as the engine does and remembers the position of its DLQ entry.
func deadLetter(s *Sub, e *Entry) int64 {
	p, o := e.Partition, e.Offset
	id := s.DeadLetter(e)
	dlqPositions.Lock()
	defer dlqPositions.Unlock()
	if dlqPositions.m[s] == nil {
		dlqPositions.m[s] = map[int64][2]int64{}
	}
	dlqPositions.m[s][id] = [2]int64{int64(p), o}
	return id
}

// replayDLQ replays the DLQ entries ids (all when empty) as the engine does and returns how many.
func replayDLQ(s *Sub, ids []int64, due int64) int {
	sel := s.DLQSelect(ids)
	dlqPositions.Lock()
	defer dlqPositions.Unlock()
	for _, id := range sel {
		s.DLQPurge([]int64{id})
		pos := dlqPositions.m[s][id]
		s.Replay(int32(pos[0]), pos[1], id, due)
	}
	return len(sel)
}

func TestFloorAdvancesOverContiguousDone(t *testing.T) {
	t.Parallel()
	s := New([]int64{10})
	for o := int64(10); o < 15; o++ {
		if e := s.Deliver(0, o, "m", 100*sec); e == nil || e.Attempt != 1 {
			t.Fatalf("deliver %d: %+v", o, e)
		}
	}
	checkInvariants(t, s)
	for _, o := range []int64{11, 13} {
		if got := s.Ack(0, o, 100); got != Acked {
			t.Fatalf("ack %d = %v", o, got)
		}
	}
	if s.Floor(0) != 10 {
		t.Fatalf("floor %d, want 10", s.Floor(0))
	}
	if got := s.Ack(0, 10, 100); got != Acked {
		t.Fatal(got)
	}
	if s.Floor(0) != 12 {
		t.Fatalf("floor %d, want 12", s.Floor(0))
	}
	if got := s.Ack(0, 11, 100); got != AlreadyDone {
		t.Fatalf("re-ack below floor = %v", got)
	}
	if got := s.Ack(0, 13, 100); got != AlreadyDone {
		t.Fatalf("re-ack above floor = %v", got)
	}
	if got := s.Ack(0, 100, 100); got != Unknown {
		t.Fatalf("ack at high water = %v", got)
	}
	if got := s.Ack(1, 0, 100); got != Unknown {
		t.Fatalf("ack unknown partition = %v", got)
	}
	// Ack ahead of the cursor: the cursor skips it later.
	if got := s.Ack(0, 15, 100); got != Acked {
		t.Fatal(got)
	}
	if c := s.Cursor(0); c != 16 {
		t.Fatalf("cursor %d, want 16", c)
	}
	s.Ack(0, 12, 100)
	s.Ack(0, 14, 100)
	if s.Floor(0) != 16 || s.Cursor(0) != 16 {
		t.Fatalf("floor %d cursor %d, want 16 16", s.Floor(0), s.Cursor(0))
	}
	checkInvariants(t, s)
	if len(s.parts[0].pending) != 0 || s.parts[0].done.words != nil {
		t.Fatal("state not sparse after everything was acked")
	}
}

func TestExpiryBackoffThenDLQ(t *testing.T) {
	t.Parallel()
	s := New([]int64{0})
	const max = 3
	s.Deliver(0, 0, "a", 30*sec)
	now := int64(0)
	for attempt := 1; attempt <= max; attempt++ {
		now += 31 * sec
		dead := expire(s, now, max)
		if attempt == max {
			if len(dead) != 1 || dead[0].Attempt != max {
				t.Fatalf("attempt %d: dead = %v", attempt, dead)
			}
			deadLetter(s, dead[0])
			break
		}
		if len(dead) != 0 {
			t.Fatalf("attempt %d: dead too early", attempt)
		}
		due := (now - sec) + int64(storage.RedeliveryBackoff(attempt)) // deadline was now-1s
		got, next, ok := takeDue(s, due-1, "b", false, nil, 10, 0)
		if len(got) != 0 || !ok || next != due {
			t.Fatalf("attempt %d: before backoff got %d, next %d (want %d)", attempt, len(got), next, due)
		}
		now = due
		got, _, _ = takeDue(s, now, "b", false, nil, 10, now+30*sec)
		if len(got) != 1 || got[0].Attempt != attempt+1 || got[0].Member != "b" {
			t.Fatalf("attempt %d: redelivery %+v", attempt, got)
		}
	}
	if s.Floor(0) != 1 || s.DLQLen() != 1 {
		t.Fatalf("floor %d dlq %d", s.Floor(0), s.DLQLen())
	}
	checkInvariants(t, s)
}

func TestTakeDueOrderAvoidAndFilter(t *testing.T) {
	t.Parallel()
	s := New([]int64{0, 0})
	for o := int64(0); o < 3; o++ {
		s.Deliver(0, o, "a", 10*sec)
		s.Deliver(1, o, "b", 10*sec)
	}
	// Nack in an order different from offsets, with different delays.
	s.Nack(0, 2, "a", 0, 1*sec, false, 5)
	s.Nack(1, 0, "b", 0, 2*sec, false, 5)
	s.Nack(0, 0, "a", 0, 3*sec, false, 5)
	checkInvariants(t, s)
	got, _, _ := takeDue(s, 5*sec, "c", false, nil, 2, 20*sec)
	if len(got) != 2 || got[0].Offset != 2 || got[0].Partition != 0 || got[1].Partition != 1 {
		t.Fatalf("oldest due first: %+v %+v", got[0], got[1])
	}
	// The remaining one (0:0) was last delivered to "a": avoided for a (and left out of next),
	// given to c.
	got, next, ok := takeDue(s, 5*sec, "a", true, nil, 5, 20*sec)
	if len(got) != 0 || ok {
		t.Fatalf("avoid: got %d next %d %v", len(got), next, ok)
	}
	got, _, _ = takeDue(s, 5*sec, "a", false, []int32{1}, 5, 20*sec)
	if len(got) != 0 {
		t.Fatal("partition filter ignored")
	}
	got, _, _ = takeDue(s, 5*sec, "c", true, nil, 5, 20*sec)
	if len(got) != 1 || got[0].Offset != 0 || got[0].Attempt != 2 {
		t.Fatalf("got %+v", got)
	}
	checkInvariants(t, s)
}

func TestNackExtendRelease(t *testing.T) {
	t.Parallel()
	s := New([]int64{0})
	for o := int64(0); o < 4; o++ {
		s.Deliver(0, o, "a", 10*sec)
	}
	if out, _ := s.Nack(0, 0, "b", 0, 0, false, 5); out != NotHeld {
		t.Fatal("nack by another member")
	}
	if out, _ := s.Nack(0, 0, "a", 10*sec, 0, false, 5); out != NotHeld {
		t.Fatal("nack after the lease expired")
	}
	if out, _ := s.Nack(0, 9, "a", 0, 0, false, 5); out != NotHeld {
		t.Fatal("nack of an undelivered offset")
	}
	if !s.Extend(0, 1, "a", 9*sec, 50*sec) || s.Extend(0, 1, "b", 9*sec, 50*sec) {
		t.Fatal("extend")
	}
	if d, _ := s.NextDeadline(); d != 10*sec {
		t.Fatalf("next deadline %d", d)
	}
	if out, e := s.Nack(0, 2, "a", 0, 0, true, 5); out != DeadLetter || e.Offset != 2 {
		t.Fatal("nack to DLQ")
	} else {
		deadLetter(s, e)
	}
	rel, dead := s.Release("a", sec, 5)
	if rel != 3 || len(dead) != 0 {
		t.Fatalf("release %d %d", rel, len(dead))
	}
	if in, wt := s.Counts(); in != 0 || wt != 3 {
		t.Fatalf("counts %d %d", in, wt)
	}
	// Release on the max-th delivery dead-letters.
	got, _, _ := takeDue(s, sec, "b", false, nil, 10, 20*sec)
	if len(got) != 3 {
		t.Fatal(len(got))
	}
	_, dead = s.Release("b", 2*sec, 2)
	if len(dead) != 3 {
		t.Fatalf("dead %d", len(dead))
	}
	for _, e := range dead {
		deadLetter(s, e)
	}
	if s.Floor(0) != 4 || s.DLQLen() != 4 {
		t.Fatalf("floor %d dlq %d", s.Floor(0), s.DLQLen())
	}
	checkInvariants(t, s)
}

func TestDLQReplayPurgeExpire(t *testing.T) {
	t.Parallel()
	s := New([]int64{0})
	for o := int64(0); o < 5; o++ {
		s.Deliver(0, o, "a", 10*sec)
		_, e := s.Nack(0, o, "a", 0, 0, true, 5)
		deadLetter(s, e)
	}
	if s.Floor(0) != 5 {
		t.Fatal("dead-lettered messages do not count as done")
	}
	if page := s.DLQIDs(0, 2); !reflect.DeepEqual(page, []int64{1, 2}) {
		t.Fatalf("page %v", page)
	}
	if page := s.DLQIDs(2, 100); !reflect.DeepEqual(page, []int64{3, 4, 5}) {
		t.Fatalf("page 2 %v", page)
	}
	if n := replayDLQ(s, []int64{2, 4, 99}, 0); n != 2 {
		t.Fatalf("replayed %d", n)
	}
	got, _, _ := takeDue(s, sec, "b", false, nil, 10, 20*sec)
	if len(got) != 2 || got[0].Offset != 1 || got[0].Attempt != 1 || got[0].DLQ != 2 {
		t.Fatalf("replayed delivery %+v", got)
	}
	if s.Ack(0, 1, 5) != Acked || s.Ack(0, 1, 5) != AlreadyDone {
		t.Fatal("ack of replayed message")
	}
	out, e := s.Nack(0, 3, "b", sec, 0, true, 5)
	if out != DeadLetter {
		t.Fatal(out)
	}
	deadLetter(s, e)
	if s.DLQLen() != 4 || s.NextDLQID() != 7 {
		t.Fatalf("dlq %d next %d", s.DLQLen(), s.NextDLQID())
	}
	if ids := s.DLQExpireBelow(2); !reflect.DeepEqual(ids, []int64{1}) {
		t.Fatalf("expired %v", ids)
	}
	if s.DLQFirst() != 3 || s.MinReplayedDLQ() != 7 {
		t.Fatalf("first %d, lowest replayed %d", s.DLQFirst(), s.MinReplayedDLQ())
	}
	if n := s.DLQPurge([]int64{3}); n != 1 {
		t.Fatalf("purged %d", n)
	}
	if n := s.DLQPurge(nil); n != 2 {
		t.Fatalf("purged %d", n)
	}
	checkInvariants(t, s)
}

func TestForceFloorAndClamp(t *testing.T) {
	t.Parallel()
	s := New([]int64{0})
	for o := int64(0); o < 10; o++ {
		s.Deliver(0, o, "a", 10*sec)
	}
	s.Ack(0, 3, 10)
	s.Ack(0, 8, 10)
	if n := s.ForceFloor(0, 5); n != 4 {
		t.Fatalf("not done below 5: %d", n)
	}
	checkInvariants(t, s)
	if s.Floor(0) != 5 {
		t.Fatal(s.Floor(0))
	}
	s.Clamp(0, 7)
	checkInvariants(t, s)
	if s.Cursor(0) != 7 || s.Floor(0) != 5 {
		t.Fatalf("clamp: floor %d cursor %d", s.Floor(0), s.Cursor(0))
	}
	s.ForceFloor(0, 20)
	if s.Floor(0) != 20 || s.Cursor(0) != 20 {
		t.Fatal("force past cursor")
	}
	checkInvariants(t, s)
}

// TestRandomOpsKeepInvariants applies random operations and checks the invariants and a model of
// which offsets are done after each step.
func TestRandomOpsKeepInvariants(t *testing.T) {
	t.Parallel()
	for seed := uint64(0); seed < 20; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 99))
			const parts, maxDel = 3, 3
			s := New(make([]int64, parts))
			done := make([]map[int64]bool, parts)
			for i := range done {
				done[i] = map[int64]bool{}
			}
			hw := []int64{0, 0, 0}
			now := int64(0)
			members := []string{"a", "b", "c"}
			deadLetter := func(es []*Entry) {
				for _, e := range es {
					if e.DLQ == 0 {
						done[e.Partition][e.Offset] = true
					}
					deadLetter(s, e)
				}
			}
			for step := 0; step < 3000; step++ {
				p := int32(rng.IntN(parts))
				m := members[rng.IntN(len(members))]
				switch rng.IntN(12) {
				case 0, 1:
					hw[p] += int64(rng.IntN(5))
				case 2, 3: // claim
					deadLetter(expire(s, now, maxDel))
					got, _, _ := takeDue(s, now, m, rng.IntN(2) == 0, nil, 3, now+10*sec)
					for range 3 - len(got) {
						c := s.Cursor(p)
						if c >= hw[p] {
							break
						}
						switch rng.IntN(6) {
						case 0:
							s.Complete(p, c)
							done[p][c] = true
						case 1:
							s.Delay(p, c, now+5*sec)
						default:
							s.Deliver(p, c, m, now+10*sec)
						}
					}
				case 4, 5: // ack
					if hw[p] == 0 {
						continue
					}
					o := rng.Int64N(hw[p] + 2)
					want := Acked
					if o >= hw[p] {
						want = Unknown
					}
					if done[p][o] {
						want = AlreadyDone
					}
					if s.part(p).replayed[o] != nil {
						want = Acked
					}
					if got := s.Ack(p, o, hw[p]); got != want {
						t.Fatalf("step %d: ack %d:%d = %v, want %v", step, p, o, got, want)
					}
					if want == Acked {
						done[p][o] = true
					}
				case 6:
					if hw[p] == 0 {
						continue
					}
					o := rng.Int64N(hw[p])
					out, e := s.Nack(p, o, m, now, now+int64(rng.IntN(3))*sec, rng.IntN(4) == 0, maxDel)
					if out == DeadLetter {
						deadLetter([]*Entry{e})
					}
				case 7:
					s.Extend(p, rng.Int64N(hw[p]+1), m, now, now+20*sec)
				case 8:
					_, dead := s.Release(m, now, maxDel)
					deadLetter(dead)
				case 9:
					replayDLQ(s, nil, now)
				case 10, 11:
					now += int64(rng.IntN(20)) * sec
				}
				checkInvariants(t, s)
				for i := range parts {
					f := int64(0)
					for done[i][f] {
						f++
					}
					if got := s.Floor(int32(i)); got != f {
						t.Fatalf("step %d: partition %d floor %d, model %d", step, i, got, f)
					}
				}
				if step%97 == 0 {
					// Export/Import keeps everything persisted.
					a, b := s.Export()
					s2 := Import(a, b)
					checkInvariants(t, s2)
					a2, b2 := s2.Export()
					if !reflect.DeepEqual(a, a2) || !reflect.DeepEqual(b, b2) {
						t.Fatalf("step %d: export/import differ:\n%+v %v\n%+v %v", step, a, b, a2, b2)
					}
				}
			}
		})
	}
}

func TestRestoreMatchesLive(t *testing.T) {
	t.Parallel()
	// Live: deliver 0..4, ack 1, nack 2 with delay, delay 5 (NotBefore), complete 6.
	live := New([]int64{0})
	for o := int64(0); o < 5; o++ {
		live.Deliver(0, o, "a", 10*sec)
	}
	live.Delay(0, 5, 50*sec)
	live.Complete(0, 6)
	live.Ack(0, 1, 10)
	live.Nack(0, 2, "a", 0, 7*sec, false, 5)

	// Replay of the same records.
	re := New([]int64{0})
	for o := int64(0); o < 5; o++ {
		re.RestoreClaim(0, o, 1, false)
	}
	re.Delay(0, 5, 50*sec)
	re.Complete(0, 6)
	re.RestoreCursor(0, 7)
	re.Ack(0, 1, Forever)
	re.RestoreNack(0, 2, 7*sec, false, false)
	checkInvariants(t, re)

	a, _ := live.Export()
	b, _ := re.Export()
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("live %+v\nreplay %+v", a, b)
	}
	// 0, 2, 3 and 4 were delivered once; 5 (NotBefore) never.
	ex := re.Exhausted(1, func(int32) bool { return true })
	if len(ex) != 4 {
		t.Fatalf("exhausted %d, want 4", len(ex))
	}
	for _, e := range ex {
		re.DeadLetter(e)
	}
	checkInvariants(t, re)
	if re.Floor(0) != 5 || re.DLQLen() != 4 {
		t.Fatalf("floor %d dlq %d", re.Floor(0), re.DLQLen())
	}
}

// An offset MaxDoneSpan or more above the floor is refused instead of growing the done bitset
// without bound (a damaged state record replays acks with no high-water mark).
func TestAckBeyondDoneSpanRefused(t *testing.T) {
	t.Parallel()
	s := New([]int64{0})
	if got := s.Ack(0, MaxDoneSpan, Forever); got != Unknown {
		t.Fatalf("ack at floor+MaxDoneSpan = %v, want Unknown", got)
	}
	if got := s.Ack(0, 1<<62, Forever); got != Unknown {
		t.Fatalf("ack at 2^62 = %v, want Unknown", got)
	}
	if n := len(s.parts[0].done.words); n != 0 {
		t.Fatalf("done bitset grew to %d words", n)
	}
	if got := s.Ack(0, MaxDoneSpan-1, Forever); got != Acked {
		t.Fatalf("ack at floor+MaxDoneSpan-1 = %v, want Acked", got)
	}
	if s.Floor(0) != 0 {
		t.Fatalf("floor moved to %d", s.Floor(0))
	}
	checkInvariants(t, s)
}

// UncleanRestart counts one more attempt for every message in the delivery state and makes the
// offsets between the cursor and the claim horizon suspect: their first delivery is attempt 2, and
// one that waits for its NotBefore counts one possible delivery. Export and Import keep both.
func TestUncleanRestartAndSuspectOffsets(t *testing.T) {
	t.Parallel()
	s := New([]int64{0, 10})
	if s.Horizon(0) != 0 || s.Horizon(1) != 10 {
		t.Fatalf("initial horizons %d %d, want the start offsets", s.Horizon(0), s.Horizon(1))
	}
	s.SetHorizon(0, 100)
	s.SetHorizon(0, 50) // lower: ignored
	if s.Horizon(0) != 100 {
		t.Fatalf("horizon %d, want 100", s.Horizon(0))
	}
	s.Deliver(0, 0, "a", 10*sec)
	s.Deliver(0, 1, "a", 10*sec)
	s.Nack(0, 1, "a", 0, 5*sec, false, 9)
	replayDLQ(s, nil, 0) // nothing to replay
	s.addDLQ(0)
	s.DLQPurge([]int64{1})
	s.Replay(0, 0, 1, 0) // a replayed copy of offset 0, attempt 0

	s.UncleanRestart()
	checkInvariants(t, s)
	if s.Suspect(0) != 100 || s.Suspect(1) != 10 {
		t.Fatalf("suspect %d %d, want 100 10", s.Suspect(0), s.Suspect(1))
	}
	pt := s.parts[0]
	if pt.pending[0].Attempt != 2 || pt.pending[1].Attempt != 2 || pt.replayed[0].Attempt != 1 {
		t.Fatalf("attempts after the unclean restart: %d %d replayed %d, want 2 2 1",
			pt.pending[0].Attempt, pt.pending[1].Attempt, pt.replayed[0].Attempt)
	}
	if e := s.Deliver(0, 2, "a", 10*sec); e.Attempt != 2 {
		t.Fatalf("first delivery of suspect offset 2: attempt %d, want 2", e.Attempt)
	}
	if e := s.Delay(0, 3, 50*sec); e.Attempt != 1 {
		t.Fatalf("suspect offset 3 waiting for NotBefore: attempt %d, want 1", e.Attempt)
	}

	parts, dlq := s.Export()
	if parts[0].Horizon != 100 || parts[0].Suspect != 100 || parts[1].Suspect != 0 {
		t.Fatalf("exported %+v", parts)
	}
	back := Import(parts, dlq)
	checkInvariants(t, back)
	if p2, _ := back.Export(); !reflect.DeepEqual(parts, p2) {
		t.Fatalf("export/import:\n%+v\n%+v", parts, p2)
	}
	if e := back.Deliver(0, 4, "a", 10*sec); e.Attempt != 2 {
		t.Fatalf("suspect offset after import: attempt %d, want 2", e.Attempt)
	}
	// Beyond the suspect range, first deliveries are attempt 1 again.
	back.SetHorizon(0, 200)
	for o := int64(5); o < 100; o++ {
		back.Complete(0, o)
	}
	if e := back.Deliver(0, 100, "a", 10*sec); e == nil || e.Attempt != 1 {
		t.Fatalf("offset 100 (not suspect): %+v", e)
	}
	// Clamp cuts horizon and suspect back to the high-water mark.
	back.Clamp(0, 3)
	if back.Horizon(0) != 3 || back.Suspect(0) != 3 {
		t.Fatalf("after clamp: horizon %d suspect %d", back.Horizon(0), back.Suspect(0))
	}
}

// TestDLQIndex: the DLQ index costs a bit per ID between its lowest entry and the next ID, finds
// pages, selections and expiries by ID, and exports as runs (one for a contiguous DLQ).
func TestDLQIndex(t *testing.T) {
	t.Parallel()
	const n = 100_000
	s := New([]int64{0})
	for range n {
		s.addDLQ(0)
	}
	if _, d := s.Export(); len(d.Live) != 1 || d.Live[0] != [2]int64{1, n + 1} || d.Next != n+1 {
		t.Fatalf("export of a contiguous DLQ: %+v", d)
	}
	if words := len(s.dlqLive.words); words > n/64+2 {
		t.Fatalf("%d words for %d entries", words, n)
	}
	if got := s.DLQSelect([]int64{n - 1, n - 3, n - 3, n + 5}); !reflect.DeepEqual(got, []int64{n - 3, n - 1}) {
		t.Fatalf("select %v", got)
	}
	if got := s.DLQPurge([]int64{n - 1, n - 3, n + 5}); got != 2 {
		t.Fatalf("purged %d", got)
	}
	if got := s.DLQIDs(n-4, 3); !reflect.DeepEqual(got, []int64{n - 2, n}) {
		t.Fatalf("page %v", got)
	}
	if ids := s.DLQExpireBelow(4); !reflect.DeepEqual(ids, []int64{1, 2, 3}) {
		t.Fatalf("expired %v", ids)
	}
	if s.DLQLen() != n-5 || s.DLQFirst() != 4 {
		t.Fatalf("dlq %d, first %d", s.DLQLen(), s.DLQFirst())
	}
	_, d := s.Export()
	back := New([]int64{0})
	back.importDLQ(d)
	checkInvariants(t, back)
	if _, d2 := back.Export(); !reflect.DeepEqual(d, d2) || back.DLQLen() != s.DLQLen() {
		t.Fatalf("export/import: %+v\n%+v", d, d2)
	}
	// Entries lost from the log (outside [first, end)) are dropped.
	if got := back.DLQLost(10, n-2); got != 6+2 { // 4..9, n-2 and n
		t.Fatalf("lost %d", got)
	}
	if back.DLQPurge(nil) != n-5-8 || back.DLQLen() != 0 || back.DLQFirst() != n+1 {
		t.Fatalf("after purge of all: %d entries, first %d", back.DLQLen(), back.DLQFirst())
	}
	checkInvariants(t, s)
	checkInvariants(t, back)
}

// TestDoneRuns: the offsets completed out of order above the floor, as runs cut to [from, to);
// runs crossing bitset words stay whole.
func TestDoneRuns(t *testing.T) {
	s := New([]int64{10})
	for _, o := range []int64{12, 13, 14, 60, 61, 62, 63, 64, 65, 70, 200} {
		s.Complete(0, o)
	}
	if got, want := s.DoneRuns(0, 0, 1000), [][2]int64{{12, 15}, {60, 66}, {70, 71}, {200, 201}}; !slices.Equal(got, want) {
		t.Errorf("DoneRuns = %v, want %v", got, want)
	}
	if got, want := s.DoneRuns(0, 13, 64), [][2]int64{{13, 15}, {60, 64}}; !slices.Equal(got, want) {
		t.Errorf("DoneRuns in [13, 64) = %v, want %v", got, want)
	}
	s.Complete(0, 10)
	s.Complete(0, 11) // the floor passes 12-14
	if got, want := s.DoneRuns(0, 0, 100), [][2]int64{{60, 66}, {70, 71}}; !slices.Equal(got, want) {
		t.Errorf("DoneRuns after the floor rose to %d = %v, want %v", s.Floor(0), got, want)
	}
	if got := s.DoneRuns(1, 0, 100); got != nil {
		t.Errorf("DoneRuns of a missing partition = %v", got)
	}
}
