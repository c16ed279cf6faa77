package metrics

import (
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolmq/spool/internal/storage"
)

// Label values of a few series.
const (
	// GroupEphemeral is the group label of the ephemeral subscriptions of a topic, aggregated.
	GroupEphemeral = "$ephemeral"
	// ProtocolBinary and ProtocolText are the protocol labels of spool_connections for the two
	// modes of the TCP listener.
	ProtocolBinary = "binary"
	ProtocolText   = "text"
)

// Metrics is the set of Spool's hook metrics, plus the broker collector once RegisterBroker was
// called. Create it with New and pass it down. Every method is safe for concurrent use and does
// nothing on a nil *Metrics.
type Metrics struct {
	reg prometheus.Registerer

	published       *prometheus.CounterVec
	publishDuration prometheus.Histogram
	publishErrors   *prometheus.CounterVec
	delivered       *prometheus.CounterVec
	redelivered     *prometheus.CounterVec
	endToEnd        *prometheus.HistogramVec
	acked           *prometheus.CounterVec
	nacked          *prometheus.CounterVec
	deadLettered    *prometheus.CounterVec
	expired         *prometheus.CounterVec
	zombie          *prometheus.CounterVec
	sizeRemoved     *prometheus.CounterVec
	fsyncDuration   prometheus.Histogram
	fsyncRecords    prometheus.Histogram
	connections     *prometheus.GaugeVec
	connectionsTot  *prometheus.CounterVec
	httpRequests    *prometheus.CounterVec
	httpDuration    *prometheus.HistogramVec
	authDenied      *prometheus.CounterVec
	lifecycle       *lifecycleMetrics
	rebalance       *rebalanceMetrics

	// vecs are the vectors labelled by topic and idx the label values they hold (forget.go).
	vecs []topicVec
	idx  seriesIndex
}

