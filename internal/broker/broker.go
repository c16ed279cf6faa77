package broker

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Defaults and limits of Config.
const (
	// DefaultMaxInFlight is the credit of a member that does not ask for another (seed 002 CG-2).
	DefaultMaxInFlight = 10
	// MaxInFlightLimit bounds a member's credit; its deliveries channel has that capacity.
	MaxInFlightLimit = 65536
	// DefaultRetentionInterval is how often the retention job runs.
	DefaultRetentionInterval = time.Minute
	// DefaultPollInterval is how soon an idle subscription owner first looks at its subscription again
	// without a wake-up (see Config.PollInterval).
	DefaultPollInterval = time.Second
	// MaxLeaseDuration bounds every lease a client asks for: SubscribeParams.LeaseDuration, an
	// Extend (binary protocol and HTTP) and the text mode's text_ack_wait, like a topic's ack_wait.
	MaxLeaseDuration = 24 * time.Hour
)

// CheckLeaseDuration returns an error wrapping storage.ErrInvalidArgument (INVALID_ARGUMENT on
// the wire) unless d, the lease duration named what, is between 0 (the topic's ack_wait) and
// MaxLeaseDuration.
func CheckLeaseDuration(what string, d time.Duration) error {
	if d < 0 || d > MaxLeaseDuration {
		return invalid("%s must be between 0 (the topic's ack_wait) and %s, got %s", what, MaxLeaseDuration, d)
	}
	return nil
}

// Defaults of the bounds on what clients can make the broker keep (Config).
const (
	// DefaultMaxTopics is the default Config.MaxTopics: each topic partition costs at least its
	// first log segment (64 KiB on the embedded engine), a file handle while open and memory.
	DefaultMaxTopics = 10_000
	// DefaultMaxPartitions is the default Config.MaxPartitions.
	DefaultMaxPartitions = 1024
	// DefaultMaxSubscriptions is the default Config.MaxSubscriptions: each durable subscription
	// keeps delivery state per partition of its topic for as long as it is not deleted.
	DefaultMaxSubscriptions = 100_000
	// DefaultMaxBindings is the default Config.MaxBindings.
	DefaultMaxBindings = 10_000
)

