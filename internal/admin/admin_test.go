package admin

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	api "github.com/spoolmq/spool/client/admin"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

func TestNewValidates(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{}); err == nil {
		t.Fatal("New without a broker succeeded")
	}
	e := newEnv(t, nil)
	for _, cfg := range []Config{
		{Broker: e.b, MaxBodyBytes: -1},
		{Broker: e.b, PullMaxInFlight: broker.MaxInFlightLimit + 1},
		{Broker: e.b, PullMaxBatch: 50, PullMaxInFlight: 10},
		{Broker: e.b, DefaultPullWait: time.Minute, MaxPullWait: time.Second},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
}

func TestProbesAndReadiness(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	var st Status
	e.do("GET", "/healthz", nil).ok(200, &st)
	if st.Status != "ok" {
		t.Fatalf("healthz: %+v", st)
	}
	e.do("GET", "/readyz", nil).ok(200, &st)
	if st.Status != "ready" {
		t.Fatalf("readyz: %+v", st)
	}
	e.stopBroker()
	d := e.do("GET", "/readyz", nil).fails(503, "CLOSED")
	if !d.Retryable {
		t.Error("not-ready error is not retryable")
	}
	e.do("GET", "/healthz", nil).ok(200, nil)
	// The API answers CLOSED (503, retryable) once the broker stopped.
	d = e.do("GET", "/api/v1/topics", nil).fails(503, "CLOSED")
	if !d.Retryable {
		t.Error("CLOSED is not retryable")
	}
}

func TestReadyFuncIsUsed(t *testing.T) {
	t.Parallel()
	ready := fmt.Errorf("warming up")
	e := newEnv(t, func(c *Config) { c.Ready = func() error { return ready } })
	e.do("GET", "/readyz", nil).fails(503, "INTERNAL")
}

func TestNotFoundAndMethodNotAllowed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("GET", "/api/v1/nope", nil).fails(404, "NOT_FOUND")
	e.do("GET", "/nope", nil).fails(404, "NOT_FOUND") // "/" is the dashboard
	r := e.do("PATCH", "/api/v1/topics", nil)
	r.fails(405, "METHOD_NOT_ALLOWED")
	if allow := r.header.Get("Allow"); !strings.Contains(allow, "GET") || !strings.Contains(allow, "POST") {
		t.Errorf("Allow = %q", allow)
	}
	e.do("DELETE", "/healthz", nil).fails(405, "METHOD_NOT_ALLOWED")
	e.do("GET", "/api/v1/topics/a/groups/b/pull", nil).fails(405, "METHOD_NOT_ALLOWED")
	if id := r.header.Get("X-Request-Id"); id == "" {
		t.Error("no X-Request-Id on an error response")
	}
	r = e.do("GET", "/healthz", nil, "X-Request-Id", "abc-123")
	if id := r.header.Get("X-Request-Id"); id != "abc-123" {
		t.Errorf("X-Request-Id = %q, want the caller's", id)
	}
}

func TestTopics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)

	var created Topic
	r := e.do("POST", "/api/v1/topics", map[string]any{"name": "orders.created", "partitions": 2, "ack_wait": "10s"}).ok(201, &created)
	if created.Name != "orders.created" || created.Config.Partitions != 2 || time.Duration(created.Config.AckWait) != 10*time.Second ||
		created.Config.Semantics != api.Queue || created.Config.MaxDeliveries != 5 {
		t.Fatalf("created %+v", created)
	}
	if loc := r.header.Get("Location"); loc != "/api/v1/topics/orders.created" {
		t.Errorf("Location = %q", loc)
	}
	// Seed 002 M4-11 shape; durations as milliseconds too.
	e.do("POST", "/api/v1/topics", map[string]any{"name": "test-topic", "retention_policy": map[string]any{"max_age": 3600}}).ok(201, &created)
	if time.Duration(created.Config.MessageRetention) != time.Hour {
		t.Errorf("retention_policy.max_age: message_retention = %v", time.Duration(created.Config.MessageRetention))
	}
	e.do("POST", "/api/v1/topics", map[string]any{"name": "events", "semantics": "PUB_SUB", "ack_wait": 1500}).ok(201, &created)
	if time.Duration(created.Config.AckWait) != 1500*time.Millisecond {
		t.Errorf("ack_wait 1500 ms = %v", time.Duration(created.Config.AckWait))
	}

	e.do("POST", "/api/v1/topics", map[string]any{"name": "events"}).fails(409, "TOPIC_EXISTS")
	e.do("POST", "/api/v1/topics", map[string]any{"name": "bad/name"}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics", map[string]any{"name": "x", "partitons": 2}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics", map[string]any{"name": "x", "semantics": "FANOUT"}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics", map[string]any{"name": "x", "ack_wait": "soon"}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics", "{not json").fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics", "").fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics", map[string]any{}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics", []byte("name=x"), "Content-Type", "application/x-www-form-urlencoded").fails(415, "UNSUPPORTED_MEDIA_TYPE")

	var list TopicList
	r = e.do("GET", "/api/v1/topics", nil).ok(200, &list)
	if list.Total != 3 || len(list.Topics) != 3 || list.Topics[0].Name != "events" || r.header.Get("X-Total-Count") != "3" {
		t.Fatalf("list: %+v", list)
	}
	e.do("GET", "/api/v1/topics?pattern=orders.%23", nil).ok(200, &list)
	if list.Total != 1 || list.Topics[0].Name != "orders.created" {
		t.Fatalf("pattern orders.#: %+v", list)
	}
	e.do("GET", "/api/v1/topics?limit=1&offset=1", nil).ok(200, &list)
	if list.Total != 3 || len(list.Topics) != 1 || list.Topics[0].Name != "orders.created" {
		t.Fatalf("page 2: %+v", list)
	}
	e.do("GET", "/api/v1/topics?offset=9", nil).ok(200, &list)
	if len(list.Topics) != 0 {
		t.Fatalf("past the end: %+v", list)
	}
	e.do("GET", "/api/v1/topics?limit=-1", nil).fails(400, "INVALID_ARGUMENT")
	e.do("GET", "/api/v1/topics?pattern=a..b", nil).fails(400, "INVALID_ARGUMENT")

	// Get with stats after a publish.
	e.do("POST", "/api/v1/topics/orders.created/messages", map[string]any{"payload": "hello"}).ok(201, nil)
	var got Topic
	e.do("GET", "/api/v1/topics/orders.created", nil).ok(200, &got)
	if got.Stats == nil || got.Stats.Messages != 1 || len(got.Stats.Partitions) != 2 || got.Subscriptions != 1 {
		t.Fatalf("get: %+v stats %+v", got, got.Stats)
	}
	e.do("GET", "/api/v1/topics/missing", nil).fails(404, "TOPIC_NOT_FOUND")
	e.do("GET", "/api/v1/topics/a..b", nil).fails(400, "INVALID_ARGUMENT")

	// Update: absent fields keep their values.
	e.do("PUT", "/api/v1/topics/events/config", map[string]any{"max_deliveries": 9}).ok(200, &got)
	if got.Config.MaxDeliveries != 9 || got.Config.Semantics != api.PubSub || time.Duration(got.Config.AckWait) != 1500*time.Millisecond {
		t.Fatalf("update: %+v", got.Config)
	}
	e.do("PUT", "/api/v1/topics/orders.created/config", map[string]any{"partitions": 1}).fails(400, "INVALID_ARGUMENT")
	// 0 is refused as 0 (it used to be read as the default, 1, and refused as "got 1"), also on a
	// one-partition topic where 1 would have passed silently.
	for _, topic := range []string{"orders.created", "events"} {
		if d := e.do("PUT", "/api/v1/topics/"+topic+"/config", map[string]any{"partitions": 0}).fails(400, "INVALID_ARGUMENT"); !strings.Contains(d.Message, "got 0") {
			t.Errorf("partitions 0 on %s: %q", topic, d.Message)
		}
	}
	e.do("PUT", "/api/v1/topics/orders.created/config", map[string]any{"semantics": "PUB_SUB"}).fails(400, "INVALID_ARGUMENT")
	e.do("PUT", "/api/v1/topics/orders.created/config", map[string]any{"max_deliveries": 0, "bogus": 1}).fails(400, "INVALID_ARGUMENT")
	e.do("PUT", "/api/v1/topics/missing/config", map[string]any{"max_deliveries": 3}).fails(404, "TOPIC_NOT_FOUND")
	// queue_to_group outside a change from QUEUE to PUB_SUB is refused, not ignored.
	for topic, body := range map[string]map[string]any{
		"orders.created": {"max_deliveries": 4, "queue_to_group": "legacy"},
		"events":         {"semantics": "PUB_SUB", "queue_to_group": "legacy"},
	} {
		if d := e.do("PUT", "/api/v1/topics/"+topic+"/config", body).fails(400, "INVALID_ARGUMENT"); !strings.Contains(d.Message, "queue_to_group is only for a change from QUEUE to PUB_SUB") {
			t.Errorf("queue_to_group on %s with %v: %q", topic, body, d.Message)
		}
	}
	e.do("PUT", "/api/v1/topics/orders.created/config", map[string]any{"semantics": "PUB_SUB", "queue_to_group": "legacy"}).ok(200, &got)
	if got.Config.Semantics != api.PubSub {
		t.Fatalf("QUEUE to PUB_SUB: %+v", got.Config)
	}
	var g Group
	e.do("GET", "/api/v1/topics/orders.created/groups/legacy", nil).ok(200, &g)
	if g.Pending != 1 || g.State != api.Active {
		t.Fatalf("queue subscription became group legacy: %+v", g)
	}

	// Delete: refused while a live durable subscription exists, unless forced.
	e.do("DELETE", "/api/v1/topics/orders.created", nil).fails(409, "TOPIC_HAS_SUBSCRIPTIONS")
	e.do("DELETE", "/api/v1/topics/orders.created?force=maybe", nil).fails(400, "INVALID_ARGUMENT")
	e.do("DELETE", "/api/v1/topics/orders.created?force=true", nil).ok(204, nil)
	e.do("GET", "/api/v1/topics/orders.created", nil).fails(404, "TOPIC_NOT_FOUND")
	e.do("DELETE", "/api/v1/topics/orders.created", nil).fails(404, "TOPIC_NOT_FOUND")
	e.do("DELETE", "/api/v1/topics/test-topic", nil).ok(204, nil)
}

