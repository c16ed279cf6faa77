package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
)

// invalid and validName are the shared validation errors of package storage.
var (
	invalid   = storage.Invalid
	validName = storage.InvalidName
)

// now is the engine clock in UTC, truncated to the microseconds PostgreSQL keeps, so that what a
// method returns equals what a later read returns.
func (e *Engine) now() time.Time {
	return e.clockNow().UTC().Truncate(time.Microsecond)
}

// isUniqueViolation reports a unique_violation (SQLSTATE 23505).
func isUniqueViolation(err error) bool { return pgCode(err) == "23505" }

// checkTopic takes the result of a TopicCreateParams or TopicUpdateParams Check and adds the
// configuration as stored in spool.topics.
func checkTopic(cfg storage.TopicConfig, err error) (storage.TopicConfig, []byte, error) {
	if err != nil {
		return cfg, nil, err
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return cfg, nil, fmt.Errorf("pgstore: encode topic config: %w", err)
	}
	return cfg, cfgJSON, nil
}

// TopicCreate creates a topic: its spool.topics row, one spool.partitions row per partition and
// its subscriptions, in one transaction. A QUEUE topic gets its one subscription (group
// storage.QueueGroup, FROM_BEGINNING); a PUB_SUB topic gets one subscription per group with a
// matching binding (the group's first matching pattern in byte order, from the beginning).
// Bindings cannot change while topics are being created (SHARE lock on spool.bindings), so a
// binding either subscribes a new topic or was created after the topic was visible. Concurrent
// creates of one name, also by other broker instances: one wins, the others get
// storage.ErrTopicExists. Bounded by Config.TxTimeout (past it: TIMEOUT, retryable).
func (e *Engine) TopicCreate(ctx context.Context, params *storage.TopicCreateParams) (*storage.Topic, error) {
	cfg, cfgJSON, err := checkTopic(params.Check())
	if err != nil {
		return nil, err
	}
	out, err := withTxTimeout(e, ctx, "topic create", func(ctx context.Context) (*storage.Topic, error) {
		return e.topicCreate(ctx, params, cfg, cfgJSON)
	})
	if err != nil {
		return nil, err
	}
	e.announce(storage.Notification{Kind: storage.NotifyTopicCreated, Topic: params.Name})
	return out, nil
}

