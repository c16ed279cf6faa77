package config

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/auth"
	"github.com/spoolmq/spool/internal/storage/wal"
	"github.com/spoolmq/spool/internal/tlsconf"
)

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "spool.yaml")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := Load("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:9092" || cfg.HTTP != "127.0.0.1:8080" || cfg.Insecure || cfg.DataDir != "./spool-data" || cfg.Store != "" ||
		cfg.Server.MaxConnections != 10_000 || cfg.Server.HeartbeatInterval != 10*time.Second ||
		cfg.Server.SessionTimeout != 30*time.Second || !cfg.Broker.AutoCreate || cfg.Broker.AutoCreateSemantics != "QUEUE" ||
		cfg.WAL.SlowSync != time.Second {
		t.Fatalf("defaults: %+v", cfg)
	}
}

// TestTextAckTimeoutFollowsWait: text_ack_timeout left unset is 5 min, or text_ack_wait when that
// is lower, so that lowering the wait alone does not stop the broker from starting.
func TestTextAckTimeoutFollowsWait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  []string
		want time.Duration
	}{
		{nil, 5 * time.Minute},
		{[]string{"SPOOL_SERVER_TEXT_ACK_WAIT=1m"}, time.Minute},
		{[]string{"SPOOL_SERVER_TEXT_ACK_WAIT=1m", "SPOOL_SERVER_TEXT_ACK_TIMEOUT=30s"}, 30 * time.Second},
		{[]string{"SPOOL_SERVER_TEXT_ACK_TIMEOUT=1h"}, time.Hour},
	} {
		cfg, err := Load("", tc.env, nil)
		if err != nil {
			t.Fatalf("%v: %v", tc.env, err)
		}
		if cfg.Server.TextAckTimeout != tc.want {
			t.Errorf("%v: text_ack_timeout %s, want %s", tc.env, cfg.Server.TextAckTimeout, tc.want)
		}
	}
}

// TestPrecedence: file < environment < flags.
func TestPrecedence(t *testing.T) {
	t.Parallel()
	file := writeFile(t, `
listen: ":1111"
http: ":2222"
insecure: true
data_dir: /from/file
server:
  max_connections: 10
  heartbeat_interval: 2s
  session_timeout: 6s
broker:
  auto_create: false
`)
	env := []string{
		"SPOOL_HTTP=:3333",
		"SPOOL_DATA_DIR=/from/env",
		"SPOOL_SERVER_MAX_CONNECTIONS=20",
		"SPOOL_BROKER_AUTO_CREATE=true",
		"SPOOL_TEST_SOMETHING_ELSE=ignored", // the test harness's
		"SPOOL_ADDR=localhost:1",            // the client commands'
		"PATH=/bin",
	}
	flags := map[string]string{"data_dir": "/from/flag", "server.session_timeout": "8s"}
	cfg, err := Load(file, env, flags)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"listen":         cfg.Listen == ":1111",
		"http":           cfg.HTTP == ":3333",
		"data_dir":       cfg.DataDir == "/from/flag",
		"max_conns":      cfg.Server.MaxConnections == 20,
		"heartbeat":      cfg.Server.HeartbeatInterval == 2*time.Second,
		"session":        cfg.Server.SessionTimeout == 8*time.Second,
		"auto_create":    cfg.Broker.AutoCreate,
		"text_ack_wait":  cfg.Server.TextAckWait == 24*time.Hour, // default kept
		"shutdown":       cfg.ShutdownTimeout == 30*time.Second,
		"unknown_env_ok": true,
	}
	for k, ok := range want {
		if ok != true {
			t.Errorf("%s wrong: %+v", k, cfg)
		}
	}
}

func TestConfigFileFromEnv(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "listen: \"127.0.0.1:4444\"\n")
	cfg, err := Load("", []string{"SPOOL_CONFIG=" + file}, nil)
	if err != nil || cfg.Listen != "127.0.0.1:4444" {
		t.Fatalf("cfg %+v, %v", cfg.Listen, err)
	}
	if _, err := Load("", nil, nil); err != nil {
		t.Fatal(err)
	}
	empty := writeFile(t, "")
	if _, err := Load(empty, nil, nil); err != nil {
		t.Fatalf("empty file: %v", err)
	}
}

