package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/spoolmq/spool/internal/auth"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/server"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal"
	"github.com/spoolmq/spool/internal/tlsconf"
)

// EnvPrefix starts the name of every environment variable that overrides a setting.
const EnvPrefix = "SPOOL_"

// EnvConfigFile names the configuration file when no file is given to Load.
const EnvConfigFile = EnvPrefix + "CONFIG"

// Config is the configuration of spool serve. The yaml tags are the keys of the configuration
// file; the dotted path of a key ("server.max_connections") is also the name of its environment
// variable (SPOOL_SERVER_MAX_CONNECTIONS) and of its entry in Load's flags map.
type Config struct {
	// Listen is the TCP address of the binary protocol and the text mode, host:port (an empty
	// host: every interface; the port 0 to 65535 or a service name). Defaults to
	// "127.0.0.1:9092"; an address other hosts reach needs Insecure.
	Listen string `yaml:"listen"`
	// HTTP is the address of the HTTP listener (admin API, dashboard, /metrics, /healthz, /readyz),
	// host:port as Listen: not a URL, although the client commands' SPOOL_HTTP may be one (their
	// --http takes host:port too, so one host:port value serves both). Defaults to
	// "127.0.0.1:8080"; an address other hosts reach needs Insecure.
	HTTP string `yaml:"http"`
	// Insecure lets Listen and HTTP be addresses that other hosts reach (":9092", a LAN address)
	// although authentication is off (no auth.principals): whoever reaches them may publish,
	// consume, purge DLQs and delete topics. For a trusted network only. Defaults to false: without
	// authentication both must be loopback addresses (127.0.0.0/8, ::1, localhost); with it they
	// may be any address.
	Insecure bool `yaml:"insecure"`
	// HTTPMaxConnections bounds the open connections of the HTTP listener; one more is answered
	// 503 OVERLOADED (Retry-After: 1) and closed. Defaults to 1024.
	HTTPMaxConnections int `yaml:"http_max_connections"`
	// HTTPAllowedHosts are host names (without port) that a request to the HTTP or debug listener
	// may name in its Host header besides localhost, IP addresses, the machine's host name and
	// the host of http, while authentication is off: e.g. the name a reverse proxy forwards, or
	// the name Prometheus scrapes. Other names are refused (421) because a web page using DNS
	// rebinding names its own. File only.
	HTTPAllowedHosts []string `yaml:"http_allowed_hosts"`
	// DataDir is the directory of the embedded engine. Defaults to "./spool-data".
	DataDir string `yaml:"data_dir"`
	// Store selects the engine: empty for the embedded engine in DataDir, or a postgres:// URL
	// for the PostgreSQL engine (see Postgres). Defaults to empty.
	Store string `yaml:"store"`
	// LogLevel is debug, info, warn or error. Logs are JSON lines on stderr. Defaults to info.
	LogLevel string `yaml:"log_level"`
	// ShutdownTimeout bounds the graceful shutdown on SIGTERM or SIGINT. Defaults to 30 s.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// DebugListen is the address of an opt-in listener serving Go's /debug/pprof/ profiles (CPU,
	// heap, goroutines, mutex, block), host:port as Listen. Keep it on loopback: it has no
	// authentication. Defaults to empty: off.
	DebugListen string `yaml:"debug_listen"`

	// WAL configures the embedded engine. Ignored with a PostgreSQL store (wal.unsafe_no_sync is
	// refused there); the ranges of its values are checked with either engine, wal.max_open_files
	// against ulimit -n with the embedded engine only.
	WAL WAL `yaml:"wal"`
	// Postgres configures the PostgreSQL engine (used when Store is a postgres:// URL). Ignored
	// with the embedded engine; the ranges of its values are checked with either engine.
	Postgres Postgres `yaml:"postgres"`
	// Broker configures the broker.
	Broker Broker `yaml:"broker"`
	// Server configures the TCP server (protocol limits and timeouts); see server.Config.
	Server server.Config `yaml:"server"`
	// Auth configures authentication and authorization (auth.principals, file only; see
	// auth.Config). Without principals every client may do everything, and auth.open_metrics:
	// false, which closes /metrics to clients without a principal, is refused.
	Auth auth.Config `yaml:"auth"`
}

