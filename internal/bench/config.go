package bench

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/spoolmq/spool/client"
	"github.com/spoolmq/spool/internal/storage"
)

// Modes of a run.
const (
	// ModePublish measures publish throughput (closed loop: each publisher sends as fast as its
	// acknowledgements, or its async window, allow).
	ModePublish = "publish"
	// ModeE2E measures end-to-end latency at a fixed open-loop rate, with consumer groups.
	ModeE2E = "e2e"
)

// Defaults of Config.
const (
	DefaultAddr  = "127.0.0.1:9092"
	DefaultAdmin = "http://127.0.0.1:8080"
	DefaultSize  = 1024
	DefaultRate  = 10_000
	// DefaultDuration and DefaultWarmup are e2e's; publish mode's are 10 s and 2 s.
	DefaultDuration        = 30 * time.Second
	DefaultWarmup          = 5 * time.Second
	DefaultPublishDuration = 10 * time.Second
	DefaultPublishWarmup   = 2 * time.Second
	DefaultGroups          = 1
	DefaultConsumers       = 4
	DefaultPublishers      = 1
	DefaultMaxInFlight     = 1000
	DefaultPartitions      = 1
	DefaultDrain           = 30 * time.Second
	DefaultSemantics       = SemanticsPubSub
	DefaultPGSchema        = "spool"
	DefaultPGSample        = 30 * time.Second
	// MinPGSample is the shortest PGSample.
	MinPGSample = time.Second
	// MaxSeenBytes bounds the memory of an e2e run's per-message bookkeeping: one bit per message
	// of the schedule per group (Groups x (Warmup+Duration) x Rate / 8 bytes), allocated up front.
	MaxSeenBytes = 1 << 30
)

// MaxDrainFactor bounds the wait for the last deliveries of an e2e run that still makes
// progress: at most this many times Config.Drain.
const MaxDrainFactor = 10

// Semantics of the topic a run creates (storage.Queue and storage.PubSub).
const (
	// SemanticsQueue: one shared subscription; e2e consumers share it (one group).
	SemanticsQueue = "QUEUE"
	// SemanticsPubSub: one subscription per consumer group; each group receives every message.
	SemanticsPubSub = "PUB_SUB"
)

