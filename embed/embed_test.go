package embed_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/client"
	"github.com/spoolmq/spool/embed"
	"github.com/spoolmq/spool/internal/auth"
	"github.com/spoolmq/spool/internal/testutil"
)

const waitTimeout = 15 * time.Second

// publish publishes n messages "<prefix>-<i>" to topic.
func publish(t *testing.T, c *client.Client, topic, prefix string, n int) {
	t.Helper()
	for i := range n {
		if _, err := c.Publish(t.Context(), topic, client.Message{Payload: fmt.Appendf(nil, "%s-%d", prefix, i)}); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
}

// consume subscribes to topic in group until it received want payloads (acking each), and
// returns them.
func consume(t *testing.T, c *client.Client, topic, group string, want int) map[string]int {
	t.Helper()
	var mu sync.Mutex
	got := map[string]int{}
	n := 0
	done := make(chan struct{})
	sub, err := c.Subscribe(t.Context(), client.SubscribeParams{Topic: topic, Group: group, Start: client.FromBeginning()},
		func(_ context.Context, d *client.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			got[string(d.Payload)]++
			if n++; n == want {
				close(done)
			}
			return nil
		})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	defer func() { _ = sub.Close(context.Background()) }()
	select {
	case <-done:
	case <-time.After(waitTimeout):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("received %d of %d messages within %s", n, want, waitTimeout)
	}
	mu.Lock()
	defer mu.Unlock()
	return got
}

func start(t *testing.T, cfg embed.Config) *embed.Broker {
	t.Helper()
	b, err := embed.Start(t.Context(), cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	return b
}

func dial(t *testing.T, b *embed.Broker) *client.Client {
	t.Helper()
	c, err := b.Dial(t.Context())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// TestEmbeddedBrokerKeepsMessages: a program publishes to its embedded broker with the client
// API, closes it, starts it again on the same directory, and consumes what it published.
func TestEmbeddedBrokerKeepsMessages(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	b := start(t, embed.Config{DataDir: dir})
	c := dial(t, b)
	publish(t, c, "jobs", "m", 20)
	if err := c.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(t.Context()); err != nil {
		t.Fatalf("close: %v", err)
	}
	if _, err := b.Dial(t.Context()); err == nil {
		t.Fatal("dial after close succeeded")
	}

	b = start(t, embed.Config{DataDir: dir})
	got := consume(t, dial(t, b), "jobs", "", 20)
	for i := range 20 {
		if got[fmt.Sprintf("m-%d", i)] != 1 {
			t.Fatalf("after a restart: %v, want m-0..m-19 once each", got)
		}
	}
}

// TestEmbeddedBrokerOverTCP: with Listen, other processes reach the embedded broker over TCP and
// share its topics with the in-memory clients.
func TestEmbeddedBrokerOverTCP(t *testing.T) {
	t.Parallel()
	b := start(t, embed.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0",
		Settings: map[string]string{"broker.auto_create_semantics": "PUB_SUB"}})
	if !strings.HasPrefix(b.Addr(), "127.0.0.1:") {
		t.Fatalf("Addr %q", b.Addr())
	}
	remote, err := client.Dial(t.Context(), b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close(context.Background())
	publish(t, remote, "events", "tcp", 5)
	publish(t, dial(t, b), "events", "mem", 5)
	got := consume(t, dial(t, b), "events", "audit", 10)
	if len(got) != 10 {
		t.Fatalf("in-memory consumer got %v", got)
	}
}

// TestEmbeddedBrokerBadSettings: bad settings are refused naming the setting, before anything is
// written.
func TestEmbeddedBrokerBadSettings(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	for _, c := range []struct {
		settings map[string]string
		want     string
	}{
		{map[string]string{"broker.max_topics": "many"}, "broker.max_topics"},
		{map[string]string{"server.max_conections": "5"}, "no such setting"},
		{map[string]string{"data_dir": "/elsewhere"}, `setting "data_dir": use the Config field`},
		{map[string]string{"server.tls.cert_file": "x.pem", "server.tls.key_file": "x.key"}, "server.tls"},
		// spool serve's settings an embedded broker has no use for are refused, not ignored.
		{map[string]string{"http": "127.0.0.1:8080"}, `setting "http" is spool serve's only: an embedded broker has no HTTP listener`},
		{map[string]string{"http_max_connections": "10"}, `setting "http_max_connections" is spool serve's only: an embedded broker has no HTTP listener`},
		{map[string]string{"auth.open_metrics": "true"}, `setting "auth.open_metrics" is spool serve's only: an embedded broker has no HTTP listener`},
		{map[string]string{"debug_listen": "127.0.0.1:6060"}, `setting "debug_listen" is spool serve's only`},
		{map[string]string{"log_level": "debug"}, `setting "log_level" is spool serve's only: an embedded broker logs to Config.Logger`},
		{map[string]string{"shutdown_timeout": "5s"}, `setting "shutdown_timeout" is spool serve's only: the context of Broker.Close`},
	} {
		b, err := embed.Start(t.Context(), embed.Config{DataDir: dir, Settings: c.settings})
		if err == nil {
			_ = b.Close(context.Background())
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("settings %v: %v, want an error with %q", c.settings, err, c.want)
		}
	}
	// Without principals, a listener other hosts reach needs insecure, as with spool serve.
	if _, err := embed.Start(t.Context(), embed.Config{DataDir: dir, Listen: "0.0.0.0:0"}); err == nil || !strings.Contains(err.Error(), "insecure") {
		t.Errorf("a listener on every address without principals: %v, want a refusal naming insecure", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("refused starts wrote the data directory: %v", err)
	}
}

// TestEmbeddedBrokerOnPostgreSQL: an embedded broker on the PostgreSQL engine.
func TestEmbeddedBrokerOnPostgreSQL(t *testing.T) {
	t.Parallel()
	url := testutil.DatabaseURL(t)
	schema := testutil.PGSchema(t, url, "t_embed_")
	b := start(t, embed.Config{Store: url, Settings: map[string]string{"postgres.schema": schema}})
	c := dial(t, b)
	publish(t, c, "jobs", "pg", 10)
	if got := consume(t, c, "jobs", "", 10); len(got) != 10 {
		t.Fatalf("got %v", got)
	}
}

// TestEmbeddedBrokerPrincipals: principals from a configuration file apply to in-memory clients
// too: without a token the handshake is refused, with one the principal's permissions hold.
func TestEmbeddedBrokerPrincipals(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	hash, err := auth.HashToken("s3cret-token-0123456789abcdef")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "spool.yaml")
	// The file's listen and http are not used (nor refused for want of insecure): no TCP. Its
	// settings of spool serve only are ignored, so that one file serves both.
	yaml := fmt.Sprintf(`listen: "0.0.0.0:9092"
http: "0.0.0.0:8080"
http_max_connections: 10
debug_listen: "127.0.0.1:6060"
log_level: debug
shutdown_timeout: 5s
auth:
  open_metrics: false
  principals:
    - name: app
      token_hash: %q
      permissions:
        - {action: publish, topics: "jobs"}
        - {action: consume, topics: "jobs"}
`, hash)
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	b := start(t, embed.Config{DataDir: filepath.Join(dir, "data"), ConfigFile: file})
	if b.Addr() != "" {
		t.Fatalf("the file's listen opened %s", b.Addr())
	}
	if anon, err := b.Dial(t.Context()); err == nil || !strings.Contains(err.Error(), "NOT_AUTHENTICATED") {
		if anon != nil {
			_ = anon.Close(context.Background())
		}
		t.Fatalf("dial without a token: %v, want NOT_AUTHENTICATED", err)
	}
	c, err := b.Dial(t.Context(), client.Token("s3cret-token-0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.Publish(t.Context(), "other", client.Message{Payload: []byte("x")}); err == nil || !strings.Contains(err.Error(), "PERMISSION_DENIED") {
		t.Fatalf("publish outside the permissions: %v, want PERMISSION_DENIED", err)
	}
	publish(t, c, "jobs", "a", 3)
	if got := consume(t, c, "jobs", "", 3); len(got) != 3 {
		t.Fatalf("got %v", got)
	}
}
