package admin

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/broker"
)

// serve is do without the network: the request runs through the handler on this goroutine, so a
// topicReadHook set by the test may call serve again (an update landing inside another).
func (e *env) serve(method, path string, body any) *resp {
	e.t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		e.t.Fatal(err)
	}
	req := httptest.NewRequestWithContext(e.t.Context(), method, path, bytes.NewReader(data))
	req.Host = "localhost" // not httptest's example.com: without auth the handler refuses other names
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	return &resp{t: e.t, status: rec.Code, header: rec.Header(), body: rec.Body.Bytes(), what: method + " " + path}
}

// Two updates of different fields of a topic's configuration both survive when the second lands
// between the first one's read of the configuration and its write: the first one's write finds
// the configuration changed, and its body is applied again to a fresh read instead of writing
// back message_retention as it was read.
func TestTopicConfigUpdateInterleaved(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "cfg"}).ok(201, nil)
	var reads int
	e.h.topicReadHook = func(topic string) {
		if topic != "cfg" {
			t.Errorf("hook called for topic %q", topic)
		}
		reads++
		if reads == 1 { // the first update has read the configuration: the second one lands now
			var second Topic
			e.serve("PUT", "/api/v1/topics/cfg/config", map[string]any{"message_retention": "1h"}).ok(200, &second)
			if got := time.Duration(second.Config.MessageRetention); got != time.Hour {
				t.Errorf("second update: message_retention %s", got)
			}
		}
	}
	var first Topic
	e.serve("PUT", "/api/v1/topics/cfg/config", map[string]any{"max_message_bytes": 2048}).ok(200, &first)
	// Reads: the first update's, the second's, the first's again after its write was refused.
	if reads != 3 {
		t.Errorf("configuration read %d times, want 3", reads)
	}
	var got Topic
	e.do("GET", "/api/v1/topics/cfg", nil).ok(200, &got)
	for what, tp := range map[string]Topic{"first update's answer": first, "GET": got} {
		if tp.Config.MaxMessageBytes != 2048 || time.Duration(tp.Config.MessageRetention) != time.Hour {
			t.Errorf("%s: max_message_bytes %d, message_retention %s; want both updates (2048, 1h)", what,
				tp.Config.MaxMessageBytes, time.Duration(tp.Config.MessageRetention))
		}
	}
}

// An update whose write is overtaken by another update at each of its topicUpdateAttempts
// attempts fails with 409 TOPIC_CHANGED and changes nothing; the topic keeps the other updates.
func TestTopicConfigUpdateKeepsChanging(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "busy"}).ok(201, nil)
	var reads int
	e.h.topicReadHook = func(topic string) {
		reads++
		info, err := e.b.Topic(t.Context(), topic)
		if err != nil {
			t.Errorf("Topic: %v", err)
			return
		}
		cfg := info.Topic.Config
		cfg.AckWait = time.Duration(reads) * time.Second
		if _, err := e.b.UpdateTopic(t.Context(), broker.UpdateTopicParams{Name: topic, Config: cfg}); err != nil {
			t.Errorf("UpdateTopic: %v", err)
		}
	}
	d := e.serve("PUT", "/api/v1/topics/busy/config", map[string]any{"max_deliveries": 9}).fails(http.StatusConflict, "TOPIC_CHANGED")
	if reads != topicUpdateAttempts {
		t.Errorf("configuration read %d times, want %d", reads, topicUpdateAttempts)
	}
	if !strings.Contains(d.Message, "send it again") || d.Retryable {
		t.Errorf("error %+v: want a message saying to send it again, not retryable", d)
	}
	var got Topic
	e.do("GET", "/api/v1/topics/busy", nil).ok(200, &got)
	if got.Config.MaxDeliveries != 5 || time.Duration(got.Config.AckWait) != topicUpdateAttempts*time.Second {
		t.Errorf("max_deliveries %d (want the default 5), ack_wait %s (want the hook's last, %ds)",
			got.Config.MaxDeliveries, time.Duration(got.Config.AckWait), topicUpdateAttempts)
	}
}