// TestErrorsNameTheSetting: every error says which key (or variable, or flag) is wrong.
func TestErrorsNameTheSetting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		file  string
		env   []string
		flags map[string]string
		want  string
	}{
		{name: "unknown file key", file: "listn: x\n", want: "listn (line 1): field listn not found"},
		{name: "bad yaml type", file: "server:\n  max_connections: many\n", want: "server.max_connections (line 2): cannot unmarshal"},
		{name: "bad yaml duration", file: "listen: x\nwal:\n  unsafe_no_sync: false\n  slow_sync: soon\n", want: "wal.slow_sync (line 4): cannot unmarshal"},
		{name: "bad yaml section", file: "server: 5\n", want: "server (line 1): cannot unmarshal"},
		{name: "yaml syntax", file: "server:\n\tx: 1\n", want: "line 2"},
		// An unknown SPOOL_* variable is an error like an unknown key in the file.
		{name: "unknown env", env: []string{"SPOOL_SERVER_MAX_CONECTIONS=5"}, want: "environment SPOOL_SERVER_MAX_CONECTIONS: no such setting (did you mean SPOOL_SERVER_MAX_CONNECTIONS?)"},
		{name: "unknown env far from any", env: []string{"SPOOL_FROBNICATE=1"}, want: "environment SPOOL_FROBNICATE: no such setting; a setting's variable is"},
		{name: "bad env integer", env: []string{"SPOOL_SERVER_MAX_CONNECTIONS=many"}, want: "SPOOL_SERVER_MAX_CONNECTIONS"},
		{name: "bad env duration", env: []string{"SPOOL_SHUTDOWN_TIMEOUT=10"}, want: "SPOOL_SHUTDOWN_TIMEOUT: invalid duration"},
		{name: "bad env bool", env: []string{"SPOOL_WAL_UNSAFE_NO_SYNC=maybe"}, want: "SPOOL_WAL_UNSAFE_NO_SYNC"},
		{name: "unknown flag", flags: map[string]string{"nope": "1"}, want: "flag nope: no such setting"},
		{name: "server field", flags: map[string]string{"server.max_connections": "0"}, want: "server.max_connections"},
		{name: "session timeout", flags: map[string]string{"server.session_timeout": "5s"}, want: "server.session_timeout"},
		{name: "semantics", env: []string{"SPOOL_BROKER_AUTO_CREATE_SEMANTICS=FANOUT"}, want: "broker.auto_create_semantics"},
		{name: "log level", flags: map[string]string{"log_level": "loud"}, want: "log_level"},
		{name: "store", flags: map[string]string{"store": "mysql://x"}, want: "store: must be empty"},
		{name: "store password redacted", flags: map[string]string{"store": "mysql://u:secret@h"}, want: "u:***@h"},
		{name: "listen", flags: map[string]string{"listen": ""}, want: "listen: must not be empty"},
		{name: "http connections", env: []string{"SPOOL_HTTP_MAX_CONNECTIONS=0"}, want: "http_max_connections: must be between 1 and 1000000, got 0"},
		{name: "http allowed hosts", file: "http_allowed_hosts: [proxy.example, \"proxy.example:443\"]\n", want: `http_allowed_hosts: "proxy.example:443" is not a host name`},
		{name: "tx timeout negative", env: []string{"SPOOL_POSTGRES_TX_TIMEOUT=-1s"}, want: "postgres.tx_timeout"},
		{name: "tx timeout too small", flags: map[string]string{"postgres.tx_timeout": "5ms"}, want: "postgres.tx_timeout: must be between 10ms and 1h"},
		{name: "tx timeout too large", file: "postgres:\n  tx_timeout: 61m\n", want: "postgres.tx_timeout: must be between 10ms and 1h"},
		{name: "postgres producer ids zero", env: []string{"SPOOL_POSTGRES_MAX_PRODUCER_IDS=0"}, want: "postgres.max_producer_ids: must be at least 1, got 0"},
		{name: "slow sync zero", env: []string{"SPOOL_WAL_SLOW_SYNC=0s"}, want: "wal.slow_sync: must be between 1ms and 1h"},
		{name: "slow sync too large", file: "wal:\n  slow_sync: 2h\n", want: "wal.slow_sync: must be between 1ms and 1h"},
		{name: "max open files negative", env: []string{"SPOOL_WAL_MAX_OPEN_FILES=-1"}, want: "wal.max_open_files: must be 0 (half of the open file limit) or positive, got -1"},
		{name: "max open files over the limit", file: "wal:\n  max_open_files: 1073741824\n", want: "wal.max_open_files: must be at most the process's open file limit"},
		{name: "backpressure interval", env: []string{"SPOOL_BROKER_BACKPRESSURE_INTERVAL=1ms"}, want: "broker.backpressure_interval: must be between 10ms and 1m"},
		{name: "max throttle delay", flags: map[string]string{"broker.max_throttle_delay": "2m"}, want: "broker.max_throttle_delay: must be between 1ms and 1m"},
		{name: "conn buffer", env: []string{"SPOOL_SERVER_MAX_CONN_BUFFER_BYTES=1000"}, want: "server.max_conn_buffer_bytes"},
		{name: "text ack timeout", flags: map[string]string{"server.text_ack_timeout": "25h"}, want: "server.text_ack_timeout"},
		{name: "text ack timeout above a lowered wait", env: []string{"SPOOL_SERVER_TEXT_ACK_WAIT=1m", "SPOOL_SERVER_TEXT_ACK_TIMEOUT=2m"}, want: "server.text_ack_timeout: must be between 1ms and text_ack_wait (1m0s), got 2m0s"},
		{name: "unsafe no sync on postgres", env: []string{"SPOOL_STORE=postgres://spool@db/spool", "SPOOL_WAL_UNSAFE_NO_SYNC=true"}, want: "wal.unsafe_no_sync: applies to the embedded engine only"},
		{name: "goodbye grace zero", file: "server:\n  goodbye_grace: 0s\n", want: "server.goodbye_grace: must be positive"},
		{name: "lifecycle interval", env: []string{"SPOOL_BROKER_LIFECYCLE_INTERVAL=10ms"}, want: "broker.lifecycle_interval: must be at least 1s"},
		{name: "backfill batch", env: []string{"SPOOL_BROKER_BACKFILL_BATCH=0"}, want: "broker.backfill_batch: must be between 1 and 1000000"},
		{name: "backfill target", env: []string{"SPOOL_BROKER_BACKFILL_TARGET_P95=10us"}, want: "broker.backfill_target_p95: must be at least 1ms"},
		{name: "backfill max rate", env: []string{"SPOOL_BROKER_BACKFILL_MAX_RATE=5"}, want: "broker.backfill_max_rate: must be between 100"},
		{name: "rebalance delay", env: []string{"SPOOL_BROKER_REBALANCE_DELAY=2m"}, want: "broker.rebalance_delay: must be between 0 and 1m"},
		{name: "subscription retention", flags: map[string]string{"broker.subscription_retention": "0s"}, want: "broker.subscription_retention: must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := ""
			if tc.file != "" {
				file = writeFile(t, tc.file)
			}
			_, err := Load(file, tc.env, tc.flags)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Fatalf("error leaks the password: %v", err)
			}
		})
	}
}

