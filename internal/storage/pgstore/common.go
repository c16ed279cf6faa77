package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spoolmq/spool/internal/storage"
)

// querier is what pgx.Tx, *pgx.Conn and *pgxpool.Pool have in common.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// topicRow is a row of spool.topics.
type topicRow struct {
	id        int64
	name      string
	cfg       storage.TopicConfig
	createdAt time.Time
	gen       int64 // bumped by every change of config (migration 0018), see takeOffsetsSQL
}

func (t *topicRow) topic() *storage.Topic {
	return &storage.Topic{Name: t.name, Config: t.cfg, CreatedAt: t.createdAt.UTC()}
}

// lockMode says whether a lookup takes a row lock.
type lockMode int

const (
	noLock    lockMode = iota
	forShare           // FOR SHARE: the row cannot change or go away until the transaction ends
	forUpdate          // FOR UPDATE
	// FOR NO KEY UPDATE: like FOR UPDATE for a change of non-key columns, but does not block
	// foreign-key checks (FOR KEY SHARE) of rows inserted elsewhere that reference this one.
	forNoKeyUpdate
)

func (m lockMode) clause() string {
	switch m {
	case forShare:
		return " FOR SHARE"
	case forUpdate:
		return " FOR UPDATE"
	case forNoKeyUpdate:
		return " FOR NO KEY UPDATE"
	}
	return ""
}

// loadTopic reads a topic by name; storage.ErrTopicNotFound if there is none.
func (e *Engine) loadTopic(ctx context.Context, q querier, name string, lock lockMode) (*topicRow, error) {
	var t topicRow
	var cfg []byte
	err := q.QueryRow(ctx, e.sql("SELECT id, name, config, created_at, gen FROM spool.topics WHERE name = $1"+lock.clause()), name).
		Scan(&t.id, &t.name, &cfg, &t.createdAt, &t.gen)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %q", storage.ErrTopicNotFound, name)
	}
	if err != nil {
		return nil, fmt.Errorf("pgstore: load topic %q: %w", name, err)
	}
	if err := json.Unmarshal(cfg, &t.cfg); err != nil {
		return nil, fmt.Errorf("%w: topic %q: config: %v", storage.ErrCorrupt, name, err)
	}
	t.cfg = t.cfg.WithDefaults() // settings added after the topic was stored (dedup_window)
	return &t, nil
}

// subRow is a row of spool.subscriptions.
type subRow struct {
	storage.Subscription
	topicID int64
}

// subColumns are the columns scanSub reads, in order.
const subColumns = "id, topic_id, topic, group_name, pattern, ephemeral, state, start, created_at, updated_at, ordering, heartbeat_timeout_ms, last_heartbeat_at, max_backfill, backfill"

// scanSub scans the subColumns of one row.
func scanSub(row pgx.Row) (*subRow, error) {
	var s subRow
	var state string
	var start, ordering, backfill []byte
	var timeoutMS int64
	if err := row.Scan(&s.ID, &s.topicID, &s.Topic, &s.Group, &s.Pattern, &s.Ephemeral, &state, &start, &s.CreatedAt, &s.UpdatedAt, &ordering,
		&timeoutMS, &s.LastHeartbeatAt, &s.MaxBackfillMessages, &backfill); err != nil {
		return nil, err
	}
	if backfill != nil {
		s.Backfill = &storage.Backfill{}
		if err := json.Unmarshal(backfill, s.Backfill); err != nil {
			return nil, fmt.Errorf("%w: subscription %d: backfill: %v", storage.ErrCorrupt, s.ID, err)
		}
		s.Backfill.StartedAt, s.Backfill.UpdatedAt = s.Backfill.StartedAt.UTC(), s.Backfill.UpdatedAt.UTC()
	}
	if err := scanOrdering(&s.Subscription, ordering); err != nil {
		return nil, err
	}
	s.HeartbeatTimeout = time.Duration(timeoutMS) * time.Millisecond
	s.LastHeartbeatAt = s.LastHeartbeatAt.UTC()
	s.State = storage.SubscriptionState(state)
	if err := json.Unmarshal(start, &s.Start); err != nil {
		return nil, fmt.Errorf("%w: subscription %d: start: %v", storage.ErrCorrupt, s.ID, err)
	}
	s.Start.Time = s.Start.Time.UTC()
	s.CreatedAt = s.CreatedAt.UTC()
	s.UpdatedAt = s.UpdatedAt.UTC()
	return &s, nil
}

// loadSub reads a subscription by id; storage.ErrSubscriptionNotFound if there is none or it is
// DELETED.
func (e *Engine) loadSub(ctx context.Context, q querier, id int64, lock lockMode) (*subRow, error) {
	s, err := scanSub(q.QueryRow(ctx, e.sql("SELECT "+subColumns+" FROM spool.subscriptions WHERE id = $1"+lock.clause()), id))
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && s.State == storage.Deleted) {
		return nil, fmt.Errorf("%w: id %d", storage.ErrSubscriptionNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("pgstore: load subscription %d: %w", id, err)
	}
	return s, nil
}