// WAL configures the embedded engine; a PostgreSQL store ignores it.
type WAL struct {
	// UnsafeNoSync acknowledges publishes and acks before they are fsynced: a machine crash (not a
	// process crash) loses acknowledged messages. Defaults to false.
	UnsafeNoSync bool `yaml:"unsafe_no_sync"`
	// SegmentBytes is the largest size log segments are preallocated to (they start at 64 KiB and
	// grow four times with each segment that fills), 1 MiB to 1 GiB. Defaults to 64 MiB.
	SegmentBytes int64 `yaml:"segment_bytes"`
	// MaxProducerIDs bounds the producer ids remembered for de-duplication, all topics together
	// (each in memory until its dedup_window ends, ~110 bytes whatever its length): past it,
	// publishes with new ids get RATE_LIMITED. Defaults to 2,000,000 (~220 MB).
	MaxProducerIDs int `yaml:"max_producer_ids"`
	// SharedFlush lets the logs of a group-commit round share one cache flush where the engine
	// can check that this is safe (ext4 without data=journal, kernel 5.2 or later; see
	// docs/storage.md, "Durability"): one fdatasync instead of one per log. Set it to false on
	// storage stacks whose guarantees differ from the filesystem's own (every log then
	// fdatasyncs itself). Defaults to true.
	SharedFlush bool `yaml:"shared_flush"`
	// SlowSync is the duration of an fdatasync, or of a whole group-commit round, above which the
	// engine logs a warning ("wal sync slow" with the file; "wal commit round slow" with the
	// round's phases: write, write_back, sync, other). Lower it to see the disk stalls behind a
	// latency tail. Defaults to 1s.
	SlowSync time.Duration `yaml:"slow_sync"`
	// MaxOpenFiles bounds the segment files the engine keeps open: the files of the partitions
	// idle the longest are closed past it and opened again on use, so that 10,000 topics run
	// under ulimit -n 4096. Files in use at the same moment are never closed (a busy
	// partition's active segment stays open). At most the process's open file limit
	// (RLIMIT_NOFILE), checked with the embedded engine only. Defaults to 0: half of that limit.
	MaxOpenFiles int `yaml:"max_open_files"`
}

// Postgres configures the PostgreSQL engine; the embedded engine ignores it.
type Postgres struct {
	// Schema is the PostgreSQL schema of Spool's tables. Defaults to "spool".
	Schema string `yaml:"schema"`
	// Migrate applies pending schema migrations when the broker starts (under an advisory lock, so
	// concurrent instances migrate once). When false, the broker refuses to start on an older
	// schema: run "spool migrate". Defaults to true.
	Migrate bool `yaml:"migrate"`
	// MaxConns bounds the connection pool of one broker instance. A busy instance uses about two
	// connections per subscription with members (claims, acks) plus one per publishing client
	// connection; waiting for a pooled connection shows up as latency. Defaults to 32 (mind the
	// database's max_connections when many instances share it).
	MaxConns int `yaml:"max_conns"`
	// BucketWidth is the time span of one partition of the messages table (retention drops whole
	// partitions); read only when the schema is created. Defaults to 1 h.
	BucketWidth time.Duration `yaml:"bucket_width"`
	// PollInterval is how often the engine looks for messages published by other instances when
	// no notification came. Defaults to 1 s.
	PollInterval time.Duration `yaml:"poll_interval"`
	// ClaimInterval is the shortest time between two claims of one subscription on this instance
	// (broker.Config.ClaimInterval): under load one claim transaction then takes everything
	// published meanwhile. Adds up to that much latency under load (a claim after a quiet period
	// is not delayed). In full from 4 subscriptions with members on the instance; with fewer, a
	// share (a quarter with one). Defaults to 20 ms; 0 claims at every wake-up.
	ClaimInterval time.Duration `yaml:"claim_interval"`
	// TxTimeout bounds the database transaction of a claim, ack, nack or extend (a combined one),
	// a release, a publish by the broker, a DLQ list, a catalog operation, a read and
	// statistics; topic and subscription deletes and DLQ purges and replays until they hold
	// their locks
	// (pgstore.Config.TxTimeout): when the database does not answer in time (network black hole,
	// a row lock held by another session, a stuck server or synchronous standby), the request
	// fails with TIMEOUT (retryable) instead of waiting until TCP gives up. Such a transaction
	// takes milliseconds, seconds under heavy load. Defaults to 10 s; between 10 ms and 1 h.
	TxTimeout time.Duration `yaml:"tx_timeout"`
	// MaxProducerIDs bounds the producer ids the database remembers for de-duplication, all topics
	// together (spool.producer_ids, until their dedup_window ends and maintenance prunes them):
	// past it, publishes with new ids get RATE_LIMITED. Counted approximately: each instance
	// recounts every maintenance pass (docs/storage.md, "Producer de-duplication"); give every
	// instance the same value. Defaults to 1,000,000 (pgstore.DefaultMaxProducerIDs).
	MaxProducerIDs int `yaml:"max_producer_ids"`
}

