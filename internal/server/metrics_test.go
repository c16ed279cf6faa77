package server

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolmq/spool/internal/metrics"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
	"github.com/spoolmq/spool/protocol"
)

// metricsEnv starts a server whose metrics are in the returned registry.
func metricsEnv(t *testing.T) (*env, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	return newEnv(t, func(c *Config) { c.Metrics = m }, nil), reg
}

// TestNackOnLastAttemptMetrics: a nack on the last attempt, which the engine dead-letters, counts
// as nacked and as dead-lettered, on the binary and the text protocol (and over HTTP, see
// internal/admin TestNackOnLastAttemptMetrics).
func TestNackOnLastAttemptMetrics(t *testing.T) {
	t.Parallel()
	e, reg := metricsEnv(t)
	if _, err := e.b.CreateTopic(t.Context(), "jobs", storage.TopicConfig{Semantics: storage.PubSub, MaxDeliveries: 1}); err != nil {
		t.Fatal(err)
	}
	c := e.dial(nil)
	c.subscribe(&protocol.Subscribe{Topic: "jobs", Group: "billing", MaxInFlight: 1})
	c.publish("jobs", "b")
	d := c.deliveriesN(1)
	if nack := expectOK[*protocol.NackOK](c, &protocol.Nack{Refs: refs(d...)}); nack.Nacked != 0 || nack.DeadLettered != 1 {
		t.Fatalf("nack on the last attempt: %+v, want dead-lettered 1", nack)
	}
	labels := map[string]string{"topic": "jobs", "group": "billing"}
	testutil.ExpectMetric(t, reg, "spool_messages_nacked_total", labels, 1)
	testutil.ExpectMetric(t, reg, "spool_messages_dead_lettered_total", labels, 1)

	// The text protocol's NACK.
	if _, err := e.b.CreateTopic(t.Context(), "tjobs", storage.TopicConfig{Semantics: storage.PubSub, MaxDeliveries: 1}); err != nil {
		t.Fatal(err)
	}
	tc := e.dialText()
	tc.send("VERBOSE ON", "JOIN_GROUP billing a", "SUBSCRIBE tjobs")
	tc.expect("OK verbose on")
	tc.expect("OK group billing consumer a")
	tc.expect("OK subscribed tjobs")
	c.publish("tjobs", "t")
	tc.expectLine("DELIVERY 1 0 1 tjobs t")
	tc.send("NACK 1")
	tc.expect("OK 0 nacked")
	labels = map[string]string{"topic": "tjobs", "group": "billing"}
	testutil.ExpectMetric(t, reg, "spool_messages_nacked_total", labels, 1)
	testutil.ExpectMetric(t, reg, "spool_messages_dead_lettered_total", labels, 1)
}

// TestHookMetricsGroupLabel: deliveries, acks and nacks are labelled with the subscription's group
// as the scrape-time metrics name it: "$queue" for a QUEUE topic's subscription (also for a member
// that gave a group), "$ephemeral" for the subscription of a member without a group on a PUB_SUB
// topic; never "" (doc.go of internal/metrics).
func TestHookMetricsGroupLabel(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	e := newEnv(t, func(c *Config) { c.Metrics = m }, nil)
	if err := m.RegisterBroker(e.b, metrics.CollectorOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.CreateTopic(t.Context(), "events", storage.TopicConfig{Semantics: storage.PubSub}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		topic, group, label string
	}{
		{"jobs", "", "$queue"},
		{"jobs2", "billing", "$queue"},
		{"events", "", "$ephemeral"},
	} {
		cl := e.dial(nil)
		// An ephemeral subscription starts at the end: subscribe, then publish.
		cl.subscribe(&protocol.Subscribe{Topic: c.topic, Group: c.group, MaxInFlight: 2})
		cl.publish(c.topic, "a", "b")
		d := cl.deliveriesN(2)
		expectOK[*protocol.AckOK](cl, &protocol.Ack{Refs: refs(d[0])})
		expectOK[*protocol.NackOK](cl, &protocol.Nack{Refs: refs(d[1]), ToDLQ: true})
		labels := map[string]string{"topic": c.topic, "group": c.label}
		for _, name := range []string{"spool_messages_delivered_total", "spool_messages_acked_total",
			"spool_messages_nacked_total", "spool_messages_dead_lettered_total"} {
			want := 1.0
			if name == "spool_messages_delivered_total" {
				want = 2
			}
			testutil.ExpectMetric(t, reg, name, labels, want)
		}
		// The same labels as the scrape-time metrics of the subscription: they join.
		if _, ok := testutil.MetricValue(t, reg, "spool_subscription_pending", labels); !ok {
			t.Errorf("no series spool_subscription_pending%v", labels)
		}
	}
	for _, name := range []string{"spool_messages_delivered_total", "spool_messages_acked_total"} {
		for _, topic := range []string{"jobs", "jobs2", "events"} {
			if _, ok := testutil.MetricValue(t, reg, name, map[string]string{"topic": topic, "group": ""}); ok {
				t.Errorf("%s{topic=%q,group=\"\"} exists", name, topic)
			}
		}
	}
}
