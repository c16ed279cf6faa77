package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/storage"
)

// RetentionApply applies retention at the engine's current time, topic by topic (ordered by
// name), each topic in one transaction, with the semantics of the embedded engine at message
// granularity. For each partition, the prefix of messages (from low_offset) is removed in which
// every message is:
//
//   - below the retention floor (the lowest ack floor of the subscriptions that hold retention:
//     ACTIVE and PAUSED ones, ephemeral ones included) and older than message_retention;
//   - with no subscription holding retention, older than zero_subscription_retention, or below the
//     lowest floor of the subscriptions with state (DEAD ones) and older than message_retention;
//   - or older than max_retention (strictly).
//
// Removing means advancing the partition's low_offset and low_published_at (one UPDATE per topic
// partition, with the row locked, never a statement per message) and raising the delivery state
// of the subscriptions to the new low (trimDeliveryState). Removed messages that a subscription
// with state had not completed (at or above its ack floor) count as MessagesExpired, by reason
// (countExpired), the others as MessagesDeleted; BytesDeleted is their stored size. DLQ entries
// dead for longer than max_retention are removed (expireDLQ). Then the buckets that hold no
// retained message are detached and dropped (dropBuckets): that is when the storage is reclaimed.
// Last, expired producer ids are pruned and counted, as maintenance does (pruneProducerIDs).
// Backlog is estimated from the buckets left that dropBuckets could have dropped (retentionBacklog).
//
// Safe on several instances at once: each topic is handled under pg_try_advisory_xact_lock (an
// instance that does not get it skips the topic, another is doing it), and the bucket work under
// the bucket lock.
func (e *Engine) RetentionApply(ctx context.Context) (*storage.RetentionResult, error) {
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	now := e.now()
	rows, err := e.pool.Query(ctx, e.sql("SELECT id, name FROM spool.topics ORDER BY name"))
	if err != nil {
		return nil, e.mapErr(fmt.Errorf("pgstore: retention: list topics: %w", err))
	}
	type topicRef struct {
		id   int64
		name string
	}
	var topics []topicRef
	for rows.Next() {
		var t topicRef
		if err := rows.Scan(&t.id, &t.name); err != nil {
			rows.Close()
			return nil, e.mapErr(fmt.Errorf("pgstore: retention: list topics: %w", err))
		}
		topics = append(topics, t)
	}
	if err := rows.Err(); err != nil {
		return nil, e.mapErr(fmt.Errorf("pgstore: retention: list topics: %w", err))
	}
	res := &storage.RetentionResult{}
	e.dropped.drain(res)
	live := make(map[int64]bool, len(topics))
	for _, t := range topics {
		live[t.id] = true
	}
	e.watches.keep(live)
	for _, t := range topics {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		var tr storage.RetentionResult
		prev := e.watches.get(t.id)
		var watch map[watchKey]floorWatch
		err := e.tx(ctx, func(tx pgx.Tx) error {
			tr = storage.RetentionResult{}
			var err error
			watch, err = e.retainTopic(ctx, tx, t.id, t.name, now, prev, &tr)
			return err
		})
		if err != nil {
			return res, fmt.Errorf("pgstore: retention of topic %q: %w", t.name, err)
		}
		if watch != nil {
			e.watches.put(t.id, watch) // nil: skipped (another instance had it, or deleted)
		}
		for _, x := range tr.SizeRemoved {
			res.AddSizeRemoved(x.Topic, x.Messages, x.Bytes)
		}
		for _, z := range tr.Zombies {
			res.AddZombie(z.Topic, z.Group, z.SubscriptionID, z.Messages)
		}
		res.MessagesDeleted += tr.MessagesDeleted
		for _, x := range tr.Expired {
			res.AddExpired(x.Topic, x.Reason, x.Messages)
		}
		res.DLQEntriesExpired += tr.DLQEntriesExpired
		res.BytesDeleted += tr.BytesDeleted
		if tr.MessagesDeleted+tr.MessagesExpired+tr.DLQEntriesExpired+tr.BytesDeleted != 0 {
			e.log.Debug("pgstore: retention", "topic", t.name, "deleted", tr.MessagesDeleted, "expired", tr.MessagesExpired,
				"dlq_expired", tr.DLQEntriesExpired, "bytes", tr.BytesDeleted)
		}
	}
	if _, err := e.dropBuckets(ctx, now); err != nil {
		// The messages are logically gone already; the next run tries again.
		e.log.Warn("pgstore: retention: drop buckets", "err", err)
	}
	if res.Backlog, err = e.retentionBacklog(ctx, now); err != nil {
		e.log.Warn("pgstore: retention: backlog", "err", err)
	}
	// Producer ids past their dedup_window go too (as in maintenance), making room under
	// Config.MaxProducerIDs; the next run or maintenance pass tries again after a failure.
	if err := e.pruneProducerIDs(ctx, now, pruneProducerIDsBatch); err != nil {
		e.log.Warn("pgstore: retention: prune producer ids", "err", err)
	} else if err := e.countProducerIDs(ctx); err != nil {
		e.log.Warn("pgstore: retention: count producer ids", "err", err)
	}
	return res, nil
}