func TestPostgresStoreIsValid(t *testing.T) {
	t.Parallel()
	cfg, err := Load("", []string{"SPOOL_STORE=postgres://spool@localhost/spool"}, nil)
	if err != nil || !IsPostgresURL(cfg.Store) {
		t.Fatalf("%+v %v", cfg.Store, err)
	}
	if cfg.Postgres.TxTimeout != 10*time.Second {
		t.Fatalf("default postgres.tx_timeout %s, want 10s", cfg.Postgres.TxTimeout)
	}
	if cfg.Postgres.MaxProducerIDs != 1_000_000 {
		t.Fatalf("default postgres.max_producer_ids %d, want 1,000,000", cfg.Postgres.MaxProducerIDs)
	}
	cfg, err = Load("", []string{"SPOOL_STORE=postgres://spool@localhost/spool", "SPOOL_POSTGRES_MAX_PRODUCER_IDS=5000"}, nil)
	if err != nil || cfg.Postgres.MaxProducerIDs != 5000 {
		t.Fatalf("SPOOL_POSTGRES_MAX_PRODUCER_IDS=5000: %d, %v", cfg.Postgres.MaxProducerIDs, err)
	}
	cfg, err = Load("", []string{"SPOOL_STORE=postgres://spool@localhost/spool", "SPOOL_POSTGRES_TX_TIMEOUT=3s"}, nil)
	if err != nil || cfg.Postgres.TxTimeout != 3*time.Second {
		t.Fatalf("SPOOL_POSTGRES_TX_TIMEOUT=3s: %s, %v", cfg.Postgres.TxTimeout, err)
	}
	file := writeFile(t, "postgres:\n  tx_timeout: 1h\n")
	cfg, err = Load(file, []string{"SPOOL_STORE=postgres://spool@localhost/spool"}, nil)
	if err != nil || cfg.Postgres.TxTimeout != time.Hour {
		t.Fatalf("postgres.tx_timeout 1h in the file: %s, %v", cfg.Postgres.TxTimeout, err)
	}
	cfg, err = Load(file, []string{"SPOOL_STORE=postgres://spool@localhost/spool", "SPOOL_POSTGRES_TX_TIMEOUT=10ms"}, nil)
	if err != nil || cfg.Postgres.TxTimeout != 10*time.Millisecond {
		t.Fatalf("SPOOL_POSTGRES_TX_TIMEOUT=10ms over the file's 1h: %s, %v", cfg.Postgres.TxTimeout, err)
	}
	// The setting's name before it covered publishes and DLQ operations is no setting any more:
	// an error that names the new one.
	_, err = Load("", []string{"SPOOL_POSTGRES_DELIVERY_TX_TIMEOUT=3s", "SPOOL_POSTGRES_TX_TIMEOUT=3s"}, nil)
	if err == nil || !strings.Contains(err.Error(), "environment SPOOL_POSTGRES_DELIVERY_TX_TIMEOUT: no such setting (did you mean SPOOL_POSTGRES_TX_TIMEOUT?)") {
		t.Fatalf("the old variable: %v", err)
	}
}