// Config configures a run. The zero value of a field means its default (WithDefaults); fields
// that do not apply to the mode are ignored.
type Config struct {
	// Mode is ModePublish or ModeE2E. Required.
	Mode string
	// Addr is the broker's TCP address. Defaults to 127.0.0.1:9092.
	Addr string
	// Admin is the base URL of the broker's HTTP admin API, used to create the topic (Semantics)
	// and delete it after the run. Defaults to http://127.0.0.1:8080. NoAdmin skips it: the
	// topic is then auto-created by the first publish (QUEUE), which allows one group only.
	Admin   string
	NoAdmin bool
	// TLS, when set, is the TLS configuration of the broker connections and of an https:// Admin.
	TLS *tls.Config
	// Token, when set, is sent in every connection's Hello and as the admin API's Bearer token
	// (brokers with authentication).
	Token string
	// Topic is the topic to use. Defaults to a fresh one per run, "bench.<run id>", created
	// with Semantics, Partitions and the retention overrides, and deleted after the run. A given
	// topic that exists is used as it is (its semantics read through the admin API) and kept.
	Topic string
	// Semantics of a topic the run creates: SemanticsPubSub (the default) or SemanticsQueue. On a
	// QUEUE topic the e2e consumers share the topic's one subscription (they subscribe without a
	// group), so Groups must be 1.
	Semantics string
	// Partitions of a topic the run creates. Defaults to 1.
	Partitions int
	// MessageRetention and MaxRetention override the topic configuration of a topic the run
	// creates (message_retention, max_retention; see storage.TopicConfig). Zero leaves the
	// broker's default.
	MessageRetention, MaxRetention time.Duration
	// MaxBacklogMessages and BacklogPolicy set the backpressure of a topic the run creates
	// (max_backlog_messages, backlog_policy: reject or throttle; 0 and "": none and the
	// broker's default). The run reports the publishes the broker throttled and refused.
	MaxBacklogMessages int64
	BacklogPolicy      string
	// Completion is the completion_tracking of a topic the run creates (watermark or refcount;
	// "": the broker's default, watermark). The broker refuses a mode it does not build.
	Completion string
	// SlowConsumer, in e2e mode, makes the consumers of the first group take that long over each
	// message (a slow group for backpressure runs). 0: no delay.
	SlowConsumer time.Duration
	// Keep keeps a topic the run created.
	Keep bool
	// Size is the payload size in bytes. Defaults to 1024; e2e needs at least StampSize.
	Size int
	// Publishers is the number of publishing goroutines. Defaults to 1.
	Publishers int
	// Clients is the number of client connections the publishers share (publisher i uses client
	// i mod Clients). Defaults to Publishers (one each).
	Clients int
	// Async publishes with PublishAsync (window Window per client) instead of waiting for each
	// acknowledgement.
	Async bool
	// Window is the PublishAsync window of each client. Defaults to client.DefaultMaxAsyncInFlight
	// (1024).
	Window int
	// Batch is the number of messages per synchronous publish request (publish mode). Defaults
	// to 1.
	Batch int
	// Duration is the measured time, after Warmup. Defaults to 30 s (e2e) or 10 s (publish). In
	// publish mode, Count may replace it.
	Duration time.Duration
	// Warmup is run before the measured time and left out of every figure. Defaults to 5 s (e2e)
	// or 2 s (publish); negative means none.
	Warmup time.Duration
	// Count, in publish mode, publishes this many messages in all (warm-up included; rounded up
	// to whole batches) instead of running for Duration; the measured time then ends with the
	// last acknowledgement.
	Count int64
	// Rate is the e2e target rate, in messages per second over all publishers. Defaults to 10,000.
	Rate float64
	// Groups and Consumers: e2e consumer groups, each with Consumers consumers (one client
	// connection each). Default to 1 and 4.
	Groups, Consumers int
	// MaxInFlight is each consumer's credit. Defaults to 1000.
	MaxInFlight int
	// Drain bounds the wait for the last publish acknowledgements after the schedule ended; then
	// (e2e) the run waits for every acknowledged message to reach every group as long as
	// deliveries go on, ending after Drain without a new one (or after MaxDrainFactor times
	// Drain in all). Defaults to 30 s.
	Drain time.Duration
	// PGURL, when set, is the PostgreSQL database of the broker's engine (a pgx connection string):
	// the run reports the WAL written, the tables' tuple counters and dead tuples, and a series of
	// the schema's total size and of the partitions of PGSchema.messages (see PGResult). Errors
	// reading statistics are reported in the result, not fatal.
	PGURL string
	// PGSchema is the broker's schema. Defaults to "spool".
	PGSchema string
	// PGSample is the interval of the size series. Defaults to 30 s; at least 1 s.
	PGSample time.Duration
	// Logger receives the clients' logs. Nil discards them.
	Logger *slog.Logger
	// Clock paces the e2e schedule. Defaults to SystemClock.
	Clock Clock
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.Admin == "" {
		c.Admin = DefaultAdmin
	}
	if c.Semantics == "" {
		c.Semantics = DefaultSemantics
	}
	if c.PGSchema == "" {
		c.PGSchema = DefaultPGSchema
	}
	if c.PGSample == 0 {
		c.PGSample = DefaultPGSample
	}
	def(&c.Partitions, DefaultPartitions)
	def(&c.Size, DefaultSize)
	def(&c.Publishers, DefaultPublishers)
	def(&c.Clients, c.Publishers)
	def(&c.Window, client.DefaultMaxAsyncInFlight)
	def(&c.Batch, 1)
	def(&c.Groups, DefaultGroups)
	def(&c.Consumers, DefaultConsumers)
	def(&c.MaxInFlight, DefaultMaxInFlight)
	if c.Duration == 0 {
		c.Duration = DefaultDuration
		if c.Mode == ModePublish {
			c.Duration = DefaultPublishDuration
		}
	}
	if c.Warmup == 0 {
		c.Warmup = DefaultWarmup
		if c.Mode == ModePublish {
			c.Warmup = DefaultPublishWarmup
		}
	}
	if c.Warmup < 0 {
		c.Warmup = 0
	}
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.Drain == 0 {
		c.Drain = DefaultDrain
	}
	if c.Clock == nil {
		c.Clock = SystemClock{}
	}
	return c
}