// partRetention is a partition's state as retention sees it.
type partRetention struct {
	partition int32
	low, next int64
	// bounds: the first offset (>= low) published at or after now minus max_retention,
	// message_retention and zero_subscription_retention; next when there is none.
	boundMax, boundMsg, boundZero int64
	// floors of the subscriptions with state (-1: none): holding retention, and all of them.
	minHold, minAll int64
}

// cut returns where the partition's retained messages start after retention.
func (p *partRetention) cut() int64 {
	c := max(p.low, p.boundMax)
	if p.minHold >= 0 {
		c = max(c, min(p.minHold, p.boundMsg))
	} else {
		c = max(c, p.boundZero)
		if p.minAll >= 0 {
			c = max(c, min(p.minAll, p.boundMsg))
		}
	}
	return min(c, p.next)
}

// countExpired counts in res the messages of [low, cut) that a subscription with state had not
// completed (from minAll on) and returns how many: those older than max_retention (below
// boundMax) with reason max_retention, the others with the rule that let cut pass them (as
// RetentionResult's reasons are ordered: zero_subscription without a subscription holding
// retention, dead_subscription with one, since only a DEAD one can be behind it).
func (p *partRetention) countExpired(res *storage.RetentionResult, topic string, cut int64) int64 {
	if p.minAll < 0 || cut <= p.minAll {
		return 0
	}
	from := max(p.low, p.minAll)
	byMax := max(min(cut, p.boundMax)-from, 0)
	res.AddExpired(topic, storage.ExpiredMaxRetention, byMax)
	reason := storage.ExpiredDeadSubscription
	if p.minHold < 0 {
		reason = storage.ExpiredZeroSubscription
	}
	res.AddExpired(topic, reason, cut-from-byMax)
	return cut - from
}

// retentionBoundsSQL reads, for each partition of topic $1 that holds messages, its low and next
// offsets, the bounds of the three times in $2 (max_retention, message_retention and
// zero_subscription_retention before now: partRetention's boundMax, boundMsg and boundZero, by
// the binary search of searchTimesCTE, so that a group holding millions of messages older than
// message_retention does not make every run read them) and the floors of its subscriptions, in
// one snapshot.
const retentionBoundsSQL = searchTimesCTE + `SELECT p.partition, p.low_offset, p.next_offset,
	coalesce(b1.off, p.next_offset), coalesce(b2.off, p.next_offset), coalesce(b3.off, p.next_offset),
	coalesce(f.min_hold, -1), coalesce(f.min_all, -1)
FROM spool.partitions p
LEFT JOIN found b1 ON b1.partition = p.partition AND b1.k = 1
LEFT JOIN found b2 ON b2.partition = p.partition AND b2.k = 2
LEFT JOIN found b3 ON b3.partition = p.partition AND b3.k = 3
` + floorsJoinSQL