// Config configures a Broker. The zero value of every field but Engine is valid and means the
// default.
type Config struct {
	// Engine stores everything. Required. The broker does not close it.
	Engine storage.Engine
	// Logger receives the broker's logs. Nil discards them.
	Logger *slog.Logger
	// Clock must be the engine's clock: the broker compares lease deadlines and NextDue times of
	// the engine with it to set its timers. Defaults to storage.SystemClock.
	Clock storage.Clock
	// DisableAutoCreate makes Publish to an unknown topic fail with storage.ErrTopicNotFound.
	// Auto-create is on by default.
	DisableAutoCreate bool
	// AutoCreateConfig is the configuration of auto-created topics, completed with
	// storage.TopicConfig.WithDefaults; its Semantics (setting auto_create_semantics) defaults to
	// QUEUE.
	AutoCreateConfig storage.TopicConfig
	// MaxTopics bounds the topics the engine keeps: creating one more (CreateTopic or an
	// auto-creating publish) fails with storage.ErrLimitExceeded (LIMIT_EXCEEDED). Defaults to
	// DefaultMaxTopics; negative means no bound.
	MaxTopics int
	// MaxSubscriptions bounds the durable subscriptions (groups) the engine keeps: creating one
	// more (a member of a new group, GroupCreate) fails with storage.ErrLimitExceeded. Those that
	// bindings make when a topic is created are not checked (bindings and topics are bounded).
	// Defaults to DefaultMaxSubscriptions; negative means no bound.
	MaxSubscriptions int
	// MaxBindings bounds the bindings (durable groups on topic patterns) the engine keeps, as
	// MaxSubscriptions does. Defaults to DefaultMaxBindings; negative means no bound.
	MaxBindings int
	// MaxPartitions bounds a topic's partitions on create and update (at most
	// storage.MaxPartitions): more fail with storage.ErrLimitExceeded. Defaults to
	// DefaultMaxPartitions.
	MaxPartitions int
	// RetentionInterval is how often the broker calls Engine.RetentionApply. Defaults to 1 minute;
	// a negative value disables the job (another broker instance or a test runs it).
	RetentionInterval time.Duration
	// OnRetention, if set, is called after every run of the retention job with what it removed,
	// also with the partial result of a run that failed (what it removed is gone all the same):
	// metrics count RetentionResult.Expired there (invariant 1). It must not block.
	OnRetention func(*storage.RetentionResult)
	// OnRetentionError, if set, is called when a run of the retention job fails, with the error it
	// logs (not when the run stops because the broker or engine is closing): metrics count
	// cleanup failures there. It must not block.
	OnRetentionError func(error)
	// SlowOperation is the duration above which a publish, claim, ack, nack, read or retention
	// run is logged at WARN ("slow broker operation", with op and took). Defaults to
	// DefaultSlowOperation (100 ms); negative: never.
	SlowOperation time.Duration
	// BackpressureInterval is how often the backlogs of the topics with a backlog bound are read
	// (backpressure.go). Defaults to DefaultBackpressureInterval (1 s); negative: never (tests call
	// RefreshBackpressure).
	BackpressureInterval time.Duration
	// MaxThrottleDelay is the longest a throttled publish waits. Defaults to
	// DefaultMaxThrottleDelay (1 s).
	MaxThrottleDelay time.Duration
	// LifecycleInterval is how often the broker heartbeats the subscriptions its members are
	// attached to and runs the subscription lifecycle job (lifecycle.go): at most this, and at most
	// a fifth of the shortest heartbeat timeout, at least MinLifecycleInterval. Defaults to
	// DefaultLifecycleInterval; a negative value disables the job (heartbeats still run at the
	// default interval: another instance or a test runs the job).
	LifecycleInterval time.Duration
	// SubscriptionRetention is how long a CANCELLED subscription is kept before the lifecycle job
	// makes it DELETED. Defaults to storage.DefaultSubscriptionRetention (30 days).
	SubscriptionRetention time.Duration
	// OnLifecycle, if set, is called after every run of the lifecycle job with what it changed,
	// and after every resurrection or deletion made outside it (LifecycleResult.Job false);
	// metrics count every transition there, once. It must not block.
	OnLifecycle func(*LifecycleResult)
	// OnForceComplete, if set, is called after ForceCompleteGroup with the messages it completed
	// (metrics count them). It must not block.
	OnForceComplete func(topic, group string, n int)
	// OnFiltered, if set, is called with the messages of a subscription (its topic and group)
	// that no member's filter matched and that were completed without a delivery (filtered.go;
	// metrics count them). It runs on the subscription's owner and must not block.
	OnFiltered func(topic, group string, n int)
	// OnDeadLettered, if set, is called with the messages of a subscription (its topic and
	// group) that the engine dead-lettered in a claim (leases that expired on their
	// max_deliveries-th delivery), when a member of this broker left (its leases on their
	// max_deliveries-th delivery released), in a rebalance of an ordered group this broker
	// stored (leases on their max_deliveries-th delivery in the partitions it moved), and once
	// at Start for those the engine dead-lettered when it opened (Engine.DLQRecovered: the
	// embedded engine's leases lost in a restart on their max_deliveries-th delivery). Nacks
	// are not reported: their callers count the engine's DeliveriesNackResult.DeadLettered.
	// Metrics count them. It must not block.
	OnDeadLettered func(topic, group string, n int)
	// Backfill paces the delivery of backfill ranges (backfill.go); zero fields take defaults.
	Backfill BackfillConfig
	// DefaultMaxInFlight is the credit of a member whose SubscribeParams.MaxInFlight is 0: how many
	// unacknowledged deliveries it may hold. Defaults to 10; at most MaxInFlightLimit.
	DefaultMaxInFlight int
	// PollInterval is how long a subscription owner with members first waits without a wake-up before it
	// asks the engine again; while these polls deliver nothing it waits twice as long each time,
	// up to 16 poll intervals, and a delivery starts over. It covers wake-ups that cannot reach
	// this process (a lost database notification, clock skew between the broker and the
	// database); an idle broker with a thousand subscriptions then claims some 60 times a second,
	// not a thousand. Defaults to 1 second.
	PollInterval time.Duration
	// ClaimInterval is the shortest time between the starts of two dispatch passes of one
	// subscription: wake-ups that come sooner wait for it, so one claim takes everything published
	// meanwhile (joins and leaves do not: they are handled during the wait). 0 (the default) claims at every wake-up, which suits the embedded engine; on
	// PostgreSQL, where every claim is a transaction, a few milliseconds trade that much latency for
	// far fewer transactions under load. It applies in full from claimIntervalFull subscriptions
	// with members on this instance; fewer cannot make many claim transactions, so they wait a
	// share of it (claimIntervalNow).
	ClaimInterval time.Duration
	// RebalanceDelay is how long an ordered group's owner waits after a member joined or left
	// before it rebalances: the joins and leaves within it make one rebalance (a deploy, a crash
	// loop). Defaults to DefaultRebalanceDelay (100 ms); negative: at once. At most 1 minute.
	RebalanceDelay time.Duration
	// SharedEngine says that other broker instances share the engine (PostgreSQL): an ordered
	// group's assignment then keeps the members other instances listed while they are live (see
	// ordered.go), the broker records its members (with their filters) and renews their
	// liveness, and member filters count the other instances' members (filtered.go).
	SharedEngine bool
	// MemberTimeout is how long, with SharedEngine, a member of an ordered group stays live in the
	// engine after this broker last renewed it (the broker renews every third of it): when this
	// instance dies, other instances give its members' partitions to their own members after
	// that. spool serve passes the member session timeout (server.session_timeout). Defaults to
	// DefaultMemberTimeout; storage.MinMemberTTL to storage.MaxMemberTTL.
	MemberTimeout time.Duration
	// OnRebalance, if set, is called after every rebalance this broker stored (metrics). It must
	// not block.
	OnRebalance func(RebalanceInfo)
}

