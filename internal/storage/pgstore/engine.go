package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolmq/spool/internal/storage"
)

var _ storage.Engine = (*Engine)(nil)

// Config configures an Engine. Zero fields get the documented defaults.
type Config struct {
	// URL is the PostgreSQL connection string (postgres://user:pass@host:port/db?...). Required.
	URL string
	// Schema is the PostgreSQL schema holding Spool's tables and functions. Defaults to "spool".
	Schema string
	// Clock is the time source of every time-dependent decision (tests). Defaults to the
	// database's clock, which this instance estimates from readings of clock_timestamp() when it
	// opens and at each InstanceHeartbeat (clock.go): instances sharing a database agree on leases,
	// heartbeats and retention whatever their own clocks say.
	Clock storage.Clock
	// Logger receives the engine's logs. Nil discards them.
	Logger *slog.Logger
	// Migrate applies pending migrations at Open (under an advisory lock, so concurrent instances
	// do it once). When false, Open fails if the schema is not at the latest version.
	Migrate bool
	// MaxConns bounds the connection pool. Defaults to 32.
	MaxConns int32
	// BucketWidth is the time span of one partition of the messages table: retention drops whole
	// buckets. Used when the store is created; later instances read it from spool.settings.
	// Defaults to 1 h.
	BucketWidth time.Duration
	// PollInterval is how often the engine looks for messages published by other instances when
	// no notification came (the fallback of LISTEN/NOTIFY). Defaults to 1 s.
	PollInterval time.Duration
	// NotifyDelay is the longest a publish waits before its NOTIFY to other instances is sent;
	// notifications of one topic inside it are merged into one. Defaults to 2 ms.
	NotifyDelay time.Duration
	// InstanceHeartbeat is how often this instance refreshes its row in spool.instances, and with
	// it its reading of the database's clock (clock.go). Defaults to 5 s.
	InstanceHeartbeat time.Duration
	// MessageCacheBytes bounds the in-memory cache of recent messages that claims read before the
	// database (fan-out to many groups reads each message from PostgreSQL once per instance).
	// Defaults to 64 MiB; negative disables it.
	MessageCacheBytes int64
	// TxTimeout bounds the transaction of a request, from waiting for a pool connection to its
	// COMMIT, for claims, acks, nacks and extends (a combined lane transaction, combine.go),
	// releases, broker publishes (MessagesAppend; not PublishTx, whose transaction belongs to the
	// application), DLQ lists, catalog operations (topics, subscriptions, bindings),
	// MessagesRead, TopicStats and SubscriptionStats. Topic and subscription deletes (and
	// subscription changes to CANCELLED or DELETED) and DLQ purges and replays are bounded only
	// until they hold their locks, not during the statement that changes their DLQ rows. Such a transaction takes
	// milliseconds, seconds under heavy load; one that has not finished in time (a database that
	// stopped answering, a row lock another session holds) is abandoned and rolled back, and the
	// request fails with an error wrapping context.DeadlineExceeded (the protocol's TIMEOUT,
	// retryable) instead of waiting until TCP gives up. Retention, the LISTEN connection and
	// Close do not use it. Defaults to 10 s; between 10 ms and 1 h.
	TxTimeout time.Duration
	// localClock replaces time.Now as this instance's own clock when Clock is nil (tests: a
	// skewed host).
	localClock func() time.Time
	// MaxProducerIDs bounds the producer ids spool.producer_ids remembers for de-duplication, all
	// topics together (instances sharing the database should set the same): past it, a broker
	// publish (MessagesAppend, PublishTx) with new ids is refused with storage.ErrRateLimited
	// until the prune of expired ids makes room. Counted approximately (producerids.go).
	// Defaults to 1,000,000.
	MaxProducerIDs int
}

// Defaults of Config.
const (
	DefaultSchema            = "spool"
	DefaultMaxConns          = 32
	DefaultBucketWidth       = time.Hour
	DefaultPollInterval      = time.Second
	DefaultNotifyDelay       = 2 * time.Millisecond
	DefaultInstanceHeartbeat = 5 * time.Second
	DefaultMessageCacheBytes = 64 << 20
	DefaultTxTimeout         = 10 * time.Second
	DefaultMaxProducerIDs    = 1_000_000
)

