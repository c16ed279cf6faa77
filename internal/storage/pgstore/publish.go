package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/storage"
)

// PublishTx publishes a batch of messages inside the caller's transaction tx (which must be a
// transaction on the same database and schema as the engine): the messages exist if and only if
// the caller commits. Validation, partitioning and de-duplication are those of MessagesAppend
// (errors wrap the same storage sentinels).
//
// The messages are staged (spool.staged, see sequencer.go), not appended: they take no offset and
// no lock that another publisher waits for, so a caller that publishes and then works for a while
// holds up nobody. Once the caller commits, a broker instance's sequencer appends them to the log,
// gapless, in staging order among committed rows (a transaction that commits before another one
// publishes gets the lower offset), and consumers are woken. The returned positions carry the partitions
// and offset -1 (the offset is assigned by the sequencer); a duplicate of a stored message carries
// its position (offset -1 while that one is still staged). If the caller rolls back, nothing was
// published. The topic row is locked FOR SHARE until the caller's transaction ends (the topic
// cannot change or go away meanwhile), and a producer id's row until then too (a concurrent
// publish of the same id waits).
//
// It runs inside a savepoint: an error rolls the savepoint back and leaves tx usable. Safe for
// concurrent use on different transactions; tx itself must not be used concurrently, as with any
// pgx.Tx.
func (e *Engine) PublishTx(ctx context.Context, tx pgx.Tx, p *storage.MessagesAppendParams) (*storage.MessagesAppendResult, error) {
	if tx == nil {
		return nil, invalid("nil transaction")
	}
	if err := validateAppend(p); err != nil {
		return nil, err
	}
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	now := e.clockNow()
	var res *storage.MessagesAppendResult
	err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
		plan, err := e.planAppend(ctx, sp, p, now, nil, nil)
		if err != nil {
			return err
		}
		res, err = e.stageInTx(ctx, sp, plan, len(p.Messages))
		return err
	})
	if err != nil {
		return nil, wrapAppendErr(p.Topic, e.mapErr(err))
	}
	return res, nil
}