// runState is the lifecycle of a Broker.
type runState uint8

const (
	stateNew runState = iota
	stateRunning
	stateStopped
)

// Broker is the in-process message broker: it validates and routes publishes to the engine,
// auto-creates topics, keeps the members of consumer groups connected to this process, and
// dispatches deliveries to them under credit-based flow control. Every method is safe for
// concurrent use. See the package documentation for the design.
type Broker struct {
	engine           storage.Engine
	logger           *slog.Logger
	clock            storage.Clock
	autoCreate       bool
	autoCreateConfig storage.TopicConfig
	maxTopics        int // 0: no bound
	maxSubscriptions int // 0: no bound
	maxBindings      int // 0: no bound
	maxPartitions    int
	// storageFullSince is when publishes started failing with storage.ErrFull (unix ns), 0 while
	// they are stored (noteStorage).
	storageFullSince atomic.Int64
	// storageFullLast is the last such refusal (unix ns): StorageFull expires without newer ones.
	storageFullLast   atomic.Int64
	retentionInterval time.Duration
	onRetention       func(*storage.RetentionResult)
	onRetentionError  func(error)
	// trace writes the per-message DEBUG lines and the slow-operation WARN lines.
	trace *tracer
	// bp holds the backpressure states of the bounded topics (backpressure.go).
	bp                   backpressure
	backpressureInterval time.Duration
	maxThrottleDelay     time.Duration
	pollInterval         time.Duration
	claimInterval        time.Duration
	rebalanceDelay       time.Duration
	sharedEngine         bool
	memberTimeout        time.Duration
	// instance names this broker instance in member records and give-backs (filtered.go).
	instance string
	// livenessInterval is livenessLoop's period: a third of memberTimeout (tests change it
	// before Start).
	livenessInterval time.Duration
	// refreshInterval is how often an owner with members rereads its subscription when no
	// backfill range is paced (refreshBackfill): a minute (tests change it before Start).
	refreshInterval time.Duration
	// maxOrderedMembers bounds the members of one ordered group on this instance:
	// storage.MaxAssignmentMembers (tests lower it before subscribing).
	maxOrderedMembers int
	// maxSharedMembers bounds, with a shared engine, the members of one shared subscription on
	// this instance: storage.MaxRenewMembers, what one record write holds (tests lower it
	// before subscribing).
	maxSharedMembers   int
	onRebalance        func(RebalanceInfo)
	defaultMaxInFlight int
	// lifecycleInterval is the longest wait between two lifecycle runs; maintainSubs is false when
	// Config.LifecycleInterval disabled the job (heartbeats only).
	lifecycleInterval     time.Duration
	maintainSubs          bool
	subscriptionRetention time.Duration
	onLifecycle           func(*LifecycleResult)
	onForceComplete       func(topic, group string, n int)
	onFiltered            func(topic, group string, n int)
	onDeadLettered        func(topic, group string, n int)

	// lifecycleWait is the lifecycle loop's current interval (ns; MaxInt64 while it is computed);
	// lifecycleResched makes the loop compute it again, lifecycleCheck run if due (lifecycle.go).
	lifecycleWait    atomic.Int64
	lifecycleResched chan struct{}
	lifecycleCheck   chan struct{}

	// backfill paces backfill ranges and counts what they missed (backfill.go).
	backfill backfillStats

	// counts are the groups' processed, failed and filtered totals of this process
	// (groupcounts.go).
	counts groupCounters

	// cleanup records the cleanup jobs' runs (cleanup.go).
	cleanup cleanupStats

	// wg counts every goroutine the broker owns (subscription owners, notifier, retention job).
	wg sync.WaitGroup
	// quit is closed by Stop; every owned goroutine selects on it.
	quit chan struct{}
	// events queues topic created/deleted notifications for the notifier goroutine.
	events eventQueue
	// moveMu serializes the moves of members after semantics changes (reattachTopic): an
	// UpdateTopic's own and the notifier's (followSemantics, on the engine's notification of the
	// rename, which also comes for this broker's own changes) would otherwise interleave their
	// leaves and attaches, and UpdateTopic could return before its members were moved. Held
	// across engine calls and waits for owners, which never take it; never taken under Broker.mu.
	moveMu sync.Mutex

	// mu guards the fields below. It is never held while calling the engine.
	mu         sync.RWMutex
	state      runState
	rootCtx    context.Context
	cancelRoot context.CancelCauseFunc
	unregister func()
	stopDone   chan struct{}
	// members are the live members of this process by ID.
	members map[string]*Member
	// subs are the owners of the subscriptions that have at least one member here, by
	// subscription ID.
	subs map[int64]*owner
	// byTopic indexes subs by topic for message wake-ups.
	byTopic map[string]map[int64]*owner
}

