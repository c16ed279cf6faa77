package metrics

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
)

// BrokerSource is what the broker collector reads at scrape time. *broker.Broker implements it.
type BrokerSource interface {
	// Topics describes every topic with its statistics.
	Topics(ctx context.Context) ([]*broker.TopicInfo, error)
	// Groups describes every subscription that is not DELETED with its statistics.
	Groups(ctx context.Context) ([]*broker.GroupInfo, error)
	// Members describes the broker's live members.
	Members() []broker.MemberInfo
	// StorageFull reports whether publishes are refused because the storage is out of space.
	StorageFull() (since time.Time, full bool)
	// Backpressure describes the topics with a backlog bound (broker backpressure.go).
	Backpressure() []broker.BackpressureInfo
}

// DefaultCollectTimeout bounds the reading of the broker at one scrape.
const DefaultCollectTimeout = 5 * time.Second

// CollectorOptions configure the broker collector.
type CollectorOptions struct {
	// Timeout bounds the reading of the broker at one scrape. Defaults to DefaultCollectTimeout.
	Timeout time.Duration
	// Logger receives a warning when reading the broker fails. Nil discards.
	Logger *slog.Logger
}

// RegisterBroker registers a collector that reads src at every scrape and exports the broker
// metrics (queue_depth, consumer_lag, message_throughput, spool_topic_*, spool_subscription_*,
// spool_broker_*; see the package documentation) with the registerer given to New. Each scrape
// also forgets the hook series of the topics and groups its listings no longer have (forget.go).
// It fails if m was created without a registerer or a broker collector is registered already.
func (m *Metrics) RegisterBroker(src BrokerSource, opts CollectorOptions) error {
	if m == nil || m.reg == nil {
		return errors.New("metrics: register broker collector: no registerer")
	}
	if src == nil {
		return errors.New("metrics: register broker collector: nil broker")
	}
	c := NewBrokerCollector(src, opts)
	c.hooks = m
	if err := m.reg.Register(c); err != nil {
		return err
	}
	if c, ok := src.(cleanupSource); ok {
		if err := m.reg.Register(newCleanupCollector(c)); err != nil {
			return err
		}
	}
	if c, ok := src.(backfillSource); ok {
		return m.reg.Register(newBackfillCollector(c))
	}
	return nil
}

// BrokerCollector is a prometheus.Collector of the broker metrics. Collect is safe for concurrent
// use; concurrent scrapes are serialized (each reads the broker once, in turn).
type BrokerCollector struct {
	src     BrokerSource
	timeout time.Duration
	logger  *slog.Logger
	errors  atomic.Int64
	// hooks, if set (RegisterBroker), has its series of topics and groups gone swept at every
	// scrape that read the broker.
	hooks *Metrics

	// mu serializes collections.
	mu sync.Mutex
}

// NewBrokerCollector returns a collector of the broker metrics of src, for registries other than
// the one of a Metrics (RegisterBroker is the usual way).
func NewBrokerCollector(src BrokerSource, opts CollectorOptions) *BrokerCollector {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &BrokerCollector{
		src:     src,
		timeout: cmp.Or(opts.Timeout, DefaultCollectTimeout),
		logger:  logger.With("component", "metrics"),
	}
}

