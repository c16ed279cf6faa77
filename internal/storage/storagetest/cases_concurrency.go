package storagetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

func concurrencyCases() []testCase {
	return []testCase{
		{name: "queue_publishers_and_members", fn: testConcurrentQueue},
		{name: "pubsub_groups", fn: testConcurrentPubSub},
		{name: "expiring_leases", fn: testConcurrentExpiry},
		{name: "create_races", fn: testConcurrentCreate},
		{name: "retention_apply_concurrently", fn: testConcurrentRetention},
	}
}

// safetyNet bounds how long a concurrent case may run before it gives up and fails (a hang would
// otherwise only end with the test binary's timeout). It is not a speed assertion.
const safetyNet = 90 * time.Second

// concurrentRun publishes from several goroutines and claims/acks from several members on each
// subscription, and returns how often each message was delivered (and acked) per subscription.
type concurrentRun struct {
	x          *env
	topic      string
	partitions int
	publishers int
	perPub     int
	subs       []int64
	members    int

	mu        sync.Mutex
	delivered map[int64]map[storage.DeliveryRef]int
}

func (c *concurrentRun) run(t *testing.T) {
	x := c.x
	total := int64(c.publishers * c.perPub)
	c.delivered = map[int64]map[storage.DeliveryRef]int{}
	for _, sub := range c.subs {
		c.delivered[sub] = map[storage.DeliveryRef]int{} // all before any member starts
	}
	wake := make(chan struct{}, 1)
	unregister := x.e.NotifyRegister(func(storage.Notification) {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	defer unregister()
	giveUp := time.Now().Add(safetyNet)

	var wg sync.WaitGroup
	for i := range c.publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			key := fmt.Sprintf("publisher-%d", i)
			for seq := 0; seq < c.perPub; {
				n := min(1+rng.IntN(5), c.perPub-seq)
				msgs := make([]storage.AppendMessage, n)
				for j := range msgs {
					msgs[j] = keyed(key, fmt.Sprintf("%d:%d", i, seq+j))
				}
				if _, err := x.e.MessagesAppend(x.ctx, &storage.MessagesAppendParams{Topic: c.topic, Messages: msgs}); err != nil {
					t.Errorf("publisher %d: %v", i, err)
					return
				}
				seq += n
			}
		}()
	}
	for _, sub := range c.subs {
		var acked atomic.Int64
		done := make(chan struct{})
		var closeOnce sync.Once
		for m := range c.members {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(sub), uint64(m)))
				member := fmt.Sprintf("member-%d", m)
				for acked.Load() < total {
					if time.Now().After(giveUp) {
						t.Errorf("subscription %d %s: gave up after %s with %d of %d acked", sub, member, safetyNet, acked.Load(), total)
						return
					}
					res, err := x.e.DeliveriesClaim(x.ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub, Member: member, Max: 1 + rng.IntN(8)})
					if err != nil {
						t.Errorf("subscription %d %s: claim: %v", sub, member, err)
						return
					}
					if len(res.Deliveries) == 0 {
						select {
						case <-wake:
						case <-done:
						case <-time.After(5 * time.Millisecond): // poll fallback: notifications may be coalesced
						}
						continue
					}
					c.mu.Lock()
					for _, d := range res.Deliveries {
						c.delivered[sub][d.Ref()]++
					}
					c.mu.Unlock()
					ar, err := x.e.DeliveriesAck(x.ctx, &storage.DeliveriesAckParams{SubscriptionID: sub, Member: member, Refs: RefsOf(res.Deliveries)})
					if err != nil {
						t.Errorf("subscription %d %s: ack: %v", sub, member, err)
						return
					}
					if ar.Acked != len(res.Deliveries) {
						t.Errorf("subscription %d %s: acked %d of %d fresh deliveries (already done %d)", sub, member, ar.Acked, len(res.Deliveries), ar.AlreadyDone)
						return
					}
					if acked.Add(int64(ar.Acked)) >= total {
						closeOnce.Do(func() { close(done) })
					}
				}
			}()
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}