// New validates cfg and returns a broker that is not started yet.
func New(cfg Config) (*Broker, error) {
	if cfg.Engine == nil {
		return nil, invalid("broker config: Engine is required")
	}
	maxInFlight := cmp.Or(cfg.DefaultMaxInFlight, DefaultMaxInFlight)
	if maxInFlight < 1 || maxInFlight > MaxInFlightLimit {
		return nil, invalid("broker config: DefaultMaxInFlight must be between 1 and %d, got %d",
			MaxInFlightLimit, cfg.DefaultMaxInFlight)
	}
	if cfg.ClaimInterval < 0 || cfg.ClaimInterval > time.Second {
		return nil, invalid("broker config: ClaimInterval must be between 0 and 1s, got %s", cfg.ClaimInterval)
	}
	if cfg.MaxThrottleDelay < 0 || cfg.MaxThrottleDelay > time.Minute {
		return nil, invalid("broker config: MaxThrottleDelay must be between 0 and 1m, got %s", cfg.MaxThrottleDelay)
	}
	if cfg.RebalanceDelay > time.Minute {
		return nil, invalid("broker config: RebalanceDelay must be at most 1m, got %s", cfg.RebalanceDelay)
	}
	rebalanceDelay := cmp.Or(cfg.RebalanceDelay, DefaultRebalanceDelay)
	if rebalanceDelay < 0 {
		rebalanceDelay = 0
	}
	memberTimeout := cmp.Or(cfg.MemberTimeout, DefaultMemberTimeout)
	if memberTimeout < storage.MinMemberTTL || memberTimeout > storage.MaxMemberTTL {
		return nil, invalid("broker config: MemberTimeout must be between %s and %s, got %s", storage.MinMemberTTL, storage.MaxMemberTTL, cfg.MemberTimeout)
	}
	if cfg.PollInterval < 0 {
		return nil, invalid("broker config: PollInterval must not be negative, got %s", cfg.PollInterval)
	}
	bound := func(v, def int) int {
		if v = cmp.Or(v, def); v < 0 {
			return 0 // no bound
		}
		return v
	}
	maxTopics := bound(cfg.MaxTopics, DefaultMaxTopics)
	maxParts := cmp.Or(cfg.MaxPartitions, DefaultMaxPartitions)
	if maxParts < 1 || maxParts > storage.MaxPartitions {
		return nil, invalid("broker config: MaxPartitions must be between 1 and %d, got %d", storage.MaxPartitions, cfg.MaxPartitions)
	}
	autoCfg := cfg.AutoCreateConfig.WithDefaults()
	if err := autoCfg.Validate(); err != nil {
		return nil, fmt.Errorf("broker config: AutoCreateConfig: %w", err)
	}
	if autoCfg.Partitions > maxParts {
		return nil, invalid("broker config: AutoCreateConfig has %d partitions, more than MaxPartitions (%d)", autoCfg.Partitions, maxParts)
	}
	lifecycle := cmp.Or(cfg.LifecycleInterval, DefaultLifecycleInterval)
	if lifecycle > 0 && lifecycle < MinLifecycleInterval {
		return nil, invalid("broker config: LifecycleInterval must be at least %s, got %s", MinLifecycleInterval, cfg.LifecycleInterval)
	}
	every := lifecycle // heartbeats run also when the job is disabled
	if every < 0 {
		every = DefaultLifecycleInterval
	}
	if cfg.SubscriptionRetention < 0 {
		return nil, invalid("broker config: SubscriptionRetention must not be negative, got %s", cfg.SubscriptionRetention)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var clock storage.Clock = storage.SystemClock{}
	if cfg.Clock != nil {
		clock = cfg.Clock
	}
	logger = logger.With("component", "broker")
	b := &Broker{
		engine:                cfg.Engine,
		logger:                logger,
		trace:                 newTracer(logger, cfg.SlowOperation),
		clock:                 clock,
		autoCreate:            !cfg.DisableAutoCreate,
		autoCreateConfig:      autoCfg,
		maxTopics:             maxTopics,
		maxSubscriptions:      bound(cfg.MaxSubscriptions, DefaultMaxSubscriptions),
		maxBindings:           bound(cfg.MaxBindings, DefaultMaxBindings),
		maxPartitions:         maxParts,
		retentionInterval:     cmp.Or(cfg.RetentionInterval, DefaultRetentionInterval),
		backpressureInterval:  cmp.Or(cfg.BackpressureInterval, DefaultBackpressureInterval),
		maxThrottleDelay:      cmp.Or(cfg.MaxThrottleDelay, DefaultMaxThrottleDelay),
		onRetention:           cfg.OnRetention,
		onRetentionError:      cfg.OnRetentionError,
		pollInterval:          cmp.Or(cfg.PollInterval, DefaultPollInterval),
		claimInterval:         cfg.ClaimInterval,
		rebalanceDelay:        rebalanceDelay,
		sharedEngine:          cfg.SharedEngine,
		memberTimeout:         memberTimeout,
		livenessInterval:      memberTimeout / 3,
		refreshInterval:       time.Minute,
		instance:              "i-" + rand.Text()[:16],
		maxOrderedMembers:     storage.MaxAssignmentMembers,
		maxSharedMembers:      storage.MaxRenewMembers,
		onRebalance:           cfg.OnRebalance,
		defaultMaxInFlight:    maxInFlight,
		quit:                  make(chan struct{}),
		events:                eventQueue{signal: make(chan struct{}, 1)},
		members:               make(map[string]*Member),
		subs:                  make(map[int64]*owner),
		byTopic:               make(map[string]map[int64]*owner),
		lifecycleInterval:     every,
		maintainSubs:          lifecycle > 0,
		lifecycleResched:      make(chan struct{}, 1),
		lifecycleCheck:        make(chan struct{}, 1),
		subscriptionRetention: cmp.Or(cfg.SubscriptionRetention, storage.DefaultSubscriptionRetention),
		onLifecycle:           cfg.OnLifecycle,
		onForceComplete:       cfg.OnForceComplete,
		onFiltered:            cfg.OnFiltered,
		onDeadLettered:        cfg.OnDeadLettered,
		backfill:              backfillStats{cfg: cfg.Backfill.withDefaults(), progress: map[int64]*BackfillInfo{}},
	}
	b.lifecycleWait.Store(math.MaxInt64) // the loop has not computed it yet: reschedule
	return b, nil
}

// reportRecovered reports to Config.OnDeadLettered the messages the engine dead-lettered when it
// opened (Engine.DLQRecovered, which hands them out once). Only metrics need them: a failure is
// logged.
func (b *Broker) reportRecovered(ctx context.Context) {
	if b.onDeadLettered == nil {
		return
	}
	counts, err := b.engine.DLQRecovered(ctx)
	if err != nil {
		b.logger.WarnContext(ctx, "dead-letters of the engine's open not counted", slog.Any("error", err))
		return
	}
	for _, c := range counts {
		b.countDeadLettered(c.Topic, c.Group, c.Messages)
	}
}

// DefaultMaxInFlight returns the credit of a member that subscribes with MaxInFlight 0
// (Config.DefaultMaxInFlight or its default).
func (b *Broker) DefaultMaxInFlight() int { return b.defaultMaxInFlight }

// MaxTopics is the bound on topics the broker keeps (Config.MaxTopics; 0: none).
func (b *Broker) MaxTopics() int { return b.maxTopics }

// Start registers for engine notifications and starts the broker's own goroutines (the notifier
// and the retention job; subscription owners start with their first member). ctx provides values only:
// cancelling it does not stop the broker, Stop does. Start fails with ErrNotRunning after Stop and
// is a no-op when already started.
func (b *Broker) Start(ctx context.Context) error {
	// The lifecycle loop's first wait follows the subscriptions already stored. It is read here:
	// not under b.mu (never held while calling the engine), and not on the loop's goroutine (the
	// engine is not called behind the caller's back before anything needs it).
	b.mu.RLock()
	fresh := b.state == stateNew
	b.mu.RUnlock()
	var lifecycleStart time.Time
	var firstWait time.Duration
	if fresh {
		lifecycleStart, firstWait = b.clock.Now(), b.nextLifecycle(ctx)
		b.reportRecovered(ctx)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case stateRunning:
		return nil
	case stateStopped:
		return ErrNotRunning
	}
	b.rootCtx, b.cancelRoot = context.WithCancelCause(context.WithoutCancel(ctx))
	b.state = stateRunning
	b.unregister = b.engine.NotifyRegister(b.onNotify)
	b.goLocked(b.notifyLoop)
	if b.retentionInterval > 0 {
		b.registerCleanupJob(JobRetention, b.retentionInterval)
		b.goLocked(b.retentionLoop)
	}
	if b.backpressureInterval > 0 {
		b.goLocked(b.backpressureLoop)
	}
	if b.maintainSubs {
		b.registerCleanupJob(JobSubscriptionLifecycle, b.lifecycleInterval)
	}
	b.goLocked(func() { b.lifecycleLoop(lifecycleStart, firstWait) })
	if b.sharedEngine {
		b.goLocked(b.livenessLoop)
	}
	b.logger.InfoContext(ctx, "broker started",
		slog.Bool("auto_create", b.autoCreate),
		slog.String("auto_create_semantics", string(b.autoCreateConfig.Semantics)),
		slog.Int("default_max_in_flight", b.defaultMaxInFlight))
	return nil
}

// goLocked starts an owned goroutine. b.mu must be held and the broker running.
func (b *Broker) goLocked(f func()) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		f()
	}()
}