// New creates the hook metrics and registers them with reg. A nil reg creates them without
// registering them (they record, nothing exports them). New panics if the metrics are already
// registered with reg (a programming error: call New once per registry).
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		reg: reg,
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_messages_published_total",
			Help: "Messages accepted by publish calls of this process.",
		}, []string{"topic"}),
		publishDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "spool_publish_duration_seconds",
			Help: "Duration of a publish call (one batch) until it is durable, in seconds.",
			// 100 µs to about 3.3 s.
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		publishErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_publish_errors_total",
			Help: "Failed publish calls by error name: the protocol's, or over HTTP the code of the answer (also refusals before the broker: authentication, body, validation).",
		}, []string{"code"}),
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_messages_delivered_total",
			Help: "Deliveries handed to consumers by this process.",
		}, []string{"topic", "group"}),
		redelivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_messages_redelivered_total",
			Help: "Deliveries handed to consumers with an attempt number above 1.",
		}, []string{"topic", "group"}),
		endToEnd: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "spool_end_to_end_latency_seconds",
			Help: "Time from a message's publish time to its first delivery to a consumer, in seconds.",
			// 500 µs to about 4.4 min (catching up on a backlog).
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 20),
		}, []string{"topic"}),
		acked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_messages_acked_total",
			Help: "Deliveries acked through this process.",
		}, []string{"topic", "group"}),
		nacked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_messages_nacked_total",
			Help: "Deliveries nacked through this process, those given back for redelivery and those the nack dead-lettered.",
		}, []string{"topic", "group"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_messages_dead_lettered_total",
			Help: "Messages this process dead-lettered: by a nack (to_dlq, the last attempt, a poison rule), a claim finding a lease expired on its last attempt, a member leaving with leases on their last attempt, a rebalance moving leases on their last attempt, or an embedded-engine restart finding leases on their last attempt (counted when the broker starts).",
		}, []string{"topic", "group"}),
		expired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_messages_expired_total",
			Help: "Messages the retention job of this process removed while a subscription had not completed them, by the rule that removed them (max_retention, zero_subscription, dead_subscription, size, topic_deleted).",
		}, []string{"topic", "reason"}),
		zombie: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_zombie_messages_total",
			Help: "Messages a subscription gave up when the retention job of this process force-advanced its ack floor, stuck for longer than the topic's zombie_ttl.",
		}, []string{"topic", "group"}),
		sizeRemoved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_retention_size_removed_total",
			Help: "Messages the retention job of this process removed because their topic was above max_messages or max_bytes (completed ones and, with size_policy drop_oldest, needed ones).",
		}, []string{"topic"}),
		fsyncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "spool_wal_fsync_duration_seconds",
			Help: "Duration of one group-commit round (write and fsync) of the embedded engine, in seconds.",
			// 50 µs to about 1.6 s.
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16),
		}),
		fsyncRecords: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "spool_wal_fsync_records",
			Help: "Records made durable by one group-commit round of the embedded engine.",
			// 1 to 8192.
			Buckets: prometheus.ExponentialBuckets(1, 2, 14),
		}),
		connections: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "spool_connections",
			Help: "Open client connections by protocol.",
		}, []string{"protocol"}),
		connectionsTot: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_connections_total",
			Help: "Client connections accepted by protocol.",
		}, []string{"protocol"}),
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_http_requests_total",
			Help: "HTTP requests by route pattern and status code.",
		}, []string{"route", "code"}),
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "spool_http_request_duration_seconds",
			Help: "HTTP request duration by route pattern, in seconds.",
			// 500 µs to about 33 s (long-polling pulls).
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 9),
		}, []string{"route"}),
		authDenied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spool_auth_denied_total",
			Help: "Requests refused by authentication (reason unauthenticated) or authorization (forbidden).",
		}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.published, m.publishDuration, m.publishErrors, m.delivered, m.redelivered,
			m.endToEnd, m.acked, m.nacked, m.deadLettered, m.expired, m.zombie, m.sizeRemoved, m.fsyncDuration, m.fsyncRecords,
			m.connections, m.connectionsTot, m.httpRequests, m.httpDuration, m.authDenied)
	}
	m.lifecycle = newLifecycleMetrics(reg)
	m.rebalance = newRebalanceMetrics(reg)
	m.vecs = m.topicVecs()
	return m
}

// GroupLabel returns the group label value of a subscription's group: "$ephemeral" for an
// ephemeral subscription's group ("$ephemeral-<id>"), the name itself otherwise ("$queue" for the
// queue subscription).
func GroupLabel(group string) string {
	if strings.HasPrefix(group, GroupEphemeral) {
		return GroupEphemeral
	}
	return group
}

// ObservePublish records a successful publish call of n messages to topic that took took (until
// the messages were durable). Call it once per call, not per message.
func (m *Metrics) ObservePublish(topic string, n int, took time.Duration) {
	if m == nil {
		return
	}
	m.publishDuration.Observe(took.Seconds())
	if m.idx.isGone(topic) {
		return
	}
	m.published.WithLabelValues(topic).Add(float64(n))
	m.idx.note(topic, labelNone, "")
}

// ObservePublishError records a failed publish call; code is the protocol error name
// (protocol.Error.Name, "TOPIC_NOT_FOUND") or, over HTTP, the code of the error answer (the same
// names plus a few of HTTP's own, UNSUPPORTED_MEDIA_TYPE), which keeps the label bounded. Count
// every failure, also those refused before the broker saw the call.
func (m *Metrics) ObservePublishError(code string) {
	if m == nil {
		return
	}
	m.publishErrors.WithLabelValues(code).Inc()
}

// ObserveDelivery records one delivery handed to a consumer of group on topic (the subscription's
// group, broker.Member.SubscriptionGroup: "$queue", "$ephemeral-<id>" or a durable name, see the
// package doc). attempt is storage.Delivery.Attempt; attempts above 1 also count as
// redeliveries. For a first attempt, the time since publishedAt (storage.Message.PublishedAt, the
// broker's or database's clock) is observed as end-to-end latency.
func (m *Metrics) ObserveDelivery(topic, group string, attempt int, publishedAt time.Time) {
	o := m.Deliveries()
	o.Observe(topic, group, attempt, publishedAt)
}

