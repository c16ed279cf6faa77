package pgstore

// Stubs owned by the deliveries helper (claim, ack, nack, extend, release, DLQ, subscription
// stats). Replace each with the real implementation in its own file.

import (
	"context"

	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/storage"
)

// trimDeliveryState removes the delivery state of subscription partitions of (topicID,
// partition) below newLow and raises their ack floors and cursors to newLow (retention removed
// the messages below it). Called by RetentionApply inside its transaction, with the partition
// row locked.
func (e *Engine) trimDeliveryState(ctx context.Context, tx pgx.Tx, topicID int64, partition int32, newLow int64) error {
	return errTODO
}

// pendingCount returns how many messages of a subscription are not done (SubscriptionStats'
// Pending), inside tx. TopicDelete uses it for the queue subscription of a QUEUE topic.
func (e *Engine) pendingCount(ctx context.Context, tx pgx.Tx, subID int64) (int64, error) {
	return 0, errTODO
}

func (e *Engine) DeliveriesAck(ctx context.Context, p *storage.DeliveriesAckParams) (*storage.DeliveriesAckResult, error) {
	return nil, errTODO
}
func (e *Engine) DeliveriesClaim(ctx context.Context, p *storage.DeliveriesClaimParams) (*storage.DeliveriesClaimResult, error) {
	return nil, errTODO
}
func (e *Engine) DeliveriesExtend(ctx context.Context, p *storage.DeliveriesExtendParams) (*storage.DeliveriesExtendResult, error) {
	return nil, errTODO
}
func (e *Engine) DeliveriesNack(ctx context.Context, p *storage.DeliveriesNackParams) (*storage.DeliveriesNackResult, error) {
	return nil, errTODO
}
func (e *Engine) DeliveriesRelease(ctx context.Context, p *storage.DeliveriesReleaseParams) (*storage.DeliveriesReleaseResult, error) {
	return nil, errTODO
}
func (e *Engine) DLQList(ctx context.Context, p *storage.DLQListParams) ([]*storage.DLQEntry, error) {
	return nil, errTODO
}
func (e *Engine) DLQPurge(ctx context.Context, p *storage.DLQPurgeParams) (int, error) {
	return 0, errTODO
}
func (e *Engine) DLQReplay(ctx context.Context, p *storage.DLQReplayParams) (int, error) {
	return 0, errTODO
}
func (e *Engine) SubscriptionStats(ctx context.Context, id int64) (*storage.SubscriptionStats, error) {
	return nil, errTODO
}

// expireDLQ removes the DLQ entries of the topic's subscriptions that are dead since before
// cutoff (max_retention) and returns how many. Called by RetentionApply inside its transaction.
func (e *Engine) expireDLQ(ctx context.Context, tx pgx.Tx, topicID int64, cutoff time.Time) (int64, error) {
	return 0, errTODO
}