// Stop stops the broker: it unregisters from the engine, closes every member (releasing their
// leases and deleting their ephemeral subscriptions), stops every owned goroutine and waits for
// them until ctx ends. It does not close the engine. Stop is idempotent and safe before Start;
// concurrent and later calls wait for the first one.
func (b *Broker) Stop(ctx context.Context) error {
	b.mu.Lock()
	switch b.state {
	case stateNew:
		b.state = stateStopped
		b.stopDone = make(chan struct{})
		close(b.stopDone)
		b.mu.Unlock()
		return nil
	case stateStopped:
		done := b.stopDone
		b.mu.Unlock()
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("broker: stop: %w", context.Cause(ctx))
		}
	}
	b.state = stateStopped
	b.stopDone = make(chan struct{})
	done := b.stopDone
	unregister := b.unregister
	members := make([]*Member, 0, len(b.members))
	for _, m := range b.members {
		members = append(members, m)
	}
	b.mu.Unlock()
	defer close(done)

	unregister()
	var errs []error
	for _, m := range members {
		if err := m.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	b.cancelRoot(ErrNotRunning)
	close(b.quit)
	waited := make(chan struct{})
	go func() {
		b.wg.Wait()
		close(waited)
	}()
	select {
	case <-waited:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("broker: stop: waiting for goroutines: %w", context.Cause(ctx)))
	}
	b.logger.InfoContext(ctx, "broker stopped", slog.Int("members_closed", len(members)))
	return errors.Join(errs...)
}

