package pgstore

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/storage"
)

// BindingCreate registers a durable group on a topic pattern: TopicCreate of a matching PUB_SUB
// topic subscribes the group from the topic's beginning, atomically with the creation (see
// TopicCreate for how the two serialize across instances). Existing topics are not subscribed.
// Bounded by Config.TxTimeout (past it: TIMEOUT, retryable).
func (e *Engine) BindingCreate(ctx context.Context, params *storage.BindingCreateParams) (*storage.Binding, error) {
	start, err := params.Check()
	if err != nil {
		return nil, err
	}
	startJSON, err := json.Marshal(start)
	if err != nil {
		return nil, fmt.Errorf("pgstore: encode start position: %w", err)
	}
	return withTxTimeout(e, ctx, "binding create", func(ctx context.Context) (*storage.Binding, error) {
		return e.bindingCreate(ctx, params, start, startJSON)
	})
}

// bindingCreate runs BindingCreate with ctx bounded by Config.TxTimeout.
func (e *Engine) bindingCreate(ctx context.Context, params *storage.BindingCreateParams, start storage.StartPosition, startJSON []byte) (*storage.Binding, error) {
	var out *storage.Binding
	err := e.tx(ctx, func(tx pgx.Tx) error {
		if params.MaxBindings > 0 {
			// Every pattern member's Subscribe creates its binding, which mostly exists: answered
			// before the lock and the count.
			var exists bool
			if err := tx.QueryRow(ctx, e.sql("SELECT EXISTS (SELECT 1 FROM spool.bindings WHERE group_name = $1 AND pattern = $2)"),
				params.Group, params.Pattern).Scan(&exists); err != nil {
				return fmt.Errorf("pgstore: create binding %q %q: %w", params.Group, params.Pattern, err)
			}
			if exists {
				return fmt.Errorf("%w: group %q pattern %q", storage.ErrBindingExists, params.Group, params.Pattern)
			}
			if err := e.checkCount(ctx, tx, "binding-create", "SELECT count(*) FROM spool.bindings", params.MaxBindings,
				"bindings, the most this broker keeps (broker.max_bindings); delete bindings or raise it"); err != nil {
				return err
			}
		}
		b := &storage.Binding{Group: params.Group, Pattern: params.Pattern, Start: start, CreatedAt: e.now()}
		_, err := tx.Exec(ctx, e.sql("INSERT INTO spool.bindings (group_name, pattern, start, created_at) VALUES ($1, $2, $3, $4)"),
			b.Group, b.Pattern, startJSON, b.CreatedAt)
		if isUniqueViolation(err) {
			return fmt.Errorf("%w: group %q pattern %q", storage.ErrBindingExists, params.Group, params.Pattern)
		}
		if err != nil {
			return fmt.Errorf("pgstore: create binding %q %q: %w", params.Group, params.Pattern, err)
		}
		out = b
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// BindingDelete removes a binding; the subscriptions it created stay. Bounded by Config.TxTimeout
// (past it: TIMEOUT, retryable).
func (e *Engine) BindingDelete(ctx context.Context, params *storage.BindingDeleteParams) error {
	if err := params.Check(); err != nil {
		return err
	}
	_, err := withTxTimeout(e, ctx, "binding delete", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, e.bindingDelete(ctx, params)
	})
	return err
}

// bindingDelete runs BindingDelete with ctx bounded by Config.TxTimeout.
func (e *Engine) bindingDelete(ctx context.Context, params *storage.BindingDeleteParams) error {
	return e.tx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, e.sql("DELETE FROM spool.bindings WHERE group_name = $1 AND pattern = $2"), params.Group, params.Pattern)
		if err != nil {
			return fmt.Errorf("pgstore: delete binding %q %q: %w", params.Group, params.Pattern, err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("%w: group %q pattern %q", storage.ErrBindingNotFound, params.Group, params.Pattern)
		}
		return nil
	})
}

// BindingList lists all bindings ordered by group, then pattern (byte-wise). Bounded by
// Config.TxTimeout (past it: TIMEOUT, retryable).
func (e *Engine) BindingList(ctx context.Context) ([]*storage.Binding, error) {
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	return withTxTimeout(e, ctx, "binding list", e.bindingList)
}

// bindingList runs BindingList with ctx bounded by Config.TxTimeout.
func (e *Engine) bindingList(ctx context.Context) ([]*storage.Binding, error) {
	rows, err := e.pool.Query(ctx, e.sql("SELECT group_name, pattern, start, created_at FROM spool.bindings ORDER BY group_name, pattern"))
	if err != nil {
		return nil, e.mapErr(fmt.Errorf("pgstore: list bindings: %w", err))
	}
	defer rows.Close()
	out := []*storage.Binding{}
	for rows.Next() {
		var b storage.Binding
		var start []byte
		if err := rows.Scan(&b.Group, &b.Pattern, &start, &b.CreatedAt); err != nil {
			return nil, e.mapErr(fmt.Errorf("pgstore: list bindings: %w", err))
		}
		if err := json.Unmarshal(start, &b.Start); err != nil {
			return nil, fmt.Errorf("%w: binding %q %q: start: %v", storage.ErrCorrupt, b.Group, b.Pattern, err)
		}
		b.Start.Time = b.Start.Time.UTC()
		b.CreatedAt = b.CreatedAt.UTC()
		out = append(out, &b)
	}
	if err := rows.Err(); err != nil {
		return nil, e.mapErr(fmt.Errorf("pgstore: list bindings: %w", err))
	}
	return out, nil
}