func TestKeysHaveEnvNames(t *testing.T) {
	t.Parallel()
	keys := Keys()
	for _, k := range []string{"listen", "http", "data_dir", "store", "log_level", "server.max_connections", "server.text_publisher_idle", "wal.unsafe_no_sync", "broker.auto_create"} {
		if !slices.Contains(keys, k) {
			t.Errorf("key %q missing from %v", k, keys)
		}
	}
	if EnvName("server.max_connections") != "SPOOL_SERVER_MAX_CONNECTIONS" {
		t.Error(EnvName("server.max_connections"))
	}
	for _, k := range keys {
		if strings.Contains(k, "logger") || strings.Contains(k, "clock") || strings.Contains(k, "version") {
			t.Errorf("non-setting field exposed: %s", k)
		}
	}
}

// TestExposedWithoutAuthenticationRefused: without authentication (no auth.principals) the listeners
// bind loopback only; an address other hosts reach is refused unless insecure is set, with a
// message that says how to open them.
func TestExposedWithoutAuthenticationRefused(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{":9092", "0.0.0.0:9092", "[::]:9092", "10.1.2.3:9092", "spool.example.com:9092"} {
		for _, key := range []string{"listen", "http"} {
			_, err := Load("", nil, map[string]string{key: addr})
			if err == nil || !strings.Contains(err.Error(), key+": ") || !strings.Contains(err.Error(), "--insecure") {
				t.Errorf("%s %q without insecure: %v", key, addr, err)
			}
			cfg, err := Load("", []string{"SPOOL_INSECURE=true"}, map[string]string{key: addr})
			if err != nil || !cfg.Insecure {
				t.Errorf("%s %q with insecure: %v", key, addr, err)
			}
		}
	}
	for _, addr := range []string{"127.0.0.1:9092", "127.0.0.2:1", "[::1]:9092", "localhost:9092", "LOCALHOST:0"} {
		if _, err := Load("", nil, map[string]string{"listen": addr}); err != nil {
			t.Errorf("loopback %q: %v", addr, err)
		}
	}
}