// checkRunning returns ErrNotRunning unless the broker is started and not stopped.
func (b *Broker) checkRunning() error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.state != stateRunning {
		return ErrNotRunning
	}
	return nil
}

// notifyRenamed is the notifier's own kind of job, next to the engine's notifications: an owner
// found its subscription of Topic renamed, which only a semantics change does (owner.refresh).
const notifyRenamed storage.NotificationKind = math.MaxUint8

// onNotify is the engine's notification callback. It must not block: message notifications only
// wake subscription owners (non-blocking sends under b.mu, which is never held across engine calls), and
// topic notifications are queued for the notifier goroutine.
func (b *Broker) onNotify(n storage.Notification) {
	switch n.Kind {
	case storage.NotifyMessages:
		b.wakeTopic(n.Topic)
	case storage.NotifyTopicCreated, storage.NotifyTopicDeleted:
		b.events.push(n)
	case storage.NotifySubscription:
		// Paused, resumed, cancelled, deleted or renamed (perhaps through another broker
		// instance): its owner here rereads it at once (refresh), whether or not a member has
		// credit, instead of at its once-a-minute reread.
		b.rereadSubscription(n.SubscriptionID)
	}
}

// wakeTopic wakes the owners of every subscription of topic that has members here.
func (b *Broker) wakeTopic(topic string) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	for _, s := range b.byTopic[topic] {
		s.wakeUp()
	}
}