var (
	topicLabels = []string{"topic"}
	subLabels   = []string{"topic", "group"}

	descQueueDepth = prometheus.NewDesc("queue_depth",
		"Messages of the topic not yet done: QUEUE topics: pending of the queue subscription; PUB_SUB topics: largest pending over ACTIVE and PAUSED subscriptions.",
		topicLabels, nil)
	descConsumerLag = prometheus.NewDesc("consumer_lag",
		"Messages never delivered to the subscription (high-water mark minus cursor, over partitions).",
		subLabels, nil)
	descThroughput = prometheus.NewDesc("message_throughput",
		"Messages ever appended to the topic (sum of partition high-water marks); use rate().",
		topicLabels, nil)
	descTopicMessages = prometheus.NewDesc("spool_topic_messages",
		"Retained messages of the topic.", topicLabels, nil)
	descTopicBytes = prometheus.NewDesc("spool_topic_bytes",
		"Bytes of the topic's log segments.", topicLabels, nil)
	descTopicSizeExceeded = prometheus.NewDesc("spool_topic_size_bound_exceeded",
		"For a topic with max_messages or max_bytes: 1 while it holds more (what the bound may not remove because a group still needs it, or what came since the last retention run), else 0.",
		topicLabels, nil)
	descTopicPartitions = prometheus.NewDesc("spool_topic_partitions",
		"Partitions of the topic.", topicLabels, nil)
	descPartitionDamaged = prometheus.NewDesc("spool_partition_damaged",
		"1 for each partition the embedded engine found damaged (unavailable until repaired with spool data truncate); absent for healthy ones.",
		[]string{"topic", "partition"}, nil)
	descTopicSubs = prometheus.NewDesc("spool_topic_subscriptions",
		"Subscriptions of the topic that are not DELETED.", topicLabels, nil)
	descTopicMembers = prometheus.NewDesc("spool_topic_members",
		"Members of this broker attached to the topic.", topicLabels, nil)
	descSubState = prometheus.NewDesc("spool_subscription_state",
		"1 for the subscription's current state, 0 for the others ($ephemeral: subscriptions per state).",
		[]string{"topic", "group", "state"}, nil)
	descSubPending = prometheus.NewDesc("spool_subscription_pending",
		"Messages not yet done by the subscription: never delivered, leased or waiting for redelivery.", subLabels, nil)
	descSubInFlight = prometheus.NewDesc("spool_subscription_in_flight",
		"Leased messages of the subscription.", subLabels, nil)
	descSubRedelivering = prometheus.NewDesc("spool_subscription_redelivering",
		"Messages of the subscription waiting for redelivery.", subLabels, nil)
	descSubDLQ = prometheus.NewDesc("spool_subscription_dead_lettered",
		"Entries in the subscription's dead-letter queue.", subLabels, nil)
	descSubMembers = prometheus.NewDesc("spool_subscription_members",
		"Members of this broker attached to the subscription.", subLabels, nil)
	descBackpressureState = prometheus.NewDesc("spool_topic_backpressure_state",
		"Backpressure of a topic with a backlog bound: 0 normal, 1 throttled (publishes delayed), 2 rejecting (publishes refused RATE_LIMITED).",
		topicLabels, nil)
	descBacklog = prometheus.NewDesc("spool_topic_backlog_messages",
		"Backlog of a topic with a backlog bound: messages not yet done by its slowest ACTIVE subscription, at the last backpressure refresh.",
		topicLabels, nil)
	descPublishesThrottled = prometheus.NewDesc("spool_publishes_throttled_total",
		"Publishes delayed by the topic's backpressure (throttle policy) since the broker started.", topicLabels, nil)
	descPublishesRejected = prometheus.NewDesc("spool_publishes_rejected_total",
		"Publishes refused RATE_LIMITED by the topic's backpressure since the broker started.", topicLabels, nil)
	descBrokerMembers = prometheus.NewDesc("spool_broker_members",
		"Live members (consumers) of this broker.", nil, nil)
	descBrokerUp = prometheus.NewDesc("spool_broker_up",
		"1 if the broker answered this scrape, 0 if not.", nil, nil)
	descStorageFull = prometheus.NewDesc("spool_storage_full",
		"1 while publishes are refused because the storage is out of space (from a publish refused with STORAGE_FULL until one is stored again or 10 s after the last refusal), else 0.", nil, nil)
	descCollectDuration = prometheus.NewDesc("spool_metrics_collect_duration_seconds",
		"Time reading the broker took at this scrape.", nil, nil)
	descCollectErrors = prometheus.NewDesc("spool_metrics_collect_errors_total",
		"Scrapes at which reading the broker failed.", nil, nil)

	allDescs = []*prometheus.Desc{descQueueDepth, descConsumerLag, descThroughput, descTopicMessages,
		descTopicBytes, descTopicSizeExceeded, descTopicPartitions, descPartitionDamaged, descTopicSubs, descTopicMembers, descSubState, descSubPending,
		descSubInFlight, descSubRedelivering, descSubDLQ, descSubMembers, descBrokerMembers, descBrokerUp,
		descBackpressureState, descBacklog, descPublishesThrottled, descPublishesRejected,
		descStorageFull, descCollectDuration, descCollectErrors}

	// exportedStates are the states spool_subscription_state has a series for (DELETED
	// subscriptions are not listed by the broker).
	exportedStates = []storage.SubscriptionState{storage.Active, storage.Paused, storage.Dead, storage.Cancelled}
)