// TestTLSFileErrorsAreTyped: a missing key file, an unreadable or unusable certificate and a bad
// client CA are *KeyError naming the key (and *tlsconf.FileError inside), found at load time.
func TestTLSFileErrorsAreTyped(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		name  string
		env   []string
		key   string
		inMsg string
	}{
		{"cert without key", []string{"SPOOL_SERVER_TLS_CERT_FILE=" + garbage}, "server.tls.key_file", "must be set"},
		{"key without cert", []string{"SPOOL_SERVER_TLS_KEY_FILE=" + garbage}, "server.tls.cert_file", "must be set"},
		{"unreadable cert", []string{"SPOOL_SERVER_TLS_CERT_FILE=" + missing, "SPOOL_SERVER_TLS_KEY_FILE=" + garbage}, "server.tls.cert_file", "no such file"},
		{"unreadable key", []string{"SPOOL_SERVER_TLS_CERT_FILE=" + garbage, "SPOOL_SERVER_TLS_KEY_FILE=" + missing}, "server.tls.key_file", "no such file"},
		{"not a certificate", []string{"SPOOL_SERVER_TLS_CERT_FILE=" + garbage, "SPOOL_SERVER_TLS_KEY_FILE=" + garbage}, "server.tls.cert_file", "PEM"},
	} {
		_, err := Load("", tc.env, nil)
		var ke *KeyError
		var fe *tlsconf.FileError
		if !errors.As(err, &ke) || ke.Key != tc.key || !errors.As(err, &fe) || !strings.Contains(err.Error(), tc.inMsg) ||
			strings.Count(err.Error(), "cert_file")+strings.Count(err.Error(), "key_file") > 2 {
			t.Errorf("%s: got %v (%T), want a *KeyError for %s mentioning %q", tc.name, err, err, tc.key, tc.inMsg)
		}
	}
	var ke *KeyError
	if _, err := Load("", []string{"SPOOL_SERVER_MAX_CONNECTIONS=0"}, nil); !errors.As(err, &ke) || ke.Key != "server.max_connections" {
		t.Errorf("server section: got %v, want a *KeyError for server.max_connections", err)
	}
}

// TestAuthSection: principals come from the file; with them the listeners may be any address;
// an invalid principal is a *KeyError naming it; the list is no variable.
func TestAuthSection(t *testing.T) {
	t.Parallel()
	h, err := auth.HashToken("0123456789abcdef")
	if err != nil {
		t.Fatal(err)
	}
	billing := `
auth:
  open_metrics: false
  principals:
    - name: billing
      token_hash: "` + h + `"
      permissions:
        - {action: publish, topics: "orders.#"}
        - {action: consume, topics: "orders.*", groups: "billing-*"}
`
	cfg, err := Load(writeFile(t, "listen: \":9092\"\nhttp: \"0.0.0.0:8080\"\n"+billing), nil, nil)
	if err != nil {
		t.Fatalf("exposed listeners with authentication: %v", err)
	}
	if len(cfg.Auth.Principals) != 1 || cfg.Auth.OpenMetrics || cfg.Auth.Principals[0].Permissions[1].Groups != "billing-*" {
		t.Fatalf("auth section read as %+v", cfg.Auth)
	}
	// A cert_cn needs mutual TLS: without client_ca_file no certificate is verified.
	ops := billing + `
    - name: ops
      cert_cn: ops.example.com
      permissions:
        - {action: admin, topics: "#"}
`
	var ke *KeyError
	if _, err := Load(writeFile(t, ops), nil, nil); !errors.As(err, &ke) || ke.Key != "auth.principals[1].cert_cn" {
		t.Fatalf("cert_cn without client_ca_file: got %v, want a *KeyError for auth.principals[1].cert_cn", err)
	}
	// With one, validation goes on to the TLS files (here missing).
	if _, err := Load(writeFile(t, ops), []string{"SPOOL_SERVER_TLS_CLIENT_CA_FILE=/nonexistent/ca.pem"}, nil); !errors.As(err, &ke) || !strings.HasPrefix(ke.Key, "server.tls.") {
		t.Fatalf("cert_cn with client_ca_file: got %v, want the TLS files checked", err)
	}
	if !Defaults().Auth.OpenMetrics {
		t.Error("open_metrics defaults to false")
	}
	bad := writeFile(t, `
auth:
  principals:
    - name: billing
      token_hash: "plain"
`)
	if _, err := Load(bad, nil, nil); !errors.As(err, &ke) || ke.Key != "auth.principals[0].token_hash" {
		t.Errorf("a plain token_hash: got %v, want a *KeyError for auth.principals[0].token_hash", err)
	}
	keys := Keys()
	if !slices.Contains(keys, "auth.open_metrics") || slices.Contains(keys, "auth.principals") {
		t.Errorf("keys %v: want auth.open_metrics and not auth.principals", keys)
	}
}