var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.Clock == nil {
		c.Clock = storage.SystemClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.BucketWidth == 0 {
		c.BucketWidth = DefaultBucketWidth
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.NotifyDelay == 0 {
		c.NotifyDelay = DefaultNotifyDelay
	}
	if c.InstanceHeartbeat == 0 {
		c.InstanceHeartbeat = DefaultInstanceHeartbeat
	}
	if c.MessageCacheBytes == 0 {
		c.MessageCacheBytes = DefaultMessageCacheBytes
	}
	if c.TxTimeout == 0 {
		c.TxTimeout = DefaultTxTimeout
	}
	if c.MaxProducerIDs == 0 {
		c.MaxProducerIDs = DefaultMaxProducerIDs
	}
	return c
}

// Validate reports the first invalid field of c (after defaults) as an error wrapping
// storage.ErrInvalidArgument.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: pgstore: %s %s", storage.ErrInvalidArgument, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.URL == "":
		return bad("url", "is required (postgres://user@host:port/db)")
	case !schemaName.MatchString(c.Schema):
		return bad("schema", "must match %s, got %q", schemaName, c.Schema)
	case c.MaxConns < 2 || c.MaxConns > 1000:
		return bad("max_conns", "must be between 2 and 1000, got %d", c.MaxConns)
	case c.BucketWidth < time.Second || c.BucketWidth > 30*24*time.Hour:
		return bad("bucket_width", "must be between 1s and 720h, got %s", c.BucketWidth)
	case c.PollInterval < time.Millisecond || c.PollInterval > time.Minute:
		return bad("poll_interval", "must be between 1ms and 1m, got %s", c.PollInterval)
	case c.NotifyDelay < 0 || c.NotifyDelay > time.Second:
		return bad("notify_delay", "must be between 0 and 1s, got %s", c.NotifyDelay)
	case c.InstanceHeartbeat < 10*time.Millisecond || c.InstanceHeartbeat > time.Minute:
		return bad("instance_heartbeat", "must be between 10ms and 1m, got %s", c.InstanceHeartbeat)
	case c.TxTimeout < 10*time.Millisecond || c.TxTimeout > time.Hour:
		return bad("tx_timeout", "must be between 10ms and 1h, got %s", c.TxTimeout)
	case c.MaxProducerIDs < 1:
		return bad("max_producer_ids", "must be at least 1, got %d", c.MaxProducerIDs)
	}
	return nil
}

// Engine is the PostgreSQL storage engine. Every method is safe for concurrent use, also by
// several Engines (broker instances) on the same schema.
type Engine struct {
	cfg   Config
	pool  *pgxpool.Pool
	clock storage.Clock
	// dbClock: no Config.Clock was given, so the engine's clock is the database's: dbc's estimate
	// (clock.go), or now() in SQL (heartbeats, dead detection, member expiry; sublifecycle.go).
	dbClock bool
	dbc     dbTime
	log     *slog.Logger
	schema  string
	// instance identifies this Engine in spool.instances and as owner of its ephemeral
	// subscriptions; startedAt is when it registered.
	instance [16]byte
	// instanceHex is instance in hex, as notification payloads carry it.
	instanceHex string
	startedAt   time.Time

	// queries caches SQL text rendered for the schema (see sql).
	queries sync.Map // string -> string

	closed atomic.Bool
	// closing: Close began; new appends are refused while the queued ones finish (waitAppends).
	closing   atomic.Bool
	closeOnce sync.Once
	// stop ends the background goroutines (listener, notifier, poller, heartbeat); wg waits for
	// them.
	stop   context.CancelFunc
	bgCtx  context.Context
	wg     sync.WaitGroup
	bucket bucketState
	notify notifyState
	// cache holds recent messages for claims (nil when disabled).
	cache *msgCache
	// topicCfgs: the topic configurations delivery loads decoded (deliveries.go).
	topicCfgs topicConfigs
	// lanes queue claims, acks, nacks and extends into shared transactions (combine.go).
	lanes [deliveryLanes]opLane
	// laneTxs and laneOps count the transactions of the lanes and the operations they ran.
	laneTxs, laneOps atomic.Int64
	// appends queue concurrent MessagesAppend calls of a topic into shared transactions
	// (appendcombine.go); appendTxs and appendOps count those transactions and the calls they ran,
	// appendRequeues the transactions whose calls queued again (errLaneBroken).
	appends                              appendLanes
	appendTxs, appendOps, appendRequeues atomic.Int64
	// predict holds where this instance's appends left each partition, so that a lane's
	// transaction may insert its rows before it takes the partitions' rows (appendpredict.go);
	// appendGuesses counts the transactions that did, appendMisses those whose guess was wrong.
	predict                     predictions
	appendGuesses, appendMisses atomic.Int64
	// seqWake wakes the sequencer of staged messages (sequencer.go); seqRows counts the rows it
	// sequenced (or dropped), seqBusy its attempts that found the sequencing lock held, seqEmpty
	// its transactions that found nothing staged, seqCycles the wake-ups it finished.
	seqWake                               chan struct{}
	seqRows, seqBusy, seqEmpty, seqCycles atomic.Int64
	// seqSkips counts sequencing transactions that left rows because a partition row was held.
	seqSkips atomic.Int64
	// dropped counts, by topic name, the staged messages that a forced topic delete or the
	// sequencer removed, until the next RetentionApply reports them (invariant 1: a metric
	// counts every removal).
	dropped droppedCounts
	// watches are this instance's views of the ack floors, for zombie_ttl (zombie.go).
	watches floorWatches
	// sizeRunLimit bounds what one retention run reads for a topic's size bound
	// (defaultSizeRunLimit).
	sizeRunLimit int
	// ids estimates the rows of spool.producer_ids (Config.MaxProducerIDs, producerids.go).
	ids idCount
}