func TestPublish(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.MaxPublishBodyBytes = 4096 })
	var res PublishResult
	e.do("POST", "/api/v1/topics/auto.created/messages", map[string]any{"payload": "one", "key": "k", "headers": map[string]string{"h": "v"}}).ok(201, &res)
	if len(res.Messages) != 1 || res.Messages[0].ID != "0" || res.Messages[0].Offset != 0 {
		t.Fatalf("single: %+v", res)
	}
	bin := []byte{0xff, 0x00, 0xfe}
	e.do("POST", "/api/v1/topics/auto.created/messages", map[string]any{"messages": []map[string]any{
		{"payload_base64": base64.StdEncoding.EncodeToString(bin)},
		{"payload": "three", "delay": "1h"},
	}}).ok(201, &res)
	if len(res.Messages) != 2 || res.Messages[0].Offset != 1 || res.Messages[1].Offset != 2 {
		t.Fatalf("batch: %+v", res)
	}
	e.do("POST", "/api/v1/topics/auto.created/messages?key=rk", []byte("raw body"), "Content-Type", "application/octet-stream").ok(201, &res)
	if res.Messages[0].Offset != 3 {
		t.Fatalf("raw: %+v", res)
	}

	// Bad input changes nothing.
	e.do("POST", "/api/v1/topics/auto.created/messages", map[string]any{"payload": "a", "payload_base64": "YQ=="}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics/auto.created/messages", map[string]any{"payload_base64": "!!"}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics/auto.created/messages", map[string]any{"messages": []map[string]any{{"payload": "a"}}, "payload": "b"}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics/auto.created/messages", map[string]any{"payload": "a", "partition": 5}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics/auto.created/messages", map[string]any{"payload": "a", "ttl": "-1s"}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics/a..b/messages", map[string]any{"payload": "a"}).fails(400, "INVALID_ARGUMENT")
	// A body without a message publishes nothing (it used to append one empty message).
	if d := e.do("POST", "/api/v1/topics/auto.created/messages", map[string]any{"messages": []any{}}).fails(400, "INVALID_ARGUMENT"); !strings.Contains(d.Message, "messages is empty") {
		t.Errorf("empty messages: %q", d.Message)
	}
	if d := e.do("POST", "/api/v1/topics/auto.created/messages", map[string]any{}).fails(400, "INVALID_ARGUMENT"); !strings.Contains(d.Message, "no message in the body") {
		t.Errorf("empty object: %q", d.Message)
	}
	e.do("POST", "/api/v1/topics/auto.created/messages", map[string]any{"payload": strings.Repeat("x", 5000)}).fails(413, "FRAME_TOO_LARGE")
	e.do("POST", "/api/v1/topics", map[string]any{"name": "small", "max_message_bytes": 10}).ok(201, nil)
	e.do("POST", "/api/v1/topics/small/messages", map[string]any{"payload": strings.Repeat("x", 11)}).fails(413, "MESSAGE_TOO_LARGE")
	e.do("POST", "/api/v1/topics", map[string]any{"name": "blocked", "semantics": "PUB_SUB", "block_writes_on_zero_subscriptions": true}).ok(201, nil)
	e.do("POST", "/api/v1/topics/blocked/messages", map[string]any{"payload": "a"}).fails(409, "NO_SUBSCRIPTIONS")

	var got Topic
	e.do("GET", "/api/v1/topics/auto.created", nil).ok(200, &got)
	if got.Stats.Messages != 4 {
		t.Fatalf("messages after bad publishes: %d, want 4", got.Stats.Messages)
	}

	// What was published comes back intact through a pull (the delayed message is not due).
	msgs := e.pullN("auto.created", "$queue", 3, nil)
	byOffset := make(map[int64]PulledMessage)
	for _, m := range msgs {
		byOffset[m.Offset] = m
	}
	if m := byOffset[0]; m.Payload == nil || *m.Payload != "one" || m.Key == nil || *m.Key != "k" || m.Headers["h"] != "v" || m.Attempt != 1 {
		t.Errorf("message 0: %+v", m)
	}
	if m := byOffset[1]; m.PayloadBase64 == nil || *m.PayloadBase64 != base64.StdEncoding.EncodeToString(bin) || m.Payload != nil {
		t.Errorf("message 1: %+v", m)
	}
	if m := byOffset[3]; m.Payload == nil || *m.Payload != "raw body" || m.Key == nil || *m.Key != "rk" {
		t.Errorf("message 3: %+v", m)
	}
	if _, ok := byOffset[2]; ok {
		t.Error("the delayed message was delivered")
	}
}