// check verifies every message was delivered exactly once per subscription and each publisher's
// messages are stored in its publish order.
func (c *concurrentRun) check(t *testing.T) {
	x := c.x
	hw := x.highWaters(c.topic)
	var stored int64
	for p := range int32(c.partitions) {
		last := map[string]int{}
		for _, m := range x.read(c.topic, p, 0) {
			pub, seq, _ := strings.Cut(string(m.Payload), ":")
			n, err := strconv.Atoi(seq)
			noErr(t, err, "payload %q", m.Payload)
			if prev, ok := last[pub]; ok {
				isTrue(t, n > prev, "partition %d: publisher %s's message %d stored after its message %d", p, pub, n, prev)
			}
			last[pub] = n
			stored++
		}
		for _, sub := range c.subs {
			for o := int64(0); o < hw[p]; o++ {
				equal(t, c.delivered[sub][ref(p, o)], 1, "subscription %d: deliveries of %d:%d", sub, p, o)
			}
		}
	}
	equal(t, stored, int64(c.publishers*c.perPub), "messages stored")
	for _, sub := range c.subs {
		equal(t, len(c.delivered[sub]), c.publishers*c.perPub, "subscription %d: distinct messages delivered", sub)
		x.requireStats(sub, wantStats{}, "after the concurrent run")
	}
}

func testConcurrentQueue(t *testing.T, x *env) {
	x.createTopic("cq", storage.TopicConfig{Partitions: 3, AckWait: time.Hour})
	c := &concurrentRun{x: x, topic: "cq", partitions: 3, publishers: 4, perPub: 150, members: 4, subs: []int64{x.queueSub("cq").ID}}
	c.run(t)
	c.check(t)
}

func testConcurrentPubSub(t *testing.T, x *env) {
	x.createTopic("cps", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2, AckWait: time.Hour})
	a := x.subscribe("cps", "a", fromBeginning)
	b := x.subscribe("cps", "b", fromBeginning)
	c := &concurrentRun{x: x, topic: "cps", partitions: 2, publishers: 2, perPub: 100, members: 2, subs: []int64{a.ID, b.ID}}
	c.run(t)
	c.check(t)
}

// testConcurrentExpiry: members lose some deliveries (no ack), nack or extend others, while the
// clock moves: leases expire and messages are redelivered under contention. The recorder checks
// that no message is leased twice at once; at the end every message was completed exactly once.
func testConcurrentExpiry(t *testing.T, x *env) {
	const total = 200
	x.createTopic("cexp", storage.TopicConfig{Partitions: 2, AckWait: 2 * time.Second, MaxDeliveries: 1000})
	q := x.queueSub("cexp")
	var completed atomic.Int64
	giveUp := time.Now().Add(safetyNet)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < total; i += 4 {
			msgs := []storage.AppendMessage{msg("a"), msg("b"), msg("c"), msg("d")}
			if _, err := x.e.MessagesAppend(x.ctx, &storage.MessagesAppendParams{Topic: "cexp", Messages: msgs}); err != nil {
				t.Errorf("publish: %v", err)
				return
			}
		}
	}()
	for m := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(m), 99))
			member := fmt.Sprintf("member-%d", m)
			for completed.Load() < total {
				if time.Now().After(giveUp) {
					t.Errorf("%s: gave up after %s with %d of %d completed", member, safetyNet, completed.Load(), total)
					return
				}
				res, err := x.e.DeliveriesClaim(x.ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: member, Max: 1 + rng.IntN(4)})
				if err != nil {
					t.Errorf("%s: claim: %v", member, err)
					return
				}
				if len(res.Deliveries) == 0 || rng.IntN(3) == 0 {
					x.clock.Advance(time.Duration(300+rng.IntN(1000)) * time.Millisecond)
				}
				var acks, nacks, extends []storage.DeliveryRef
				for _, d := range res.Deliveries {
					switch r := rng.IntN(10); {
					case r < 2: // lost: the lease will expire
					case r < 3:
						nacks = append(nacks, d.Ref())
					case r < 4:
						extends = append(extends, d.Ref())
						acks = append(acks, d.Ref())
					default:
						acks = append(acks, d.Ref())
					}
				}
				if len(extends) > 0 {
					if _, err := x.e.DeliveriesExtend(x.ctx, &storage.DeliveriesExtendParams{SubscriptionID: q.ID, Member: member, Refs: extends}); err != nil {
						t.Errorf("%s: extend: %v", member, err)
						return
					}
				}
				if len(nacks) > 0 {
					if _, err := x.e.DeliveriesNack(x.ctx, &storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: member, Refs: nacks}); err != nil {
						t.Errorf("%s: nack: %v", member, err)
						return
					}
				}
				if len(acks) > 0 {
					ar, err := x.e.DeliveriesAck(x.ctx, &storage.DeliveriesAckParams{SubscriptionID: q.ID, Member: member, Refs: acks})
					if err != nil {
						t.Errorf("%s: ack: %v", member, err)
						return
					}
					completed.Add(int64(ar.Acked))
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	equal(t, completed.Load(), int64(total), "messages completed: each exactly once over all acks")
	hw := x.highWaters("cexp")
	x.requireStats(q.ID, wantStats{}, "after the run")
	x.requireFloor(q.ID, 0, hw[0], hw[0], "partition 0")
	x.requireFloor(q.ID, 1, hw[1], hw[1], "partition 1")
	x.advance(time.Hour)
	equal(t, len(x.claimAll(q.ID, "late")), 0, "nothing left")
}