// Broker configures the broker.
type Broker struct {
	// AutoCreate creates an unknown topic on its first publish. Defaults to true.
	AutoCreate bool `yaml:"auto_create"`
	// AutoCreateSemantics is the semantics of auto-created topics, QUEUE or PUB_SUB. Defaults to
	// QUEUE.
	AutoCreateSemantics string `yaml:"auto_create_semantics"`
	// DefaultMaxInFlight is the credit of a consumer that asks for none. Defaults to 10.
	DefaultMaxInFlight int `yaml:"default_max_in_flight"`
	// MaxTopics bounds the topics the broker keeps (explicit and auto-created): one more is
	// refused with LIMIT_EXCEEDED. 0 means no bound. Defaults to 10,000.
	MaxTopics int `yaml:"max_topics"`
	// MaxSubscriptions bounds the durable subscriptions (groups) the broker keeps: a member of a
	// new group, or a group created ahead, past it is refused with LIMIT_EXCEEDED. 0 means no
	// bound. Defaults to 100,000.
	MaxSubscriptions int `yaml:"max_subscriptions"`
	// MaxBindings bounds the bindings (durable groups on topic patterns) the broker keeps, as
	// MaxSubscriptions does. 0 means no bound. Defaults to 10,000.
	MaxBindings int `yaml:"max_bindings"`
	// MaxPartitions bounds a topic's partitions (create, and growth by update). At most 4096.
	// Defaults to 1024.
	MaxPartitions int `yaml:"max_partitions"`
	// RetentionInterval is how often retention runs. Defaults to 1 minute.
	RetentionInterval time.Duration `yaml:"retention_interval"`
	// LifecycleInterval is how often the broker heartbeats the subscriptions its consumers are
	// attached to and runs dead detection and the CANCELLED -> DELETED cleanup (at most a fifth of
	// the shortest heartbeat timeout). At least 1 s. Defaults to 1 minute.
	LifecycleInterval time.Duration `yaml:"lifecycle_interval"`
	// SubscriptionRetention is how long a CANCELLED subscription is kept before it becomes DELETED
	// and leaves the listings. Defaults to 30 days (720h).
	SubscriptionRetention time.Duration `yaml:"subscription_retention"`
	// BackfillBatch is the most backfill range messages one claim takes (seed 000's
	// backfill_batch), 1 to 1,000,000. Defaults to 10,000.
	BackfillBatch int `yaml:"backfill_batch"`
	// BackfillTargetP95 is the claim latency p95 above which a backfill's rate is halved (AIMD),
	// at least 1ms. Defaults to 10ms.
	BackfillTargetP95 time.Duration `yaml:"backfill_target_p95"`
	// BackfillMaxRate caps a backfill's messages per second per group and broker instance, 100
	// to 10,000,000. Defaults to 50,000.
	BackfillMaxRate int `yaml:"backfill_max_rate"`
	// PollInterval is how long an idle dispatcher first waits before it looks again; it backs off
	// to 16 times that while it finds nothing. Defaults to 1 s.
	PollInterval time.Duration `yaml:"poll_interval"`
	// RebalanceDelay is how long an ordered group waits after a member joined or left before it
	// rebalances: joins and leaves within it make one rebalance. 0 rebalances at once; at most
	// 1 minute. Defaults to 100 ms.
	RebalanceDelay time.Duration `yaml:"rebalance_delay"`
	// SlowOperation is the duration above which a broker operation (publish, claim, ack, nack,
	// read, retention run) is logged at WARN, "slow broker operation" (seed 002 M4-13). 0 turns
	// it off. Defaults to 100 ms.
	SlowOperation time.Duration `yaml:"slow_operation"`
	// BackpressureInterval is how often the backlog of the topics with a backlog bound is read
	// (topic backpressure). Defaults to 1 s.
	BackpressureInterval time.Duration `yaml:"backpressure_interval"`
	// MaxThrottleDelay is the longest a publish to a throttled topic waits. Defaults to 1 s; at
	// most 1 minute.
	MaxThrottleDelay time.Duration `yaml:"max_throttle_delay"`
}

// Bounds of wal.segment_bytes. The largest is the embedded engine's own (wal.Config.Validate),
// checked here so that the error names the key and comes before the engine opens.
const (
	minSegmentBytes = 1 << 20
	maxSegmentBytes = 1 << 30
)