// retainTopic applies retention to one topic inside tx; see RetentionApply. prev is the
// instance's view of the topic's floors (zombie.go); the new one is returned, nil when the topic
// was skipped.
func (e *Engine) retainTopic(ctx context.Context, tx pgx.Tx, topicID int64, name string, now time.Time,
	prev map[watchKey]floorWatch, res *storage.RetentionResult) (map[watchKey]floorWatch, error) {
	ok, err := tryXactLock(ctx, tx, lockKey(e.schema, "retention:"+strconv.FormatInt(topicID, 10)))
	if err != nil || !ok {
		return nil, err
	}
	var cfgJSON []byte
	err = tx.QueryRow(ctx, e.sql("SELECT config FROM spool.topics WHERE id = $1 FOR SHARE"), topicID).Scan(&cfgJSON)
	if errors.Is(err, pgx.ErrNoRows) {
		return map[watchKey]floorWatch{}, nil // deleted meanwhile
	}
	if err != nil {
		return nil, err
	}
	var cfg storage.TopicConfig
	if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
		return nil, fmt.Errorf("%w: topic %d: config: %v", storage.ErrCorrupt, topicID, err)
	}
	cfg = cfg.WithDefaults()

	if err := noJIT(ctx, tx); err != nil {
		return nil, err
	}
	watch, err := e.advanceZombies(ctx, tx, topicID, name, cfg, now, prev, res)
	if err != nil {
		return nil, err
	}
	removed := res.MessagesDeleted + res.MessagesExpired
	if err := e.retainTopicMessages(ctx, tx, topicID, name, now, cfg, res); err != nil {
		return nil, err
	}
	if res.MessagesDeleted+res.MessagesExpired > removed {
		// Retention may have raised floors (drop_oldest, max_retention): that is no progress of
		// the subscription, so the view keeps its "since" with the floor as retention left it
		// (as the embedded engine does); else a stuck subscription would never reach zombie_ttl.
		if err := e.rewatchFloors(ctx, tx, topicID, watch); err != nil {
			return nil, err
		}
	}
	return watch, nil
}

