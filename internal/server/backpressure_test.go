package server

import (
	"strings"
	"testing"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// A topic at its backlog bound refuses publishes over TCP with RATE_LIMITED and the broker's
// retry-after (binary Error frame; text ERR line); a principal holding the priority permission
// still publishes.
func TestBackpressureRefusalOverTCP(t *testing.T) {
	e, _ := authEnv(t)
	defer e.close()
	if _, err := e.b.CreateTopic(t.Context(), "orders.bp", storage.TopicConfig{MaxBacklogMessages: 2}); err != nil {
		t.Fatal(err)
	}
	alice := e.dial(&protocol.Hello{ClientName: "test", Token: aliceToken})
	alice.publish("orders.bp", "a", "b")
	if err := e.b.RefreshBackpressure(t.Context()); err != nil {
		t.Fatal(err)
	}
	if bp, _ := e.b.TopicBackpressure("orders.bp"); bp.State != broker.BackpressureRejecting {
		t.Fatalf("backpressure %+v, want rejecting", bp)
	}
	pe := alice.expectErr(&protocol.Publish{Topic: "orders.bp", Messages: []protocol.PublishMessage{{Partition: protocol.PartitionAuto, Payload: []byte("c")}}}, protocol.CodeRateLimited)
	if !pe.Retryable || pe.RetryAfter < broker.DefaultBackpressureInterval {
		t.Fatalf("refused publish: %+v, want retryable with retry_after >= 1s", pe)
	}

	dave := e.dial(&protocol.Hello{ClientName: "test", Token: daveToken})
	dave.publish("orders.bp", "priority")

	tc := e.dialText()
	tc.send("AUTH "+aliceToken, "PUBLISH orders.bp c")
	tc.expect("OK authenticated as alice")
	if l := tc.expect("ERR RATE_LIMITED"); !strings.Contains(l, "retry after") {
		t.Fatalf("text refusal %q does not say when to retry", l)
	}
	st := e.groupStats("orders.bp", storage.QueueGroup)
	if st.Pending != 3 {
		t.Fatalf("pending %d, want 3 (a, b and the priority one; the refused ones changed nothing)", st.Pending)
	}
}