// Defaults returns the default configuration.
func Defaults() Config {
	srv := server.DefaultConfig()
	return Config{
		Listen:             "127.0.0.1:9092",
		HTTP:               "127.0.0.1:8080",
		HTTPMaxConnections: 1024,
		DataDir:            "./spool-data",
		LogLevel:           "info",
		ShutdownTimeout:    30 * time.Second,
		WAL:                WAL{SegmentBytes: 64 << 20, SharedFlush: true, SlowSync: time.Second, MaxProducerIDs: wal.DefaultMaxProducerIDs},
		Postgres: Postgres{Schema: "spool", Migrate: true, MaxConns: 32, BucketWidth: time.Hour, PollInterval: time.Second,
			ClaimInterval: 20 * time.Millisecond, TxTimeout: 10 * time.Second, MaxProducerIDs: 1_000_000},
		Broker: Broker{
			AutoCreate:            true,
			AutoCreateSemantics:   string(storage.Queue),
			DefaultMaxInFlight:    10,
			MaxTopics:             broker.DefaultMaxTopics,
			MaxSubscriptions:      broker.DefaultMaxSubscriptions,
			MaxBindings:           broker.DefaultMaxBindings,
			MaxPartitions:         broker.DefaultMaxPartitions,
			RetentionInterval:     time.Minute,
			PollInterval:          time.Second,
			RebalanceDelay:        broker.DefaultRebalanceDelay,
			SlowOperation:         broker.DefaultSlowOperation,
			BackpressureInterval:  broker.DefaultBackpressureInterval,
			MaxThrottleDelay:      broker.DefaultMaxThrottleDelay,
			LifecycleInterval:     broker.DefaultLifecycleInterval,
			SubscriptionRetention: storage.DefaultSubscriptionRetention,
			BackfillBatch:         broker.DefaultBackfillBatch,
			BackfillTargetP95:     broker.DefaultBackfillTargetP95,
			BackfillMaxRate:       broker.DefaultBackfillMaxRate,
		},
		Server: srv,
		Auth:   auth.Config{OpenMetrics: true},
	}
}

// Load builds the configuration: the defaults, then the YAML file (file, or the file named by
// SPOOL_CONFIG in env when file is empty; no file at all is fine), then the SPOOL_* variables of
// env (in os.Environ form), then flags (keyed by the dotted path of the setting: "listen",
// "data_dir", "server.max_connections"). Each later source overrides the earlier ones. Unknown
// keys in the file, unknown flag keys and SPOOL_* variables that name no setting are errors
// (except OtherEnv and the test harness's SPOOL_TEST_* variables). The result is validated.
func Load(file string, env []string, flags map[string]string) (Config, error) {
	cfg, err := load(file, env, flags)
	if err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// LoadStore is Load for a command that only opens the store (spool migrate): the same sources and
// the same errors for unknown keys, but only the store's settings are validated (store,
// postgres.schema, postgres.bucket_width), not the listeners, TLS files or limits it never uses,
// so that spool serve's own file works from an administrator's shell.
func LoadStore(file string, env []string, flags map[string]string) (Config, error) {
	cfg, err := load(file, env, flags)
	if err != nil {
		return Config{}, err
	}
	if err := cfg.validateStore(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// load is Load without the validation.
func load(file string, env []string, flags map[string]string) (Config, error) {
	cfg := Defaults()
	cfg.Server.TextAckTimeout = 0 // unless set: 5 min, at most text_ack_wait (below)
	if file == "" {
		file = lookupEnv(env, EnvConfigFile)
	}
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return Config{}, fmt.Errorf("config file: %w", err)
		}
		if err := decodeFile(data, &cfg); err != nil {
			return Config{}, fmt.Errorf("config file %s: %w", file, err)
		}
	}
	fields := settings(&cfg)
	byEnv := envNames(fields)
	for _, kv := range env {
		name, value, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		f, ok := fields[byEnv[name]]
		if !ok {
			if notSetting(name) {
				return Config{}, unknownEnvError(name, byEnv)
			}
			continue
		}
		if err := f.set(value); err != nil {
			return Config{}, fmt.Errorf("environment %s: %w", name, err)
		}
	}
	keys := make([]string, 0, len(flags))
	for k := range flags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		f, ok := fields[k]
		if !ok {
			return Config{}, fmt.Errorf("flag %s: no such setting", k)
		}
		if err := f.set(flags[k]); err != nil {
			return Config{}, fmt.Errorf("flag %s: %w", k, err)
		}
	}
	if cfg.Server.TextAckTimeout == 0 {
		// Not set: the default, at most text_ack_wait (which may have been lowered).
		cfg.Server.TextAckTimeout = min(server.DefaultTextAckTimeout, cfg.Server.TextAckWait)
	}
	return cfg, nil
}

// OtherEnv are the SPOOL_* variables that name no setting but are no mistake either: the
// configuration file (EnvConfigFile), the broker address and the token of the client commands
// (spool pub, sub, ...; SPOOL_HTTP, their admin API address, is also the setting http).
// Variables starting with TestEnvPrefix belong to the test harness.
var OtherEnv = []string{EnvConfigFile, "SPOOL_ADDR", "SPOOL_TOKEN"}

// TestEnvPrefix starts the variables of the test harness (SPOOL_TEST_REQUIRE_PG, ...), which Load
// leaves alone.
const TestEnvPrefix = EnvPrefix + "TEST_"

// notSetting reports whether name, a variable that names no setting, is an error for Load: it
// has the SPOOL_ prefix and is neither in OtherEnv nor a test harness variable.
func notSetting(name string) bool {
	return strings.HasPrefix(name, EnvPrefix) && !strings.HasPrefix(name, TestEnvPrefix) && !slices.Contains(OtherEnv, name)
}