// wakeAll wakes every subscription owner (tests call it after moving a fake clock).
func (b *Broker) wakeAll() {
	b.mu.RLock()
	defer b.mu.RUnlock()
	for _, s := range b.subs {
		s.wakeUp()
	}
}

// wakeSubscription wakes the owner of one subscription if it has members here.
func (b *Broker) wakeSubscription(id int64) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if s := b.subs[id]; s != nil {
		s.wakeUp()
	}
}

// notifyLoop handles topic created and deleted notifications, which need engine calls, and the
// semantics changes owners found (notifyRenamed): moving members waits for their owners.
func (b *Broker) notifyLoop() {
	for {
		select {
		case <-b.quit:
			return
		case <-b.events.signal:
		}
		for _, n := range b.events.take() {
			switch n.Kind {
			case storage.NotifyTopicCreated:
				b.attachMatching(b.rootCtx, n.Topic, true)
			case storage.NotifyTopicDeleted:
				b.detachTopic(b.rootCtx, n.Topic)
			case notifyRenamed:
				b.followSemantics(b.rootCtx, n.Topic)
			}
		}
	}
}

// retentionLoop runs Engine.RetentionApply every retentionInterval.
func (b *Broker) retentionLoop() {
	ticker := time.NewTicker(b.retentionInterval)
	defer ticker.Stop()
	for {
		select {
		case <-b.quit:
			return
		case <-ticker.C:
		}
		b.runRetention(b.rootCtx)
	}
}

