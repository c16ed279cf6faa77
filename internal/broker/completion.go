package broker

import (
	"context"
	"fmt"

	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
)

// MessageCompletion returns the completion record of a retained message of a refcount topic:
// which groups it waits or waited for, each with its state and time (storage.CompletionAuditor).
// A watermark topic is refused with INVALID_ARGUMENT, a message no longer retained with
// OFFSET_OUT_OF_RANGE.
func (b *Broker) MessageCompletion(ctx context.Context, topic string, partition int32, offset int64) (*storage.MessageCompletion, error) {
	if err := b.checkRunning(); err != nil {
		return nil, err
	}
	if err := names.ValidateTopic(topic); err != nil {
		return nil, invalidName(err)
	}
	a, ok := b.engine.(storage.CompletionAuditor)
	if !ok {
		return nil, invalid("the storage engine keeps no completion records")
	}
	mc, err := a.MessageCompletion(ctx, &storage.MessageCompletionParams{Topic: topic, Partition: partition, Offset: offset})
	if err != nil {
		return nil, fmt.Errorf("broker: completion of %s %d:%d: %w", topic, partition, offset, err)
	}
	return mc, nil
}