// Validate reports the first invalid field of a config WithDefaults was applied to. The error
// wraps storage.ErrInvalidArgument.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("bench: %w: %s", storage.ErrInvalidArgument, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Mode != ModePublish && c.Mode != ModeE2E:
		return bad("mode must be %q or %q, got %q", ModePublish, ModeE2E, c.Mode)
	case c.Size < 0 || c.Size > storage.MaxMessageBytesLimit:
		return bad("size must be between 0 and %d, got %d", storage.MaxMessageBytesLimit, c.Size)
	case c.Mode == ModeE2E && c.Size < StampSize:
		return bad("e2e size must be at least %d bytes (the stamp), got %d", StampSize, c.Size)
	case c.Publishers < 1 || c.Publishers > 10_000:
		return bad("publishers must be between 1 and 10000, got %d", c.Publishers)
	case c.Clients < 1 || c.Clients > c.Publishers:
		return bad("clients must be between 1 and publishers (%d), got %d", c.Publishers, c.Clients)
	case c.Window < 1:
		return bad("window must be at least 1, got %d", c.Window)
	case c.Batch < 1 || c.Batch > 10_000:
		return bad("batch must be between 1 and 10000, got %d", c.Batch)
	case c.Mode == ModeE2E && c.Batch != 1:
		return bad("batch applies to publish mode only")
	case c.Partitions < 1:
		return bad("partitions must be at least 1, got %d", c.Partitions)
	case c.Duration <= 0:
		return bad("duration must be above 0, got %s", c.Duration)
	case c.Count < 0:
		return bad("count must not be negative, got %d", c.Count)
	case c.Mode == ModeE2E && c.Count > 0:
		return bad("count applies to publish mode only (e2e runs at a rate for a duration)")
	case c.Rate <= 0 || c.Rate > 10_000_000:
		return bad("rate must be above 0 and at most 10000000, got %v", c.Rate)
	case c.Groups < 1 || c.Groups > 1000:
		return bad("groups must be between 1 and 1000, got %d", c.Groups)
	case c.Consumers < 1 || c.Consumers > 1000:
		return bad("consumers must be between 1 and 1000, got %d", c.Consumers)
	case c.Semantics != SemanticsQueue && c.Semantics != SemanticsPubSub:
		return bad("semantics must be %s or %s, got %q", SemanticsQueue, SemanticsPubSub, c.Semantics)
	case c.Mode == ModeE2E && c.Semantics == SemanticsQueue && c.Groups != 1:
		return bad("a QUEUE topic has one subscription that its consumers share: groups must be 1, got %d (give --consumers to add consumers)", c.Groups)
	case c.Mode == ModeE2E && c.NoAdmin && c.Groups > 1:
		return bad("more than one group needs a PUB_SUB topic: give the HTTP admin address (an auto-created topic is QUEUE)")
	case c.MaxBacklogMessages < 0:
		return bad("max backlog messages must not be negative, got %d", c.MaxBacklogMessages)
	case c.BacklogPolicy != "" && c.BacklogPolicy != string(storage.BacklogReject) && c.BacklogPolicy != string(storage.BacklogThrottle):
		return bad("backlog policy must be reject or throttle, got %q", c.BacklogPolicy)
	case c.Completion != "" && c.Completion != string(storage.Watermark) && c.Completion != string(storage.Refcount):
		return bad("completion must be %s or %s, got %q", storage.Watermark, storage.Refcount, c.Completion)
	case c.Completion != "" && c.NoAdmin:
		return bad("completion tracking is set when the run creates the topic: give the HTTP admin address")
	case (c.MaxBacklogMessages > 0 || c.BacklogPolicy != "") && c.NoAdmin:
		return bad("a backlog bound is set when the run creates the topic: give the HTTP admin address")
	case c.SlowConsumer < 0 || c.SlowConsumer > time.Minute:
		return bad("slow consumer delay must be between 0 and 1m, got %s", c.SlowConsumer)
	case c.SlowConsumer > 0 && c.Mode != ModeE2E:
		return bad("slow consumer applies to e2e mode only")
	case c.MessageRetention < 0 || c.MaxRetention < 0:
		return bad("retention must not be negative, got message retention %s, max retention %s", c.MessageRetention, c.MaxRetention)
	case c.MaxRetention > 0 && c.MaxRetention < time.Second:
		return bad("max retention must be at least 1s, got %s", c.MaxRetention)
	case c.MaxRetention > 0 && c.MessageRetention > c.MaxRetention:
		return bad("message retention (%s) must not exceed max retention (%s)", c.MessageRetention, c.MaxRetention)
	case c.NoAdmin && (c.MessageRetention > 0 || c.MaxRetention > 0):
		return bad("retention overrides apply to a topic the run creates: they need the HTTP admin API")
	case c.PGSample < MinPGSample:
		return bad("pg sample interval must be at least %s, got %s", MinPGSample, c.PGSample)
	case c.Mode == ModeE2E && c.seenBytes() > MaxSeenBytes:
		return bad("%d group(s) x %.0f messages need %.0f MiB of bookkeeping (1 bit per message per group and 1 for the acknowledgements), above %d MiB: shorten the run or lower the rate",
			c.Groups, c.scheduled(), c.seenBytes()/(1<<20), MaxSeenBytes>>20)
	case c.MaxInFlight < 1 || c.MaxInFlight > 65_536:
		return bad("max in flight must be between 1 and 65536, got %d", c.MaxInFlight)
	case c.Drain < 0:
		return bad("drain must not be negative, got %s", c.Drain)
	}
	return nil
}

// scheduled returns the number of messages of an e2e schedule (warm-up included).
func (c Config) scheduled() float64 { return (c.Warmup + c.Duration).Seconds() * c.Rate }

// seenBytes returns the size of an e2e run's bitmaps (one bit per message per group for the
// receipts, and one for the acknowledgements).
func (c Config) seenBytes() float64 { return (c.scheduled()/8 + 8) * float64(c.Groups+1) }