// DeliveryObserver records deliveries as ObserveDelivery does, looking the labelled series up
// once per run of deliveries of one topic and group rather than once per delivery (in a 16-group
// fan-out, recording deliveries took 1.65% of the broker's CPU profile that way, 1.24% this
// way). Make one per batch
// (Metrics.Deliveries) and drop it after: the series it holds are not looked up again, so if
// ForgetTopic deletes them meanwhile, the rest of the batch counts in series no longer exported.
type DeliveryObserver struct {
	m            *Metrics
	topic, group string
	ok           bool
	gone         bool // the topic was forgotten: its deliveries are not counted
	delivered    prometheus.Counter
	redelivered  prometheus.Counter // looked up on the first redelivery
	endToEnd     prometheus.Observer
}

// Deliveries returns a DeliveryObserver for one batch of deliveries.
func (m *Metrics) Deliveries() DeliveryObserver { return DeliveryObserver{m: m} }

// Observe is ObserveDelivery.
func (o *DeliveryObserver) Observe(topic, group string, attempt int, publishedAt time.Time) {
	if o.m == nil {
		return
	}
	if !o.ok || topic != o.topic || group != o.group {
		*o = DeliveryObserver{m: o.m, topic: topic, group: group, ok: true, gone: o.m.idx.isGone(topic)}
		if o.gone {
			return
		}
		g := GroupLabel(group)
		o.delivered, o.endToEnd = o.m.delivered.WithLabelValues(topic, g), o.m.endToEnd.WithLabelValues(topic)
		o.m.idx.note(topic, labelGroup, g)
	}
	if o.gone {
		return
	}
	o.delivered.Inc()
	if attempt > 1 {
		if o.redelivered == nil {
			g := GroupLabel(group)
			o.redelivered = o.m.redelivered.WithLabelValues(topic, g)
			o.m.idx.note(topic, labelGroup, g) // after the series is made (note)
		}
		o.redelivered.Inc()
		return
	}
	if !publishedAt.IsZero() {
		o.endToEnd.Observe(max(time.Since(publishedAt), 0).Seconds())
	}
}

// ObserveAck records n deliveries of group on topic acked.
func (m *Metrics) ObserveAck(topic, group string, n int) {
	if m == nil || n <= 0 || m.idx.isGone(topic) {
		return
	}
	g := GroupLabel(group)
	m.acked.WithLabelValues(topic, g).Add(float64(n))
	m.idx.note(topic, labelGroup, g)
}

// ObserveNack records nacks of deliveries of group on topic with the engine's counts
// (storage.DeliveriesNackResult): nacked messages were given back for redelivery, deadLettered ones
// went to the dead-letter queue (a nack with ToDLQ, on the last attempt or by a poison rule). All
// of them count as nacked, so that every protocol counts a nack the same whatever its outcome;
// deadLettered ones also count as dead-lettered.
func (m *Metrics) ObserveNack(topic, group string, nacked, deadLettered int) {
	if m == nil || nacked < 0 || deadLettered < 0 || nacked+deadLettered == 0 || m.idx.isGone(topic) {
		return
	}
	g := GroupLabel(group)
	m.nacked.WithLabelValues(topic, g).Add(float64(nacked + deadLettered))
	if deadLettered > 0 {
		m.deadLettered.WithLabelValues(topic, g).Add(float64(deadLettered))
	}
	m.idx.note(topic, labelGroup, g)
}

