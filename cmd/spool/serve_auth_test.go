package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/client"
	"github.com/spoolmq/spool/internal/auth"
	"github.com/spoolmq/spool/internal/config"
	"github.com/spoolmq/spool/internal/testutil"
	"github.com/spoolmq/spool/protocol"
)

// TestServeAuth runs spool serve with authentication and mutual TLS on addresses other hosts
// reach (allowed without insecure because authentication is on): the client certificate's CN
// names one principal, a Bearer token another; each may do what its permissions say only.
func TestServeAuth(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t)
	certPEM, keyPEM, _ := ca.issue(true)
	clientCert, clientKey, _ := ca.issue(false) // CN "spool test leaf"
	for name, data := range map[string][]byte{"ca.pem": ca.pem, "server.pem": certPEM, "server.key": keyPEM} {
		writeFile(t, filepath.Join(dir, name), data)
	}
	const opsToken = "ops-0123456789abcdef"
	opsHash, err := auth.HashToken(opsToken)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Defaults()
	cfg.Listen, cfg.HTTP = ":0", ":0"
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.ShutdownTimeout = cliWaitTimeout
	cfg.Server.HandshakeTimeout = time.Second // a text session the certificate names outlives it
	cfg.Server.TLS.CertFile, cfg.Server.TLS.KeyFile, cfg.Server.TLS.ClientCAFile =
		filepath.Join(dir, "server.pem"), filepath.Join(dir, "server.key"), filepath.Join(dir, "ca.pem")
	cfg.Auth.Principals = []auth.Principal{
		{Name: "leaf", CertCN: "spool test leaf", Permissions: []auth.Permission{{Action: auth.Publish, Topics: "tls.#"}}},
		{Name: "ops", TokenHash: opsHash, Permissions: []auth.Permission{{Action: auth.Admin, Topics: "#"}}},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("exposed listeners with authentication: %v", err)
	}
	logs := startRun(t, cfg)
	serving, seen := waitLog(t, logs, "spool serving", 0)
	waitLog(t, logs, "authentication on: clients need a token or a client certificate naming a principal", seen)
	local := func(addr any) string {
		_, port, err := net.SplitHostPort(addr.(string))
		if err != nil {
			t.Fatal(err)
		}
		return net.JoinHostPort("127.0.0.1", port)
	}
	tcpAddr, httpAddr := local(serving["tcp"]), local(serving["http"])

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.pem)
	pair, err := tls.X509KeyPair(clientCert, clientKey)
	if err != nil {
		t.Fatal(err)
	}
	clientTLS := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}
	wctx, wcancel := context.WithTimeout(context.Background(), cliWaitTimeout)
	defer wcancel()

	// The certificate names leaf: publish on tls.# only.
	c, err := client.Dial(wctx, tcpAddr, client.TLSConfig(clientTLS))
	if err != nil {
		t.Fatalf("client with a certificate naming a principal: %v", err)
	}
	defer c.Close(context.Background())
	if _, err := c.Publish(wctx, "tls.t", client.Message{Payload: []byte("one")}); err != nil {
		t.Fatalf("leaf publish on tls.t: %v", err)
	}
	if _, err := c.Publish(wctx, "other.t", client.Message{Payload: []byte("x")}); !errors.Is(err, protocol.ErrPermissionDenied) {
		t.Fatalf("leaf publish on other.t: %v, want PERMISSION_DENIED", err)
	}
	// A wrong token is refused even with a good certificate.
	if c2, err := client.Dial(wctx, tcpAddr, client.TLSConfig(clientTLS), client.Token("wrong-0123456789abcdef")); !errors.Is(err, protocol.ErrNotAuthenticated) {
		if c2 != nil {
			c2.Close(context.Background())
		}
		t.Fatalf("wrong token: %v, want NOT_AUTHENTICATED", err)
	}

	// Text mode: the certificate authenticates without AUTH.
	tc, err := tls.DialWithDialer(&net.Dialer{Timeout: cliWaitTimeout}, "tcp", tcpAddr, clientTLS)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	_ = tc.SetDeadline(time.Now().Add(cliWaitTimeout))
	br := bufio.NewReader(tc)
	for _, step := range []struct{ line, want string }{
		{"PUBLISH tls.t text", "OK "},
		{"PUBLISH other.t text", "ERR PERMISSION_DENIED "},
	} {
		if _, err := io.WriteString(tc, step.line+"\n"); err != nil {
			t.Fatal(err)
		}
		if reply, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(reply, step.want) {
			t.Fatalf("text %q: %q, %v; want %q", step.line, reply, err, step.want)
		}
	}
	// A session the certificate names is authenticated from its start: PING (interactive), then
	// quiet past the handshake timeout, is not closed as unauthenticated.
	ti, err := tls.DialWithDialer(&net.Dialer{Timeout: cliWaitTimeout}, "tcp", tcpAddr, clientTLS)
	if err != nil {
		t.Fatal(err)
	}
	defer ti.Close()
	_ = ti.SetDeadline(time.Now().Add(cliWaitTimeout))
	bi := bufio.NewReader(ti)
	for i, line := range []string{"PING", "PING"} {
		if i == 1 {
			time.Sleep(cfg.Server.HandshakeTimeout + 300*time.Millisecond)
		}
		if _, err := io.WriteString(ti, line+"\n"); err != nil {
			t.Fatal(err)
		}
		if reply, err := bi.ReadString('\n'); err != nil || !strings.HasPrefix(reply, "OK PONG") {
			t.Fatalf("interactive text session named by its certificate, %s %d: %q, %v", line, i+1, reply, err)
		}
	}

	// HTTP: the certificate alone (leaf) may publish on tls.# but not list topics, the ops token
	// may list them; probes are open.
	pubReq, err := http.NewRequestWithContext(wctx, "POST", "https://"+httpAddr+"/api/v1/topics/tls.t/messages", strings.NewReader(`{"payload":"http"}`))
	if err != nil {
		t.Fatal(err)
	}
	pubReq.Header.Set("Content-Type", "application/json")
	if resp, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS}, Timeout: cliWaitTimeout}).Do(pubReq); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("HTTP publish as leaf: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS}, Timeout: cliWaitTimeout}
	get := func(path, token string) int {
		req, err := http.NewRequestWithContext(wctx, "GET", "https://"+httpAddr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" && !strings.HasPrefix(token, "Basic ") {
			token = "Bearer " + token
		}
		if token != "" {
			req.Header.Set("Authorization", token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		path, token string
		want        int
	}{
		{"/api/v1/topics", "", http.StatusForbidden},
		{"/api/v1/topics", "wrong-0123456789abcdef", http.StatusUnauthorized},
		{"/api/v1/topics", opsToken, http.StatusOK},
		// A Basic header is no token: the certificate still names leaf (403, not 401).
		{"/api/v1/topics", "Basic b3BzOnNlY3JldA==", http.StatusForbidden},
		{"/healthz", "Basic b3BzOnNlY3JldA==", http.StatusOK},
		{"/healthz", "", http.StatusOK},
		{"/readyz", "", http.StatusOK},
		{"/metrics", "", http.StatusOK},
	} {
		if got := get(tc.path, tc.token); got != tc.want {
			t.Errorf("GET %s (token %q): %d, want %d", tc.path, tc.token, got, tc.want)
		}
	}
	waitLog(t, logs, "request denied", seen)

	// The CLI: --token-file or $SPOOL_TOKEN, with the client certificate.
	writeFile(t, filepath.Join(dir, "client.pem"), clientCert)
	writeFile(t, filepath.Join(dir, "client.key"), clientKey)
	writeFile(t, filepath.Join(dir, "ops.token"), []byte(opsToken+"\n"))
	tlsArgs := []string{"--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, "client.pem"), "--tls-key", filepath.Join(dir, "client.key")}
	var out, errb testutil.SyncBuffer
	e := &cliEnv{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, loc: time.UTC}
	if code := runCLI(wctx, e, runTopic, append([]string{"list", "--http", httpAddr}, tlsArgs...)); code != 1 || !strings.Contains(errb.String(), "PERMISSION_DENIED") {
		t.Fatalf("spool topic list as leaf: exit %d: %s", code, errb.String())
	}
	if code := runCLI(wctx, e, runTopic, append([]string{"list", "--http", httpAddr, "--token-file", filepath.Join(dir, "ops.token")}, tlsArgs...)); code != 0 || !strings.Contains(out.String(), "tls.t") {
		t.Fatalf("spool topic list --token-file: exit %d: %s %s", code, out.String(), errb.String())
	}
	e.getenv = func(k string) string {
		if k == envToken {
			return "wrong-0123456789abcdef"
		}
		return ""
	}
	if code := runCLI(wctx, e, runPub, append([]string{"--addr", tcpAddr, "tls.t", "two"}, tlsArgs...)); code != 1 || strings.Count(errb.String(), "NOT_AUTHENTICATED") != 1 {
		t.Fatalf("spool pub with a wrong $SPOOL_TOKEN: exit %d: %s", code, errb.String())
	}

	// spool bench: the leaf certificate may publish on tls.# but not create topics; with the
	// ops token (admin, not publish) it creates the topic, and its publishes are refused (the
	// run reports them): the token reached both the admin API and the TCP port.
	var bout testutil.SyncBuffer
	benchArgs := append([]string{"publish", "--addr", tcpAddr, "--admin", "https://" + httpAddr, "--count", "5", "--warmup", "0"}, tlsArgs...)
	if err := benchMain(wctx, benchArgs, &bout, &bout); err == nil || !strings.Contains(err.Error(), "PERMISSION_DENIED") {
		t.Fatalf("spool bench as leaf: %v\n%s", err, bout.String())
	}
	if err := benchMain(wctx, append(benchArgs, "--token-file", filepath.Join(dir, "ops.token")), &bout, &bout); err != nil ||
		!strings.Contains(bout.String(), "created by the run") || !strings.Contains(bout.String(), "PERMISSION_DENIED: principal ops may not publish") {
		t.Fatalf("spool bench with the ops token: %v\n%s", err, bout.String())
	}
}
