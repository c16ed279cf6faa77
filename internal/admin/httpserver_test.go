package admin

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/testutil"
)

// rawRequest writes req on a new connection to addr and reads the response.
func rawRequest(t *testing.T, addr, req string) (*http.Response, net.Conn) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	if _, err := io.WriteString(nc, req); err != nil {
		t.Fatal(err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(waitTimeout))
	res, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	return res, nc
}

// decodeError reads a JSON error response.
func decodeError(t *testing.T, res *http.Response) errorDetail {
	t.Helper()
	defer res.Body.Close()
	var body errorBody
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		t.Fatalf("decoding the error: %v", err)
	}
	return body.Error
}

// TestBodyReadTimeout: a request body that does not arrive within the body read timeout is
// answered 408 SESSION_TIMEOUT (it used to hold the connection and its goroutine forever), and
// the deadline does not cut off a pull that waits longer than it once its body was read.
func TestBodyReadTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.BodyReadTimeout = 300 * time.Millisecond })
	addr := strings.TrimPrefix(e.srv.URL, "http://")

	res, _ := rawRequest(t, addr, "POST /api/v1/topics HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"+
		"Content-Length: 100\r\n\r\n{\"name\":")
	if d := decodeError(t, res); res.StatusCode != http.StatusRequestTimeout || d.Code != "SESSION_TIMEOUT" ||
		!strings.Contains(d.Message, "request body not received within 300ms") {
		t.Fatalf("slow body: %d %+v", res.StatusCode, d)
	}
	e.do("GET", "/api/v1/topics/x", nil).fails(404, "TOPIC_NOT_FOUND") // nothing was created

	e.do("POST", "/api/v1/topics", map[string]any{"name": "slow.pull"}).ok(201, nil)
	var pr PullResult
	e.do("POST", "/api/v1/topics/slow.pull/groups/$queue/pull", map[string]any{"wait": "1s"}).ok(200, &pr)
	if len(pr.Messages) != 0 {
		t.Fatalf("pull: %+v", pr)
	}
}

// TestLimitListener: a connection over the limit is answered 503 OVERLOADED with Retry-After and
// closed; once a connection closes, its place is free again.
func TestLimitListener(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(e.h, testLogger(t))
	done := make(chan error, 1)
	go func() { done <- srv.Serve(LimitListener(ln, 1, nil, nil)) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	addr := ln.Addr().String()
	get := "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"

	// The first connection stays open (keep-alive) and holds the only place.
	res, first := rawRequest(t, addr, get)
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("first connection: %d", res.StatusCode)
	}
	res, _ = rawRequest(t, addr, get)
	if d := decodeError(t, res); res.StatusCode != http.StatusServiceUnavailable || d.Code != "OVERLOADED" || !d.Retryable ||
		res.Header.Get("Retry-After") != "1" || !strings.Contains(d.Message, "too many HTTP connections (limit 1)") {
		t.Fatalf("over the limit: %d %v %+v", res.StatusCode, res.Header, d)
	}
	first.Close()
	testutil.Eventually(t, waitTimeout, "a place after the close", func() error {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer nc.Close()
		_, _ = io.WriteString(nc, get)
		_ = nc.SetReadDeadline(time.Now().Add(waitTimeout))
		res, err := http.ReadResponse(bufio.NewReader(nc), nil)
		if err != nil {
			return err
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			return fmt.Errorf("status %d", res.StatusCode)
		}
		return nil
	})
}
