package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/storage"
)

// txNotifyInstance is the instance id in the payload of notifications sent inside a caller's
// transaction (PublishTx, spool.publish): nobody's, so every instance wakes, this one included
// (its listener receives the notification once the caller commits).
const txNotifyInstance = "0"

// PublishTx appends a batch of messages inside the caller's transaction tx (which must be a
// transaction on the same database and schema as the engine): the messages exist if and only if
// the caller commits. Validation, partitioning and PublishedAt are those of MessagesAppend
// (errors wrap the same storage sentinels). The returned positions are final once the caller
// commits; if it rolls back, nothing was published and no offset was consumed.
//
// The offsets are taken with the same row lock of spool.partitions as MessagesAppend, held until
// the caller's transaction ends: publishers to the same partitions (any instance, any caller)
// wait until then, which keeps offsets gapless in visibility order. Publish late in long
// transactions. The topic row is locked FOR SHARE until then too.
//
// The bucket for the publish time is ensured before, on another connection of the engine's pool,
// outside tx. The append runs inside a savepoint, so that a missing bucket (dropped by retention,
// or a partition whose time is ahead of this clock) is created and the append retried without
// aborting tx; any other error rolls the savepoint back too, leaving tx usable. Other broker
// instances (and this one) are woken by a pg_notify inside tx, which PostgreSQL delivers at commit
// and coalesces per topic and transaction. Safe for concurrent use on different transactions; tx
// itself must not be used concurrently, as with any pgx.Tx.
func (e *Engine) PublishTx(ctx context.Context, tx pgx.Tx, p *storage.MessagesAppendParams) (*storage.MessagesAppendResult, error) {
	if tx == nil {
		return nil, invalid("nil transaction")
	}
	now, err := e.prepareAppend(ctx, p)
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		var plan *appendPlan
		var res *storage.MessagesAppendResult
		err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			var err error
			plan, err = e.planAppend(ctx, sp, p, now, nil)
			if err != nil {
				return err
			}
			res, err = e.appendInTx(ctx, sp, plan, len(p.Messages), now,
				formatPayload(txNotifyInstance, storage.Notification{Kind: storage.NotifyMessages, Topic: p.Topic}))
			return err
		})
		if err != nil && attempt == 0 && isNoPartition(err) {
			if err := e.recreateBuckets(ctx, now, plan); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, wrapAppendErr(p.Topic, e.mapErr(err))
		}
		return res, nil
	}
}
