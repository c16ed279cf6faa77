package admin

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	api "github.com/spoolmq/spool/client/admin"
	"github.com/spoolmq/spool/internal/auth"
	"github.com/spoolmq/spool/internal/storage"
)

const (
	pubToken   = "publisher-0123456789abcdef" // publish and consume orders.#
	adminToken = "admin-0123456789abcdef"     // admin on #
	prioToken  = "priority-0123456789abcdef"  // publish orders.# with priority (backpressure exempt)
)

// authEnv is an env with two principals; openMetrics is auth.open_metrics.
func authEnv(t *testing.T, openMetrics bool) *env {
	t.Helper()
	hash := func(tok string) string {
		h, err := auth.HashToken(tok)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	a, err := auth.New(auth.Config{OpenMetrics: openMetrics, Principals: []auth.Principal{
		{Name: "publisher", TokenHash: hash(pubToken), Permissions: []auth.Permission{
			{Action: auth.Publish, Topics: "orders.#"}, {Action: auth.Consume, Topics: "orders.#"},
		}},
		{Name: "ops", TokenHash: hash(adminToken), Permissions: []auth.Permission{{Action: auth.Admin, Topics: "#"}}},
		{Name: "prio", TokenHash: hash(prioToken), Permissions: []auth.Permission{
			{Action: auth.Publish, Topics: "orders.#"}, {Action: auth.Priority, Topics: "orders.#"},
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return newEnv(t, func(c *Config) { c.Auth = a })
}

func bearer(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

func TestAuthHTTP(t *testing.T) {
	e := authEnv(t, true)
	msg := map[string]any{"payload": "aGk="}
	// No token, a wrong token: 401 with WWW-Authenticate, nothing published.
	r := e.do("POST", "/api/v1/topics/orders.x/messages", msg)
	r.fails(http.StatusUnauthorized, "NOT_AUTHENTICATED")
	if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
		t.Errorf("401 without WWW-Authenticate: Bearer: %q", r.header.Get("WWW-Authenticate"))
	}
	e.do("POST", "/api/v1/topics/orders.x/messages", msg, bearer("wrong-0123456789abcdef")...).fails(http.StatusUnauthorized, "NOT_AUTHENTICATED")
	e.do("GET", "/api/v1/topics", nil, "Authorization", "Basic "+pubToken).fails(http.StatusUnauthorized, "NOT_AUTHENTICATED")
	// Publish inside and outside the permission.
	e.do("POST", "/api/v1/topics/orders.x/messages", msg, bearer(pubToken)...).ok(http.StatusCreated, nil)
	e.do("POST", "/api/v1/topics/billing.x/messages", msg, bearer(pubToken)...).fails(http.StatusForbidden, "PERMISSION_DENIED")
	if _, err := e.eng.TopicGet(context.Background(), "billing.x"); !errors.Is(err, storage.ErrTopicNotFound) {
		t.Errorf("a refused publish left billing.x: %v", err)
	}
	// Consume: pull on orders.x is allowed.
	e.do("POST", "/api/v1/topics/orders.x/groups/g/pull", map[string]any{"max": 1, "wait": "0s"}, bearer(pubToken)...).ok(http.StatusOK, nil)
	// Admin endpoints: refused for the publisher, allowed for ops.
	e.do("DELETE", "/api/v1/topics/orders.x?force=true", nil, bearer(pubToken)...).fails(http.StatusForbidden, "PERMISSION_DENIED")
	e.do("GET", "/api/v1/topics", nil, bearer(pubToken)...).fails(http.StatusForbidden, "PERMISSION_DENIED")
	e.do("GET", "/api/v1/topics", nil, bearer(adminToken)...).ok(http.StatusOK, nil)
	if _, err := e.eng.TopicGet(context.Background(), "orders.x"); err != nil {
		t.Errorf("a refused delete changed orders.x: %v", err)
	}
	e.do("DELETE", "/api/v1/topics/orders.x?force=true", nil, bearer(adminToken)...).ok(http.StatusNoContent, nil)
	// ops may administer but not publish.
	e.do("POST", "/api/v1/topics/orders.y/messages", msg, bearer(adminToken)...).fails(http.StatusForbidden, "PERMISSION_DENIED")
	// Probes, the OpenAPI document and (open_metrics) /metrics need nothing.
	for _, p := range []string{"/healthz", "/readyz", "/metrics", "/api/v1/openapi.json"} {
		e.do("GET", p, nil).ok(http.StatusOK, nil)
	}
	denied := func(reason string) float64 {
		mfs, err := e.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if mf.GetName() == "spool_auth_denied_total" && m.GetLabel()[0].GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
		return 0
	}
	if got := denied(auth.ReasonUnauthenticated); got != 3 {
		t.Errorf("unauthenticated denials %v, want 3", got)
	}
	if got := denied(auth.ReasonForbidden); got != 4 {
		t.Errorf("forbidden denials %v, want 4", got)
	}
}

func TestAuthHTTPClosedMetrics(t *testing.T) {
	e := authEnv(t, false)
	e.do("GET", "/metrics", nil).fails(http.StatusUnauthorized, "NOT_AUTHENTICATED")
	e.do("GET", "/metrics", nil, bearer(pubToken)...).fails(http.StatusForbidden, "PERMISSION_DENIED")
	e.do("GET", "/metrics", nil, bearer(adminToken)...).ok(http.StatusOK, nil)
	e.do("GET", "/healthz", nil).ok(http.StatusOK, nil)
	e.do("GET", "/readyz", nil).ok(http.StatusOK, nil)
}

// TestOpenAPIAuth: the routes that need a principal declare the bearer scheme and 401/403; the
// probes do not.
func TestOpenAPIAuth(t *testing.T) {
	e := newEnv(t, nil)
	var doc struct {
		Paths map[string]map[string]struct {
			Security  []map[string]any `json:"security"`
			Responses map[string]any   `json:"responses"`
		} `json:"paths"`
		Comps struct {
			Security map[string]any `json:"securitySchemes"`
		} `json:"components"`
	}
	e.do("GET", "/api/v1/openapi.json", nil).ok(http.StatusOK, &doc)
	if doc.Comps.Security["bearer"] == nil {
		t.Error("no bearer security scheme")
	}
	pub := doc.Paths["/api/v1/topics/{topic}/messages"]["post"]
	if len(pub.Security) != 1 || pub.Responses["401"] == nil || pub.Responses["403"] == nil {
		t.Errorf("publish: security %v, responses %v", pub.Security, pub.Responses)
	}
	health := doc.Paths["/healthz"]["get"]
	if len(health.Security) != 0 || health.Responses["401"] != nil {
		t.Errorf("/healthz: security %v, responses %v", health.Security, health.Responses)
	}
}

// A topic at its backlog bound answers HTTP publishes 429 RATE_LIMITED with Retry-After; the
// topic shows its backpressure state and counts; a principal with priority still publishes.
func TestBackpressureHTTP(t *testing.T) {
	e := authEnv(t, true)
	cfg := map[string]any{"name": "orders.bp", "max_backlog_messages": 1, "backlog_policy": "reject"}
	var tp Topic
	e.do("POST", "/api/v1/topics", cfg, bearer(adminToken)...).ok(http.StatusCreated, &tp)
	if tp.Config.MaxBacklogMessages != 1 || tp.Config.BacklogPolicy != api.BacklogReject {
		t.Fatalf("created config %+v", tp.Config)
	}
	msg := map[string]any{"payload": "a"}
	e.do("POST", "/api/v1/topics/orders.bp/messages", msg, bearer(pubToken)...).ok(http.StatusCreated, nil)
	if err := e.b.RefreshBackpressure(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := e.do("POST", "/api/v1/topics/orders.bp/messages", msg, bearer(pubToken)...)
	r.fails(http.StatusTooManyRequests, "RATE_LIMITED")
	if r.header.Get("Retry-After") == "" {
		t.Fatal("429 without Retry-After")
	}
	e.do("POST", "/api/v1/topics/orders.bp/messages", msg, bearer(prioToken)...).ok(http.StatusCreated, nil)
	e.do("GET", "/api/v1/topics/orders.bp", nil, bearer(adminToken)...).ok(http.StatusOK, &tp)
	// The backlog is estimated: the read (1) plus the priority publish accepted since.
	if bp := tp.Backpressure; bp == nil || bp.State != "rejecting" || bp.Rejected != 1 || bp.BacklogMessages != 2 {
		t.Fatalf("topic backpressure %+v, want rejecting, 1 rejected, backlog 2", bp)
	}
}