func TestPullAckNackExtend(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "jobs", "ack_wait": "1m"}).ok(201, nil)
	for i := range 4 {
		e.do("POST", "/api/v1/topics/jobs/messages", map[string]any{"payload": fmt.Sprintf("job-%d", i)}).ok(201, nil)
	}
	// Nothing ready: an empty answer, at once with wait 0.
	var empty PullResult
	e.do("POST", "/api/v1/topics", map[string]any{"name": "quiet"}).ok(201, nil)
	e.do("POST", "/api/v1/topics/quiet/groups/$queue/pull", map[string]any{"wait": "0s"}).ok(200, &empty)
	if len(empty.Messages) != 0 {
		t.Fatalf("pull from an empty topic: %+v", empty)
	}

	msgs := e.pullN("jobs", "$queue", 4, nil)
	for _, m := range msgs {
		if m.LeaseDeadline.Before(time.Now().Add(30*time.Second)) || m.SubscriptionID == 0 {
			t.Fatalf("lease of %+v", m)
		}
	}
	var ack AckResult
	e.do("POST", "/api/v1/topics/jobs/groups/$queue/ack", map[string]any{"ids": []string{msgs[0].ID}}).ok(200, &ack)
	if ack.Acked == nil || *ack.Acked != 1 {
		t.Fatalf("ack: %+v", ack)
	}
	// Acks are idempotent.
	e.do("POST", "/api/v1/topics/jobs/groups/$queue/ack", map[string]any{"refs": []storage.DeliveryRef{{Partition: 0, Offset: msgs[0].Offset}}}).ok(200, nil)
	var ext ExtendResult
	e.do("POST", "/api/v1/topics/jobs/groups/$queue/extend", map[string]any{"ids": []string{msgs[1].ID}, "duration": "5m"}).ok(200, &ext)
	if ext.LeaseDeadline.Before(time.Now().Add(4 * time.Minute)) {
		t.Fatalf("extend: %+v", ext)
	}
	// Nack at once: redelivered (attempt 2) to the next pull.
	e.do("POST", "/api/v1/topics/jobs/groups/$queue/nack", map[string]any{"ids": []string{msgs[2].ID}}).ok(200, &ack)
	if ack.Nacked == nil || *ack.Nacked != 1 {
		t.Fatalf("nack: %+v", ack)
	}
	again := e.pullN("jobs", "$queue", 1, nil)
	if again[0].Offset != msgs[2].Offset || again[0].Attempt != 2 {
		t.Fatalf("redelivery: %+v", again[0])
	}
	// Nack a message that is not held (acked already): LEASE_NOT_HELD.
	e.do("POST", "/api/v1/topics/jobs/groups/$queue/nack", map[string]any{"ids": []string{msgs[0].ID}}).fails(409, "LEASE_NOT_HELD")
	// Nack to the DLQ with a reason.
	e.do("POST", "/api/v1/topics/jobs/groups/$queue/nack", map[string]any{"ids": []string{msgs[3].ID}, "to_dlq": true, "reason": "bad job"}).ok(200, nil)
	var dlq DLQList
	e.do("GET", "/api/v1/topics/jobs/groups/$queue/dlq", nil).ok(200, &dlq)
	if len(dlq.Entries) != 1 || dlq.Entries[0].LastError != "bad job" || dlq.Entries[0].Reason != storage.DLQRejected ||
		dlq.Entries[0].Message.Offset != msgs[3].Offset {
		t.Fatalf("dlq: %+v", dlq)
	}

	// Bad requests.
	e.do("POST", "/api/v1/topics/jobs/groups/$queue/ack", map[string]any{}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics/jobs/groups/$queue/ack", map[string]any{"ids": []string{"x:y"}}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics/jobs/groups/$queue/ack", map[string]any{"ids": []string{"999"}}).fails(400, "INVALID_ARGUMENT")
	// A ref that names no message fails the ack after the others were acked, as documented.
	if d := e.do("POST", "/api/v1/topics/jobs/groups/$queue/ack", map[string]any{"ids": []string{msgs[1].ID, "999"}}).fails(400, "INVALID_ARGUMENT"); !strings.Contains(d.Message, "1 of 2 refs name no message") {
		t.Errorf("partial ack: %q", d.Message)
	}
	e.do("POST", "/api/v1/topics/jobs/groups/$queue/nack", map[string]any{"ids": []string{msgs[1].ID}}).fails(409, "LEASE_NOT_HELD") // acked
	var doc struct {
		Paths map[string]map[string]struct {
			Description string `json:"description"`
		} `json:"paths"`
	}
	e.do("GET", "/api/v1/openapi.json", nil).ok(200, &doc)
	if desc := doc.Paths["/api/v1/topics/{topic}/groups/{group}/ack"]["post"].Description; !strings.Contains(desc, "400 INVALID_ARGUMENT") || !strings.Contains(desc, "the others are acked") {
		t.Errorf("ack's description does not document the partial ack: %q", desc)
	}
	e.do("POST", "/api/v1/topics/jobs/groups/$queue/nack", map[string]any{"ids": []string{"1"}, "delay": "-1s"}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics/jobs/groups/$queue/pull", map[string]any{"max": 0, "wait": "1h"}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics/jobs/groups/$queue/pull", map[string]any{"max": 100000}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics/missing/groups/$queue/pull", nil).fails(404, "TOPIC_NOT_FOUND")
	e.do("POST", "/api/v1/topics", map[string]any{"name": "fan", "semantics": "PUB_SUB"}).ok(201, nil)
	e.do("POST", "/api/v1/topics/fan/groups/$queue/pull", nil).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics/fan/groups/bad%20group/pull", nil).fails(400, "INVALID_ARGUMENT")
}

// TestAckOtherSubscriptionRefused: the permission checked is the URL's topic and group, so an ack,
// nack or extend naming the subscription of another group (here another topic's) is refused and
// settles nothing there.
func TestAckOtherSubscriptionRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for _, name := range []string{"open", "billing"} {
		e.do("POST", "/api/v1/topics", map[string]any{"name": name, "ack_wait": "1m"}).ok(201, nil)
	}
	e.do("POST", "/api/v1/topics/open/messages", map[string]any{"payload": "o"}).ok(201, nil)
	e.do("POST", "/api/v1/topics/billing/messages", map[string]any{"payload": "b"}).ok(201, nil)
	mine := e.pullN("open", "$queue", 1, nil)[0]
	theirs := e.pullN("billing", "$queue", 1, nil)[0]
	if mine.SubscriptionID == theirs.SubscriptionID {
		t.Fatalf("both topics have subscription %d", mine.SubscriptionID)
	}
	for _, op := range []string{"ack", "nack", "extend"} {
		e.do("POST", "/api/v1/topics/open/groups/$queue/"+op, map[string]any{"subscription_id": theirs.SubscriptionID,
			"ids": []string{theirs.ID}, "duration": "1m"}).fails(400, "INVALID_ARGUMENT")
	}
	// billing's message is still leased to its own pull session: its nack settles it.
	var res AckResult
	e.do("POST", "/api/v1/topics/billing/groups/$queue/nack", map[string]any{"ids": []string{theirs.ID}}).ok(200, &res)
	if res.Nacked == nil || *res.Nacked != 1 {
		t.Fatalf("nack of billing's message: %+v", res)
	}
	// The right subscription id is still taken.
	e.do("POST", "/api/v1/topics/open/groups/$queue/ack", map[string]any{"subscription_id": mine.SubscriptionID,
		"ids": []string{mine.ID}}).ok(200, &res)
	if res.Acked == nil || *res.Acked != 1 {
		t.Fatalf("ack with the group's subscription id: %+v", res)
	}
}

