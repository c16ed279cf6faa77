package admin

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/testutil"
)

// TestLimitListenerTLS: with a TLS configuration every connection speaks TLS, the one refused
// over the limit too (its 503 OVERLOADED arrives inside TLS), and closing a TLS connection frees
// its place.
func TestLimitListenerTLS(t *testing.T) {
	t.Parallel()
	cert, pool := testutil.SelfSignedCert(t, "spool")
	e := newEnv(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(e.h, testLogger(t))
	done := make(chan error, 1)
	go func() {
		done <- srv.Serve(LimitListener(ln, 1, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil))
	}()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	addr := ln.Addr().String()
	get := func() (*http.Response, net.Conn, error) {
		nc, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: "spool"})
		if err != nil {
			return nil, nil, err
		}
		_ = nc.SetDeadline(time.Now().Add(waitTimeout))
		if _, err := io.WriteString(nc, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"); err != nil {
			nc.Close()
			return nil, nil, err
		}
		res, err := http.ReadResponse(bufio.NewReader(nc), nil)
		if err != nil {
			nc.Close()
			return nil, nil, err
		}
		return res, nc, nil
	}
	res, first, err := get()
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("first connection: %v %v", res, err)
	}
	res.Body.Close()
	res, second, err := get()
	if err != nil {
		t.Fatalf("over the limit: %v", err)
	}
	second.Close()
	if d := decodeError(t, res); res.StatusCode != http.StatusServiceUnavailable || d.Code != "OVERLOADED" {
		t.Fatalf("over the limit: %d %+v", res.StatusCode, d)
	}
	first.Close()
	testutil.Eventually(t, waitTimeout, "a place after the close", func() error {
		res, nc, err := get()
		if err != nil {
			return err
		}
		defer nc.Close()
		res.Body.Close()
		if res.StatusCode != 200 {
			return fmt.Errorf("status %d", res.StatusCode)
		}
		return nil
	})
}