// retainTopicMessages removes what retention allows of one topic's messages inside tx.
func (e *Engine) retainTopicMessages(ctx context.Context, tx pgx.Tx, topicID int64, name string, now time.Time,
	cfg storage.TopicConfig, res *storage.RetentionResult) error {
	rows, err := tx.Query(ctx, e.sql(retentionBoundsSQL), topicID,
		[]time.Time{now.Add(-cfg.MaxRetention), now.Add(-cfg.MessageRetention), now.Add(-cfg.ZeroSubscriptionRetention)})
	if err != nil {
		return err
	}
	var parts []partRetention
	for rows.Next() {
		var p partRetention
		if err := rows.Scan(&p.partition, &p.low, &p.next, &p.boundMax, &p.boundMsg, &p.boundZero, &p.minHold, &p.minAll); err != nil {
			rows.Close()
			return err
		}
		if p.cut() > p.low {
			parts = append(parts, p)
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}

	for _, p := range parts {
		cut := p.cut()
		bytes, ok, err := e.advanceLow(ctx, tx, topicID, p.partition, p.low, cut)
		if err != nil {
			return err
		}
		if !ok {
			continue // another instance moved it meanwhile
		}
		expired := p.countExpired(res, name, cut)
		res.MessagesDeleted += cut - p.low - expired
		res.BytesDeleted += bytes
	}
	if cfg.HasSizeBound() {
		if err := e.retainSize(ctx, tx, topicID, name, cfg, res); err != nil {
			return err
		}
	}
	n, err := e.expireDLQ(ctx, tx, topicID, now.Add(-cfg.MaxRetention))
	if err != nil {
		return err
	}
	res.DLQEntriesExpired += n
	return nil
}

// advanceLow removes the messages [low, cut) of one partition: it advances its low_offset,
// low_published_at and bytes (if low_offset is still low: ok is false otherwise, another
// instance moved it), raises the subscriptions' delivery state to cut and deletes the completion
// records below cut. It returns the bytes removed.
func (e *Engine) advanceLow(ctx context.Context, tx pgx.Tx, topicID int64, partition int32, low, cut int64) (bytes int64, ok bool, err error) {
	// Lock the row first (publishers in flight commit before), then compute the new
	// low_published_at and the bytes in a new statement, which sees what they committed.
	b := &pgx.Batch{}
	b.Queue(e.sql("SELECT low_offset FROM spool.partitions WHERE topic_id = $1 AND partition = $2 FOR UPDATE"), topicID, partition)
	b.Queue(e.sql(`
		WITH gone AS (
			SELECT coalesce(sum(m.size + `+strconv.Itoa(messageOverhead)+`), 0)::bigint AS bytes, count(*) AS n
			FROM spool.messages m
			WHERE m.topic_id = $1 AND m.partition = $2 AND m."offset" >= $3 AND m."offset" < $4)
		UPDATE spool.partitions p SET
			low_offset = $4,
			low_published_at = (SELECT m.published_at FROM spool.messages m
				WHERE m.topic_id = $1 AND m.partition = $2 AND m."offset" = $4),
			bytes = greatest(p.bytes - (SELECT bytes FROM gone), 0)
		WHERE p.topic_id = $1 AND p.partition = $2 AND p.low_offset = $3
		RETURNING (SELECT bytes FROM gone), (SELECT n FROM gone)`), topicID, partition, low, cut)
	br := tx.SendBatch(ctx, b)
	var cur int64
	if err := br.QueryRow().Scan(&cur); err != nil {
		br.Close()
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, false, nil
		}
		return 0, false, err
	}
	var n int64
	err = br.QueryRow().Scan(&bytes, &n)
	br.Close()
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	if n != cut-low {
		e.log.Warn("pgstore: retention: partition misses messages", "topic_id", topicID, "partition", partition,
			"from", low, "to", cut, "found", n)
	}
	if err := e.trimDeliveryState(ctx, tx, topicID, partition, cut); err != nil {
		return 0, false, err
	}
	// Completion records go with their messages, by age and by size alike (a watermark topic has
	// none: an index probe).
	if _, err := tx.Exec(ctx, e.sql(`DELETE FROM spool.completions WHERE topic_id = $1 AND partition = $2 AND hi <= $3`),
		topicID, partition, cut); err != nil {
		return 0, false, fmt.Errorf("pgstore: retention: completion records: %w", err)
	}
	return bytes, true, nil
}

// defaultSizeRunLimit bounds the rows one run reads for a topic's size bound, so the messages it
// removes (the next run goes on): each partition's oldest defaultSizeRunLimit / partitions, at
// least sizeMinPerPartition. Engine.sizeRunLimit holds it (tests lower it).
const (
	defaultSizeRunLimit = 10000
	sizeMinPerPartition = 100
)

// floorsJoinSQL ends retentionBoundsSQL and sizeStateSQL: per partition of topic $1 holding
// messages, the lowest ack floor of the subscriptions that hold retention (ACTIVE, PAUSED:
// min_hold) and of all with delivery state (DEAD too: min_all).
const floorsJoinSQL = `
LEFT JOIN (
	SELECT sp.partition,
		min(sp.ack_floor) FILTER (WHERE sb.state IN ('ACTIVE', 'PAUSED')) AS min_hold,
		min(sp.ack_floor) AS min_all
	FROM spool.subscriptions sb JOIN spool.sub_partitions sp ON sp.sub_id = sb.id
	WHERE sb.topic_id = $1 AND sb.state IN ('ACTIVE', 'PAUSED', 'DEAD')
	GROUP BY sp.partition
) f ON f.partition = p.partition
WHERE p.topic_id = $1 AND p.low_offset < p.next_offset
ORDER BY p.partition`

// sizeStateSQL reads, after the age rules, each partition of topic $1 that holds messages: its
// low and next offsets, bytes, and the floors of its subscriptions (as retentionBoundsSQL).
const sizeStateSQL = `SELECT p.partition, p.low_offset, p.next_offset, p.bytes,
	coalesce(f.min_hold, -1), coalesce(f.min_all, -1)
FROM spool.partitions p
` + floorsJoinSQL