func TestPullSessionCloses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.PullIdleTimeout = 50 * time.Millisecond })
	e.do("POST", "/api/v1/topics/work/messages", map[string]any{"payload": "w"}).ok(201, nil)
	msgs := e.pullN("work", "$queue", 1, nil)
	pullMembers := func() int {
		n := 0
		for _, m := range e.b.Members() {
			if strings.HasPrefix(m.ID, "http-pull-") {
				n++
			}
		}
		return n
	}
	if pullMembers() != 1 {
		t.Fatalf("pull members: %d", pullMembers())
	}
	e.do("POST", "/api/v1/topics/work/groups/$queue/ack", map[string]any{"ids": []string{msgs[0].ID}}).ok(200, nil)
	// Idle and nothing handed out: the session ends and its member leaves.
	waitFor(t, "pull session closes", func() error {
		if n := pullMembers(); n != 0 {
			return fmt.Errorf("%d pull members", n)
		}
		return nil
	})
	var g Group
	e.do("GET", "/api/v1/topics/work/groups/$queue", nil).ok(200, &g)
	if g.Pending != 0 {
		t.Fatalf("pending after ack: %+v", g)
	}

	// Handler.Close ends the sessions: later pulls are CLOSED, the rest of the API works.
	e.do("POST", "/api/v1/topics/work/messages", map[string]any{"payload": "w2"}).ok(201, nil)
	e.pullN("work", "$queue", 1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := e.h.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := pullMembers(); n != 0 {
		t.Fatalf("%d pull members after Close", n)
	}
	e.do("POST", "/api/v1/topics/work/groups/$queue/pull", nil).fails(503, "CLOSED")
	// The released message is pending again, not lost.
	e.do("GET", "/api/v1/topics/work/groups/$queue", nil).ok(200, &g)
	if g.Pending != 1 || g.InFlight != 0 {
		t.Fatalf("after Close: %+v", g)
	}
}

