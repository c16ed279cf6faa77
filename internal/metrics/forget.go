package metrics

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
)

// Forgetting the series of topics and groups that no longer exist (the package doc says when:
// ForgetTopic, ObserveNotification, and the sweep of every scrape of the broker collector).
//
// Deleting by label values needs them: DeletePartialMatch scans every series of a vector under
// its lock, so forgetting one topic would cost as much as all topics have series (18 vectors, of
// up to a series per topic and group at 10,000 topics), and deleting many topics the square of
// it. seriesIndex records, per topic, the groups and expiry reasons that have series, and a topic's series are
// deleted with DeleteLabelValues, one hash lookup each. Recording is one lock-free map lookup per
// observation (per batch of deliveries); only a label set seen for the first time takes the
// index's mutex.
//
// A forgotten topic leaves a tombstone: its observations are dropped (expiries count under
// TopicDeleted) until the process learns that the topic exists again or goneTTL passed.

// TopicDeleted is the topic label under which spool_messages_expired_total counts the expiries
// of topics this process already forgot (reason topic_deleted, or a retention run that raced the
// deletion). Topic names cannot start with '$'.
const TopicDeleted = "$deleted"

// goneTTL is how long a tombstone drops the observations of a forgotten topic at most; it bounds
// the tombstones' memory when the topic never comes back. Far above the retention interval (the
// retention run that reports a deleted topic's last expiries comes within one).
const goneTTL = time.Hour

// labelKind says what the second label of a topic vector is.
type labelKind uint8

const (
	labelNone   labelKind = iota // topic only
	labelGroup                   // topic, group
	labelReason                  // topic, reason
)

// topicVec is a hook vector whose first label is topic.
type topicVec struct {
	vec    *prometheus.MetricVec
	second labelKind
}

// indexKey is one label set of seriesIndex.known: a topic (labelNone), or a topic with a group or
// an expiry reason.
type indexKey struct {
	topic, label string
	kind         labelKind
}

// seriesIndex records the topics, groups and expiry reasons that have hook series, and the
// tombstones of forgotten topics.
type seriesIndex struct {
	// epoch counts the sweeps begun (sweepBegin): topics, groups and tombstones record the epoch
	// they were made in, so that a sweep leaves alone what appeared after its listings began.
	epoch atomic.Int64
	// known holds every indexKey of topics, for note's lock-free check; written under mu.
	known sync.Map
	// gone maps the topics forgotten to their *tombstone, read lock-free while goneN > 0;
	// written under mu.
	gone  sync.Map
	goneN atomic.Int64

	// mu guards the fields below and the writes of known and gone.
	mu     sync.Mutex
	topics map[string]*topicSeries
	pruned time.Time // when pruneLocked last ran
}

// topicSeries is what seriesIndex knows of one topic.
type topicSeries struct {
	born    int64            // epoch of its first series
	groups  map[string]int64 // group label -> epoch of its first series
	reasons map[string]struct{}
}

type tombstone struct {
	epoch int64
	at    time.Time
}