// Open connects to PostgreSQL, applies migrations when cfg.Migrate is set (or checks the schema
// version otherwise), registers the instance and starts the background goroutines (LISTEN, poll
// fallback, heartbeat).
func Open(ctx context.Context, cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dbClock := cfg.Clock == nil
	cfg = cfg.withDefaults()
	pcfg, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("%w: pgstore: url: %v", storage.ErrInvalidArgument, err)
	}
	pcfg.MaxConns = cfg.MaxConns
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: connect: %w", err)
	}
	e := &Engine{cfg: cfg, pool: pool, clock: cfg.Clock, log: cfg.Logger, schema: cfg.Schema, cache: newMsgCache(cfg.MessageCacheBytes),
		seqWake: make(chan struct{}, 1), dbClock: dbClock, sizeRunLimit: defaultSizeRunLimit}
	e.dbc.local = time.Now
	if cfg.localClock != nil {
		e.dbc.local = cfg.localClock
	}
	if _, err := rand.Read(e.instance[:]); err != nil {
		pool.Close()
		return nil, fmt.Errorf("pgstore: instance id: %w", err)
	}
	e.instance[6] = e.instance[6]&0x0f | 0x40 // UUID version 4
	e.instance[8] = e.instance[8]&0x3f | 0x80
	e.instanceHex = hex.EncodeToString(e.instance[:])
	if cfg.Migrate {
		err = Migrate(ctx, pool, cfg.Schema, cfg.BucketWidth)
	} else if err = checkServer(ctx, pool); err == nil {
		err = checkVersion(ctx, pool, cfg.Schema)
	}
	if err == nil {
		err = e.readDBClock(ctx)
	}
	if err == nil {
		err = e.countProducerIDs(ctx)
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	e.bgCtx, e.stop = context.WithCancel(context.Background())
	if err := e.start(ctx); err != nil {
		e.stop()
		e.wg.Wait()
		pool.Close()
		return nil, err
	}
	return e, nil
}

// Close waits for the appends queued before it (appended and answered, each transaction bounded
// by Config.TxTimeout), stops the background goroutines, removes this
// instance's ephemeral subscriptions and closes the pool. Later calls of any method return
// storage.ErrClosed. Safe to call twice.
func (e *Engine) Close() error {
	var err error
	e.closeOnce.Do(func() {
		e.closing.Store(true)
		e.waitAppends() // appends queued before Close: appended and answered
		e.closed.Store(true)
		e.stop()
		e.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err = e.shutdown(ctx)
		e.pool.Close()
		e.log.Debug("pgstore: closed", "delivery_transactions", e.laneTxs.Load(), "delivery_operations", e.laneOps.Load(),
			"publish_transactions", e.appendTxs.Load(), "publish_calls", e.appendOps.Load(),
			"publish_requeues", e.appendRequeues.Load(), "publish_guesses", e.appendGuesses.Load(), "publish_guesses_missed", e.appendMisses.Load())
	})
	return err
}

