package wal

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/substate"
)

// claimAll claims until a claim returns nothing.
func (h *harness) claimAll(sub int64, member string) []*storage.Delivery {
	h.t.Helper()
	var all []*storage.Delivery
	for {
		ds := h.claim(sub, member, 64)
		if len(ds) == 0 {
			return all
		}
		all = append(all, ds...)
	}
}

// TestRestartRedeliversEveryUnackedMessage: after a clean restart or a crash, every message that
// was not acked is delivered again, and no acked message is. After a clean restart the attempt is
// the count it had plus one (1 if it was never delivered); after a crash one more, since a claim
// record may have been lost (here none was: the count skips one), and a message never delivered
// but below the claim horizon counts as possibly delivered once.
func TestRestartRedeliversEveryUnackedMessage(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"close", "crash"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.createTopic("orders", storage.TopicConfig{Partitions: 3, MaxDeliveries: 10})
			q := h.queueSub("orders")
			pos := h.publishN("orders", 60)
			key := func(p int32, o int64) string { return fmt.Sprintf("%d:%d", p, o) }
			attempts := map[string]int{}
			acked := map[string]bool{}
			first := h.claim(q.ID, "a", 30)
			equal(t, len(first), 30, "first claim")
			var toAck []storage.DeliveryRef
			for i, d := range first {
				equal(t, d.Attempt, 1, "first attempt")
				attempts[key(d.Partition, d.Offset)] = d.Attempt
				if i%3 == 0 {
					toAck = append(toAck, d.Ref())
					acked[key(d.Partition, d.Offset)] = true
				}
			}
			equal(t, h.ack(q.ID, toAck...).Acked, len(toAck), "acked")
			// Nack five messages and take them again (attempt 2) from another member.
			var nacks []storage.DeliveryRef
			for i, d := range first {
				if i%3 != 0 && len(nacks) < 5 {
					nacks = append(nacks, d.Ref())
				}
			}
			nr, err := h.e.DeliveriesNack(h.ctx, &storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "a", Refs: nacks})
			h.must(err, "nack")
			equal(t, nr.Nacked, 5, "nacked")
			again := h.claimP(storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "b", Max: 5, AvoidMember: true}).Deliveries
			equal(t, len(again), 5, "redelivered after nack")
			for _, d := range again {
				equal(t, d.Attempt, 2, "attempt after nack")
				attempts[key(d.Partition, d.Offset)] = 2
			}

			bump := 0
			if mode == "close" {
				h.restart()
			} else {
				h.crash()
				bump = 1
			}

			got := h.claimAll(q.ID, "c")
			seen := map[string]bool{}
			for _, d := range got {
				k := key(d.Partition, d.Offset)
				if acked[k] {
					t.Fatalf("acked message %s delivered again after the restart", k)
				}
				if seen[k] {
					t.Fatalf("message %s delivered twice after the restart", k)
				}
				seen[k] = true
				equal(t, d.Attempt, attempts[k]+1+bump, "attempt of "+k)
				equal(t, string(d.Payload), fmt.Sprintf("m%d", slices.IndexFunc(pos, func(p storage.MessagePosition) bool {
					return p.Partition == d.Partition && p.Offset == d.Offset
				})), "payload of "+k)
			}
			equal(t, len(got), 60-len(acked), "messages delivered after the restart")
			h.ack(q.ID, refs(got)...)
			h.restart()
			equal(t, len(h.claimAll(q.ID, "c")), 0, "nothing after everything was acked")
			st := h.stats(q.ID)
			equal(t, st.Pending, 0, "pending")
			for _, ps := range st.Partitions {
				equal(t, ps.AckFloor, ps.HighWater, "floor at high water")
			}
		})
	}
}