// sizeCandidatesSQL lists the oldest messages of the ranges ($2 partitions, $3 from, $4 to) of
// topic $1, at most $5 per partition (read in index order), oldest first across partitions
// (within a partition in offset order), with their stored size.
const sizeCandidatesSQL = `SELECT m.partition, m."offset", m.size + ` + "%d" + `
FROM unnest($2::int[], $3::bigint[], $4::bigint[]) AS r (partition, lo, hi)
CROSS JOIN LATERAL (SELECT m.partition, m."offset", m.published_at, m.size FROM spool.messages m
	WHERE m.topic_id = $1 AND m.partition = r.partition AND m."offset" >= r.lo AND m."offset" < r.hi
	ORDER BY m."offset" LIMIT $5) m
ORDER BY m.published_at, m.partition, m."offset"`

// retainSize applies the topic's size bound (max_messages, max_bytes) after the age rules: while
// the topic is above it, its oldest messages across partitions go, message by message, but with
// size_policy keep_needed only those every subscription holding retention completed (below their
// lowest floor). At most about Engine.sizeRunLimit messages per run. Removed messages a subscription with
// state had not completed are expired with reason size; all are counted in SizeRemoved.
func (e *Engine) retainSize(ctx context.Context, tx pgx.Tx, topicID int64, name string, cfg storage.TopicConfig, res *storage.RetentionResult) error {
	type part struct {
		partition               int32
		low, next, bytes, cut   int64
		minHold, minAll, cutLim int64
	}
	rows, err := tx.Query(ctx, e.sql(sizeStateSQL), topicID)
	if err != nil {
		return fmt.Errorf("size bound: %w", err)
	}
	var parts []part
	var msgs, bytes int64
	for rows.Next() {
		var p part
		if err := rows.Scan(&p.partition, &p.low, &p.next, &p.bytes, &p.minHold, &p.minAll); err != nil {
			rows.Close()
			return fmt.Errorf("size bound: %w", err)
		}
		msgs += p.next - p.low
		bytes += p.bytes
		p.cut, p.cutLim = p.low, p.next
		if cfg.SizePolicy != storage.SizeDropOldest && p.minHold >= 0 {
			p.cutLim = min(p.minHold, p.next)
		}
		parts = append(parts, p)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("size bound: %w", err)
	}
	if !cfg.OverSize(msgs, bytes) {
		return nil
	}
	var ps []int32
	var los, his []int64
	idx := map[int32]int{}
	for i, p := range parts {
		if p.cutLim > p.low {
			idx[p.partition] = i
			ps, los, his = append(ps, p.partition), append(los, p.low), append(his, p.cutLim)
		}
	}
	if len(ps) == 0 {
		return nil // everything left is needed
	}
	per := max(e.sizeRunLimit/len(ps), min(sizeMinPerPartition, e.sizeRunLimit))
	rows, err = tx.Query(ctx, e.sql(fmt.Sprintf(sizeCandidatesSQL, messageOverhead)), topicID, ps, los, his, per)
	if err != nil {
		return fmt.Errorf("size bound: candidates: %w", err)
	}
	type cand struct {
		partition  int32
		off, bytes int64
	}
	var cands []cand
	for rows.Next() {
		var c cand
		if err := rows.Scan(&c.partition, &c.off, &c.bytes); err != nil {
			rows.Close()
			return fmt.Errorf("size bound: candidates: %w", err)
		}
		cands = append(cands, c)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("size bound: candidates: %w", err)
	}
	taken := map[int32]int{}
	for _, c := range cands {
		if !cfg.OverSize(msgs, bytes) {
			break
		}
		parts[idx[c.partition]].cut = c.off + 1
		msgs--
		bytes -= c.bytes
		// A partition whose read is used up may hold older messages than the next candidates
		// of the others: the next run goes on from here.
		if taken[c.partition]++; taken[c.partition] == per {
			break
		}
	}
	for _, p := range parts {
		if p.cut <= p.low {
			continue
		}
		gone, ok, err := e.advanceLow(ctx, tx, topicID, p.partition, p.low, p.cut)
		if err != nil {
			return fmt.Errorf("size bound: %w", err)
		}
		if !ok {
			continue
		}
		var expired int64
		if p.minAll >= 0 && p.cut > p.minAll {
			expired = p.cut - max(p.low, p.minAll)
			res.AddExpired(name, storage.ExpiredSize, expired)
		}
		res.MessagesDeleted += p.cut - p.low - expired
		res.BytesDeleted += gone
		res.AddSizeRemoved(name, p.cut-p.low, gone)
	}
	return nil
}