func TestGroupsAndDLQ(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "events", "semantics": "PUB_SUB"}).ok(201, nil)
	e.do("GET", "/api/v1/topics/events/groups/billing", nil).fails(404, "SUBSCRIPTION_NOT_FOUND")
	var gl GroupList
	e.do("GET", "/api/v1/topics/events/groups", nil).ok(200, &gl)
	if len(gl.Groups) != 0 {
		t.Fatalf("groups of a new topic: %+v", gl)
	}
	e.do("GET", "/api/v1/topics/missing/groups", nil).fails(404, "TOPIC_NOT_FOUND")

	for i := range 3 {
		e.do("POST", "/api/v1/topics/events/messages", map[string]any{"payload": fmt.Sprintf("e%d", i)}).ok(201, nil)
	}
	// The first pull creates billing's subscription at FROM_BEGINNING.
	msgs := e.pullN("events", "billing", 3, map[string]any{"start": map[string]any{"kind": "FROM_BEGINNING"}})
	// A member connected through the broker (a TCP client) joins billing too.
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	m, err := e.b.Subscribe(ctx, broker.SubscribeParams{Pattern: "events", Group: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(ctx)

	var g Group
	e.do("GET", "/api/v1/topics/events/groups/billing", nil).ok(200, &g)
	if g.State != api.Active || g.MemberCount != 2 || len(g.Members) != 2 || g.Pending != 3 || g.InFlight != 3 || g.Lag != 0 ||
		g.SubscriptionID == 0 || len(g.Partitions) != 1 {
		t.Fatalf("billing: %+v", g)
	}
	e.do("GET", "/api/v1/groups?topic=events&state=ACTIVE", nil).ok(200, &gl)
	if len(gl.Groups) != 1 || gl.Groups[0].Group != "billing" {
		t.Fatalf("filtered groups: %+v", gl)
	}
	e.do("GET", "/api/v1/groups?state=PAUSED", nil).ok(200, &gl)
	if len(gl.Groups) != 0 {
		t.Fatalf("PAUSED groups: %+v", gl)
	}
	e.do("GET", "/api/v1/groups?state=SLEEPY", nil).fails(400, "INVALID_ARGUMENT")
	var ml MemberList
	e.do("GET", "/api/v1/members", nil).ok(200, &ml)
	if len(ml.Members) != 2 {
		t.Fatalf("members: %+v", ml)
	}
	// From here on the pull session is billing's only member.
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// Dead-letter two messages.
	for _, msg := range msgs[:2] {
		e.do("POST", "/api/v1/topics/events/groups/billing/nack", map[string]any{"ids": []string{msg.ID}, "to_dlq": true, "reason": "poison"}).ok(200, nil)
	}
	var dlq DLQList
	e.do("GET", "/api/v1/topics/events/groups/billing/dlq?limit=1", nil).ok(200, &dlq)
	if len(dlq.Entries) != 1 || dlq.NextAfterID == nil {
		t.Fatalf("dlq page 1: %+v", dlq)
	}
	first := dlq.Entries[0]
	after := *dlq.NextAfterID
	dlq = DLQList{}
	e.do("GET", fmt.Sprintf("/api/v1/topics/events/groups/billing/dlq?after_id=%d&limit=5", after), nil).ok(200, &dlq)
	if len(dlq.Entries) != 1 || dlq.NextAfterID != nil || dlq.Entries[0].ID <= first.ID {
		t.Fatalf("dlq page 2: %+v", dlq)
	}
	second := dlq.Entries[0]
	var entry DLQEntry
	e.do("GET", fmt.Sprintf("/api/v1/topics/events/groups/billing/dlq/%d", first.ID), nil).ok(200, &entry)
	if entry.ID != first.ID || entry.Message.Payload == nil || entry.Attempts != 1 || entry.LastError != "poison" {
		t.Fatalf("dlq entry: %+v", entry)
	}
	// payload=false: the same entries without their payloads, with their sizes.
	var light DLQList
	e.do("GET", "/api/v1/topics/events/groups/billing/dlq?payload=false", nil).ok(200, &light)
	if len(light.Entries) != 2 || light.Entries[0].ID != first.ID {
		t.Fatalf("dlq without payloads: %+v", light)
	}
	for _, le := range light.Entries {
		if m := le.Message; m.Payload != nil || m.PayloadBase64 != nil || m.PayloadBytes == nil {
			t.Fatalf("dlq entry with payload=false: %+v", le)
		}
	}
	if got, want := *light.Entries[0].Message.PayloadBytes, len(*entry.Message.Payload); got != want {
		t.Errorf("payload_bytes %d, want %d", got, want)
	}
	if raw := e.do("GET", "/api/v1/topics/events/groups/billing/dlq?payload=false", nil).body; bytes.Contains(raw, []byte(`"payload"`)) {
		t.Errorf("payload=false answer has payloads: %s", raw)
	}
	var full DLQList
	e.do("GET", "/api/v1/topics/events/groups/billing/dlq?payload=true", nil).ok(200, &full)
	if len(full.Entries) != 2 || full.Entries[0].Message.Payload == nil || full.Entries[0].Message.PayloadBytes != nil {
		t.Fatalf("dlq with payload=true: %+v", full)
	}
	e.do("GET", "/api/v1/topics/events/groups/billing/dlq?payload=maybe", nil).fails(400, "INVALID_ARGUMENT")
	e.do("GET", "/api/v1/topics/events/groups/billing/dlq/999", nil).fails(404, "NOT_FOUND")
	e.do("GET", "/api/v1/topics/events/groups/billing/dlq/x", nil).fails(400, "INVALID_ARGUMENT")
	e.do("GET", "/api/v1/topics/events/groups/nobody/dlq", nil).fails(404, "SUBSCRIPTION_NOT_FOUND")

	// Replay the first to billing only: it comes back with a fresh attempt count.
	e.do("POST", "/api/v1/topics/events/groups/billing/dlq/replay", map[string]any{}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/api/v1/topics/events/groups/billing/dlq/replay", map[string]any{"ids": []int64{1}, "all": true}).fails(400, "INVALID_ARGUMENT")
	var res DLQResult
	e.do("POST", "/api/v1/topics/events/groups/billing/dlq/replay", map[string]any{"ids": []int64{first.ID}}).ok(200, &res)
	if res.Replayed == nil || *res.Replayed != 1 {
		t.Fatalf("replay: %+v", res)
	}
	again := e.pullN("events", "billing", 1, nil)
	if again[0].Offset != first.Message.Offset || again[0].Attempt != 1 {
		t.Fatalf("replayed delivery: %+v", again[0])
	}
	e.do("POST", "/api/v1/topics/events/groups/billing/dlq/purge", map[string]any{"all": true}).ok(200, &res)
	if res.Purged == nil || *res.Purged != 1 {
		t.Fatalf("purge: %+v (second entry %d)", res, second.ID)
	}

	// Pause, resume, cancel, with the transitions seed 000 allows.
	e.do("POST", "/api/v1/topics/events/groups/billing/pause", nil).ok(200, &g)
	if g.State != api.Paused {
		t.Fatalf("pause: %+v", g)
	}
	e.do("POST", "/api/v1/topics/events/groups/billing/pause", nil).fails(409, "INVALID_TRANSITION")
	e.do("POST", "/api/v1/topics/events/groups/billing/resume", nil).ok(200, &g)
	if g.State != api.Active {
		t.Fatalf("resume: %+v", g)
	}
	e.do("POST", "/api/v1/topics/events/groups/billing/cancel", nil).ok(200, &g)
	if g.State != api.Cancelled {
		t.Fatalf("cancel: %+v", g)
	}
	e.do("POST", "/api/v1/topics/events/groups/billing/resume", nil).fails(409, "INVALID_TRANSITION")
	e.do("POST", "/api/v1/topics/events/groups/nobody/pause", nil).fails(404, "SUBSCRIPTION_NOT_FOUND")
	e.do("POST", "/api/v1/topics/events/groups/bad%20name/pause", nil).fails(400, "INVALID_ARGUMENT")
}

func TestBindings(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for _, p := range []string{"orders.*", "audit.#"} {
		m, err := e.b.Subscribe(ctx, broker.SubscribeParams{Pattern: p, Group: "audit"})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close(ctx)
	}
	var bl BindingList
	e.do("GET", "/api/v1/bindings", nil).ok(200, &bl)
	if len(bl.Bindings) != 2 || bl.Bindings[0].Group != "audit" {
		t.Fatalf("bindings: %+v", bl)
	}
	e.do("DELETE", "/api/v1/bindings/audit/audit.%23", nil).ok(204, nil)
	e.do("DELETE", "/api/v1/bindings/audit/orders.*", nil).ok(204, nil)
	e.do("DELETE", "/api/v1/bindings/audit/orders.*", nil).fails(404, "BINDING_NOT_FOUND")
	e.do("DELETE", "/api/v1/bindings/audit/orders..x", nil).fails(400, "INVALID_ARGUMENT")
	e.do("GET", "/api/v1/bindings", nil).ok(200, &bl)
	if len(bl.Bindings) != 0 {
		t.Fatalf("bindings after delete: %+v", bl)
	}
}

func TestSeedPaths(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	e.do("POST", "/api/v1/topics", map[string]any{"name": "orders", "semantics": "PUB_SUB"}).ok(201, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "jobs"}).ok(201, nil)
	var members []*broker.Member
	for _, g := range []string{"billing", "billing", "audit"} {
		m, err := e.b.Subscribe(ctx, broker.SubscribeParams{Pattern: "orders", Group: g})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close(ctx)
		members = append(members, m)
	}
	for i := range 2 {
		e.do("POST", "/api/v1/topics/orders/messages", map[string]any{"payload": fmt.Sprintf("o%d", i)}).ok(201, nil)
		e.do("POST", "/api/v1/topics/jobs/messages", map[string]any{"payload": fmt.Sprintf("j%d", i)}).ok(201, nil)
	}

	// M4-2: topics with subscriber counts (raw JSON shape).
	var raw map[string][]map[string]any
	e.do("GET", "/admin/topics", nil).ok(200, &raw)
	if len(raw["topics"]) != 2 {
		t.Fatalf("/admin/topics: %v", raw)
	}
	byName := make(map[string]map[string]any)
	for _, tp := range raw["topics"] {
		byName[tp["name"].(string)] = tp
	}
	if o := byName["orders"]; o["subscribers"] != 3.0 || o["subscriptions"] != 2.0 || o["messages"] != 2.0 || o["semantics"] != "PUB_SUB" {
		t.Errorf("orders: %v", o)
	}
	if j := byName["jobs"]; j["subscribers"] != 0.0 || j["subscriptions"] != 1.0 || j["queue_depth"] != 2.0 {
		t.Errorf("jobs: %v", j)
	}

	// M4-3: groups with member counts.
	e.do("GET", "/admin/groups", nil).ok(200, &raw)
	counts := make(map[string]any)
	for _, g := range raw["groups"] {
		counts[g["topic"].(string)+"/"+g["group"].(string)] = g["members"]
		if _, ok := g["consumers"].([]any); !ok {
			t.Errorf("group without consumers list: %v", g)
		}
	}
	want := map[string]any{"orders/billing": 2.0, "orders/audit": 1.0, "jobs/$queue": 0.0}
	for k, v := range want {
		if counts[k] != v {
			t.Errorf("/admin/groups %s members = %v, want %v (all %v)", k, counts[k], v, counts)
		}
	}

	// M4-6: replay. Dead-letter one message of audit and one of jobs' queue subscription.
	d := <-members[2].Deliveries()
	if err := members[2].Nack(ctx, d.SubscriptionID, []storage.DeliveryRef{d.Ref()}, broker.NackOptions{ToDLQ: true}); err != nil {
		t.Fatal(err)
	}
	jobs := e.pullN("jobs", "$queue", 1, nil)
	e.do("POST", "/api/v1/topics/jobs/groups/$queue/nack", map[string]any{"ids": []string{jobs[0].ID}, "to_dlq": true}).ok(200, nil)
	var dl DLQList
	e.do("GET", "/api/v1/topics/orders/groups/audit/dlq", nil).ok(200, &dl)
	auditEntry := dl.Entries[0].ID
	e.do("GET", "/api/v1/topics/jobs/groups/$queue/dlq", nil).ok(200, &dl)
	jobsEntry := dl.Entries[0].ID

	var rr SeedReplayResult
	// The seed's shape on a QUEUE topic: the queue subscription.
	e.do("POST", "/admin/dlq/replay", map[string]any{"message_id": fmt.Sprintf("dlq-%d", jobsEntry), "target_topic": "jobs"}).ok(200, &rr)
	if rr.Replayed != 1 || rr.Group != storage.QueueGroup || rr.Topic != "jobs" {
		t.Fatalf("seed replay on jobs: %+v", rr)
	}
	// The seed's shape on a PUB_SUB topic: the one group whose DLQ has that id.
	e.do("POST", "/admin/dlq/replay", map[string]any{"message_id": fmt.Sprint(auditEntry), "target_topic": "orders"}).ok(200, &rr)
	if rr.Replayed != 1 || rr.Group != "audit" {
		t.Fatalf("seed replay on orders: %+v", rr)
	}
	for replayed := range members[2].Deliveries() {
		if replayed.Offset == d.Offset {
			if replayed.Attempt != 1 {
				t.Fatalf("replayed to audit: %+v", replayed)
			}
			break
		}
	}
	// Spool's shape.
	e.do("POST", "/admin/dlq/replay", map[string]any{"topic": "orders", "group": "audit", "all": true}).ok(200, &rr)
	if rr.Replayed != 0 {
		t.Fatalf("replay of an empty DLQ: %+v", rr)
	}
	e.do("POST", "/admin/dlq/replay", map[string]any{"message_id": "dlq-99", "target_topic": "orders"}).fails(404, "NOT_FOUND")
	e.do("POST", "/admin/dlq/replay", map[string]any{"message_id": "nope", "target_topic": "orders"}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/admin/dlq/replay", map[string]any{"message_id": "1"}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/admin/dlq/replay", map[string]any{"topic": "orders", "all": true}).fails(400, "INVALID_ARGUMENT")
	e.do("POST", "/admin/dlq/replay", map[string]any{"topic": "missing", "ids": []int{1}}).fails(404, "TOPIC_NOT_FOUND")
}

func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "orders", "semantics": "PUB_SUB"}).ok(201, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	m, err := e.b.Subscribe(ctx, broker.SubscribeParams{Pattern: "orders", Group: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(ctx)
	for i := range 3 {
		e.do("POST", "/api/v1/topics/orders/messages", map[string]any{"payload": fmt.Sprintf("o%d", i)}).ok(201, nil)
	}
	r := e.do("GET", "/metrics", nil).ok(200, nil)
	text := string(r.body)
	for _, want := range []string{
		`queue_depth{topic="orders"} 3`,
		`consumer_lag{group="billing",topic="orders"}`,
		`message_throughput{topic="orders"} 3`,
		`spool_subscription_pending{group="billing",topic="orders"} 3`,
		`spool_topic_messages{topic="orders"} 3`,
		`spool_messages_published_total{topic="orders"} 3`,
		`spool_http_requests_total{code="201",route="POST /api/v1/topics/{topic}/messages"} 3`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", text)
	}

	e2 := newEnv(t, func(c *Config) { c.Gatherer = nil })
	e2.do("GET", "/metrics", nil).fails(404, "NOT_FOUND")
}

func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	var doc struct {
		OpenAPI string                               `json:"openapi"`
		Paths   map[string]map[string]map[string]any `json:"paths"`
		Comps   struct {
			Schemas map[string]any `json:"schemas"`
		} `json:"components"`
	}
	r := e.do("GET", "/api/v1/openapi.json", nil).ok(200, &doc)
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi version %q", doc.OpenAPI)
	}
	var documented []string
	for path, item := range doc.Paths {
		for method, op := range item {
			documented = append(documented, strings.ToUpper(method)+" "+path)
			if op["summary"] == "" || op["operationId"] == "" || op["responses"] == nil {
				t.Errorf("%s %s: incomplete operation %v", method, path, op)
			}
			// Every request can be refused for its Host (authentication off, DNS rebinding).
			if resp, _ := op["responses"].(map[string]any); resp["421"] == nil {
				t.Errorf("%s %s: no 421 response", method, path)
			}
			// Every path parameter is declared.
			declared := map[string]bool{}
			params, _ := op["parameters"].([]any)
			for _, p := range params {
				pm := p.(map[string]any)
				if pm["in"] == "path" {
					declared[pm["name"].(string)] = true
				}
			}
			for _, name := range pathParams(path) {
				if !declared[name] {
					t.Errorf("%s %s: path parameter %s not declared", method, path, name)
				}
			}
		}
	}
	routes := e.h.Routes()
	slices.Sort(documented)
	sorted := slices.Sorted(slices.Values(routes))
	if !slices.Equal(documented, sorted) {
		t.Errorf("documented routes differ from registered routes:\ndocumented %v\nregistered %v", documented, sorted)
	}
	// Every registered route is served by the mux under its own pattern.
	for _, rt := range routes {
		method, path, _ := strings.Cut(rt, " ")
		concrete := path
		for _, p := range pathParams(path) {
			concrete = strings.Replace(concrete, "{"+p+"}", "x", 1)
		}
		req, err := http.NewRequest(method, concrete, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, pattern := e.h.mux.Handler(req); pattern != rt {
			t.Errorf("%s %s is served by %q, want %q", method, concrete, pattern, rt)
		}
	}
	// Every $ref resolves.
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if ref, ok := x["$ref"].(string); ok {
				name := strings.TrimPrefix(ref, "#/components/schemas/")
				if _, ok := doc.Comps.Schemas[name]; !ok {
					t.Errorf("unresolved $ref %s", ref)
				}
			}
			for _, c := range x {
				walk(c)
			}
		case []any:
			for _, c := range x {
				walk(c)
			}
		}
	}
	var all any
	if err := json.Unmarshal(r.body, &all); err != nil {
		t.Fatal(err)
	}
	walk(all)
	// A few schemas have the fields the handlers write.
	topic := doc.Comps.Schemas["Topic"].(map[string]any)["properties"].(map[string]any)
	for _, f := range []string{"name", "config", "stats", "subscriptions"} {
		if _, ok := topic[f]; !ok {
			t.Errorf("schema Topic lacks %s", f)
		}
	}
	pub := doc.Comps.Schemas["PublishRequest"].(map[string]any)["properties"].(map[string]any)
	for _, f := range []string{"messages", "payload", "payload_base64", "key"} {
		if _, ok := pub[f]; !ok {
			t.Errorf("schema PublishRequest lacks %s", f)
		}
	}
}

func TestRequestBodyLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.MaxBodyBytes = 64 })
	e.do("POST", "/api/v1/topics", map[string]any{"name": "t", "semantics": strings.Repeat("Q", 100)}).fails(413, "FRAME_TOO_LARGE")
	// Publishes have their own, larger limit.
	e.do("POST", "/api/v1/topics/t/messages", map[string]any{"payload": strings.Repeat("x", 100)}).ok(201, nil)
}

func TestDurationJSON(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{`"30s"`: 30 * time.Second, `1500`: 1500 * time.Millisecond, `"1h30m"`: 90 * time.Minute} {
		var d Duration
		if err := json.Unmarshal([]byte(in), &d); err != nil || time.Duration(d) != want {
			t.Errorf("Unmarshal(%s) = %v, %v; want %v", in, time.Duration(d), err, want)
		}
	}
	for _, in := range []string{`"soon"`, `true`, `{}`} {
		var d Duration
		if err := json.Unmarshal([]byte(in), &d); err == nil {
			t.Errorf("Unmarshal(%s) succeeded", in)
		}
	}
	out, err := json.Marshal(Duration(90 * time.Second))
	if err != nil || string(out) != `"1m30s"` {
		t.Errorf("Marshal = %s, %v", out, err)
	}
}

func TestStatusForEveryProtocolCode(t *testing.T) {
	t.Parallel()
	// Request-content and state errors are 4xx and not retryable; availability errors are 5xx or
	// 429 and retryable: the HTTP status agrees with the table's retry flag.
	for _, pe := range protocol.Errors() {
		s := statusForCode(pe.Code)
		if pe.Retryable != (s >= 500 || s == http.StatusTooManyRequests) {
			t.Errorf("%s (retryable %v) maps to %d", pe.Name, pe.Retryable, s)
		}
	}
}