// runRetention applies retention once, reports what it removed to Config.OnRetention (also what a
// failed run removed before it failed) and logs it: the totals at INFO, and at WARN each topic
// and reason of messages removed while a subscription had not completed them and each group
// whose stuck floor zombie_ttl force-advanced; at INFO what each topic's size bound removed.
func (b *Broker) runRetention(ctx context.Context) {
	start, clockStart := time.Now(), b.clock.Now()
	res, err := b.engine.RetentionApply(ctx)
	if took, slow := b.trace.isSlow(start); slow {
		b.trace.logSlow(ctx, "retention", took)
	}
	var removed, backlog int64
	if res != nil {
		removed, backlog = res.MessagesDeleted+res.MessagesExpired, res.Backlog
	}
	b.recordCleanupRun(JobRetention, clockStart, b.clock.Now().Sub(clockStart), removed, backlog, err)
	if res != nil {
		if b.onRetention != nil {
			b.onRetention(res)
		}
		b.logRetention(ctx, res, time.Since(start))
	}
	if err != nil {
		if errors.Is(err, storage.ErrClosed) || ctx.Err() != nil {
			return
		}
		b.logger.WarnContext(ctx, "retention failed", slog.Any("error", err))
		if b.onRetentionError != nil {
			b.onRetentionError(err)
		}
	}
}

// logRetention logs what a retention run removed, if anything.
func (b *Broker) logRetention(ctx context.Context, res *storage.RetentionResult, took time.Duration) {
	ctx = context.WithoutCancel(ctx) // a run cut short by Stop still says what it removed
	for _, x := range res.Expired {
		b.logger.WarnContext(ctx, "retention expired messages a subscription had not completed",
			slog.String("topic", x.Topic), slog.String("reason", string(x.Reason)), slog.Int64("messages", x.Messages))
	}
	for _, x := range res.SizeRemoved {
		b.logger.InfoContext(ctx, "retention removed the oldest messages of a topic above its size bound",
			slog.String("topic", x.Topic), slog.Int64("messages", x.Messages), slog.Int64("bytes", x.Bytes))
	}
	for _, z := range res.Zombies {
		b.logger.WarnContext(ctx, "zombie_ttl force-advanced a stuck subscription: it gave up messages it had not completed",
			slog.String("topic", z.Topic), slog.String("group", z.Group), slog.Int64("subscription", z.SubscriptionID),
			slog.Int64("messages", z.Messages))
	}
	if res.MessagesDeleted+res.MessagesExpired+res.DLQEntriesExpired == 0 {
		return
	}
	b.logger.InfoContext(ctx, "retention applied",
		slog.Int64("messages_deleted", res.MessagesDeleted),
		slog.Int64("messages_expired", res.MessagesExpired),
		slog.Int64("dlq_entries_expired", res.DLQEntriesExpired),
		slog.Int64("bytes_deleted", res.BytesDeleted),
		slog.Duration("took", took))
}

// eventQueue is an unbounded queue of topic notifications. Its mutex is a leaf: nothing else is
// locked while holding it.
type eventQueue struct {
	mu     sync.Mutex
	items  []storage.Notification
	signal chan struct{}
}

func (q *eventQueue) push(n storage.Notification) {
	q.mu.Lock()
	q.items = append(q.items, n)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

func (q *eventQueue) take() []storage.Notification {
	q.mu.Lock()
	defer q.mu.Unlock()
	items := q.items
	q.items = nil
	return items
}

// claimIntervalFull is the number of subscriptions with members on an instance from which their
// owners wait the whole ClaimInterval between two passes.
const claimIntervalFull = 4

// claimIntervalNow is ClaimInterval in proportion to the subscriptions with members on this
// instance, up to claimIntervalFull of them (one waits a quarter of it): the interval bounds the
// claim transactions of many busy subscriptions, and a few of them cannot make many, so they
// keep their latency (with the 20 ms default: one subscription at 10,000 msg/s waits 5 ms).
func (b *Broker) claimIntervalNow() time.Duration {
	if b.claimInterval == 0 {
		return 0
	}
	b.mu.RLock()
	n := min(max(len(b.subs), 1), claimIntervalFull)
	b.mu.RUnlock()
	return b.claimInterval * time.Duration(n) / claimIntervalFull
}