// unknownEnvError is the error of a SPOOL_* variable that names no setting, like an unknown key
// in the file: a typo would otherwise leave the setting at its default without a word. It names
// the closest setting's variable when one is a few edits away.
func unknownEnvError(name string, byEnv map[string]string) error {
	best, bestDist := "", 0
	for env := range byEnv {
		if d := editDistance(name, env); best == "" || d < bestDist || d == bestDist && env < best {
			best, bestDist = env, d
		}
	}
	hint := ""
	if best != "" && bestDist <= max(2, len(name)/3) {
		hint = fmt.Sprintf(" (did you mean %s?)", best)
	}
	return fmt.Errorf("environment %s: no such setting%s; a setting's variable is SPOOL_ and its key in upper case (server.max_connections: SPOOL_SERVER_MAX_CONNECTIONS)", name, hint)
}

// editDistance is the Levenshtein distance of a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// decodeFile decodes a YAML configuration file onto cfg. Unknown keys are errors. Errors of the
// decoder name a line only ("line 2: cannot unmarshal !!str `many` into int"); each is prefixed
// with the dotted key at that line ("server.max_connections (line 2): ...").
func decodeFile(data []byte, cfg *Config) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(cfg)
	if err == nil || errors.Is(err, io.EOF) { // io.EOF: an empty file
		return nil
	}
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err // a syntax error: the line is all there is
	}
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil {
		return err
	}
	keys := make(map[int]string)
	var walk func(prefix string, n *yaml.Node)
	walk = func(prefix string, n *yaml.Node) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(prefix, c)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				path := prefix + k.Value
				// Block style has one key per line; in a flow mapping the first key of a line wins.
				if _, ok := keys[k.Line]; !ok {
					keys[k.Line] = path
				}
				if _, ok := keys[v.Line]; !ok && v.Kind != yaml.MappingNode {
					keys[v.Line] = path
				}
				walk(path+".", v)
			}
		}
	}
	walk("", &root)
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		var line int
		if _, serr := fmt.Sscanf(m, "line %d:", &line); serr == nil && keys[line] != "" {
			_, rest, _ := strings.Cut(m, ": ")
			m = fmt.Sprintf("%s (line %d): %s", keys[line], line, rest)
		}
		msgs[i] = m
	}
	return errors.New(strings.Join(msgs, "; "))
}

// Keys lists every setting's dotted key, sorted (for documentation and tests).
func Keys() []string {
	cfg := Defaults()
	var out []string
	for k := range settings(&cfg) {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// EnvName returns the environment variable of a dotted key: "server.max_connections" ->
// SPOOL_SERVER_MAX_CONNECTIONS.
func EnvName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// envNames maps the environment variable of each setting to its key.
func envNames(fields map[string]field) map[string]string {
	out := make(map[string]string, len(fields))
	for k := range fields {
		out[EnvName(k)] = k
	}
	return out
}

func lookupEnv(env []string, name string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if n, v, ok := strings.Cut(env[i], "="); ok && n == name {
			return v
		}
	}
	return ""
}

// field is one settable leaf of Config.
type field struct {
	v reflect.Value
}

// settings maps every leaf of cfg with a yaml tag to its dotted key.
func settings(cfg *Config) map[string]field {
	out := make(map[string]field)
	var walk func(prefix string, v reflect.Value)
	walk = func(prefix string, v reflect.Value) {
		t := v.Type()
		for i := range t.NumField() {
			sf := t.Field(i)
			tag, _, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
			if tag == "" || tag == "-" || !sf.IsExported() {
				continue
			}
			key := prefix + tag
			fv := v.Field(i)
			if fv.Kind() == reflect.Slice {
				continue // lists (auth.principals) are set in the file only
			}
			if fv.Kind() == reflect.Struct && fv.Type() != reflect.TypeFor[time.Duration]() {
				walk(key+".", fv)
				continue
			}
			out[key] = field{v: fv}
		}
	}
	walk("", reflect.ValueOf(cfg).Elem())
	return out
}

// set parses s into the field: strings as is, booleans with strconv.ParseBool, integers as
// decimal numbers, durations with time.ParseDuration ("30s", "1h").
func (f field) set(s string) error {
	switch {
	case f.v.Type() == reflect.TypeFor[time.Duration]():
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("invalid duration %q (want e.g. 30s, 5m, 1h)", s)
		}
		f.v.SetInt(int64(d))
	case f.v.Kind() == reflect.String:
		f.v.SetString(s)
	case f.v.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("invalid boolean %q (want true or false)", s)
		}
		f.v.SetBool(b)
	case f.v.CanInt():
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || f.v.OverflowInt(n) {
			return fmt.Errorf("invalid integer %q", s)
		}
		f.v.SetInt(n)
	default:
		return fmt.Errorf("unsupported setting type %s", f.v.Type())
	}
	return nil
}