// topicCreate runs TopicCreate's transaction with ctx bounded by Config.TxTimeout.
func (e *Engine) topicCreate(ctx context.Context, params *storage.TopicCreateParams, cfg storage.TopicConfig, cfgJSON []byte) (*storage.Topic, error) {
	var out *storage.Topic
	err := e.tx(ctx, func(tx pgx.Tx) error {
		now := e.now()
		if params.MaxTopics > 0 {
			if err := e.checkCount(ctx, tx, "topic-create", "SELECT count(*) FROM spool.topics", params.MaxTopics,
				"topics, the most this broker keeps (broker.max_topics); delete topics or raise it"); err != nil {
				return err
			}
		}
		var groups, patterns []string
		if cfg.Semantics == storage.PubSub {
			if _, err := tx.Exec(ctx, e.sql("LOCK TABLE spool.bindings IN SHARE MODE")); err != nil {
				return fmt.Errorf("pgstore: topic create %q: lock bindings: %w", params.Name, err)
			}
			var err error
			groups, patterns, err = e.matchingBindings(ctx, tx, params.Name)
			if err != nil {
				return err
			}
		}
		var id int64
		err := tx.QueryRow(ctx, e.sql("INSERT INTO spool.topics (name, config, created_at) VALUES ($1, $2, $3) RETURNING id"),
			params.Name, cfgJSON, now).Scan(&id)
		if isUniqueViolation(err) {
			return fmt.Errorf("%w: %q", storage.ErrTopicExists, params.Name)
		}
		if err != nil {
			return fmt.Errorf("pgstore: topic create %q: %w", params.Name, err)
		}
		if _, err := tx.Exec(ctx, e.sql("INSERT INTO spool.partitions (topic_id, partition) SELECT $1, g FROM generate_series(0, $2::int - 1) g"),
			id, cfg.Partitions); err != nil {
			return fmt.Errorf("pgstore: topic create %q: partitions: %w", params.Name, err)
		}
		t := &topicRow{id: id, name: params.Name, cfg: cfg, createdAt: now}
		beginning := storage.StartPosition{Kind: storage.FromBeginning}
		zero := make([]int64, cfg.Partitions)
		if cfg.Semantics == storage.Queue {
			groups, patterns = []string{storage.QueueGroup}, []string{""}
		}
		for i, g := range groups {
			if _, err := e.insertSub(ctx, tx, t, g, patterns[i], false, beginning, zero, now, 0, 0, nil); err != nil {
				return err
			}
		}
		out = t.topic()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// matchingBindings returns, per group in byte order, the first of its binding patterns (byte
// order) that matches topic.
func (e *Engine) matchingBindings(ctx context.Context, q querier, topic string) (groups, patterns []string, err error) {
	rows, err := q.Query(ctx, e.sql("SELECT group_name, pattern FROM spool.bindings ORDER BY group_name, pattern"))
	if err != nil {
		return nil, nil, fmt.Errorf("pgstore: read bindings: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var g, p string
		if err := rows.Scan(&g, &p); err != nil {
			return nil, nil, fmt.Errorf("pgstore: read bindings: %w", err)
		}
		if (len(groups) == 0 || groups[len(groups)-1] != g) && names.Match(p, topic) {
			groups = append(groups, g)
			patterns = append(patterns, p)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("pgstore: read bindings: %w", err)
	}
	return groups, patterns, nil
}

// TopicGet returns a topic. Bounded by Config.TxTimeout (past it: TIMEOUT, retryable).
func (e *Engine) TopicGet(ctx context.Context, name string) (*storage.Topic, error) {
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	return withTxTimeout(e, ctx, "topic get", func(ctx context.Context) (*storage.Topic, error) {
		t, err := e.loadTopic(ctx, e.pool, name, noLock)
		if err != nil {
			return nil, e.mapErr(err)
		}
		return t.topic(), nil
	})
}

// TopicList lists all topics ordered by name (byte-wise). Bounded by Config.TxTimeout (past it:
// TIMEOUT, retryable).
func (e *Engine) TopicList(ctx context.Context) ([]*storage.Topic, error) {
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	return withTxTimeout(e, ctx, "topic list", e.topicList)
}

// topicList runs TopicList with ctx bounded by Config.TxTimeout.
func (e *Engine) topicList(ctx context.Context) ([]*storage.Topic, error) {
	rows, err := e.pool.Query(ctx, e.sql("SELECT name, config, created_at FROM spool.topics ORDER BY name"))
	if err != nil {
		return nil, e.mapErr(fmt.Errorf("pgstore: list topics: %w", err))
	}
	defer rows.Close()
	out := []*storage.Topic{}
	for rows.Next() {
		var t topicRow
		var cfg []byte
		if err := rows.Scan(&t.name, &cfg, &t.createdAt); err != nil {
			return nil, e.mapErr(fmt.Errorf("pgstore: list topics: %w", err))
		}
		if err := json.Unmarshal(cfg, &t.cfg); err != nil {
			return nil, fmt.Errorf("%w: topic %q: config: %v", storage.ErrCorrupt, t.name, err)
		}
		t.cfg = t.cfg.WithDefaults() // settings added after the topic was stored (dedup_window)
		out = append(out, t.topic())
	}
	if err := rows.Err(); err != nil {
		return nil, e.mapErr(fmt.Errorf("pgstore: list topics: %w", err))
	}
	return out, nil
}

// TopicUpdate replaces a topic's configuration (completed with defaults and validated).
// Partitions only grow: new partitions start empty and every subscription that has delivery state
// reads them from offset 0. QUEUE to PUB_SUB renames the queue subscription to the group
// QueueToGroup (same ID, leases and acks kept). PUB_SUB to QUEUE is refused with
// storage.ErrTopicHasSubscriptions while more than one subscription is ACTIVE or PAUSED (or the
// one that is is ephemeral), renames the one live durable subscription to the queue group, or
// creates the queue subscription (from the first retained message) when none is live. The topic
// row is locked (FOR UPDATE) for the whole change; params.Expect is compared with the
// configuration read under that lock (storage.ErrTopicChanged). Bounded by Config.TxTimeout
// (past it: TIMEOUT, retryable).
func (e *Engine) TopicUpdate(ctx context.Context, params *storage.TopicUpdateParams) (*storage.Topic, error) {
	cfg, cfgJSON, err := checkTopic(params.Check())
	if err != nil {
		return nil, err
	}
	return withTxTimeout(e, ctx, "topic update", func(ctx context.Context) (*storage.Topic, error) {
		return e.topicUpdate(ctx, params, cfg, cfgJSON)
	})
}

// topicUpdate runs TopicUpdate with ctx bounded by Config.TxTimeout.
func (e *Engine) topicUpdate(ctx context.Context, params *storage.TopicUpdateParams, cfg storage.TopicConfig, cfgJSON []byte) (*storage.Topic, error) {
	var out *storage.Topic
	var renamed []int64
	err := e.tx(ctx, func(tx pgx.Tx) error {
		renamed = nil
		t, err := e.loadTopic(ctx, tx, params.Name, forUpdate)
		if err != nil {
			return err
		}
		old := t.cfg
		// Under the row lock: no other update of the topic commits before this transaction ends.
		if err := params.CheckExpect(old); err != nil {
			return err
		}
		if cfg.Partitions < old.Partitions {
			return invalid("partitions may only grow: topic %q has %d, got %d", params.Name, old.Partitions, cfg.Partitions)
		}
		if cfg.CompletionTracking != old.CompletionTracking {
			var n int64
			if err := tx.QueryRow(ctx, e.sql(`SELECT coalesce((SELECT sum(next_offset - low_offset) FROM spool.partitions WHERE topic_id = $1), 0)
				+ (SELECT count(*) FROM spool.staged WHERE topic_id = $1)`), t.id).Scan(&n); err != nil {
				return fmt.Errorf("pgstore: topic update %q: count messages: %w", params.Name, err)
			}
			if n > 0 {
				return fmt.Errorf("%w: topic %q holds %d messages (from %s to %s: wait until retention removed them, or use a new topic)",
					storage.ErrCompletionTrackingChange, params.Name, n, old.CompletionTracking, cfg.CompletionTracking)
			}
		}
		toPubSub := old.Semantics == storage.Queue && cfg.Semantics == storage.PubSub
		toQueue := old.Semantics == storage.PubSub && cfg.Semantics == storage.Queue
		if toPubSub {
			if params.QueueToGroup == "" {
				return invalid("queue_to_group is required to change topic %q from QUEUE to PUB_SUB", params.Name)
			}
			if err := names.ValidateGroup(params.QueueToGroup); err != nil {
				return validName(err)
			}
		}
		if toQueue {
			// The queue subscription created below starts at the low offsets, which retention
			// must not move meanwhile (lock order: partitions before subscriptions).
			if _, err := tx.Exec(ctx, e.sql("SELECT 1 FROM spool.partitions WHERE topic_id = $1 ORDER BY partition FOR SHARE"), t.id); err != nil {
				return fmt.Errorf("pgstore: topic update %q: lock partitions: %w", params.Name, err)
			}
		}
		now := e.now()
		if cfg.Partitions > old.Partitions {
			if _, err := tx.Exec(ctx, e.sql("INSERT INTO spool.partitions (topic_id, partition) SELECT $1, g FROM generate_series($2::int, $3::int - 1) g"),
				t.id, old.Partitions, cfg.Partitions); err != nil {
				return fmt.Errorf("pgstore: topic update %q: partitions: %w", params.Name, err)
			}
		}
		// The topic's subscriptions (not DELETED), locked: their delivery state grows with the
		// partitions and a semantics change renames one of them.
		subs, err := e.topicSubs(ctx, tx, t.id, forNoKeyUpdate)
		if err != nil {
			return err
		}
		if cfg.Partitions > old.Partitions {
			var ids []int64
			for _, s := range subs {
				if s.State != storage.Cancelled {
					ids = append(ids, s.ID)
				}
			}
			if len(ids) > 0 {
				if _, err := tx.Exec(ctx, e.sql(`INSERT INTO spool.sub_partitions (sub_id, partition, ack_floor, cursor)
					SELECT s, g, 0, 0 FROM unnest($1::bigint[]) s, generate_series($2::int, $3::int - 1) g ORDER BY s, g`),
					ids, old.Partitions, cfg.Partitions); err != nil {
					return fmt.Errorf("pgstore: topic update %q: subscription partitions: %w", params.Name, err)
				}
			}
		}
		rename := func(id int64, group string) error {
			_, err := tx.Exec(ctx, e.sql("UPDATE spool.subscriptions SET group_name = $2, updated_at = $3 WHERE id = $1"), id, group, now)
			if isUniqueViolation(err) {
				return fmt.Errorf("%w: topic %q group %q", storage.ErrSubscriptionExists, params.Name, group)
			}
			if err != nil {
				return fmt.Errorf("pgstore: topic update %q: rename subscription %d: %w", params.Name, id, err)
			}
			renamed = append(renamed, id)
			return nil
		}
		switch {
		case toPubSub:
			var queue *subRow
			for _, s := range subs {
				if s.State == storage.Cancelled {
					continue
				}
				if s.Group == params.QueueToGroup {
					return fmt.Errorf("%w: topic %q already has group %q", storage.ErrSubscriptionExists, params.Name, params.QueueToGroup)
				}
				if s.Group == storage.QueueGroup && (queue == nil || s.ID > queue.ID) {
					queue = s
				}
			}
			if queue != nil {
				if err := rename(queue.ID, params.QueueToGroup); err != nil {
					return err
				}
			}
		case toQueue:
			var live []*subRow
			for _, s := range subs {
				if s.State.HoldsRetention() {
					live = append(live, s)
				}
			}
			switch {
			case len(live) > 1:
				return fmt.Errorf("%w: topic %q has %d live subscriptions; PUB_SUB to QUEUE needs at most one",
					storage.ErrTopicHasSubscriptions, params.Name, len(live))
			case len(live) == 1 && live[0].Ephemeral:
				return fmt.Errorf("%w: topic %q has a live ephemeral subscription; PUB_SUB to QUEUE needs a durable one or none",
					storage.ErrTopicHasSubscriptions, params.Name)
			case len(live) == 1 && live[0].Mode == storage.ModeOrdered:
				return fmt.Errorf("%w: topic %q: group %q is ordered; PUB_SUB to QUEUE needs a shared group (the queue's one subscription is shared) or none",
					storage.ErrTopicHasSubscriptions, params.Name, live[0].Group)
			case len(live) == 1:
				if err := rename(live[0].ID, storage.QueueGroup); err != nil {
					return err
				}
			default:
				t.cfg.Partitions = cfg.Partitions
				starts, err := e.resolveStart(ctx, tx, t, storage.StartPosition{Kind: storage.FromBeginning})
				if err != nil {
					return err
				}
				var skips [][][2]int64
				if cfg.CompletionTracking == storage.Refcount {
					// A join: added to the pending messages only.
					if starts, skips, err = e.refcountJoin(ctx, tx, t.id, 0, starts); err != nil {
						return err
					}
				}
				s, err := e.insertSub(ctx, tx, t, storage.QueueGroup, "", false, storage.StartPosition{Kind: storage.FromBeginning}, starts, now, 0, 0, nil)
				if err != nil {
					return err
				}
				if err := e.markSkipped(ctx, tx, s.ID, t.id, skips); err != nil {
					return err
				}
			}
		}
		if _, err := tx.Exec(ctx, e.sql("UPDATE spool.topics SET config = $2 WHERE id = $1"), t.id, cfgJSON); err != nil {
			return fmt.Errorf("pgstore: topic update %q: %w", params.Name, err)
		}
		t.cfg = cfg
		out = t.topic()
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, id := range renamed {
		e.subscriptionChanged(params.Name, id)
	}
	return out, nil
}

// TopicDelete deletes a topic's catalog rows: the topic, its partitions, its subscriptions and
// their delivery state (ON DELETE CASCADE; delivery rows by the trigger of migration 0021). Its
// messages stay in their buckets until retention drops them; topic ids are never reused, so a
// topic created again under the name starts empty.
// The bindings on the topic's plain name go with it (wildcard bindings stay).
// Without Force it fails with storage.ErrTopicHasSubscriptions while a durable subscription other
// than the queue subscription is ACTIVE or PAUSED, while the queue subscription (ACTIVE or
// PAUSED) has messages not done, or while spool.staged holds committed transactional publishes
// of the topic not sequenced yet; with Force those staged messages are deleted in the same
// transaction and counted as expired (storage.ExpiredTopicDeleted, reported by the next
// RetentionApply). The topic row lock waits for every staging transaction of the topic (they
// hold it FOR SHARE), so the check sees all of them. Locks, in the documented order: the topic, its partitions (which
// waits for publishers in flight), its subscriptions and their partitions, so the check sees
// every committed message and no claim or ack runs meanwhile. Taking those locks (and the check)
// is bounded by Config.TxTimeout (past it: TIMEOUT, retryable; nothing is deleted); the delete
// itself is not, since it removes the delivery state and DLQ entries of every subscription of the
// topic, which may legitimately take longer (txLocksBounded).
func (e *Engine) TopicDelete(ctx context.Context, params *storage.TopicDeleteParams) error {
	if err := params.Check(); err != nil {
		return err
	}
	var dropped int64
	err := e.txLocksBounded(ctx, "topic delete", func(ctx context.Context, tx pgx.Tx, locked func() error) error {
		dropped = 0
		t, err := e.loadTopic(ctx, tx, params.Name, forUpdate)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, e.sql("SELECT 1 FROM spool.partitions WHERE topic_id = $1 ORDER BY partition FOR UPDATE"), t.id); err != nil {
			return fmt.Errorf("pgstore: topic delete %q: lock partitions: %w", params.Name, err)
		}
		subs, err := e.topicSubs(ctx, tx, t.id, forUpdate)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, e.sql(`SELECT 1 FROM spool.sub_partitions sp JOIN spool.subscriptions s ON s.id = sp.sub_id
			WHERE s.topic_id = $1 ORDER BY sp.sub_id, sp.partition FOR UPDATE OF sp`), t.id); err != nil {
			return fmt.Errorf("pgstore: topic delete %q: lock subscription partitions: %w", params.Name, err)
		}
		if !params.Force {
			for _, s := range subs {
				if s.Ephemeral || !s.State.HoldsRetention() {
					continue
				}
				if s.Group != storage.QueueGroup {
					return fmt.Errorf("%w: topic %q (subscription %d of group %q is %s; use force to cancel it)",
						storage.ErrTopicHasSubscriptions, params.Name, s.ID, s.Group, s.State)
				}
				st, err := e.subStats(ctx, tx, s)
				if err != nil {
					return fmt.Errorf("pgstore: topic delete %q: pending messages: %w", params.Name, err)
				}
				if st.Pending > 0 {
					return fmt.Errorf("%w: topic %q: the queue has %d messages not done (use force to delete them)",
						storage.ErrTopicHasSubscriptions, params.Name, st.Pending)
				}
			}
			// Committed transactional publishes not sequenced yet (the topic row lock waited for
			// every staging transaction of the topic, so all of them are visible).
			var staged bool
			if err := tx.QueryRow(ctx, e.sql("SELECT EXISTS (SELECT 1 FROM spool.staged WHERE topic_id = $1)"), t.id).Scan(&staged); err != nil {
				return fmt.Errorf("pgstore: topic delete %q: staged messages: %w", params.Name, err)
			}
			if staged {
				return fmt.Errorf("%w: topic %q has committed transactional messages not yet in the log (retry, or use force to delete them)",
					storage.ErrTopicHasSubscriptions, params.Name)
			}
		}
		// The bindings on the topic's plain name (a durable group's Subscribe of a topic that did
		// not exist yet) were for this topic only: left alone they would subscribe their groups,
		// without members, to a topic created later under the name. Wildcard bindings stay (the
		// name has no wildcard, so no wildcard pattern equals it). The delete's ROW EXCLUSIVE lock
		// waits for the PUB_SUB topic creations holding SHARE on spool.bindings, which never wait
		// for this transaction's rows: one of this name fails on the topic row (still there,
		// locked, not yet deleted) with ErrTopicExists. So the wait is bounded by their
		// transactions, and by TxTimeout as it comes before locked.
		if _, err := tx.Exec(ctx, e.sql("DELETE FROM spool.bindings WHERE pattern = $1"), params.Name); err != nil {
			return fmt.Errorf("pgstore: topic delete %q: bindings: %w", params.Name, err)
		}
		if err := locked(); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, e.sql("DELETE FROM spool.staged WHERE topic_id = $1"), t.id)
		if err != nil {
			return fmt.Errorf("pgstore: topic delete %q: staged messages: %w", params.Name, err)
		}
		dropped = tag.RowsAffected()
		if _, err := tx.Exec(ctx, e.sql("DELETE FROM spool.topics WHERE id = $1"), t.id); err != nil {
			return fmt.Errorf("pgstore: topic delete %q: %w", params.Name, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if dropped > 0 {
		e.dropped.add(params.Name, dropped)
		e.log.Warn("pgstore: topic delete removed committed transactional messages not yet in the log",
			"topic", params.Name, "messages", dropped)
	}
	e.announce(storage.Notification{Kind: storage.NotifyTopicDeleted, Topic: params.Name})
	return nil
}

// topicSubs returns the subscriptions of a topic that are not DELETED, in ID order, locked as
// asked.
func (e *Engine) topicSubs(ctx context.Context, q querier, topicID int64, lock lockMode) ([]*subRow, error) {
	rows, err := q.Query(ctx, e.sql("SELECT "+subColumns+" FROM spool.subscriptions WHERE topic_id = $1 AND state <> 'DELETED' ORDER BY id"+lock.clause()), topicID)
	if err != nil {
		return nil, fmt.Errorf("pgstore: subscriptions of topic %d: %w", topicID, err)
	}
	defer rows.Close()
	var out []*subRow
	for rows.Next() {
		s, err := scanSub(rows)
		if err != nil {
			if errors.Is(err, storage.ErrCorrupt) {
				return nil, err
			}
			return nil, fmt.Errorf("pgstore: subscriptions of topic %d: %w", topicID, err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: subscriptions of topic %d: %w", topicID, err)
	}
	return out, nil
}