// Describe sends the descriptors of every metric the collector exports.
func (c *BrokerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

// subAgg is the figures of one (topic, group) series: one subscription, or the sum over the
// ephemeral subscriptions of a topic.
type subAgg struct {
	pending, lag, inFlight, redelivering, dlq, members float64
	states                                             map[storage.SubscriptionState]float64
}

// Collect reads the broker and sends the broker metrics. When reading fails it sends
// spool_broker_up 0 and the error counter only, and logs a warning (not when the broker is
// simply not running).
func (c *BrokerCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()

	start := time.Now()
	begin := c.hooks.sweepBegin()
	topics, groups, err := c.read(ctx)
	took := time.Since(start)
	ch <- prometheus.MustNewConstMetric(descCollectDuration, prometheus.GaugeValue, took.Seconds())
	if err != nil {
		n := c.errors.Add(1)
		ch <- prometheus.MustNewConstMetric(descCollectErrors, prometheus.CounterValue, float64(n))
		ch <- prometheus.MustNewConstMetric(descBrokerUp, prometheus.GaugeValue, 0)
		if !errors.Is(err, broker.ErrNotRunning) && !errors.Is(err, storage.ErrClosed) {
			c.logger.Warn("reading the broker for metrics failed", slog.Any("error", err), slog.Duration("took", took))
		}
		return
	}
	c.hooks.sweep(begin, topics, groups)
	ch <- prometheus.MustNewConstMetric(descCollectErrors, prometheus.CounterValue, float64(c.errors.Load()))
	ch <- prometheus.MustNewConstMetric(descBrokerUp, prometheus.GaugeValue, 1)
	full := 0.0
	if _, ok := c.src.StorageFull(); ok {
		full = 1
	}
	ch <- prometheus.MustNewConstMetric(descStorageFull, prometheus.GaugeValue, full)
	ch <- prometheus.MustNewConstMetric(descBrokerMembers, prometheus.GaugeValue, float64(len(c.src.Members())))
	for _, bp := range c.src.Backpressure() {
		state := 0.0
		switch bp.State {
		case broker.BackpressureThrottled:
			state = 1
		case broker.BackpressureRejecting:
			state = 2
		}
		ch <- prometheus.MustNewConstMetric(descBackpressureState, prometheus.GaugeValue, state, bp.Topic)
		ch <- prometheus.MustNewConstMetric(descBacklog, prometheus.GaugeValue, float64(bp.BacklogMessages), bp.Topic)
		ch <- prometheus.MustNewConstMetric(descPublishesThrottled, prometheus.CounterValue, float64(bp.Throttled), bp.Topic)
		ch <- prometheus.MustNewConstMetric(descPublishesRejected, prometheus.CounterValue, float64(bp.Rejected), bp.Topic)
	}

	depths := QueueDepths(topics, groups)
	type key struct{ topic, group string }
	subs := make(map[key]*subAgg)
	order := make([]key, 0, len(groups))
	for _, g := range groups {
		if g.Subscription == nil {
			continue
		}
		k := key{g.Topic, g.Group}
		if g.Subscription.Ephemeral {
			k.group = GroupEphemeral
		}
		a := subs[k]
		if a == nil {
			a = &subAgg{states: make(map[storage.SubscriptionState]float64)}
			subs[k] = a
			order = append(order, k)
		}
		a.states[g.State]++
		a.members += float64(len(g.Members))
		if st := g.Stats; st != nil {
			a.pending += float64(st.Pending)
			a.lag += float64(st.Lag)
			a.inFlight += float64(st.InFlight)
			a.redelivering += float64(st.Redelivering)
			a.dlq += float64(st.DeadLettered)
		}
	}
	for _, k := range order {
		a := subs[k]
		lv := []string{k.topic, k.group}
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
		}
		gauge(descConsumerLag, a.lag)
		gauge(descSubPending, a.pending)
		gauge(descSubInFlight, a.inFlight)
		gauge(descSubRedelivering, a.redelivering)
		gauge(descSubDLQ, a.dlq)
		gauge(descSubMembers, a.members)
		for _, s := range exportedStates {
			ch <- prometheus.MustNewConstMetric(descSubState, prometheus.GaugeValue, a.states[s], k.topic, k.group, string(s))
		}
	}

	for _, t := range topics {
		if t.Topic == nil || t.Stats == nil {
			continue
		}
		name := t.Topic.Name
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, name)
		}
		var appended int64
		for _, p := range t.Stats.Partitions {
			appended += p.HighWater
			if p.Damaged {
				ch <- prometheus.MustNewConstMetric(descPartitionDamaged, prometheus.GaugeValue, 1, name, strconv.Itoa(int(p.Partition)))
			}
		}
		ch <- prometheus.MustNewConstMetric(descThroughput, prometheus.CounterValue, float64(appended), name)
		gauge(descQueueDepth, float64(depths[name]))
		gauge(descTopicMessages, float64(t.Stats.Messages))
		gauge(descTopicBytes, float64(t.Stats.Bytes))
		if cfg := t.Topic.Config; cfg.HasSizeBound() {
			v := 0.0
			if cfg.SizeBoundExceeded(t.Stats) {
				v = 1
			}
			gauge(descTopicSizeExceeded, v)
		}
		gauge(descTopicPartitions, float64(len(t.Stats.Partitions)))
		gauge(descTopicSubs, float64(t.Subscriptions))
		gauge(descTopicMembers, float64(t.Members))
	}
}