// testConcurrentCreate: creates racing for one name have exactly one winner.
func testConcurrentCreate(t *testing.T, x *env) {
	const n = 8
	race := func(what string, target error, fn func() error) {
		t.Helper()
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = fn()
			}()
		}
		wg.Wait()
		wins := 0
		for _, err := range errs {
			switch {
			case err == nil:
				wins++
			case !errors.Is(err, target):
				t.Fatalf("%s: %v, want nil or %v", what, err, target)
			}
		}
		equal(t, wins, 1, "%s: winners", what)
	}
	race("TopicCreate", storage.ErrTopicExists, func() error {
		_, err := x.e.TopicCreate(x.ctx, &storage.TopicCreateParams{Name: "race.topic", Config: pubSub(1)})
		return err
	})
	race("SubscriptionCreate", storage.ErrSubscriptionExists, func() error {
		_, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "race.topic", Group: "g"})
		return err
	})
	race("BindingCreate", storage.ErrBindingExists, func() error {
		_, err := x.e.BindingCreate(x.ctx, &storage.BindingCreateParams{Group: "g", Pattern: "race.#"})
		return err
	})
	equal(t, len(x.listSubs("race.topic")), 1, "subscriptions")
	race("TopicCreate with binding", storage.ErrTopicExists, func() error {
		_, err := x.e.TopicCreate(x.ctx, &storage.TopicCreateParams{Name: "race.bound", Config: pubSub(1)})
		return err
	})
	equal(t, len(x.listSubs("race.bound")), 1, "one binding subscription for the racing creates")
}

// testConcurrentRetention: RetentionApply is safe to run concurrently: racing calls remove and count
// every message and DLQ entry exactly once between them.
func testConcurrentRetention(t *testing.T, x *env) {
	x.createTopic("cret", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2, MessageRetention: time.Hour, MaxRetention: 2 * time.Hour})
	s := x.subscribe("cret", "s", fromBeginning)
	for range 5 {
		x.publishN("cret", 0, 20)
		x.publishN("cret", 1, 20)
	}
	ds := x.claim(s.ID, "m", 2)
	equal(t, len(ds), 2, "claimed")
	x.nack(storage.DeliveriesNackParams{SubscriptionID: s.ID, Member: "m", Refs: RefsOf(ds), ToDLQ: true})
	x.advance(2*time.Hour + time.Second)
	results := make([]*storage.RetentionResult, 4)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := x.e.RetentionApply(x.ctx)
			if err != nil {
				t.Errorf("RetentionApply %d: %v", i, err)
				return
			}
			results[i] = res
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	var sum storage.RetentionResult
	for _, r := range results {
		sum.MessagesDeleted += r.MessagesDeleted
		sum.MessagesExpired += r.MessagesExpired
		sum.DLQEntriesExpired += r.DLQEntriesExpired
	}
	equal(t, sum.MessagesExpired, int64(198), "expired over the racing calls (200 published, 2 dead-lettered and so done)")
	equal(t, sum.MessagesDeleted, int64(2), "deleted over the racing calls (the 2 dead-lettered ones)")
	equal(t, sum.DLQEntriesExpired, int64(2), "DLQ entries expired over the racing calls")
	deepEqual(t, x.lowOffsets("cret"), []int64{100, 100}, "low offsets")
}
