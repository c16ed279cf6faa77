package metrics

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	spooltest "github.com/spoolmq/spool/internal/testutil"
)

// observeAll records one observation of every hook labelled by topic, for topic and group.
func observeAll(m *Metrics, topic, group string) {
	m.ObservePublish(topic, 1, time.Millisecond)
	m.ObserveDelivery(topic, group, 1, time.Now())
	m.ObserveDelivery(topic, group, 2, time.Now())
	m.ObserveAck(topic, group, 1)
	m.ObserveNack(topic, group, 1, 1)
	m.ObserveDeadLettered(topic, group, 1)
	m.ObserveRetention(&storage.RetentionResult{MessagesExpired: 2,
		Expired:     []storage.ExpiredCount{{Topic: topic, Reason: storage.ExpiredTopicDeleted, Messages: 2}},
		Zombies:     []storage.ZombieCount{{Topic: topic, Group: group, Messages: 1}},
		SizeRemoved: []storage.SizeRemoval{{Topic: topic, Messages: 1}}})
	sub := &storage.Subscription{Topic: topic, Group: group}
	m.ObserveLifecycle(&broker.LifecycleResult{Dead: []*storage.Subscription{sub}, Resurrected: []*storage.Subscription{sub},
		Deleted: []*storage.Subscription{sub}})
	m.ObserveForceComplete(topic, group, 1)
	m.ObserveFiltered(topic, group, 1)
	m.ObserveRebalance(broker.RebalanceInfo{Topic: topic, Group: group, Generation: 1})
}

// topicSeriesCount counts the series of reg labelled with topic.
func topicSeriesCount(t *testing.T, reg prometheus.Gatherer, topic string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "topic" && l.GetValue() == topic {
					n++
				}
			}
		}
	}
	return n
}

// TestForgetTopicDropsLateObservations: ForgetTopic deletes every series of the topic, and only
// of that topic; observations that come after (the next retention run's expiries of the deleted
// topic, an ack or a delivery that raced the deletion) do not make them again: the expiries count
// under topic "$deleted". Once the engine notifies the topic created again, it is counted anew.
func TestForgetTopicDropsLateObservations(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := New(reg)
	observeAll(m, "orders", "billing")
	observeAll(m, "orders.eu", "billing")
	all := topicSeriesCount(t, reg, "orders")
	if all != 18 {
		t.Fatalf("%d series of orders, want 18 (one per hook vector labelled by topic)", all)
	}

	m.ForgetTopic("orders")
	if n := topicSeriesCount(t, reg, "orders"); n != 0 {
		t.Errorf("after ForgetTopic: %d series of orders, want 0", n)
	}
	if n := topicSeriesCount(t, reg, "orders.eu"); n != all {
		t.Errorf("after ForgetTopic(orders): %d series of orders.eu, want %d", n, all)
	}

	observeAll(m, "orders", "billing")
	if n := topicSeriesCount(t, reg, "orders"); n != 0 {
		t.Errorf("observations after ForgetTopic made %d series of orders, want 0", n)
	}
	spooltest.ExpectMetric(t, reg, "spool_messages_expired_total", map[string]string{"topic": TopicDeleted, "reason": "topic_deleted"}, 2)

	m.ObserveNotification(storage.Notification{Kind: storage.NotifyMessages, Topic: "orders"})
	m.ObservePublish("orders", 1, time.Millisecond)
	if _, ok := spooltest.MetricValue(t, reg, "spool_messages_published_total", map[string]string{"topic": "orders"}); ok {
		t.Error("a message notification revived the forgotten topic")
	}
	m.ObserveNotification(storage.Notification{Kind: storage.NotifyTopicCreated, Topic: "orders"})
	m.ObservePublish("orders", 1, time.Millisecond)
	spooltest.ExpectMetric(t, reg, "spool_messages_published_total", map[string]string{"topic": "orders"}, 1)

	m.ObserveNotification(storage.Notification{Kind: storage.NotifyTopicDeleted, Topic: "orders"})
	if n := topicSeriesCount(t, reg, "orders"); n != 0 {
		t.Errorf("after NotifyTopicDeleted: %d series of orders, want 0", n)
	}
}