// KeyError is the error of an invalid setting: Key is its dotted key ("server.tls.key_file").
type KeyError struct {
	Key string
	// Err says what is wrong (for a TLS file, a *tlsconf.FileError).
	Err error
}

func (e *KeyError) Error() string {
	if fe, ok := e.Err.(*tlsconf.FileError); ok {
		return "config: " + e.Key + ": " + fe.Detail() // the key once
	}
	return "config: " + e.Key + ": " + e.Err.Error()
}

func (e *KeyError) Unwrap() error { return e.Err }

// validateStore checks the settings that say which store to open and how (LoadStore's).
func (c Config) validateStore() error {
	bad := func(key, format string, args ...any) error {
		return &KeyError{Key: key, Err: fmt.Errorf(format, args...)}
	}
	switch {
	case c.Store != "" && !IsPostgresURL(c.Store):
		return bad("store", "must be empty (embedded engine) or a postgres:// URL, got %q", redact(c.Store))
	case c.Store != "" && !pgSchemaName(c.Postgres.Schema):
		return bad("postgres.schema", "must be a lower-case identifier ([a-z_][a-z0-9_]*, at most 63 bytes), got %q", c.Postgres.Schema)
	case c.Postgres.BucketWidth < time.Second || c.Postgres.BucketWidth > 30*24*time.Hour:
		return bad("postgres.bucket_width", "must be between 1s and 720h, got %s", c.Postgres.BucketWidth)
	}
	return nil
}

