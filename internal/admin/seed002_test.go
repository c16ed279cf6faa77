package admin

import (
	"context"
	"net/http"
	"testing"
)

// TestSeedPublish: POST /publish takes seed 002's {"topic", "message"} also as curl -d sends it
// (form content type), stores a string message as its text and any other JSON as its JSON, needs
// publish on the topic named in the body, and refuses a bad body or topic with 400.
func TestSeedPublish(t *testing.T) {
	t.Parallel()
	e := authEnv(t, true)
	form := []string{"Content-Type", "application/x-www-form-urlencoded"}
	e.do("POST", "/publish", []byte(`{"topic":"orders.x","message":"hello"}`), append(form, bearer(pubToken)...)...).ok(http.StatusCreated, nil)
	e.do("POST", "/publish", `{"topic":"orders.x","message":{"id":7}}`, bearer(pubToken)...).ok(http.StatusCreated, nil)
	var l MessageList
	e.do("GET", "/api/v1/topics/orders.x/messages", nil, bearer(pubToken)...).ok(http.StatusOK, &l)
	if len(l.Messages) != 2 || *l.Messages[0].Payload != "hello" || *l.Messages[1].Payload != `{"id":7}` {
		t.Fatalf("stored %+v", l.Messages)
	}
	e.do("POST", "/publish", `{"topic":"billing.x","message":"hi"}`, bearer(pubToken)...).fails(http.StatusForbidden, "PERMISSION_DENIED")
	e.do("POST", "/publish", `{"topic":"orders.x","message":"hi"}`).fails(http.StatusUnauthorized, "NOT_AUTHENTICATED")
	for _, body := range []string{`{"topic":"orders.x"}`, `{"topic":"bad..name","message":"x"}`, `{"topic":"orders.x","message":"x","extra":1}`} {
		e.do("POST", "/publish", body, bearer(pubToken)...).fails(http.StatusBadRequest, "INVALID_ARGUMENT")
	}
	// Only this route takes the form type, and a cross-origin browser request is refused.
	e.do("POST", "/api/v1/topics/orders.x/messages", []byte(`{"payload":"x"}`), append(form, bearer(pubToken)...)...).fails(http.StatusUnsupportedMediaType, "UNSUPPORTED_MEDIA_TYPE")
	e.do("POST", "/publish", []byte(`{"topic":"orders.x","message":"x"}`), append(form, append(bearer(pubToken), "Sec-Fetch-Site", "cross-site")...)...).fails(http.StatusForbidden, "FORBIDDEN")
}

// TestSeedPublishPriority: POST /publish at a topic's backlog bound is refused with 429, except
// for a principal with the priority permission, as on POST /api/v1/topics/{topic}/messages.
func TestSeedPublishPriority(t *testing.T) {
	e := authEnv(t, true)
	cfg := map[string]any{"name": "orders.bp", "max_backlog_messages": 1, "backlog_policy": "reject"}
	e.do("POST", "/api/v1/topics", cfg, bearer(adminToken)...).ok(http.StatusCreated, nil)
	e.do("POST", "/publish", `{"topic":"orders.bp","message":"a"}`, bearer(pubToken)...).ok(http.StatusCreated, nil)
	if err := e.b.RefreshBackpressure(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.do("POST", "/publish", `{"topic":"orders.bp","message":"b"}`, bearer(pubToken)...).fails(http.StatusTooManyRequests, "RATE_LIMITED")
	e.do("POST", "/publish", `{"topic":"orders.bp","message":"c"}`, bearer(prioToken)...).ok(http.StatusCreated, nil)
}