// TestRestartDeadLettersLostLastDelivery: a message leased on its max_deliveries-th delivery when
// the engine stops goes to the DLQ, as its lease expiry would have sent it. After a crash that
// includes a message one delivery short of it: its last delivery may have been lost with the claim
// record. DLQRecovered counts those of the last Open, once.
func TestRestartDeadLettersLostLastDelivery(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"close", "crash"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.createTopic("jobs", storage.TopicConfig{MaxDeliveries: 2})
			q := h.queueSub("jobs")
			h.publishN("jobs", 2)
			ds := h.claim(q.ID, "a", 1)
			equal(t, ds[0].Attempt, 1, "first")
			if mode == "close" {
				h.restart()
				recovered, err := h.e.DLQRecovered(h.ctx)
				h.must(err, "DLQRecovered")
				equal(t, len(recovered), 0, "subscriptions with dead-letters at an Open that made none")
				ds = h.claim(q.ID, "a", 1)
				equal(t, ds[0].Offset, int64(0), "redelivered first")
				equal(t, ds[0].Attempt, 2, "second attempt after restart")
				h.restart()
			} else {
				h.crash()
			}
			recovered, err := h.e.DLQRecovered(h.ctx)
			h.must(err, "DLQRecovered")
			equal(t, len(recovered), 1, "subscriptions with dead-letters at Open")
			equal(t, recovered[0], storage.DeadLetterCount{SubscriptionID: q.ID, Topic: "jobs", Group: q.Group, Messages: 1}, "dead-letters at Open")
			recovered, err = h.e.DLQRecovered(h.ctx)
			h.must(err, "DLQRecovered again")
			equal(t, len(recovered), 0, "subscriptions with dead-letters at Open, asked again")
			dlq, err := h.e.DLQList(h.ctx, &storage.DLQListParams{SubscriptionID: q.ID})
			h.must(err, "dlq list")
			equal(t, len(dlq), 1, "dlq entries")
			equal(t, dlq[0].Reason, storage.DLQMaxDeliveries, "reason")
			equal(t, dlq[0].Attempts, 2, "attempts")
			equal(t, string(dlq[0].Message.Payload), "m0", "payload copy")
			ds = h.claimAll(q.ID, "a")
			equal(t, len(ds), 1, "only the other message")
			equal(t, ds[0].Offset, int64(1), "offset")
			want := 1
			if mode == "crash" {
				want = 2 // below the claim horizon: possibly delivered before the crash
			}
			equal(t, ds[0].Attempt, want, "attempt of the other message")
		})
	}
}

// subProjection is what a subscription's persistent state must look like after a restart.
type subProjection struct {
	Meta    storage.Subscription
	Parts   []substate.PartState
	DLQ     []storage.DLQEntry
	NextDLQ int64
}

type projection struct {
	Topics   map[string]storage.Topic
	Bindings []storage.Binding
	Subs     map[int64]subProjection
	NextSub  int64
	HW       map[string][]int64
}

// project captures the persistent state: metadata, and delivery state with what a restart does
// not keep (the due time of a message waiting after a lease expiry, which restarts as due at once)
// normalized away.
func project(e *Engine) projection { return projectWith(e, false) }

// projectCrashed is what project returns after a crash of e that lost no record: the live state
// with the rule of an unclean restart applied (substate.Sub.UncleanRestart: every message in the
// delivery state counts one more attempt, and the offsets up to the claim horizon become suspect).
func projectCrashed(e *Engine) projection { return projectWith(e, true) }

func projectWith(e *Engine, crashed bool) projection {
	e.mu.Lock()
	defer e.mu.Unlock()
	p := projection{Topics: map[string]storage.Topic{}, Subs: map[int64]subProjection{}, NextSub: e.nextSubID, HW: map[string][]int64{}}
	for name, t := range e.topics {
		p.Topics[name] = t.meta
		for _, pt := range t.parts {
			p.HW[name] = append(p.HW[name], pt.log.NextIndex())
		}
	}
	for _, b := range e.sortedBindingsLocked() {
		p.Bindings = append(p.Bindings, *b)
	}
	for id, s := range e.subs {
		if s.meta.Ephemeral {
			continue
		}
		sp := subProjection{Meta: s.meta}
		if s.st != nil {
			var dlq substate.DLQState
			sp.Parts, dlq = s.st.Export()
			sp.NextDLQ = dlq.Next
			if s.dlq != nil {
				<-s.dlq.settled()
				entries, err := s.dlq.read(id, s.st.DLQIDs(0, s.st.DLQLen()), math.MaxInt)
				if err != nil {
					panic(err)
				}
				for _, d := range entries {
					sp.DLQ = append(sp.DLQ, *d)
				}
			}
			for i := range sp.Parts {
				if ps := &sp.Parts[i]; crashed {
					if ps.Suspect = max(ps.Suspect, ps.Horizon); ps.Suspect <= ps.Cursor {
						ps.Suspect = 0
					}
					for j := range ps.Pending {
						ps.Pending[j].Attempt++
					}
					for j := range ps.Replayed {
						ps.Replayed[j].Attempt++
					}
				}
				for j := range sp.Parts[i].Pending {
					if sp.Parts[i].Pending[j].Attempt > 0 {
						sp.Parts[i].Pending[j].Due = 0
					}
				}
				for j := range sp.Parts[i].Replayed {
					if sp.Parts[i].Replayed[j].Attempt > 0 {
						sp.Parts[i].Replayed[j].Due = 0
					}
				}
			}
		}
		p.Subs[id] = sp
	}
	return p
}