// note records that topic has a series with the second label of kind (label "" for labelNone).
// Call it after making the series (WithLabelValues), never before: a forget between the two
// then deletes the series or leaves it indexed, never unindexed.
func (x *seriesIndex) note(topic string, kind labelKind, label string) {
	k := indexKey{topic: topic, label: label, kind: kind}
	if _, ok := x.known.Load(k); ok {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.known.Load(k); ok {
		return
	}
	epoch := x.epoch.Load()
	ts := x.topics[topic]
	if ts == nil {
		if x.topics == nil {
			x.topics = make(map[string]*topicSeries)
		}
		ts = &topicSeries{born: epoch}
		x.topics[topic] = ts
		x.known.Store(indexKey{topic: topic}, struct{}{})
	}
	switch kind {
	case labelGroup:
		if ts.groups == nil {
			ts.groups = make(map[string]int64)
		}
		ts.groups[label] = epoch
	case labelReason:
		if ts.reasons == nil {
			ts.reasons = make(map[string]struct{})
		}
		ts.reasons[label] = struct{}{}
	}
	x.known.Store(k, struct{}{})
}

// isGone reports whether topic has a tombstone. Lock-free; one atomic load while there is none.
func (x *seriesIndex) isGone(topic string) bool {
	if x.goneN.Load() == 0 {
		return false
	}
	_, ok := x.gone.Load(topic)
	return ok
}

// forgetTopicLocked takes topic out of the index, leaves its tombstone and returns what its
// series were (nil if it had none). x.mu must be held.
func (x *seriesIndex) forgetTopicLocked(topic string, now time.Time) *topicSeries {
	if _, ok := x.gone.Load(topic); !ok {
		x.goneN.Add(1)
	}
	x.gone.Store(topic, &tombstone{epoch: x.epoch.Load(), at: now})
	if now.Sub(x.pruned) > goneTTL/8 {
		x.pruneLocked(now)
	}
	ts := x.topics[topic]
	if ts == nil {
		return nil
	}
	delete(x.topics, topic)
	x.known.Delete(indexKey{topic: topic})
	for g := range ts.groups {
		x.known.Delete(indexKey{topic: topic, label: g, kind: labelGroup})
	}
	for r := range ts.reasons {
		x.known.Delete(indexKey{topic: topic, label: r, kind: labelReason})
	}
	return ts
}

// reviveLocked removes topic's tombstone. x.mu must be held.
func (x *seriesIndex) reviveLocked(topic string) {
	if _, ok := x.gone.LoadAndDelete(topic); ok {
		x.goneN.Add(-1)
	}
}

// pruneLocked removes the tombstones older than goneTTL. x.mu must be held.
func (x *seriesIndex) pruneLocked(now time.Time) {
	x.pruned = now
	if x.goneN.Load() == 0 {
		return
	}
	x.gone.Range(func(k, v any) bool {
		if now.Sub(v.(*tombstone).at) > goneTTL {
			x.reviveLocked(k.(string))
		}
		return true
	})
}

// topicVecs lists the hook vectors labelled by topic.
func (m *Metrics) topicVecs() []topicVec {
	return []topicVec{
		{m.published.MetricVec, labelNone}, {m.endToEnd.MetricVec, labelNone}, {m.sizeRemoved.MetricVec, labelNone},
		{m.lifecycle.dead.MetricVec, labelNone}, {m.lifecycle.resurrected.MetricVec, labelNone},
		{m.lifecycle.deleted.MetricVec, labelNone}, {m.rebalance.duration.MetricVec, labelNone},
		{m.delivered.MetricVec, labelGroup}, {m.redelivered.MetricVec, labelGroup}, {m.acked.MetricVec, labelGroup},
		{m.nacked.MetricVec, labelGroup}, {m.deadLettered.MetricVec, labelGroup}, {m.zombie.MetricVec, labelGroup},
		{m.lifecycle.forceCompleted.MetricVec, labelGroup}, {m.lifecycle.filtered.MetricVec, labelGroup},
		{m.rebalance.count.MetricVec, labelGroup}, {m.rebalance.generation.MetricVec, labelGroup},
		{m.expired.MetricVec, labelReason},
	}
}

// deleteSeries deletes the series of topic that ts lists.
func (m *Metrics) deleteSeries(topic string, ts *topicSeries) {
	for _, v := range m.vecs {
		switch v.second {
		case labelNone:
			v.vec.DeleteLabelValues(topic)
		case labelGroup:
			for g := range ts.groups {
				v.vec.DeleteLabelValues(topic, g)
			}
		case labelReason:
			for r := range ts.reasons {
				v.vec.DeleteLabelValues(topic, r)
			}
		}
	}
}

// deleteGroupSeries deletes the series of groups of topic.
func (m *Metrics) deleteGroupSeries(topic string, groups []string) {
	for _, v := range m.vecs {
		if v.second == labelGroup {
			for _, g := range groups {
				v.vec.DeleteLabelValues(topic, g)
			}
		}
	}
}

// ForgetTopic deletes the hook series of a deleted topic so that they do not outlive it, and
// drops later observations of it (a late expiry counts under TopicDeleted) until this process
// learns that the topic exists again (ObserveNotification with NotifyTopicCreated, or a scrape
// of the broker collector listing it). Call it after deleting a topic; a topic created again
// under the name starts its counters at 0. It never blocks for long: its cost is the topic's own
// series.
func (m *Metrics) ForgetTopic(topic string) {
	if m == nil {
		return
	}
	m.idx.mu.Lock()
	ts := m.idx.forgetTopicLocked(topic, time.Now())
	m.idx.mu.Unlock()
	if ts != nil {
		m.deleteSeries(topic, ts)
	}
}

// ObserveNotification follows the engine's topic notifications: a topic deleted (by this
// process or, on PostgreSQL, by another instance) is forgotten (ForgetTopic); a topic created
// is counted again. Its signature is that of the callback of storage.Engine.NotifyRegister, so
// the engine's owner registers it (assemble.OpenEngine does); message notifications cost one
// comparison. It never blocks for long.
func (m *Metrics) ObserveNotification(n storage.Notification) {
	if m == nil {
		return
	}
	switch n.Kind {
	case storage.NotifyTopicDeleted:
		m.ForgetTopic(n.Topic)
	case storage.NotifyTopicCreated:
		if m.idx.goneN.Load() == 0 {
			return
		}
		m.idx.mu.Lock()
		m.idx.reviveLocked(n.Topic)
		m.idx.mu.Unlock()
	}
}

// sweepBegin starts a sweep: call it before reading the listings given to sweep, which then
// leaves alone the topics and groups whose first series came after.
func (m *Metrics) sweepBegin() int64 {
	if m == nil {
		return 0
	}
	return m.idx.epoch.Add(1)
}

// sweep forgets the topics that have hook series but are not in topics, and the groups of
// listed topics that have hook series but no subscription in groups (every subscription that is
// not DELETED; "$ephemeral" stays with its topic), provided their first series came before
// begin (sweepBegin). It lifts the tombstones of the topics listed that were forgotten before
// begin (created again since). Its cost is linear in the topics and groups listed and indexed.
func (m *Metrics) sweep(begin int64, topics []*broker.TopicInfo, groups []*broker.GroupInfo) {
	if m == nil {
		return
	}
	type group struct{ topic, group string }
	liveTopics := make(map[string]struct{}, len(topics))
	for _, t := range topics {
		if t.Topic != nil {
			liveTopics[t.Topic.Name] = struct{}{}
		}
	}
	liveGroups := make(map[group]struct{}, len(groups))
	for _, g := range groups {
		liveGroups[group{g.Topic, GroupLabel(g.Group)}] = struct{}{}
	}
	type forgot struct {
		topic  string
		ts     *topicSeries // the whole topic, or
		groups []string     // these groups of it
	}
	var out []forgot
	x := &m.idx
	now := time.Now()
	x.mu.Lock()
	for name, ts := range x.topics {
		if ts.born >= begin {
			continue
		}
		if _, ok := liveTopics[name]; !ok {
			out = append(out, forgot{topic: name, ts: x.forgetTopicLocked(name, now)})
			continue
		}
		var gone []string
		for g, born := range ts.groups {
			if _, ok := liveGroups[group{name, g}]; !ok && born < begin && g != GroupEphemeral {
				gone = append(gone, g)
			}
		}
		for _, g := range gone {
			delete(ts.groups, g)
			x.known.Delete(indexKey{topic: name, label: g, kind: labelGroup})
		}
		if gone != nil {
			out = append(out, forgot{topic: name, groups: gone})
		}
	}
	if x.goneN.Load() > 0 {
		x.gone.Range(func(k, v any) bool {
			if _, ok := liveTopics[k.(string)]; ok && v.(*tombstone).epoch < begin {
				x.reviveLocked(k.(string))
			}
			return true
		})
		x.pruneLocked(now)
	}
	x.mu.Unlock()
	for _, f := range out {
		if f.ts != nil {
			m.deleteSeries(f.topic, f.ts)
		}
		m.deleteGroupSeries(f.topic, f.groups)
	}
}
