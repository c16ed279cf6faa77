package broker

import (
	"fmt"
	"sync"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// deadLetters records the calls of Config.OnDeadLettered.
type deadLetters struct {
	mu sync.Mutex
	n  map[[2]string]int // topic, group
}

func (d *deadLetters) add(topic, group string, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n == nil {
		d.n = map[[2]string]int{}
	}
	d.n[[2]string{topic, group}] += n
}

// expect waits until the messages reported for group on topic are want.
func (d *deadLetters) expect(t *testing.T, topic, group string, want int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d dead-letters of %s/%s reported", want, topic, group), func() error {
		d.mu.Lock()
		defer d.mu.Unlock()
		if got := d.n[[2]string{topic, group}]; got != want {
			return fmt.Errorf("%d reported, want %d (all: %v)", got, want, d.n)
		}
		return nil
	})
}

// TestRebalanceDeadLettersReported: a rebalance that moves a partition whose lease is on its
// max_deliveries-th delivery dead-letters it, and the broker reports it to OnDeadLettered, when
// a join moves it (the owner's rebalance) and when an admin rebalance of a group without a member
// here drops its owner.
func TestRebalanceDeadLettersReported(t *testing.T) {
	t.Parallel()
	var dead deadLetters
	e := newEnv(t, func(c *Config) {
		c.RebalanceDelay = -1
		c.OnDeadLettered = dead.add
	})
	e.createTopic("o", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2, MaxDeliveries: 1})
	a := e.subscribeOrdered("o", "g", "a")
	e.waitAssignment("o", "g", "a")
	if _, err := e.b.Publish(e.ctx(), "o", []storage.AppendMessage{{Partition: 1, Payload: []byte("m")}}); err != nil {
		t.Fatal(err)
	}
	recv(t, a, 1)
	// Round robin over a, b: b gets partition 1, and a's lease on its last attempt goes to the DLQ.
	e.subscribeOrdered("o", "g", "b")
	if asg := e.waitAssignment("o", "g", "a", "b"); asg.Owner(1) != "b" {
		t.Fatalf("partition 1 owned by %q, want b", asg.Owner(1))
	}
	dead.expect(t, "o", "g", 1)

	// A group with no member here, its lease taken through the engine: RebalanceGroup with
	// DropForeign leaves its partition without an owner.
	e.createTopic("p", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 1, MaxDeliveries: 1})
	sub, err := e.engine.SubscriptionCreate(e.ctx(), &storage.SubscriptionCreateParams{Topic: "p", Group: "h",
		Start: storage.StartPosition{Kind: storage.FromBeginning}, Mode: storage.ModeOrdered})
	if err != nil {
		t.Fatal(err)
	}
	asg, err := e.engine.SubscriptionAssign(e.ctx(), &storage.SubscriptionAssignParams{SubscriptionID: sub.ID,
		Members: map[string][]int32{"x": {0}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.Publish(e.ctx(), "p", []storage.AppendMessage{{Partition: 0, Payload: []byte("m")}}); err != nil {
		t.Fatal(err)
	}
	res, err := e.engine.DeliveriesClaim(e.ctx(), &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: "x", Max: 1,
		Generation: asg.Assignment.Generation})
	if err != nil || len(res.Deliveries) != 1 {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	if _, err := e.b.RebalanceGroup(e.ctx(), RebalanceParams{Topic: "p", Group: "h", DropForeign: true}); err != nil {
		t.Fatal(err)
	}
	dead.expect(t, "p", "h", 1)
	dead.expect(t, "o", "g", 1)
}

// TestRestartDeadLettersReported: the leases on their max_deliveries-th delivery that the
// embedded engine dead-letters when it opens after a restart are reported to OnDeadLettered when
// the broker starts, once.
func TestRestartDeadLettersReported(t *testing.T) {
	t.Parallel()
	var dead deadLetters
	e := newEnv(t, func(c *Config) { c.OnDeadLettered = dead.add })
	e.createTopic("jobs", storage.TopicConfig{Semantics: storage.Queue, MaxDeliveries: 1})
	e.publishN("jobs", "m", 2)
	subs, err := e.engine.SubscriptionList(e.ctx(), &storage.SubscriptionListParams{Topic: "jobs"})
	if err != nil || len(subs) != 1 {
		t.Fatalf("subscriptions of the queue: %v, %v", subs, err)
	}
	// Leased through the engine (a member of the broker would give its leases back at Stop).
	res, err := e.engine.DeliveriesClaim(e.ctx(), &storage.DeliveriesClaimParams{SubscriptionID: subs[0].ID, Member: "x", Max: 2})
	if err != nil || len(res.Deliveries) != 2 {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	e.restart()
	dead.expect(t, "jobs", storage.QueueGroup, 2)
	e.restart()
	dead.expect(t, "jobs", storage.QueueGroup, 2)
}
