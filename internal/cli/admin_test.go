package cli

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestBaseURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"http://localhost:8080", "http://localhost:8080"},
		{"http://localhost:8080/", "http://localhost:8080"},
		{"https://spool.example.com/base/", "https://spool.example.com/base"},
		{"localhost:8080", "http://localhost:8080"},
		{":8080", "http://localhost:8080"},
		{"10.0.0.1:80", "http://10.0.0.1:80"},
		{"[::1]:8080", "http://[::1]:8080"},
		{" 127.0.0.1:9 ", "http://127.0.0.1:9"},
	} {
		got, err := BaseURL(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("BaseURL(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "localhost", "ftp://host:21", "http://", "http://host:1/?q=1", "::::"} {
		if got, err := BaseURL(in); err == nil {
			t.Errorf("BaseURL(%q) = %q, want an error", in, got)
		}
	}
}

func TestPaths(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ got, want string }{
		{TopicPath("orders.created"), "/api/v1/topics/orders.created"},
		{TopicPath("orders", "config"), "/api/v1/topics/orders/config"},
		{GroupPath("orders", "billing"), "/api/v1/topics/orders/groups/billing"},
		{GroupPath("jobs", ""), "/api/v1/topics/jobs/groups/$queue"},
		{GroupPath("jobs", "$queue", "dlq", "replay"), "/api/v1/topics/jobs/groups/$queue/dlq/replay"},
		{TopicPath("a/b?c"), "/api/v1/topics/a%2Fb%3Fc"},
	} {
		if tc.got != tc.want {
			t.Errorf("path %q, want %q", tc.got, tc.want)
		}
	}
}

// The admin API itself is exercised by cmd/spool's integration test (a real broker behind the
// real handler). Here: what the client makes of answers that are not the API's, as a proxy in
// front of it would give them, and of an address where nothing listens.
func TestCallErrors(t *testing.T) {
	t.Parallel()
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/error":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusConflict)
			_, _ = w.Write([]byte(`{"error":{"code":"TOPIC_EXISTS","message":"topic exists","retryable":false}}`))
		case "/ok":
			if r.Header.Get("Content-Type") != "application/json" || r.Method != http.MethodPost {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			_, _ = w.Write([]byte(`{"n":3}`))
		default:
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte("<html>\n  <body>Bad   gateway</body>\n</html>"))
		}
	}))
	defer proxy.Close()
	c, err := NewAdminClient(proxy.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	_, err = c.Call(ctx, http.MethodGet, "/api/error", nil, nil, nil)
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 409 || ae.Code != "TOPIC_EXISTS" || err.Error() != "TOPIC_EXISTS: topic exists" {
		t.Fatalf("API error: %#v (%v)", ae, err)
	}

	_, err = c.Call(ctx, http.MethodGet, "/elsewhere", nil, nil, nil)
	if !errors.As(err, &ae) || ae.Code != "HTTP_502" || err.Error() != "HTTP_502: Bad Gateway: <html> <body>Bad gateway</body> </html>" {
		t.Fatalf("proxy error: %v", err)
	}

	var out struct{ N int }
	raw, err := c.Call(ctx, http.MethodPost, "/ok", nil, map[string]int{"x": 1}, &out)
	if err != nil || out.N != 3 || string(raw) != `{"n":3}` {
		t.Fatalf("Call = %q, %+v, %v", raw, out, err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there any more
	down, err := NewAdminClient(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = down.Call(ctx, http.MethodGet, "/api/v1/topics", nil, nil, nil)
	hint := "cannot reach the admin API at http://" + addr + " (set --http or SPOOL_HTTP): "
	if err == nil || !strings.Contains(err.Error(), hint) || errors.As(err, &ae) {
		t.Fatalf("unreachable API: %v", err)
	}
	// The typed calls of client/admin that the CLI makes give the same hint.
	if _, err := down.Group(ctx, "t", "g"); err == nil || !strings.Contains(err.Error(), hint) {
		t.Fatalf("unreachable API, Group: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Call(cctx, http.MethodGet, "/ok", nil, nil, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: %v", err)
	}
}
