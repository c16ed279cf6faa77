package broker

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
)

// TestTraceCorrelationID: with DEBUG logs, every line about a message that carries a
// correlation_id header names it (published, synchronously or not; delivered; acked; nacked), so
// one message can be followed end to end; and with a threshold below any real duration every
// publish, claim, ack and nack is logged as a slow operation (no sleep: the threshold is the
// knob). A negative threshold logs none.
func TestTraceCorrelationID(t *testing.T) {
	t.Parallel()
	logs := &testutil.SyncBuffer{}
	e := newEnv(t, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.SlowOperation = time.Nanosecond
	})
	e.createTopic("trace", storage.TopicConfig{Semantics: storage.Queue})
	m := e.subscribe(SubscribeParams{Pattern: "trace", MaxInFlight: 10})
	msg := func(corr string) []storage.AppendMessage {
		return []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("x"),
			Headers: map[string]string{CorrelationHeader: corr, "other": "y"}}}
	}
	if _, err := e.b.Publish(e.ctx(), "trace", msg("trace-ack")); err != nil {
		t.Fatal(err)
	}
	d := recv(t, m, 1)[0]
	if err := m.Ack(e.ctx(), d.SubscriptionID, d.Ref()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	if err := e.b.PublishAsync(e.ctx(), "trace", msg("trace-nack"), PublishOptions{}, func(_ []storage.MessagePosition, err error) { done <- err }); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	d = recv(t, m, 1)[0]
	if err := m.Nack(e.ctx(), d.SubscriptionID, []storage.DeliveryRef{d.Ref()}, NackOptions{Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(logs.String(), "\n")
	for corr, want := range map[string][]string{
		"trace-ack":  {`msg="message published"`, `msg="message delivered"`, `msg="message acked"`},
		"trace-nack": {`msg="message published"`, `msg="message delivered"`, `msg="message nacked"`},
	} {
		var got []string
		for _, l := range lines {
			if strings.Contains(l, "correlation_id="+corr) {
				got = append(got, l)
			}
		}
		for _, w := range want {
			found := false
			for _, l := range got {
				found = found || strings.Contains(l, w)
			}
			if !found {
				t.Errorf("no %s line with correlation_id=%s in:\n%s", w, corr, strings.Join(got, "\n"))
			}
		}
	}
	for _, op := range []string{"publish", "claim", "ack", "nack"} {
		if !strings.Contains(logs.String(), `level=WARN msg="slow broker operation" component=broker`) ||
			!strings.Contains(logs.String(), " op="+op+" ") {
			t.Errorf("no slow-operation line for %s", op)
		}
	}

	quiet := &testutil.SyncBuffer{}
	q := newEnv(t, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(quiet, &slog.HandlerOptions{Level: slog.LevelInfo}))
		c.SlowOperation = -1
	})
	if _, err := q.b.Publish(q.ctx(), "trace", msg("quiet")); err != nil {
		t.Fatal(err)
	}
	if s := quiet.String(); strings.Contains(s, "slow broker operation") || strings.Contains(s, "quiet") {
		t.Errorf("logs with SlowOperation -1 at INFO:\n%s", s)
	}
}
