package storagetest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

func randomizedCases() []testCase {
	var cases []testCase
	for i := range 4 {
		cases = append(cases, testCase{name: fmt.Sprintf("sequence_%d", i), fn: func(t *testing.T, x *env) { testRandomized(t, x, i) }})
	}
	return cases
}

var (
	baseSeedOnce sync.Once
	baseSeed     uint64
)

// randomSeed returns the base seed: -spool.seed, else SPOOL_TEST_SEED, else the time. Sequence i uses
// base + i.
func randomSeed(t *testing.T) uint64 {
	baseSeedOnce.Do(func() {
		switch {
		case *seedFlag != 0:
			baseSeed = uint64(*seedFlag)
		case os.Getenv("SPOOL_TEST_SEED") != "":
			s, err := strconv.ParseUint(os.Getenv("SPOOL_TEST_SEED"), 10, 64)
			if err != nil {
				t.Fatalf("SPOOL_TEST_SEED=%q: %v", os.Getenv("SPOOL_TEST_SEED"), err)
			}
			baseSeed = s
		default:
			baseSeed = uint64(time.Now().UnixNano() % 1_000_000_000)
		}
	})
	return baseSeed
}

// randomOps is the length of each random sequence.
const randomOps = 600

// testRandomized applies a seeded random sequence of operations (publish, claim by a random member,
// ack, nack, extend, release, clock advance, stats, DLQ list and replay, retention, restart when
// the engine can) to the engine and to the model, comparing every result. At the end it drains
// every subscription and checks that every published message was completed exactly once (acked
// once, or dead-lettered) per subscription.
func testRandomized(t *testing.T, x *env, seq int) {
	base := randomSeed(t)
	seed := base + uint64(seq)
	t.Logf("random seed %d (reproduce with SPOOL_TEST_SEED=%d or -spool.seed=%d)", seed, base, base)
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	// The last operations, logged if the case fails.
	var trail []string
	note := func(format string, args ...any) {
		trail = append(trail, fmt.Sprintf("%s ", fmtTime(x.now()))+fmt.Sprintf(format, args...))
		if len(trail) > 60 {
			trail = trail[1:]
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last operations of seed %d:\n%s", seed, strings.Join(trail, "\n"))
		}
	})

	md := &model{t: t, topics: map[string]*mTopic{}}
	addTopic := func(name string, cfg storage.TopicConfig) *mTopic {
		tp := x.createTopic(name, cfg)
		mt := &mTopic{name: name, partitions: tp.Config.Partitions, ackWait: tp.Config.AckWait,
			maxDeliveries: tp.Config.MaxDeliveries, poison: tp.Config.PoisonRules, high: make([]int64, tp.Config.Partitions)}
		md.topics[name] = mt
		return mt
	}
	addSub := func(tp *mTopic, s *storage.Subscription) {
		md.subs = append(md.subs, &mSub{id: s.ID, name: fmt.Sprintf("%s/%s", tp.name, s.Group), topic: tp,
			cursor: make([]int64, tp.partitions), msgs: map[storage.DeliveryRef]*mMsg{}})
	}
	q := addTopic("rnd.q", storage.TopicConfig{Partitions: 2, AckWait: 5 * time.Second, MaxDeliveries: 4, MessageRetention: time.Minute})
	addSub(q, x.queueSub("rnd.q"))
	// rnd.ps has both poison rules on; nack reasons come from a small set so that they repeat.
	ps := addTopic("rnd.ps", storage.TopicConfig{Semantics: storage.PubSub, AckWait: 3 * time.Second, MaxDeliveries: 5, MessageRetention: time.Minute,
		PoisonRules: storage.PoisonRules{DistinctMembers: true, MaxFailures: 2, Window: time.Minute}})
	addSub(ps, x.subscribe("rnd.ps", "ga", fromBeginning))
	addSub(ps, x.subscribe("rnd.ps", "gb", fromBeginning))
	topics := []*mTopic{q, ps}
	members := []string{"m0", "m1", "m2"}

	pickSub := func() *mSub { return md.subs[rng.IntN(len(md.subs))] }
	pickMember := func() string { return members[rng.IntN(len(members))] }
	// pickRefs picks up to n distinct delivered refs of s that match keep.
	pickRefs := func(s *mSub, n int, keep func(*mMsg) bool) []storage.DeliveryRef {
		var all []storage.DeliveryRef
		for r, m := range s.msgs {
			if keep(m) {
				all = append(all, r)
			}
		}
		all = sortRefs(all) // map order is random: sort, then shuffle with the seeded generator
		rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		return all[:min(n, len(all))]
	}

	ops := []struct {
		name   string
		weight int
		do     func()
	}{
		{"publish", 18, func() {
			tp := topics[rng.IntN(len(topics))]
			var msgs []storage.AppendMessage
			for range 1 + rng.IntN(4) {
				if rng.IntN(2) == 0 {
					msgs = append(msgs, keyed(fmt.Sprintf("k%d", rng.IntN(5)), x.payload()))
				} else {
					msgs = append(msgs, msg(x.payload()))
				}
			}
			pos := x.publish(tp.name, msgs...)
			note("publish %s %v", tp.name, pos)
			md.published(tp, msgs, pos, x.now())
		}},
		{"claim", 30, func() {
			s := pickSub()
			p := storage.DeliveriesClaimParams{SubscriptionID: s.id, Member: pickMember(), Max: 1 + rng.IntN(5), AvoidMember: rng.IntN(3) == 0}
			res := x.claimP(p)
			note("claim %s member %s max %d avoid %v -> %s next due %s", s.name, p.Member, p.Max, p.AvoidMember, describeDeliveries(res.Deliveries), fmtTime(res.NextDue))
			md.claimed(s, p, res, x.now())
		}},
		{"ack", 18, func() {
			s := pickSub()
			now := x.now()
			refs := pickRefs(s, 1+rng.IntN(4), func(m *mMsg) bool { return !s.limbo(m, now) })
			if rng.IntN(5) == 0 {
				refs = append(refs, ref(0, s.topic.high[0]+int64(rng.IntN(3))))
			}
			if len(refs) == 0 {
				return
			}
			res := x.ack(s.id, pickMember(), refs...)
			note("ack %s %v -> %+v", s.name, refs, *res)
			md.acked(s, refs, res)
		}},
		{"nack", 8, func() {
			s := pickSub()
			member := pickMember()
			now := x.now()
			refs := pickRefs(s, 1+rng.IntN(3), func(m *mMsg) bool { return heldBy(m, member, now) })
			if rng.IntN(4) == 0 {
				refs = append(refs, pickRefs(s, 1, func(m *mMsg) bool {
					return !m.uncertain && !heldBy(m, member, now) && !s.limbo(m, now) && (m.state != stLeased || now.Before(m.deadline))
				})...)
			}
			if len(refs) == 0 {
				return
			}
			p := storage.DeliveriesNackParams{SubscriptionID: s.id, Member: member, Refs: refs, Reason: fmt.Sprintf("r%d", rng.IntN(3))}
			switch r := rng.IntN(10); {
			case r == 0:
				p.ToDLQ = true
			case r < 3:
				p.Delay = time.Duration(1+rng.IntN(20)) * time.Second
			}
			res := x.nack(p)
			note("nack %s member %s %v delay %s dlq %v -> %+v", s.name, member, refs, p.Delay, p.ToDLQ, *res)
			md.nacked(s, p, res, now)
		}},
		{"extend", 4, func() {
			s := pickSub()
			member := pickMember()
			now := x.now()
			refs := pickRefs(s, 1+rng.IntN(2), func(m *mMsg) bool { return heldBy(m, member, now) })
			if len(refs) == 0 {
				return
			}
			p := storage.DeliveriesExtendParams{SubscriptionID: s.id, Member: member, Refs: refs}
			if rng.IntN(2) == 0 {
				p.Duration = time.Duration(1+rng.IntN(10)) * time.Second
			}
			res := x.extend(p)
			note("extend %s member %s %v by %s -> %+v", s.name, member, refs, p.Duration, *res)
			md.extended(s, p, res, now)
		}},
		{"release", 3, func() {
			s := pickSub()
			member := pickMember()
			res := x.release(s.id, member)
			note("release %s member %s -> %+v", s.name, member, *res)
			md.released(s, member, res, x.now())
		}},
		{"advance", 12, func() {
			steps := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second, 2 * time.Minute}
			d := steps[rng.IntN(len(steps))]
			x.advance(d)
			note("advance %s", d)
		}},
		{"stats", 4, func() {
			s := pickSub()
			md.checkStats(s, x.stats(s.id), x.now())
		}},
		{"dlq", 2, func() {
			s := pickSub()
			md.checkDLQ(s, x.dlq(s.id), x.now(), false)
		}},
		{"replay", 1, func() {
			s := pickSub()
			now := x.now()
			for _, m := range s.msgs {
				if s.limbo(m, now) {
					return // the replay count would depend on whether the engine processed it yet
				}
			}
			n, err := x.e.DLQReplay(x.ctx, &storage.DLQReplayParams{SubscriptionID: s.id})
			noErr(t, err, "DLQReplay")
			note("replay %s -> %d", s.name, n)
			md.replayed(s, n, now)
		}},
		{"retention", 1, func() {
			res, err := x.e.RetentionApply(x.ctx)
			noErr(t, err, "RetentionApply")
			equal(t, res.MessagesExpired, int64(0), "nothing reaches max_retention in the random run")
		}},
		{"restart", 1, func() {
			if !x.caps.Restart {
				return
			}
			x.restart()
			note("restart")
			md.restarted()
		}},
	}
	total := 0
	for _, op := range ops {
		total += op.weight
	}
	counts := map[string]int{}
	for range randomOps {
		r := rng.IntN(total)
		for _, op := range ops {
			if r < op.weight {
				counts[op.name]++
				op.do()
				if t.Failed() {
					t.FailNow() // stop where the recorder found a violation: the trail ends there
				}
				break
			}
			r -= op.weight
		}
	}
	t.Logf("operations: %v", counts)

	// Drain: let every lease, backoff and delay pass, claim and ack everything, until nothing is open.
	for round := 0; ; round++ {
		if round == 50 {
			t.Fatalf("model: subscriptions not drained after %d rounds", round)
		}
		x.advance(10 * time.Minute)
		open := false
		for _, s := range md.subs {
			p := storage.DeliveriesClaimParams{SubscriptionID: s.id, Member: "drainer", Max: 100}
			res := x.claimP(p)
			now := x.now()
			md.claimed(s, p, res, now)
			if len(res.Deliveries) > 0 {
				md.acked(s, RefsOf(res.Deliveries), x.ack(s.id, "drainer", RefsOf(res.Deliveries)...))
			}
			md.checkDLQ(s, x.dlq(s.id), now, true)
			for _, m := range s.msgs {
				if m.state == stLeased || m.state == stWaiting {
					open = true
				}
			}
			for part, c := range s.cursor {
				if c < s.topic.high[part] {
					open = true
				}
			}
		}
		if !open {
			break
		}
	}
	for _, s := range md.subs {
		var done, dead int
		for _, m := range s.msgs {
			switch m.state {
			case stDone:
				done++
			case stDead:
				dead++
			}
		}
		var published int64
		for _, h := range s.topic.high {
			published += h
		}
		equal(t, int64(done+dead), published, "%s: messages completed (acked or dead-lettered) of those published", s.name)
		equal(t, s.ackedByEngine, done, "%s: the engine's Acked counts sum to the messages acked: each acked exactly once", s.name)
		x.requireStats(s.id, wantStats{dead: int64(dead)}, s.name+" after draining")
		for p, h := range s.topic.high {
			x.requireFloor(s.id, int32(p), h, h, s.name+" after draining")
		}
	}
}

func describeDeliveries(ds []*storage.Delivery) string {
	var parts []string
	for _, d := range ds {
		parts = append(parts, fmt.Sprintf("%d:%d#%d until %s", d.Partition, d.Offset, d.Attempt, fmtTime(d.LeaseDeadline)))
	}
	return "[" + strings.Join(parts, " ") + "]"
}