// backlogBucketsSQL lists the buckets that hold nothing retained and are still stored after a
// run: those dropBuckets takes as candidates from committed data (candidateLimitSQL at $1) and
// those being dropped (spool.bucket_drops), whose table exists in schema $2. A bucket a publisher
// may still write to (writeFloorSQL) is among them: it waits, like a blocked drop.
const backlogBucketsSQL = `SELECT x.name FROM (
	SELECT b.name FROM spool.buckets b
	WHERE b.end_at <= $1
	  AND b.end_at <= coalesce((SELECT min(low_published_at) FROM spool.partitions), 'infinity')
	UNION
	SELECT d.name FROM spool.bucket_drops d) x
WHERE EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = $2 AND c.relname = x.name)
ORDER BY x.name`

// bucketMessagesSQL estimates the messages of one bucket (its table is spool.bucket__): for each
// (topic, partition) it holds, found by a skip scan of its position index, the span from its
// lowest to its highest offset. Index probes only, never a scan of the bucket's rows; a
// partition's messages in a bucket are a run of offsets (published_at never decreases within a
// partition), so the span is exact but for missing offsets.
const bucketMessagesSQL = `WITH RECURSIVE k (topic_id, partition) AS (
	(SELECT m.topic_id, m.partition FROM spool.bucket__ m ORDER BY m.topic_id, m.partition LIMIT 1)
	UNION ALL
	SELECT n.topic_id, n.partition FROM k CROSS JOIN LATERAL (
		SELECT m.topic_id, m.partition FROM spool.bucket__ m
		WHERE (m.topic_id, m.partition) > (k.topic_id, k.partition)
		ORDER BY m.topic_id, m.partition LIMIT 1) n
)
SELECT coalesce(sum(
	(SELECT max(m."offset") FROM spool.bucket__ m WHERE m.topic_id = k.topic_id AND m.partition = k.partition) -
	(SELECT min(m."offset") FROM spool.bucket__ m WHERE m.topic_id = k.topic_id AND m.partition = k.partition) + 1), 0)::bigint
FROM k`

// retentionBacklog estimates RetentionResult.Backlog after a run at now: the messages of the
// buckets that hold nothing retained (every message in them is below its partition's low
// offset, or of a deleted topic) and are still stored: a drop that failed, that waits (the bucket
// lock held by another instance, a publisher's open transaction), or that another instance is
// doing. After a run whose drops all succeeded it is 0. A bucket's messages are estimated from
// its offsets (bucketMessagesSQL). Messages released from the retained range but in a bucket
// that also holds retained ones are not counted (the bucket is not removable yet).
func (e *Engine) retentionBacklog(ctx context.Context, now time.Time) (int64, error) {
	rows, err := e.pool.Query(ctx, e.sql(backlogBucketsSQL), now, e.schema)
	if err != nil {
		return 0, e.mapErr(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, e.mapErr(err)
	}
	var n int64
	for _, name := range names {
		var m int64
		// Rendered here, not through e.sql: its cache would keep one query per bucket forever.
		q := strings.ReplaceAll(renderSchema(bucketMessagesSQL, e.schema), "bucket__", name)
		if err := e.pool.QueryRow(ctx, q).Scan(&m); err != nil {
			if pgCode(err) == "42P01" { // dropped meanwhile
				continue
			}
			return n, e.mapErr(fmt.Errorf("bucket %s: %w", name, err))
		}
		n += m
	}
	return n, nil
}
