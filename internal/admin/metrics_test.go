package admin

import (
	"testing"

	"github.com/spoolmq/spool/internal/testutil"
)

// metricValue returns the value of the series name{labels} of e's registry (a counter or gauge)
// and whether it exists.
func (e *env) metricValue(name string, labels map[string]string) (float64, bool) {
	e.t.Helper()
	return testutil.MetricValue(e.t, e.reg, name, labels)
}

// expectMetric fails unless the series name{labels} exists with value want.
func (e *env) expectMetric(name string, labels map[string]string, want float64) {
	e.t.Helper()
	testutil.ExpectMetric(e.t, e.reg, name, labels, want)
}

// TestNackOnLastAttemptMetrics: a nack on the last attempt, which the engine dead-letters, counts
// as nacked and as dead-lettered, as over TCP (internal/server TestNackOnLastAttemptMetrics).
func TestNackOnLastAttemptMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "jobs", "semantics": "PUB_SUB", "max_deliveries": 1}).ok(201, nil)
	e.do("POST", "/api/v1/topics/jobs/groups", map[string]any{"group": "billing"}).ok(201, nil)
	e.do("POST", "/api/v1/topics/jobs/messages", map[string]any{"payload": "x"}).ok(201, nil)
	msgs := e.pullN("jobs", "billing", 1, nil)
	var res AckResult
	e.do("POST", "/api/v1/topics/jobs/groups/billing/nack", map[string]any{"ids": []string{msgs[0].ID}}).ok(200, &res)
	if res.Nacked == nil || *res.Nacked != 1 {
		t.Fatalf("nack answered %+v, want nacked 1", res)
	}
	labels := map[string]string{"topic": "jobs", "group": "billing"}
	e.expectMetric("spool_messages_nacked_total", labels, 1)
	e.expectMetric("spool_messages_dead_lettered_total", labels, 1)
}

// TestAckAgainNotCounted: acking a message three times over HTTP counts one ack, as over TCP (an
// ack of a message already done is not counted again, README).
func TestAckAgainNotCounted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "jobs", "semantics": "PUB_SUB"}).ok(201, nil)
	e.do("POST", "/api/v1/topics/jobs/groups", map[string]any{"group": "billing"}).ok(201, nil)
	e.do("POST", "/api/v1/topics/jobs/messages", map[string]any{"payload": "x"}).ok(201, nil)
	msgs := e.pullN("jobs", "billing", 1, nil)
	for range 3 {
		var res AckResult
		e.do("POST", "/api/v1/topics/jobs/groups/billing/ack", map[string]any{"ids": []string{msgs[0].ID}}).ok(200, &res)
		if res.Acked == nil || *res.Acked != 1 {
			t.Fatalf("ack answered %+v, want acked 1 (acks are idempotent)", res)
		}
	}
	e.expectMetric("spool_messages_acked_total", map[string]string{"topic": "jobs", "group": "billing"}, 1)
}

// TestHookMetricsGroupLabel: HTTP deliveries, acks and nacks of a QUEUE topic's subscription are
// labelled "$queue", whatever group the URL names, as its scrape-time metrics are (never "").
func TestHookMetricsGroupLabel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "jobs", "semantics": "QUEUE"}).ok(201, nil)
	for _, p := range []string{"a", "b", "c", "d"} {
		e.do("POST", "/api/v1/topics/jobs/messages", map[string]any{"payload": p}).ok(201, nil)
	}
	// Pulled as $queue and as a group name (the same subscription), acked by a URL group that has
	// no pull session (the subscription is looked up).
	msgs := e.pullN("jobs", "$queue", 2, nil)
	msgs = append(msgs, e.pullN("jobs", "workers", 2, nil)...)
	e.do("POST", "/api/v1/topics/jobs/groups/$queue/ack", map[string]any{"ids": []string{msgs[0].ID}}).ok(200, nil)
	e.do("POST", "/api/v1/topics/jobs/groups/other/ack", map[string]any{"ids": []string{msgs[2].ID}}).ok(200, nil)
	e.do("POST", "/api/v1/topics/jobs/groups/$queue/nack", map[string]any{"ids": []string{msgs[1].ID}, "to_dlq": true}).ok(200, nil)
	e.do("POST", "/api/v1/topics/jobs/groups/workers/nack", map[string]any{"ids": []string{msgs[3].ID}, "to_dlq": true}).ok(200, nil)
	labels := map[string]string{"topic": "jobs", "group": "$queue"}
	e.expectMetric("spool_messages_delivered_total", labels, 4)
	e.expectMetric("spool_messages_acked_total", labels, 2)
	e.expectMetric("spool_messages_nacked_total", labels, 2)
	e.expectMetric("spool_messages_dead_lettered_total", labels, 2)
	e.expectMetric("spool_subscription_dead_lettered", labels, 2)
	for _, g := range []string{"", "workers", "other"} {
		if _, ok := e.metricValue("spool_messages_delivered_total", map[string]string{"topic": "jobs", "group": g}); ok {
			t.Errorf("spool_messages_delivered_total{group=%q} exists", g)
		}
		if _, ok := e.metricValue("spool_messages_acked_total", map[string]string{"topic": "jobs", "group": g}); ok {
			t.Errorf("spool_messages_acked_total{group=%q} exists", g)
		}
	}
}

// TestPublishErrorsCounted: HTTP publishes refused before they reach the broker (here, by body
// validation) count in spool_publish_errors_total, on both publish routes.
func TestPublishErrorsCounted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics/jobs/messages", map[string]any{"messages": []any{}}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/publish", map[string]any{"topic": "jobs"}).fails(400, "INVALID_ARGUMENT")
	e.expectMetric("spool_publish_errors_total", map[string]string{"code": "INVALID_ARGUMENT"}, 2)
	// Refused by the broker: counted once.
	e.do("POST", "/api/v1/topics", map[string]any{"name": "one", "partitions": 1}).ok(201, nil)
	e.do("POST", "/api/v1/topics/one/messages", map[string]any{"payload": "x", "partition": 5}).fails(400, "INVALID_ARGUMENT")
	e.expectMetric("spool_publish_errors_total", map[string]string{"code": "INVALID_ARGUMENT"}, 3)
}