// TestPullClaimsOnDemand: the pull session claims what pulls ask for, not more, so messages no
// HTTP consumer asked for stay available to the group's other members.
func TestPullClaimsOnDemand(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "work"}).ok(201, nil)
	for i := range 5 {
		e.do("POST", "/api/v1/topics/work/messages", map[string]any{"payload": fmt.Sprintf("w%d", i)}).ok(201, nil)
	}
	msgs := e.pullN("work", "$queue", 2, nil)
	if len(msgs) != 2 {
		t.Fatalf("pulled %d", len(msgs))
	}
	var g Group
	e.do("GET", "/api/v1/topics/work/groups/$queue", nil).ok(200, &g)
	if g.InFlight != 2 || g.Pending != 5 {
		t.Fatalf("after pulling 2: in_flight %d pending %d, want 2 and 5", g.InFlight, g.Pending)
	}
	// A member connected through the broker gets the other three.
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	m, err := e.b.Subscribe(ctx, broker.SubscribeParams{Pattern: "work"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(ctx)
	for range 3 {
		select {
		case d := <-m.Deliveries():
			if err := m.Ack(ctx, d.SubscriptionID, d.Ref()); err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatal("the broker member did not get the messages the pull session did not ask for")
		}
	}
	// Acks work without the lease holder (by subscription id too).
	e.do("POST", "/api/v1/topics/work/groups/$queue/ack", map[string]any{"subscription_id": msgs[0].SubscriptionID,
		"ids": []string{msgs[0].ID, msgs[1].ID}}).ok(200, nil)
	e.do("GET", "/api/v1/topics/work/groups/$queue", nil).ok(200, &g)
	if g.Pending != 0 {
		t.Fatalf("pending %d after acking everything", g.Pending)
	}
}

// TestPullLeases runs on the wall clock (leases are the engine's, which uses the system clock):
// a handed-out lease that is not settled expires and the message is redelivered with attempt 2,
// while a message waiting in the session's buffer has its lease kept alive and costs no attempt.
func TestPullLeases(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	const ackWait = time.Second
	e.do("POST", "/api/v1/topics", map[string]any{"name": "slow", "ack_wait": ackWait.String()}).ok(201, nil)
	e.do("POST", "/api/v1/topics/slow/messages", map[string]any{"messages": []map[string]any{{"payload": "a"}, {"payload": "b"}}}).ok(201, nil)

	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	s, err := e.h.pulls.acquire(ctx, "slow", storage.QueueGroup, "", storage.StartPosition{}, 2)
	if err != nil {
		t.Fatal(err)
	}
	var got []*storage.Delivery
	for len(got) < 2 {
		ds, err := s.pull(ctx, 2-len(got), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ds...)
	}
	s.release()
	// Keep "b" in the session as if no pull had taken it yet; "a" stays handed out.
	a, b := got[0], got[1]
	if string(a.Payload) != "a" {
		a, b = b, a
	}
	s.forget(b.SubscriptionID, []storage.DeliveryRef{b.Ref()})
	s.putBack([]*storage.Delivery{b})

	// Wait until the session has kept b's lease alive for three lease periods past its original
	// deadline (its housekeeping extends it to a full ack_wait whenever half is gone); a's lease
	// expired meanwhile.
	orig := b.LeaseDeadline
	waitFor(t, "buffered lease kept alive", func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, d := range s.buf {
			if keyOf(d) == keyOf(b) {
				if d.LeaseDeadline.Before(orig.Add(3 * ackWait)) {
					return fmt.Errorf("lease of the buffered message ends %v after its original deadline", d.LeaseDeadline.Sub(orig))
				}
				return nil
			}
		}
		return fmt.Errorf("the buffered message left the session's buffer")
	})

	var pr PullResult
	byPayload := make(map[string]PulledMessage)
	deadline := time.Now().Add(waitTimeout)
	for len(byPayload) < 2 && time.Now().Before(deadline) {
		e.do("POST", "/api/v1/topics/slow/groups/$queue/pull", map[string]any{"max": 2, "wait": "2s"}).ok(200, &pr)
		for _, m := range pr.Messages {
			byPayload[*m.Payload] = m
		}
	}
	if m, ok := byPayload["b"]; !ok || m.Attempt != 1 {
		t.Errorf("buffered message: %+v (present %v), want attempt 1", m, ok)
	}
	if m, ok := byPayload["a"]; !ok || m.Attempt != 2 {
		t.Errorf("expired handed-out message: %+v (present %v), want attempt 2", m, ok)
	}
}

// TestZombieTTLSetting: a zombie_ttl under 1s or above max_retention is refused (nothing is
// created); a valid one is stored and shown.
func TestZombieTTLSetting(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for _, body := range []map[string]any{
		{"name": "x", "zombie_ttl": "500ms"},
		{"name": "x", "zombie_ttl": "72h", "max_retention": "48h"},
	} {
		d := e.do("POST", "/api/v1/topics", body).fails(400, "INVALID_ARGUMENT")
		if !strings.Contains(d.Message, "zombie_ttl") {
			t.Errorf("%v: message %q", body, d.Message)
		}
	}
	e.do("GET", "/api/v1/topics/x", nil).fails(404, "TOPIC_NOT_FOUND")
	r := e.do("POST", "/api/v1/topics", map[string]any{"name": "x", "completion_tracking": "watermark"}).ok(201, nil)
	if !strings.Contains(string(r.body), `"zombie_ttl":"168h0m0s"`) {
		t.Errorf("create response does not show the default zombie_ttl: %s", r.body)
	}
	e.do("PUT", "/api/v1/topics/x/config", map[string]any{"zombie_ttl": "1h"}).ok(200, nil)
	r = e.do("GET", "/api/v1/topics/x", nil).ok(200, nil)
	if !strings.Contains(string(r.body), `"zombie_ttl":"1h0m0s"`) || !strings.Contains(string(r.body), `"completion_tracking":"watermark"`) {
		t.Errorf("topic: %s", r.body)
	}
}

// TestSizeBoundSettings: max_messages, max_bytes and size_policy are validated, stored, shown
// and changed by an update; a topic above its bound whose messages its queue still needs says so
// (size_bound_exceeded).
func TestSizeBoundSettings(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for _, body := range []map[string]any{
		{"name": "s", "max_messages": -1},
		{"name": "s", "max_bytes": -1},
		{"name": "s", "max_bytes": 1000, "size_policy": "newest"},
	} {
		e.do("POST", "/api/v1/topics", body).fails(400, "INVALID_ARGUMENT")
	}
	e.do("GET", "/api/v1/topics/s", nil).fails(404, "TOPIC_NOT_FOUND")
	var tp Topic
	e.do("POST", "/api/v1/topics", map[string]any{"name": "s", "max_messages": 2, "size_policy": "keep_needed"}).ok(201, &tp)
	if tp.Config.MaxMessages != 2 || tp.Config.SizePolicy != api.SizeKeepNeeded || tp.SizeBoundExceeded {
		t.Fatalf("created: %+v", tp)
	}
	for range 3 {
		e.do("POST", "/api/v1/topics/s/messages", map[string]any{"payload": "x"}).ok(201, nil)
	}
	e.do("GET", "/api/v1/topics/s", nil).ok(200, &tp)
	if !tp.SizeBoundExceeded || tp.Stats.Messages != 3 {
		t.Fatalf("3 messages the queue needs, max_messages 2: %+v", tp)
	}
	tp = Topic{}
	e.do("PUT", "/api/v1/topics/s/config", map[string]any{"max_messages": 0, "max_bytes": 1 << 20, "size_policy": "drop_oldest"}).ok(200, &tp)
	if tp.Config.MaxMessages != 0 || tp.Config.MaxBytes != 1<<20 || tp.Config.SizePolicy != api.SizeDropOldest || tp.SizeBoundExceeded {
		t.Fatalf("updated: %+v", tp)
	}
}

