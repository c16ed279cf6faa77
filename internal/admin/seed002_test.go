package admin

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
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

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// TestSeedPublishUnauthenticatedReadsNoBody: with authentication on, POST /publish without a
// token is refused before its body is read: the topic is named in the body, but a request
// without a principal must not make the server read and decode up to the publish body limit.
func TestSeedPublishUnauthenticatedReadsNoBody(t *testing.T) {
	t.Parallel()
	seedPublishReadsNoBody(t, authEnv(t, true), "", http.StatusUnauthorized, "NOT_AUTHENTICATED")
}

// TestSeedPublishWithoutPublishPermissionReadsNoBody: a principal that may publish to no topic
// (here admin only) is refused before its body is read too.
func TestSeedPublishWithoutPublishPermissionReadsNoBody(t *testing.T) {
	t.Parallel()
	seedPublishReadsNoBody(t, authEnv(t, true), adminToken, http.StatusForbidden, "PERMISSION_DENIED")
}

// seedPublishReadsNoBody posts a body just within the publish body limit with token ("": none)
// and checks that it is refused with status and code having read at most 64 KiB of it.
func seedPublishReadsNoBody(t *testing.T, e *env, token string, status int, code string) {
	t.Helper()
	const size = DefaultMaxPublishBodyBytes - 64
	// {"topic":"orders.x","message":"x","headers":{"k":"v","k":"v",...,"z":"z"}}, within the limit.
	head, pair, tail := `{"topic":"orders.x","message":"x","headers":{`, `"k":"v",`, `"z":"z"}}`
	pairs := (size - len(head) - len(tail)) / len(pair)
	body := &countingReader{r: io.MultiReader(strings.NewReader(head),
		io.LimitReader(&repeatReader{s: pair}, int64(pairs*len(pair))), strings.NewReader(tail))}
	req := httptest.NewRequest("POST", "/publish", body)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, req)
	if w.Code != status || !strings.Contains(w.Body.String(), code) {
		t.Fatalf("status %d, body %s; want %d %s", w.Code, w.Body, status, code)
	}
	if n := body.n.Load(); n > 64<<10 {
		t.Fatalf("read %d of the %d bytes of a refused body", n, size)
	}
}

// repeatReader reads s again and again.
type repeatReader struct {
	s   string
	off int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], r.s[r.off:])
		n += c
		r.off = (r.off + c) % len(r.s)
	}
	return n, nil
}