func diffProjection(t *testing.T, want, got projection) {
	t.Helper()
	if reflect.DeepEqual(want, got) {
		return
	}
	if !reflect.DeepEqual(want.Topics, got.Topics) {
		t.Errorf("topics differ:\nwant %+v\ngot  %+v", want.Topics, got.Topics)
	}
	if !reflect.DeepEqual(want.Bindings, got.Bindings) {
		t.Errorf("bindings differ:\nwant %+v\ngot  %+v", want.Bindings, got.Bindings)
	}
	if want.NextSub != got.NextSub {
		t.Errorf("next subscription id: want %d got %d", want.NextSub, got.NextSub)
	}
	if !reflect.DeepEqual(want.HW, got.HW) {
		t.Errorf("high water marks differ:\nwant %v\ngot  %v", want.HW, got.HW)
	}
	for _, id := range slices.Sorted(maps.Keys(want.Subs)) {
		if !reflect.DeepEqual(want.Subs[id], got.Subs[id]) {
			t.Errorf("subscription %d differs:\nwant %+v\ngot  %+v", id, want.Subs[id], got.Subs[id])
		}
	}
	for id := range got.Subs {
		if _, ok := want.Subs[id]; !ok {
			t.Errorf("subscription %d appeared", id)
		}
	}
	t.FailNow()
}

// TestReplayRebuildsState applies a random workload (with snapshots taken in the background
// because the snapshot threshold is tiny), then checks that a crash (state log replay after the
// latest snapshot) and a clean restart (final snapshot only) both rebuild exactly the persistent
// state.
func TestReplayRebuildsState(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(c *Config) { c.StateLogSnapshotBytes = 2 << 10 })
			rng := rand.New(rand.NewPCG(seed, 7))
			w := newWorkload(h, rng)
			for round := 0; round < 4; round++ {
				for range 150 {
					w.step()
				}
				want := project(h.e)
				if round%2 == 0 {
					want = projectCrashed(h.e)
					h.crash()
				} else {
					h.restart()
				}
				diffProjection(t, want, project(h.e))
				w.afterRestart()
			}
			files, _ := filepath.Glob(filepath.Join(h.dir, "snapshot-*.bin"))
			if len(files) != 1 {
				t.Fatalf("want exactly one snapshot file, got %v", files)
			}
		})
	}
}

// workload applies random operations through the public API.
type workload struct {
	h       *harness
	rng     *rand.Rand
	topics  []string
	subs    []int64
	members []string
	leased  map[int64][]*storage.Delivery
	groupN  int
}

func newWorkload(h *harness, rng *rand.Rand) *workload {
	w := &workload{h: h, rng: rng, members: []string{"m1", "m2", "m3"}, leased: map[int64][]*storage.Delivery{}}
	h.createTopic("w.queue", storage.TopicConfig{Partitions: 2, MaxDeliveries: 100})
	h.createTopic("w.fan", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2, MaxDeliveries: 100})
	_, err := h.e.BindingCreate(h.ctx, &storage.BindingCreateParams{Group: "bound", Pattern: "w.*"})
	h.must(err, "binding")
	w.topics = []string{"w.queue", "w.fan"}
	w.subs = append(w.subs, h.queueSub("w.queue").ID, h.subscribe("w.fan", "g0", storage.StartPosition{Kind: storage.FromBeginning}).ID)
	return w
}

func (w *workload) afterRestart() { clear(w.leased) }