// Validate reports the first invalid setting as a *KeyError, named by its key. TLS files
// (server.tls) are read, so that a missing or unreadable one stops the start, not the first
// handshake.
func (c Config) Validate() error {
	bad := func(key, format string, args ...any) error {
		return &KeyError{Key: key, Err: fmt.Errorf(format, args...)}
	}
	if err := c.validateStore(); err != nil {
		return err
	}
	for _, a := range []struct{ key, addr, example string }{
		{"listen", c.Listen, "127.0.0.1:9092"}, {"http", c.HTTP, "127.0.0.1:8080"}, {"debug_listen", c.DebugListen, "127.0.0.1:6060"},
	} {
		if a.addr == "" && a.key == "debug_listen" {
			continue // off
		}
		if a.addr == "" {
			return bad(a.key, "must not be empty")
		}
		// Before the loopback rule, which takes what it cannot parse for an exposed address, and
		// with authentication on too, so that a bad address stops the start here and not at
		// net.Listen once the engine is open.
		if err := checkListenAddr(a.addr, a.example); err != nil {
			return &KeyError{Key: a.key, Err: err}
		}
	}
	switch {
	case !c.Insecure && !c.Auth.Enabled() && !IsLoopback(c.Listen):
		return bad("listen", "%q can be reached from other hosts, and authentication is off: configure auth.principals, use a loopback address (127.0.0.1:9092), or set insecure: true (--insecure, SPOOL_INSECURE=true) on a trusted network", c.Listen)
	case !c.Insecure && !c.Auth.Enabled() && !IsLoopback(c.HTTP):
		return bad("http", "%q can be reached from other hosts, and authentication is off: configure auth.principals, use a loopback address (127.0.0.1:8080), or set insecure: true (--insecure, SPOOL_INSECURE=true) on a trusted network", c.HTTP)
	case c.DebugListen != "" && !c.Insecure && !IsLoopback(c.DebugListen):
		return bad("debug_listen", "%q can be reached from other hosts, and the profiling listener has no authentication: use a loopback address, or set insecure: true on a trusted network", c.DebugListen)
	case badHostName(c.HTTPAllowedHosts) != "":
		return bad("http_allowed_hosts", "%q is not a host name (no port, scheme or path)", badHostName(c.HTTPAllowedHosts))
	case c.HTTPMaxConnections < 1 || c.HTTPMaxConnections > 1_000_000:
		return bad("http_max_connections", "must be between 1 and 1000000, got %d", c.HTTPMaxConnections)
	case c.Store == "" && c.DataDir == "":
		return bad("data_dir", "must not be empty with the embedded engine")
	case c.Store != "" && c.WAL.UnsafeNoSync:
		return bad("wal.unsafe_no_sync", "applies to the embedded engine only: with a PostgreSQL store, durability is the database's (synchronous_commit)")
	case c.ShutdownTimeout <= 0:
		return bad("shutdown_timeout", "must be positive, got %s", c.ShutdownTimeout)
	case c.WAL.MaxProducerIDs < 1:
		return bad("wal.max_producer_ids", "must be at least 1, got %d", c.WAL.MaxProducerIDs)
	case c.WAL.SegmentBytes < minSegmentBytes || c.WAL.SegmentBytes > maxSegmentBytes:
		return bad("wal.segment_bytes", "must be between 1 MiB and 1 GiB (%d and %d), got %d", minSegmentBytes, maxSegmentBytes, c.WAL.SegmentBytes)
	case c.WAL.SlowSync < time.Millisecond || c.WAL.SlowSync > time.Hour:
		return bad("wal.slow_sync", "must be between 1ms and 1h, got %s", c.WAL.SlowSync)
	case c.WAL.MaxOpenFiles < 0:
		return bad("wal.max_open_files", "must be 0 (half of the open file limit) or positive, got %d", c.WAL.MaxOpenFiles)
	case c.Store == "" && c.WAL.MaxOpenFiles > 0 && !openFilesAllowed(c.WAL.MaxOpenFiles):
		// The embedded engine's only: wal.* are ignored with a PostgreSQL store, and a check
		// against the machine (ulimit -n) must not stop a broker that never opens the files.
		limit, _ := wal.OpenFileLimit()
		return bad("wal.max_open_files", "must be at most the process's open file limit (ulimit -n: %d), got %d; raise the limit or lower the setting", limit, c.WAL.MaxOpenFiles)
	case c.Postgres.MaxConns < 2 || c.Postgres.MaxConns > 1000:
		return bad("postgres.max_conns", "must be between 2 and 1000, got %d", c.Postgres.MaxConns)
	case c.Postgres.PollInterval < time.Millisecond || c.Postgres.PollInterval > time.Minute:
		return bad("postgres.poll_interval", "must be between 1ms and 1m, got %s", c.Postgres.PollInterval)
	case c.Postgres.ClaimInterval < 0 || c.Postgres.ClaimInterval > time.Second:
		return bad("postgres.claim_interval", "must be between 0 and 1s, got %s", c.Postgres.ClaimInterval)
	case c.Postgres.TxTimeout < 10*time.Millisecond || c.Postgres.TxTimeout > time.Hour:
		return bad("postgres.tx_timeout", "must be between 10ms and 1h, got %s", c.Postgres.TxTimeout)
	case c.Postgres.MaxProducerIDs < 1:
		return bad("postgres.max_producer_ids", "must be at least 1, got %d", c.Postgres.MaxProducerIDs)
	case c.Broker.AutoCreateSemantics != string(storage.Queue) && c.Broker.AutoCreateSemantics != string(storage.PubSub):
		return bad("broker.auto_create_semantics", "must be QUEUE or PUB_SUB, got %q", c.Broker.AutoCreateSemantics)
	case c.Broker.MaxTopics < 0:
		return bad("broker.max_topics", "must not be negative (0: no bound), got %d", c.Broker.MaxTopics)
	case c.Broker.MaxSubscriptions < 0:
		return bad("broker.max_subscriptions", "must not be negative (0: no bound), got %d", c.Broker.MaxSubscriptions)
	case c.Broker.MaxBindings < 0:
		return bad("broker.max_bindings", "must not be negative (0: no bound), got %d", c.Broker.MaxBindings)
	case c.Broker.MaxPartitions < 1 || c.Broker.MaxPartitions > storage.MaxPartitions:
		return bad("broker.max_partitions", "must be between 1 and %d, got %d", storage.MaxPartitions, c.Broker.MaxPartitions)
	case c.Broker.DefaultMaxInFlight < 1 || c.Broker.DefaultMaxInFlight > c.Server.MaxCredit:
		return bad("broker.default_max_in_flight", "must be between 1 and server.max_credit (%d), got %d", c.Server.MaxCredit, c.Broker.DefaultMaxInFlight)
	case c.Broker.RetentionInterval <= 0:
		return bad("broker.retention_interval", "must be positive, got %s", c.Broker.RetentionInterval)
	case c.Broker.BackfillBatch < 1 || c.Broker.BackfillBatch > 1_000_000:
		return bad("broker.backfill_batch", "must be between 1 and 1000000, got %d", c.Broker.BackfillBatch)
	case c.Broker.BackfillTargetP95 < time.Millisecond:
		return bad("broker.backfill_target_p95", "must be at least 1ms, got %s", c.Broker.BackfillTargetP95)
	case c.Broker.BackfillMaxRate < 100 || c.Broker.BackfillMaxRate > 10_000_000:
		return bad("broker.backfill_max_rate", "must be between 100 and 10000000, got %d", c.Broker.BackfillMaxRate)
	case c.Broker.LifecycleInterval < broker.MinLifecycleInterval:
		return bad("broker.lifecycle_interval", "must be at least %s, got %s", broker.MinLifecycleInterval, c.Broker.LifecycleInterval)
	case c.Broker.SubscriptionRetention <= 0:
		return bad("broker.subscription_retention", "must be positive, got %s", c.Broker.SubscriptionRetention)
	case c.Broker.PollInterval <= 0:
		return bad("broker.poll_interval", "must be positive, got %s", c.Broker.PollInterval)
	case c.Broker.RebalanceDelay < 0 || c.Broker.RebalanceDelay > time.Minute:
		return bad("broker.rebalance_delay", "must be between 0 and 1m, got %s", c.Broker.RebalanceDelay)
	case c.Broker.SlowOperation < 0:
		return bad("broker.slow_operation", "must not be negative (0 turns it off), got %s", c.Broker.SlowOperation)
	case c.Broker.BackpressureInterval < 10*time.Millisecond || c.Broker.BackpressureInterval > time.Minute:
		return bad("broker.backpressure_interval", "must be between 10ms and 1m, got %s", c.Broker.BackpressureInterval)
	case c.Broker.MaxThrottleDelay < time.Millisecond || c.Broker.MaxThrottleDelay > time.Minute:
		return bad("broker.max_throttle_delay", "must be between 1ms and 1m, got %s", c.Broker.MaxThrottleDelay)
	}
	if key, err := c.Auth.Validate(); err != nil {
		return &KeyError{Key: "auth." + key, Err: err}
	}
	if !c.Auth.OpenMetrics && !c.Auth.Enabled() {
		return bad("auth.open_metrics", "false needs auth.principals: without authentication every route is open, /metrics too")
	}
	for i, p := range c.Auth.Principals {
		if p.CertCN != "" && c.Server.TLS.ClientCAFile == "" {
			return bad(fmt.Sprintf("auth.principals[%d].cert_cn", i), "needs server.tls.client_ca_file (mutual TLS): without it no client certificate is verified")
		}
	}
	if _, err := c.SlogLevel(); err != nil {
		return err
	}
	if err := c.Server.Validate(); err != nil {
		// server.Config names its fields by their yaml keys; prefix the section.
		msg := strings.TrimPrefix(err.Error(), storage.ErrInvalidArgument.Error()+": ")
		key, rest, _ := strings.Cut(msg, " ")
		return &KeyError{Key: "server." + key, Err: errors.New(rest)}
	}
	if err := c.Server.TLS.Check(); err != nil {
		var fe *tlsconf.FileError
		if errors.As(err, &fe) {
			return &KeyError{Key: "server.tls." + fe.Key, Err: fe}
		}
		return &KeyError{Key: "server.tls", Err: err}
	}
	return nil
}

