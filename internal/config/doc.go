// Package config is the configuration of spool serve: one plain struct (Config) with yaml tags,
// its defaults (Defaults, the values of BRIEF.md section 5), its validation (Validate, which names
// the offending key) and its loading (Load).
//
// # Sources and precedence
//
// Load starts from Defaults, then applies, each overriding the previous one:
//
//  1. the YAML file given with --config (or named by SPOOL_CONFIG); unknown keys are errors, and
//     errors name the dotted key and its line ("server.max_connections (line 2): ...");
//  2. environment variables: every key has one, SPOOL_ and its dotted path in upper case with
//     underscores (server.max_connections -> SPOOL_SERVER_MAX_CONNECTIONS, data_dir ->
//     SPOOL_DATA_DIR); a SPOOL_* variable that names no key is an error, like an unknown key in
//     the file (a typo would leave the setting at its default), naming the closest variable;
//     except SPOOL_CONFIG, SPOOL_ADDR and SPOOL_TOKEN (the client commands' broker address and
//     token) and the test
//     harness's SPOOL_TEST_* (OtherEnv, TestEnvPrefix);
//  3. the flags given on the command line (only those actually given).
//
// Values in the environment and in flags are strings: durations use Go's syntax ("30s", "5m"),
// booleans true or false, sizes plain byte counts.
//
// The wal.* settings are the embedded engine's and are ignored with a PostgreSQL store (store: a
// postgres:// URL), except wal.unsafe_no_sync, which is refused there; the postgres.* settings
// are ignored with the embedded engine. Their ranges are checked with either engine, but
// wal.max_open_files is checked against ulimit -n with the embedded engine only.
//
// # Example file
//
//	listen: "127.0.0.1:9092"
//	http: "127.0.0.1:8080"
//	insecure: false   # true lets listen and http be reachable from other hosts without authentication
//	http_max_connections: 1024
//	http_allowed_hosts: []   # Host names besides localhost and IPs that HTTP requests may name without auth
//	data_dir: /var/lib/spool
//	log_level: info
//	shutdown_timeout: 30s
//	wal:
//	  unsafe_no_sync: false
//	  shared_flush: true
//	  slow_sync: 1s
//	  max_open_files: 0   # segment files kept open; 0: half of ulimit -n
//	broker:
//	  auto_create: true
//	  auto_create_semantics: QUEUE
//	  default_max_in_flight: 10
//	  backpressure_interval: 1s  # how often bounded topics' backlogs are read
//	  max_throttle_delay: 1s     # longest wait of a publish to a throttled topic
//	server:
//	  max_connections: 10000
//	  max_frame_size: 10485760
//	  heartbeat_interval: 10s
//	  session_timeout: 30s
//	  max_conn_buffer_bytes: 8388608   # deliveries queued for a connection, not yet written
//	  text_ack_wait: 24h
//	  text_ack_timeout: 5m       # a text session holding deliveries without ACK/NACK is closed
//	  text_publisher_idle: 1s
//	  tls:                       # TLS on the TCP and HTTP listeners (both files, or neither)
//	    cert_file: /etc/spool/server.pem
//	    key_file: /etc/spool/server.key
//	    client_ca_file: /etc/spool/ca.pem   # optional: mutual TLS (client certificates required)
//	auth:                        # authentication on: listen and http may be any address
//	  open_metrics: true         # /metrics without credentials (/healthz, /readyz always); false needs principals
//	  principals:                # file only (no variable or flag)
//	    - name: billing
//	      token_hash: "sha256:..."   # spool token hash < token-file
//	      permissions:
//	        - {action: publish, topics: "orders.#"}
//	        - {action: consume, topics: "orders.*", groups: "billing-*"}
//	    - name: ops
//	      cert_cn: ops.example.com   # client certificate subject CN (mutual TLS)
//	      permissions:
//	        - {action: admin, topics: "#"}
//
// Validate names the offending key in a *KeyError. It also reads the server.tls files, so that a
// missing or unusable certificate, key or CA stops the start (the *KeyError then wraps a
// *tlsconf.FileError). SIGHUP reloads cert_file and key_file in spool serve.
//
// Keys lists every key. Nothing here is shared mutable state: Defaults returns a new value each
// time, and every function is safe for concurrent use.
package config