func (w *workload) step() {
	h, rng := w.h, w.rng
	ctx := h.ctx
	sub := w.subs[rng.IntN(len(w.subs))]
	member := w.members[rng.IntN(len(w.members))]
	switch rng.IntN(16) {
	case 0, 1, 2:
		topic := w.topics[rng.IntN(len(w.topics))]
		n := 1 + rng.IntN(5)
		msgs := make([]storage.AppendMessage, n)
		for i := range msgs {
			msgs[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Key: fmt.Appendf(nil, "k%d", rng.IntN(7)), Payload: []byte("x")}
			if rng.IntN(10) == 0 {
				msgs[i].NotBefore = h.clock.Now().Add(time.Duration(rng.IntN(5)) * time.Second)
			}
			if rng.IntN(10) == 0 {
				msgs[i].ExpiresAt = h.clock.Now().Add(time.Duration(rng.IntN(5)) * time.Second)
			}
		}
		h.publish(topic, msgs...)
	case 3, 4, 5:
		res, err := h.e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub, Member: member, Max: 1 + rng.IntN(6), AvoidMember: rng.IntN(2) == 0})
		if err == nil {
			w.leased[sub] = append(w.leased[sub], res.Deliveries...)
		}
	case 6, 7, 8:
		ds := w.leased[sub]
		if len(ds) == 0 {
			return
		}
		k := rng.IntN(len(ds)) + 1
		_, _ = h.e.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: sub, Refs: refs(ds[:k])})
		w.leased[sub] = ds[k:]
	case 9:
		ds := w.leased[sub]
		if len(ds) == 0 {
			return
		}
		d := ds[0]
		w.leased[sub] = ds[1:]
		_, _ = h.e.DeliveriesNack(ctx, &storage.DeliveriesNackParams{SubscriptionID: sub, Member: d.Member, Refs: []storage.DeliveryRef{d.Ref()},
			Delay: time.Duration(rng.IntN(3)) * time.Second, ToDLQ: rng.IntN(3) == 0, Reason: "boom"})
	case 10:
		_, _ = h.e.DeliveriesRelease(ctx, &storage.DeliveriesReleaseParams{SubscriptionID: sub, Member: member})
	case 11:
		if rng.IntN(2) == 0 {
			_, _ = h.e.DLQReplay(ctx, &storage.DLQReplayParams{SubscriptionID: sub})
		} else {
			_, _ = h.e.DLQPurge(ctx, &storage.DLQPurgeParams{SubscriptionID: sub, IDs: []int64{int64(rng.IntN(5))}})
		}
	case 12:
		h.clock.Advance(time.Duration(rng.IntN(40)) * time.Second)
	case 13:
		switch rng.IntN(5) {
		case 0:
			w.groupN++
			s, err := h.e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "w.fan", Group: fmt.Sprintf("g%d", w.groupN),
				Start: storage.StartPosition{Kind: storage.FromTimestamp, Time: h.clock.Now().Add(-time.Minute)}})
			h.must(err, "subscribe")
			w.subs = append(w.subs, s.ID)
		case 1:
			_, _ = h.e.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: sub, State: storage.Paused})
		case 2:
			_, _ = h.e.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: sub, State: storage.Active})
		case 3:
			_, _ = h.e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "w.fan", Ephemeral: true})
		case 4:
			if rng.IntN(4) == 0 && len(w.subs) > 3 {
				_, _ = h.e.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: sub, State: storage.Cancelled})
			}
		}
	case 14:
		if rng.IntN(8) == 0 {
			tp, err := h.e.TopicGet(ctx, "w.fan")
			h.must(err, "topic get")
			if tp.Config.Partitions < 5 {
				cfg := tp.Config
				cfg.Partitions++
				_, err := h.e.TopicUpdate(ctx, &storage.TopicUpdateParams{Name: "w.fan", Config: cfg})
				h.must(err, "grow partitions")
			}
		}
	case 15:
		if rng.IntN(10) == 0 {
			name := fmt.Sprintf("w.t%d", len(w.topics))
			h.createTopic(name, storage.TopicConfig{Semantics: storage.PubSub, MaxDeliveries: 100})
			w.topics = append(w.topics, name)
			s, err := h.e.SubscriptionGetByGroup(ctx, name, "bound")
			h.must(err, "binding subscription")
			w.subs = append(w.subs, s.ID)
		}
	}
}

// TestRestartDeadLetterIsPersisted: the dead-lettering done at Open is recorded, so the entry keeps
// its ID and a purge of it survives later restarts.
func TestRestartDeadLetterIsPersisted(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.createTopic("jobs", storage.TopicConfig{MaxDeliveries: 1})
	q := h.queueSub("jobs")
	h.publishN("jobs", 1)
	equal(t, len(h.claim(q.ID, "a", 1)), 1, "claimed")
	h.crash()
	dlq, err := h.e.DLQList(h.ctx, &storage.DLQListParams{SubscriptionID: q.ID})
	h.must(err, "list")
	equal(t, len(dlq), 1, "dead-lettered at open")
	want := project(h.e)
	h.crash()
	diffProjection(t, want, project(h.e))
	n, err := h.e.DLQPurge(h.ctx, &storage.DLQPurgeParams{SubscriptionID: q.ID, IDs: []int64{dlq[0].ID}})
	h.must(err, "purge")
	equal(t, n, 1, "purged")
	h.crash()
	dlq, err = h.e.DLQList(h.ctx, &storage.DLQListParams{SubscriptionID: q.ID})
	h.must(err, "list")
	equal(t, len(dlq), 0, "purge survives restarts")
	equal(t, h.stats(q.ID).Pending, 0, "pending")
}
