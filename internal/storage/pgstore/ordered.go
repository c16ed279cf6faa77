package pgstore

import (
	"context"
	"fmt"

	"github.com/spoolmq/spool/internal/storage"
)

// Ordered groups (storage.ModeOrdered) are not built on PostgreSQL yet: an ordered subscription
// is refused with storage.ErrNotImplemented, so no subscription here has an assignment.

// orderedNotBuilt refuses an ordered subscription.
func orderedNotBuilt(params *storage.SubscriptionCreateParams) error {
	if params.Mode == storage.ModeOrdered {
		return fmt.Errorf("%w: ordered subscriptions on PostgreSQL", storage.ErrNotImplemented)
	}
	return nil
}

// SubscriptionAssign is refused: no subscription is ordered on this engine yet.
func (e *Engine) SubscriptionAssign(ctx context.Context, params *storage.SubscriptionAssignParams) (*storage.Assignment, error) {
	if err := params.Check(); err != nil {
		return nil, err
	}
	if _, err := e.SubscriptionGet(ctx, params.SubscriptionID); err != nil {
		return nil, err
	}
	return nil, storage.Invalid("subscription %d is not ordered", params.SubscriptionID)
}

// SubscriptionAssignment is refused: no subscription is ordered on this engine yet.
func (e *Engine) SubscriptionAssignment(ctx context.Context, id int64) (*storage.Assignment, error) {
	if _, err := e.SubscriptionGet(ctx, id); err != nil {
		return nil, err
	}
	return nil, storage.Invalid("subscription %d is not ordered", id)
}
