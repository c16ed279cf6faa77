package metrics

import (
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
