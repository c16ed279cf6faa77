package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/metrics"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/pgstore"
	"github.com/spoolmq/spool/internal/storage/wal"
	"github.com/spoolmq/spool/internal/testutil"
)

// waitTimeout bounds every wait; nothing is timed, a test fails only when an expected event never
// happens.
const waitTimeout = 15 * time.Second

// TestMain fails the package when goroutines outlive the tests.
func TestMain(m *testing.M) {
	os.Exit(testutil.RunLeakChecked(m, 5*time.Second, http.DefaultClient.CloseIdleConnections))
}

// env is an admin handler over a real broker on a real engine (wal, or PostgreSQL: newEnvPG),
// served by httptest.
type env struct {
	t       *testing.T
	b       *broker.Broker
	eng     storage.Engine
	reg     *prometheus.Registry
	h       *Handler
	srv     *httptest.Server
	stopped bool
}

func newEnv(t *testing.T, mod func(*Config)) *env {
	t.Helper()
	return newEnvWith(t, wal.Config{}, metrics.CollectorOptions{}, mod)
}

// newEnvWith is newEnv on an engine with walCfg and metrics collected with opts.
func newEnvWith(t *testing.T, walCfg wal.Config, opts metrics.CollectorOptions, mod func(*Config)) *env {
	t.Helper()
	eng, err := wal.Open(t.TempDir(), walCfg)
	if err != nil {
		t.Fatalf("wal.Open: %v", err)
	}
	return newEnvOn(t, broker.Config{Engine: eng}, opts, mod)
}

// newEnvPG is newEnv on a PostgreSQL engine in a schema of its own (TEST_DATABASE_URL), with a
// broker configured as spool serve configures one on PostgreSQL (SharedEngine).
func newEnvPG(t *testing.T, mod func(*Config)) *env {
	t.Helper()
	url := testutil.DatabaseURL(t)
	eng, err := pgstore.Open(context.Background(), pgstore.Config{URL: url, Schema: testutil.PGSchema(t, url, "t_admin_"), Migrate: true})
	if err != nil {
		t.Fatalf("pgstore.Open: %v", err)
	}
	return newEnvOn(t, broker.Config{Engine: eng, SharedEngine: true}, metrics.CollectorOptions{}, mod)
}

// newEnvOn is newEnv on the broker of bcfg (its engine closed at the end of the test).
func newEnvOn(t *testing.T, bcfg broker.Config, opts metrics.CollectorOptions, mod func(*Config)) *env {
	t.Helper()
	eng := bcfg.Engine
	bcfg.Logger, bcfg.RetentionInterval = testLogger(t), -1
	b, err := broker.New(bcfg)
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatalf("broker.Start: %v", err)
	}
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	if err := m.RegisterBroker(b, opts); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Broker: b, Gatherer: reg, Metrics: m, Logger: testLogger(t)}
	if mod != nil {
		mod(&cfg)
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatalf("admin.New: %v", err)
	}
	e := &env{t: t, b: b, eng: eng, reg: reg, h: h, srv: httptest.NewServer(h)}
	t.Cleanup(func() {
		e.srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := h.Close(ctx); err != nil {
			t.Errorf("Handler.Close: %v", err)
		}
		e.stopBroker()
		if err := eng.Close(); err != nil {
			t.Errorf("engine.Close: %v", err)
		}
	})
	return e
}

func (e *env) stopBroker() {
	if e.stopped {
		return
	}
	e.stopped = true
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := e.b.Stop(ctx); err != nil {
		e.t.Errorf("broker.Stop: %v", err)
	}
}

func testLogger(t *testing.T) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("SPOOL_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: level}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// resp is an HTTP response with its body read.
type resp struct {
	t      *testing.T
	status int
	header http.Header
	body   []byte
	what   string
}

// do sends a request; body is JSON-encoded unless it is a string or []byte (sent as is).
func (e *env) do(method, path string, body any, header ...string) *resp {
	e.t.Helper()
	var rd io.Reader
	ct := ""
	switch b := body.(type) {
	case nil:
	case string:
		rd, ct = strings.NewReader(b), "application/json"
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd, ct = bytes.NewReader(data), "application/json"
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	if h := req.Header.Get("Host"); h != "" { // the client sends req.Host, not a Host header
		req.Host = h
		req.Header.Del("Host")
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return &resp{t: e.t, status: res.StatusCode, header: res.Header, body: data, what: method + " " + path}
}

// ok checks the status and decodes the body into v (if not nil).
func (r *resp) ok(status int, v any) *resp {
	r.t.Helper()
	if r.status != status {
		r.t.Fatalf("%s: status %d, want %d; body %s", r.what, r.status, status, r.body)
	}
	if v != nil {
		if err := json.Unmarshal(r.body, v); err != nil {
			r.t.Fatalf("%s: decoding %s: %v", r.what, r.body, err)
		}
	}
	return r
}

// fails checks a JSON error response.
func (r *resp) fails(status int, code string) errorDetail {
	r.t.Helper()
	if r.status != status {
		r.t.Fatalf("%s: status %d, want %d (%s); body %s", r.what, r.status, status, code, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		r.t.Fatalf("%s: error Content-Type %q", r.what, ct)
	}
	var body errorBody
	if err := json.Unmarshal(r.body, &body); err != nil {
		r.t.Fatalf("%s: decoding error %s: %v", r.what, r.body, err)
	}
	if body.Error.Code != code {
		r.t.Fatalf("%s: error code %q, want %q; body %s", r.what, body.Error.Code, code, r.body)
	}
	if body.Error.Message == "" {
		r.t.Fatalf("%s: error without message", r.what)
	}
	return body.Error
}

// pullN pulls from topic/group until n messages arrived.
func (e *env) pullN(topic, group string, n int, extra map[string]any) []PulledMessage {
	e.t.Helper()
	var out []PulledMessage
	deadline := time.Now().Add(waitTimeout)
	for len(out) < n {
		if time.Now().After(deadline) {
			e.t.Fatalf("pull %s/%s: %d of %d messages", topic, group, len(out), n)
		}
		body := map[string]any{"max": n - len(out), "wait": "2s"}
		for k, v := range extra {
			body[k] = v
		}
		var res PullResult
		e.do("POST", "/api/v1/topics/"+topic+"/groups/"+group+"/pull", body).ok(200, &res)
		out = append(out, res.Messages...)
	}
	return out
}

// waitFor polls cond until it returns nil or waitTimeout passes.
func waitFor(t *testing.T, what string, cond func() error) {
	t.Helper()
	testutil.Eventually(t, waitTimeout, what, cond)
}