// ObserveDeadLettered records n messages of group on topic that the engine dead-lettered on its
// own, in a claim (leases expired on their max_deliveries-th delivery), a release (a member left
// holding leases on it), a rebalance (leases on it in the partitions it moved) or at its open
// after a restart (leases lost on it; reported when the broker starts). Nacks are counted by
// ObserveNack. Its signature is that of broker.Config.OnDeadLettered. It never blocks.
func (m *Metrics) ObserveDeadLettered(topic, group string, n int) {
	if m == nil || n <= 0 || m.idx.isGone(topic) {
		return
	}
	g := GroupLabel(group)
	m.deadLettered.WithLabelValues(topic, g).Add(float64(n))
	m.idx.note(topic, labelGroup, g)
}

// ObserveRetention records what one run of the retention job removed: every entry of res.Expired
// (messages removed while a subscription had not completed them) in spool_messages_expired_total,
// every entry of res.Zombies (messages given up by a stuck subscription) in
// spool_zombie_messages_total, and every entry of res.SizeRemoved in
// spool_retention_size_removed_total. Expiries of a topic this process forgot (ForgetTopic) count
// under topic TopicDeleted; its other figures are dropped. Its signature is that of
// broker.Config.OnRetention. It never blocks.
func (m *Metrics) ObserveRetention(res *storage.RetentionResult) {
	if m == nil || res == nil {
		return
	}
	for _, x := range res.Expired {
		if m.idx.isGone(x.Topic) {
			m.expired.WithLabelValues(TopicDeleted, string(x.Reason)).Add(float64(x.Messages))
			continue
		}
		m.expired.WithLabelValues(x.Topic, string(x.Reason)).Add(float64(x.Messages))
		m.idx.note(x.Topic, labelReason, string(x.Reason))
	}
	for _, z := range res.Zombies {
		if m.idx.isGone(z.Topic) {
			continue
		}
		g := GroupLabel(z.Group)
		m.zombie.WithLabelValues(z.Topic, g).Add(float64(z.Messages))
		m.idx.note(z.Topic, labelGroup, g)
	}
	for _, x := range res.SizeRemoved {
		if m.idx.isGone(x.Topic) {
			continue
		}
		m.sizeRemoved.WithLabelValues(x.Topic).Add(float64(x.Messages))
		m.idx.note(x.Topic, labelNone, "")
	}
}

// ObserveFsync records one group-commit round of the embedded engine: its duration and the
// records it made durable. Its signature is that of wal.Config.OnSync, so the server passes
// m.ObserveFsync there; logs (how many log files the round synced) is not recorded. It never
// blocks.
func (m *Metrics) ObserveFsync(took time.Duration, records, logs int) {
	if m == nil {
		return
	}
	m.fsyncDuration.Observe(took.Seconds())
	m.fsyncRecords.Observe(float64(records))
}

// ConnectionOpened records a client connection accepted; protocol is a fixed name such as
// ProtocolBinary or ProtocolText. Pair it with ConnectionClosed.
func (m *Metrics) ConnectionOpened(protocol string) {
	if m == nil {
		return
	}
	m.connections.WithLabelValues(protocol).Inc()
	m.connectionsTot.WithLabelValues(protocol).Inc()
}

// ConnectionClosed records the end of a connection ConnectionOpened recorded.
func (m *Metrics) ConnectionClosed(protocol string) {
	if m == nil {
		return
	}
	m.connections.WithLabelValues(protocol).Dec()
}

// ObserveHTTPRequest records one HTTP request; route is the matched route pattern
// ("GET /api/v1/topics/{topic}", never the raw path, which would make the label unbounded),
// "unmatched" or "misdirected" (a request without authentication naming another host).
func (m *Metrics) ObserveHTTPRequest(route string, code int, took time.Duration) {
	if m == nil {
		return
	}
	m.httpRequests.WithLabelValues(route, strconv.Itoa(code)).Inc()
	m.httpDuration.WithLabelValues(route).Observe(took.Seconds())
}

// ObserveAuthDenied records a request refused by authentication or authorization; reason is
// auth.ReasonUnauthenticated or auth.ReasonForbidden.
func (m *Metrics) ObserveAuthDenied(reason string) {
	if m == nil {
		return
	}
	m.authDenied.WithLabelValues(reason).Inc()
}