// TestPublishProducerID: a second HTTP publish with the same producer_id is not stored and answers
// the first message's position with duplicate=true; dedup_window is a topic setting.
func TestPublishProducerID(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "orders", "dedup_window": "10m"}).ok(201, nil)
	var tp Topic
	e.do("GET", "/api/v1/topics/orders", nil).ok(200, &tp)
	if tp.Config.DedupWindow != Duration(10*time.Minute) {
		t.Fatalf("dedup_window: %+v", tp.Config)
	}
	var first, second PublishResult
	e.do("POST", "/api/v1/topics/orders/messages", map[string]any{"producer_id": "order-1001", "payload": "x"}).ok(201, &first)
	e.do("POST", "/api/v1/topics/orders/messages", map[string]any{"producer_id": "order-1001", "payload": "x"}).ok(201, &second)
	if first.Messages[0].Duplicate || !second.Messages[0].Duplicate || second.Messages[0].Offset != first.Messages[0].Offset ||
		second.Messages[0].ID != first.Messages[0].ID {
		t.Fatalf("first %+v, second %+v: want the second to be the first's duplicate", first, second)
	}
	e.do("GET", "/api/v1/topics/orders", nil).ok(200, &tp)
	if tp.Stats.Messages != 1 {
		t.Fatalf("messages stored: %d, want 1", tp.Stats.Messages)
	}
	e.do("POST", "/api/v1/topics", map[string]any{"name": "bad", "dedup_window": "48h"}).fails(400, "INVALID_ARGUMENT")
}

// TestPullFilter: a pull with a filter gets only the messages it matches (a session per filter);
// what no session's filter matches is completed for the group; nack names the filter to find the
// session holding the lease; a bad filter is INVALID_ARGUMENT with its position.
func TestPullFilter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "ev", "semantics": "PUB_SUB"}).ok(201, nil)
	if pe := e.do("POST", "/api/v1/topics/ev/groups/g/pull", map[string]any{"filter": "region in (eu", "wait": "0s"}).fails(400, "INVALID_ARGUMENT"); !strings.Contains(pe.Message, "at byte 13") {
		t.Fatalf("error without the position: %q", pe.Message)
	}
	// Join first (FROM_NOW), then publish.
	e.do("POST", "/api/v1/topics/ev/groups/g/pull", map[string]any{"filter": "region=eu", "wait": "0s"}).ok(200, nil)
	for _, r := range []string{"us", "eu", "ap", "eu"} {
		e.do("POST", "/api/v1/topics/ev/messages", map[string]any{"payload": r, "headers": map[string]string{"region": r}}).ok(201, nil)
	}
	got := e.pullN("ev", "g", 2, map[string]any{"filter": "region=eu"})
	for _, m := range got {
		if m.Headers["region"] != "eu" {
			t.Fatalf("filtered pull got %+v", m)
		}
	}
	// The session is (topic, group, filter): a nack without the filter finds none.
	e.do("POST", "/api/v1/topics/ev/groups/g/nack", map[string]any{"ids": []string{got[0].ID}}).fails(409, "LEASE_NOT_HELD")
	e.do("POST", "/api/v1/topics/ev/groups/g/nack", map[string]any{"ids": []string{got[0].ID}, "filter": "region=eu"}).ok(200, nil)
	again := e.pullN("ev", "g", 1, map[string]any{"filter": "region=eu"})
	if again[0].ID != got[0].ID || again[0].Attempt != 2 {
		t.Fatalf("redelivery after the nack: %+v", again[0])
	}
	e.do("POST", "/api/v1/topics/ev/groups/g/ack", map[string]any{"ids": []string{got[1].ID, again[0].ID}}).ok(200, nil)
	waitFor(t, "us and ap completed as filtered", func() error {
		var g Group
		e.do("GET", "/api/v1/topics/ev/groups/g", nil).ok(200, &g)
		if g.Pending != 0 {
			return fmt.Errorf("pending %d", g.Pending)
		}
		return nil
	})
}

// TestPullSessionsBounded: a pull that needs a session past MaxPullSessions (each filter makes
// one) gets LIMIT_EXCEEDED and leaves no member; existing sessions keep serving.
func TestPullSessionsBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.MaxPullSessions = 2 })
	e.do("POST", "/api/v1/topics", map[string]any{"name": "ps", "semantics": "PUB_SUB"}).ok(201, nil)
	e.do("POST", "/api/v1/topics/ps/groups/g/pull", map[string]any{"filter": "region=eu", "wait": "0s"}).ok(200, nil)
	e.do("POST", "/api/v1/topics/ps/groups/g/pull", map[string]any{"filter": "region=us", "wait": "0s"}).ok(200, nil)
	members := len(e.b.Members())
	if pe := e.do("POST", "/api/v1/topics/ps/groups/g/pull", map[string]any{"filter": "region=ap", "wait": "0s"}).fails(409, "LIMIT_EXCEEDED"); !strings.Contains(pe.Message, "2 pull sessions are open") {
		t.Fatalf("error %q", pe.Message)
	}
	if n := len(e.b.Members()); n != members {
		t.Fatalf("members %d after the refused pull, want %d", n, members)
	}
	e.do("POST", "/api/v1/topics/ps/groups/g/pull", map[string]any{"filter": "region=eu", "wait": "0s"}).ok(200, nil)
}

// TestPullSessionsBoundedPerGroup: a (topic, group) takes at most MaxGroupPullSessions sessions
// (each a member of the group, one per filter); past it a pull gets LIMIT_EXCEEDED and leaves no
// member, while other groups still open theirs.
func TestPullSessionsBoundedPerGroup(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.MaxGroupPullSessions = 2 })
	e.do("POST", "/api/v1/topics", map[string]any{"name": "pg", "semantics": "PUB_SUB"}).ok(201, nil)
	pull := func(group, filter string) *resp {
		return e.do("POST", "/api/v1/topics/pg/groups/"+group+"/pull", map[string]any{"filter": filter, "wait": "0s"})
	}
	pull("g", "region=eu").ok(200, nil)
	pull("g", "region=us").ok(200, nil)
	members := len(e.b.Members())
	if pe := pull("g", "region=ap").fails(409, "LIMIT_EXCEEDED"); !strings.Contains(pe.Message, `2 pull sessions of group "g" on topic "pg"`) {
		t.Fatalf("error %q", pe.Message)
	}
	if n := len(e.b.Members()); n != members {
		t.Fatalf("members %d after the refused pull, want %d", n, members)
	}
	pull("g", "region=eu").ok(200, nil)
	pull("h", "region=ap").ok(200, nil)
}

// TestPullSessionsBoundedWhileOpening: a session being opened counts against MaxPullSessions, so
// a pull arriving meanwhile is refused at once instead of making a member of its own.
func TestPullSessionsBoundedWhileOpening(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.MaxPullSessions = 1 })
	e.do("POST", "/api/v1/topics", map[string]any{"name": "po", "semantics": "PUB_SUB"}).ok(201, nil)
	members := len(e.b.Members())
	var inner *resp
	e.h.pulls.openHook = func(key sessionKey) {
		if key.filter != "region=eu" {
			return
		}
		inner = e.do("POST", "/api/v1/topics/po/groups/g/pull", map[string]any{"filter": "region=us", "wait": "0s"})
		if n := len(e.b.Members()); n != members {
			t.Errorf("members %d while the first session opens, want %d", n, members)
		}
	}
	e.do("POST", "/api/v1/topics/po/groups/g/pull", map[string]any{"filter": "region=eu", "wait": "0s"}).ok(200, nil)
	inner.fails(409, "LIMIT_EXCEEDED")
	if n := len(e.b.Members()); n != members+1 {
		t.Fatalf("members %d, want %d", n, members+1)
	}
}