// TestSweepAfterListing: a sweep forgets the topics and groups that had series before its
// listings began and are not in them, keeps "$ephemeral" with its topic, and leaves alone what
// got its first series after the listings began (a topic or group the listings may have
// missed). A topic it forgot is counted again once a later listing has it.
func TestSweepAfterListing(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := New(reg)
	for _, g := range []string{"billing", "audit", "$ephemeral-7"} {
		m.ObserveAck("orders", g, 1)
	}
	m.ObserveAck("gone", "billing", 1)
	begin := m.sweepBegin()
	m.ObserveAck("new", "billing", 1)
	m.ObserveAck("orders", "late", 1)
	topics := []*broker.TopicInfo{{Topic: &storage.Topic{Name: "orders"}}}
	groups := []*broker.GroupInfo{{Topic: "orders", Group: "billing"}}
	m.sweep(begin, topics, groups)

	acked := func(topic, group string) map[string]string { return map[string]string{"topic": topic, "group": group} }
	for _, l := range []map[string]string{acked("orders", "billing"), acked("orders", GroupEphemeral), acked("new", "billing"), acked("orders", "late")} {
		spooltest.ExpectMetric(t, reg, "spool_messages_acked_total", l, 1)
	}
	for _, l := range []map[string]string{acked("orders", "audit"), acked("gone", "billing")} {
		if _, ok := spooltest.MetricValue(t, reg, "spool_messages_acked_total", l); ok {
			t.Errorf("series %v survived the sweep", l)
		}
	}

	m.ObserveAck("gone", "billing", 1)
	if _, ok := spooltest.MetricValue(t, reg, "spool_messages_acked_total", acked("gone", "billing")); ok {
		t.Error("an ack of the swept topic made its series again")
	}
	begin = m.sweepBegin()
	m.sweep(begin, []*broker.TopicInfo{{Topic: &storage.Topic{Name: "gone"}}}, nil)
	m.ObserveAck("gone", "billing", 1)
	spooltest.ExpectMetric(t, reg, "spool_messages_acked_total", acked("gone", "billing"), 1)
}

// TestScrapeForgetsDeletedGroupsAndTopics: a broker collector's scrape forgets the hook series of
// a removed group and of a topic deleted without ForgetTopic or a notification reaching the
// metrics (the case of another instance on PostgreSQL), and keeps those of the groups and topics
// that exist: durable groups, a QUEUE topic's "$queue" and a topic's "$ephemeral".
func TestScrapeForgetsDeletedGroupsAndTopics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	m := New(reg)
	b := newBroker(t)
	if err := m.RegisterBroker(b, CollectorOptions{Logger: testLogger(t)}); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"orders", "audit.log"} {
		if _, err := b.CreateTopic(ctx, topic, storage.TopicConfig{Semantics: storage.PubSub}); err != nil {
			t.Fatal(err)
		}
		for _, g := range []string{"billing", "shipping"} {
			if _, err := b.CreateGroup(ctx, broker.CreateGroupParams{Topic: topic, Group: g}); err != nil {
				t.Fatal(err)
			}
			m.ObserveAck(topic, g, 1)
		}
	}
	if _, err := b.CreateTopic(ctx, "jobs", storage.TopicConfig{Semantics: storage.Queue}); err != nil {
		t.Fatal(err)
	}
	m.ObserveAck("jobs", storage.QueueGroup, 1)
	m.ObserveAck("orders", "$ephemeral-3", 1)
	if _, err := b.RemoveGroup(ctx, "orders", "shipping"); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteTopic(ctx, "audit.log", true); err != nil {
		t.Fatal(err)
	}
	acked := func(topic, group string) map[string]string { return map[string]string{"topic": topic, "group": group} }
	// The scrape that sweeps may have collected the hook series already: the next one has not.
	waitFor(t, "series of the removed group and the deleted topic forgotten", func() error {
		for _, l := range []map[string]string{acked("orders", "shipping"), acked("audit.log", "billing"), acked("audit.log", "shipping")} {
			if _, ok := spooltest.MetricValue(t, reg, "spool_messages_acked_total", l); ok {
				return fmt.Errorf("series %v still exported", l)
			}
		}
		return nil
	})
	for _, l := range []map[string]string{acked("orders", "billing"), acked("orders", GroupEphemeral), acked("jobs", storage.QueueGroup)} {
		spooltest.ExpectMetric(t, reg, "spool_messages_acked_total", l, 1)
	}
}