// TestDebugListenLoopbackOnly: the profiling listener has no authentication, with or without
// auth.principals: an address other hosts reach needs insecure.
func TestDebugListenLoopbackOnly(t *testing.T) {
	t.Parallel()
	if _, err := Load("", nil, map[string]string{"debug_listen": ":6060"}); err == nil || !strings.Contains(err.Error(), "debug_listen") {
		t.Fatalf("debug_listen :6060 without insecure: %v", err)
	}
	if _, err := Load("", nil, map[string]string{"debug_listen": "127.0.0.1:6060"}); err != nil {
		t.Fatalf("debug_listen on loopback: %v", err)
	}
	if _, err := Load("", []string{"SPOOL_INSECURE=true"}, map[string]string{"debug_listen": ":6060"}); err != nil {
		t.Fatalf("debug_listen :6060 with insecure: %v", err)
	}
}

// TestDeployConfigLoads: the example configuration of the systemd unit (deploy/systemd/spool.yaml)
// loads and is valid, with the data directory the unit passes, and so is its commented auth
// section once uncommented.
func TestDeployConfigLoads(t *testing.T) {
	t.Parallel()
	const file = "../../deploy/systemd/spool.yaml"
	cfg, err := Load(file, nil, map[string]string{"data_dir": "/var/lib/spool"})
	if err != nil {
		t.Fatalf("Load(%s): %v", file, err)
	}
	if cfg.Listen != "127.0.0.1:9092" || cfg.DataDir != "/var/lib/spool" {
		t.Fatalf("listen %q, data_dir %q", cfg.Listen, cfg.DataDir)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var auth []string
	in := false
	for line := range strings.Lines(string(data)) {
		if strings.HasPrefix(line, "# auth:") {
			in = true
		}
		if in && !strings.HasPrefix(line, "# ") {
			break
		}
		if in {
			auth = append(auth, strings.TrimPrefix(line, "# "))
		}
	}
	if len(auth) < 5 {
		t.Fatalf("no commented auth section in %s", file)
	}
	withAuth := filepath.Join(t.TempDir(), "spool.yaml")
	body := strings.ReplaceAll(strings.Join(auth, ""), `"sha256:..."`, `"sha256:00:`+strings.Repeat("ab", 32)+`"`)
	if err := os.WriteFile(withAuth, []byte("listen: \":9092\"\n"+body), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(withAuth, nil, nil); err != nil {
		t.Fatalf("the commented auth section does not load: %v\n%s", err, body)
	}
}

// TestListenAddressSyntax: listen, http and debug_listen must be host:port with a port net
// accepts (0 to 65535 or a service name), checked before the loopback rule and with
// authentication on too, so that a bad address is refused naming its key and not at net.Listen
// once the engine is open.
func TestListenAddressSyntax(t *testing.T) {
	t.Parallel()
	h, err := auth.HashToken("0123456789abcdef")
	if err != nil {
		t.Fatal(err)
	}
	withAuth := writeFile(t, "auth:\n  principals:\n    - name: app\n      token_hash: \""+h+"\"\n")
	for _, key := range []string{"listen", "http", "debug_listen"} {
		for _, addr := range []string{"127.0.0.1", "localhost", "127.0.0.1:99999", "127.0.0.1:-1", "127.0.0.1:no-such-service", "::1:9092", "[::1", "http://127.0.0.1:8080"} {
			for _, file := range []string{"", withAuth} {
				_, err := Load(file, nil, map[string]string{key: addr})
				var ke *KeyError
				if !errors.As(err, &ke) || ke.Key != key || !strings.Contains(err.Error(), "host:port") || strings.Contains(err.Error(), "other hosts") {
					t.Errorf("%s %q (auth file %q): got %v, want a *KeyError for %s about host:port", key, addr, file, err, key)
				}
			}
		}
		for _, addr := range []string{"127.0.0.1:0", "127.0.0.1:65535", "localhost:http", "[::1]:9092", "127.0.0.1:"} {
			if _, err := Load("", nil, map[string]string{key: addr}); err != nil {
				t.Errorf("%s %q: %v", key, addr, err)
			}
		}
		if _, err := Load(withAuth, []string{"SPOOL_INSECURE=true"}, map[string]string{key: ":9092"}); err != nil {
			t.Errorf("%s \":9092\" (every interface): %v", key, err)
		}
	}
	_, err = Load("", nil, map[string]string{"http": "http://127.0.0.1:8080"})
	if err == nil || !strings.Contains(err.Error(), `"127.0.0.1:8080"`) {
		t.Errorf("http as a URL: %v, want the host:port to give instead", err)
	}
}

// TestWALSettingsIgnoredOnPostgres: the PostgreSQL engine uses no wal.* setting, so
// wal.max_open_files, checked against the machine (ulimit -n), does not stop it from starting;
// the embedded engine still refuses a value above the limit. Ranges that depend on nothing but
// the value are checked with either engine.
func TestWALSettingsIgnoredOnPostgres(t *testing.T) {
	t.Parallel()
	const pg = "SPOOL_STORE=postgres://spool@localhost/spool"
	huge := []string{"SPOOL_WAL_MAX_OPEN_FILES=1073741824"}
	if _, err := Load("", append(huge, pg), nil); err != nil {
		t.Errorf("%v with a PostgreSQL store: %v", huge, err)
	}
	var ke *KeyError
	if _, err := Load("", huge, nil); !errors.As(err, &ke) || ke.Key != "wal.max_open_files" {
		t.Errorf("%v with the embedded engine: got %v, want a *KeyError for wal.max_open_files", huge, err)
	}
	if _, err := Load("", []string{"SPOOL_WAL_SEGMENT_BYTES=1", pg}, nil); !errors.As(err, &ke) || ke.Key != "wal.segment_bytes" {
		t.Errorf("wal.segment_bytes 1 with a PostgreSQL store: got %v, want a *KeyError for wal.segment_bytes", err)
	}
}

// TestSegmentBytesRange: wal.segment_bytes is 1 MiB to 1 GiB, refused past it naming the key
// (not only when the engine opens, naming wal.Config's field), and config's bound is wal's.
func TestSegmentBytesRange(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		value string
		ok    bool
	}{{"1048575", false}, {"1048576", true}, {"1073741824", true}, {"1073741825", false}, {"4294967296", false}} {
		_, err := Load("", []string{"SPOOL_WAL_SEGMENT_BYTES=" + tc.value}, nil)
		var ke *KeyError
		if tc.ok && err != nil {
			t.Errorf("wal.segment_bytes %s: %v", tc.value, err)
		}
		if !tc.ok && (!errors.As(err, &ke) || ke.Key != "wal.segment_bytes" || !strings.Contains(err.Error(), "between 1 MiB and 1 GiB")) {
			t.Errorf("wal.segment_bytes %s: got %v, want a *KeyError for wal.segment_bytes naming the range", tc.value, err)
		}
	}
	if err := (wal.Config{SegmentBytes: maxSegmentBytes}).Validate(); err != nil {
		t.Errorf("the embedded engine refuses config's largest wal.segment_bytes: %v", err)
	}
	if err := (wal.Config{SegmentBytes: maxSegmentBytes + 1}).Validate(); err == nil {
		t.Errorf("the embedded engine accepts more than config's largest wal.segment_bytes: raise the bound here")
	}
}

// TestClosedMetricsNeedPrincipals: auth.open_metrics: false closes /metrics to unauthenticated
// scrapers only with authentication on (it then needs admin on "#"); without principals it
// would do nothing, so it is refused.
func TestClosedMetricsNeedPrincipals(t *testing.T) {
	t.Parallel()
	var ke *KeyError
	if _, err := Load(writeFile(t, "auth:\n  open_metrics: false\n"), nil, nil); !errors.As(err, &ke) || ke.Key != "auth.open_metrics" || !strings.Contains(err.Error(), "needs auth.principals") {
		t.Errorf("open_metrics false in the file without principals: got %v, want a *KeyError for auth.open_metrics", err)
	}
	if _, err := Load("", []string{"SPOOL_AUTH_OPEN_METRICS=false"}, nil); !errors.As(err, &ke) || ke.Key != "auth.open_metrics" {
		t.Errorf("SPOOL_AUTH_OPEN_METRICS=false without principals: got %v, want a *KeyError for auth.open_metrics", err)
	}
	if _, err := Load("", []string{"SPOOL_AUTH_OPEN_METRICS=true"}, nil); err != nil {
		t.Errorf("SPOOL_AUTH_OPEN_METRICS=true without principals: %v", err)
	}
}

// TestDeployUnitOpenFiles: the systemd unit's comment on LimitNOFILE describes the open segment
// files as wal.max_open_files bounds them (idle files are closed), not one open log per partition.
func TestDeployUnitOpenFiles(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../deploy/systemd/spool.service")
	if err != nil {
		t.Fatal(err)
	}
	var comment []string
	for line := range strings.Lines(string(data)) {
		if strings.HasPrefix(line, "LimitNOFILE=") {
			break
		}
		if strings.HasPrefix(line, "#") {
			comment = append(comment, line)
		} else {
			comment = nil
		}
	}
	text := strings.Join(comment, "")
	if !strings.Contains(text, "wal.max_open_files") || strings.Contains(text, "keeps its log open") {
		t.Errorf("the comment above LimitNOFILE does not describe wal.max_open_files:\n%s", text)
	}
}

// TestLoadStoreChecksOnlyTheStore: spool migrate's loader takes spool serve's file although it
// names a TLS key this shell cannot read and a listener open to other hosts without
// authentication (Load refuses both), and still refuses a bad store setting and unknown keys.
func TestLoadStoreChecksOnlyTheStore(t *testing.T) {
	serveFile := writeFile(t, "store: postgres://spool@db:5432/app\nlisten: \"0.0.0.0:9092\"\n"+
		"server:\n  tls:\n    cert_file: /nonexistent/server.crt\n    key_file: /nonexistent/server.key\n"+
		"postgres:\n  schema: spool_app\n")
	if _, err := Load(serveFile, nil, nil); err == nil {
		t.Fatal("Load took a file with unreadable TLS files and an exposed listener")
	}
	cfg, err := LoadStore(serveFile, nil, nil)
	if err != nil {
		t.Fatalf("LoadStore: %v", err)
	}
	if cfg.Store != "postgres://spool@db:5432/app" || cfg.Postgres.Schema != "spool_app" {
		t.Fatalf("LoadStore: store %q schema %q", cfg.Store, cfg.Postgres.Schema)
	}
	var ke *KeyError
	if _, err := LoadStore(serveFile, nil, map[string]string{"postgres.schema": "Bad-Name"}); !errors.As(err, &ke) || ke.Key != "postgres.schema" {
		t.Fatalf("LoadStore with a bad schema: %v, want a postgres.schema error", err)
	}
	if _, err := LoadStore(serveFile, []string{"SPOOL_POSTGRES_SCHEMAA=x"}, nil); err == nil {
		t.Fatal("LoadStore took an unknown SPOOL_ variable")
	}
}