// read lists topics and groups. A subscription of a topic created between the two calls may be
// listed without its topic (and the other way round); the next scrape is consistent again.
func (c *BrokerCollector) read(ctx context.Context) ([]*broker.TopicInfo, []*broker.GroupInfo, error) {
	topics, err := c.src.Topics(ctx)
	if err != nil {
		return nil, nil, err
	}
	groups, err := c.src.Groups(ctx)
	if err != nil {
		return nil, nil, err
	}
	return topics, groups, nil
}

// QueueDepths returns the queue_depth of every topic: for a QUEUE topic the pending count of its
// queue subscription; for a PUB_SUB topic the largest pending count over its ACTIVE and PAUSED
// subscriptions (the group furthest behind), 0 without one. DEAD and CANCELLED subscriptions hold
// no retention and do not count. The admin API's seed path GET /admin/topics uses it too, so both
// report the same figure.
func QueueDepths(topics []*broker.TopicInfo, groups []*broker.GroupInfo) map[string]int64 {
	queue := make(map[string]bool, len(topics))
	out := make(map[string]int64, len(topics))
	for _, t := range topics {
		if t.Topic == nil {
			continue
		}
		out[t.Topic.Name] = 0
		queue[t.Topic.Name] = t.Topic.Config.Semantics == storage.Queue
	}
	for _, g := range groups {
		if g.Stats == nil {
			continue
		}
		isQueue, ok := queue[g.Topic]
		switch {
		case !ok:
			// A topic created after the topic listing: it is not reported at this scrape.
		case isQueue:
			if g.Group == storage.QueueGroup {
				out[g.Topic] = g.Stats.Pending
			}
		case g.State.HoldsRetention():
			out[g.Topic] = max(out[g.Topic], g.Stats.Pending)
		}
	}
	return out
}