// SlogLevel returns LogLevel as a slog.Level.
func (c Config) SlogLevel() (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return 0, &KeyError{Key: "log_level", Err: fmt.Errorf("must be debug, info, warn or error, got %q", c.LogLevel)}
	}
	return l, nil
}

// pgSchemaName reports whether s is a schema name the PostgreSQL engine accepts.
func pgSchemaName(s string) bool {
	if s == "" || len(s) > 63 || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// IsPostgresURL reports whether s selects the PostgreSQL engine.
func IsPostgresURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// redact hides a password in a URL-like string for error messages.
func redact(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return s
	}
	if userinfo, host, ok := strings.Cut(rest, "@"); ok {
		if user, _, ok := strings.Cut(userinfo, ":"); ok {
			return scheme + "://" + user + ":***@" + host
		}
	}
	return s
}

// Redacted returns Store without its password, for logs.
func (c Config) Redacted() string { return redact(c.Store) }

// IsLoopback reports whether a listen address (host:port) binds only loopback interfaces: a
// loopback IP or "localhost". An empty host (every interface) or any other name is not.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// checkListenAddr reports why addr is not a TCP listen address: host:port, where the host may be
// empty (every interface), an IP address or a name, and the port is 0 to 65535 or a service
// name ("http"), as net.Listen reads it. A URL is refused with the host:port to give instead.
// example is a good address for the error message.
func checkListenAddr(addr, example string) error {
	if _, rest, ok := strings.Cut(addr, "://"); ok {
		hostPort, _, _ := strings.Cut(rest, "/")
		return fmt.Errorf("%q is a URL: a listen address is host:port (%q)", addr, hostPort)
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) {
			err = errors.New(ae.Err)
		}
		_, port, _ := strings.Cut(example, ":")
		return fmt.Errorf("%q is not host:port (%v), e.g. %s, or :%s for every interface", addr, err, example, port)
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("%q is not host:port with a port from 0 to 65535 or a service name (http), got port %q", addr, port)
	}
	return nil
}

// openFilesAllowed reports whether n files fit under the process's open file limit.
func openFilesAllowed(n int) bool {
	limit, ok := wal.OpenFileLimit()
	return !ok || uint64(n) <= limit
}

// badHostName returns the first of names that is not a bare host name, or "".
func badHostName(names []string) string {
	for _, n := range names {
		if n == "" || strings.ContainsAny(n, ":/ @[]") {
			return n
		}
	}
	return ""
}
