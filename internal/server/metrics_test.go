package server

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolmq/spool/internal/metrics"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// metricsEnv starts a server whose metrics are in the returned registry.
func metricsEnv(t *testing.T) (*env, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	return newEnv(t, func(c *Config) { c.Metrics = m }, nil), reg
}

// metricValue returns the value of the counter or gauge name{labels} of reg and whether it exists.
func metricValue(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if len(got) != len(labels) {
				continue
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue(), true
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// expectMetric fails unless the series name{labels} of reg exists with value want.
func expectMetric(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string, want float64) {
	t.Helper()
	got, ok := metricValue(t, reg, name, labels)
	if !ok {
		t.Errorf("no series %s%v", name, labels)
		return
	}
	if got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

// TestNackOnLastAttemptMetrics: a nack on the last attempt, which the engine dead-letters, counts
// as nacked and as dead-lettered, on the binary and the text protocol (and over HTTP, see
// internal/admin TestNackOnLastAttemptMetrics).
func TestNackOnLastAttemptMetrics(t *testing.T) {
	t.Parallel()
	e, reg := metricsEnv(t)
	if _, err := e.b.CreateTopic(t.Context(), "jobs", storage.TopicConfig{MaxDeliveries: 1}); err != nil {
		t.Fatal(err)
	}
	c := e.dial(nil)
	c.publish("jobs", "b")
	c.subscribe(&protocol.Subscribe{Topic: "jobs", Group: "billing", MaxInFlight: 1})
	d := c.deliveriesN(1)
	if nack := expectOK[*protocol.NackOK](c, &protocol.Nack{Refs: refs(d...)}); nack.Nacked != 0 || nack.DeadLettered != 1 {
		t.Fatalf("nack on the last attempt: %+v, want dead-lettered 1", nack)
	}
	labels := map[string]string{"topic": "jobs", "group": "billing"}
	expectMetric(t, reg, "spool_messages_nacked_total", labels, 1)
	expectMetric(t, reg, "spool_messages_dead_lettered_total", labels, 1)

	// The text protocol's NACK.
	if _, err := e.b.CreateTopic(t.Context(), "tjobs", storage.TopicConfig{MaxDeliveries: 1}); err != nil {
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
	expectMetric(t, reg, "spool_messages_nacked_total", labels, 1)
	expectMetric(t, reg, "spool_messages_dead_lettered_total", labels, 1)
}