// Pool returns the engine's connection pool (tests, tools).
func (e *Engine) Pool() *pgxpool.Pool { return e.pool }

// Schema returns the schema the engine uses.
func (e *Engine) Schema() string { return e.schema }

// sql renders a query written against the schema "spool" for the configured schema: every
// "spool." becomes the quoted schema name. Queries are rendered once and cached.
func (e *Engine) sql(q string) string {
	if e.schema == DefaultSchema {
		return q
	}
	if r, ok := e.queries.Load(q); ok {
		return r.(string)
	}
	r := renderSchema(q, e.schema)
	e.queries.Store(q, r)
	return r
}

// sqlOnce is sql for a statement that names one bucket: rendered each time, never cached (the
// cache would keep every bucket's statements for the life of the process).
func (e *Engine) sqlOnce(q string) string {
	if e.schema == DefaultSchema {
		return q
	}
	return renderSchema(q, e.schema)
}

func renderSchema(q, schema string) string {
	return strings.ReplaceAll(q, "spool.", pgx.Identifier{schema}.Sanitize()+".")
}

// checkOpen returns storage.ErrClosed once Close was called.
func (e *Engine) checkOpen() error {
	if e.closed.Load() {
		return storage.ErrClosed
	}
	return nil
}

// maxTxRetries bounds how often tx retries a transaction that failed with a serialization
// failure or a deadlock.
const maxTxRetries = 8

// tx runs fn in a transaction and commits it, retrying on serialization failures and deadlocks
// (fn must be safe to run again). Errors are mapped with mapErr.
func (e *Engine) tx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return e.txWith(ctx, pgx.TxOptions{}, fn)
}

// txWith is tx with the given transaction options (isolation level, access mode).
func (e *Engine) txWith(ctx context.Context, opts pgx.TxOptions, fn func(tx pgx.Tx) error) error {
	if err := e.checkOpen(); err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		committing := false // fn succeeded: BeginTxFunc sends the COMMIT
		err := pgx.BeginTxFunc(ctx, e.pool, opts, func(tx pgx.Tx) error {
			if err := fn(tx); err != nil {
				return err
			}
			committing = true
			return nil
		})
		if err != nil && attempt < maxTxRetries && retryable(err) {
			e.log.Debug("pgstore: retrying transaction", "attempt", attempt+1, "err", err)
			continue
		}
		return e.mapTxErr(err, committing)
	}
}

// retryable reports errors after which running the whole transaction again is safe and useful.
func retryable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "40001", "40P01": // serialization_failure, deadlock_detected
			return true
		}
	}
	return false
}

// mapErr turns errors of a closed engine into storage.ErrClosed, failures of the database into
// *storage.IOError (classify; as for a read, or a transaction whose COMMIT was not sent) and
// leaves storage sentinels and everything else as they are.
func (e *Engine) mapErr(err error) error { return e.mapTxErr(err, false) }

// mapTxErr is mapErr for a transaction whose COMMIT was sent when commitSent is true (a broken
// connection then leaves the outcome unknown).
func (e *Engine) mapTxErr(err error, commitSent bool) error {
	if err == nil {
		return nil
	}
	if e.closed.Load() && !isStorageErr(err) {
		return fmt.Errorf("%w (%v)", storage.ErrClosed, err)
	}
	return classify(err, commitSent)
}

func isStorageErr(err error) bool {
	for _, s := range []error{storage.ErrInvalidArgument, storage.ErrTopicNotFound, storage.ErrTopicExists,
		storage.ErrTopicHasSubscriptions, storage.ErrNoSubscriptions, storage.ErrSubscriptionNotFound,
		storage.ErrSubscriptionExists, storage.ErrSubscriptionNotActive, storage.ErrInvalidTransition,
		storage.ErrLeaseNotHeld, storage.ErrMessageTooLarge, storage.ErrOffsetOutOfRange,
		storage.ErrBindingExists, storage.ErrBindingNotFound, storage.ErrCorrupt, storage.ErrUnavailable, storage.ErrFull,
		storage.ErrRateLimited, storage.ErrTopicChanged, storage.ErrLimitExceeded, storage.ErrStaleGeneration,
		storage.ErrClosed} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// pgCode returns the SQLSTATE of a PostgreSQL error, or "".
func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}
