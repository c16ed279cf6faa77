package pgstore

// Stubs owned by the log helper (append, read, transactional publish, buckets, retention,
// topic stats, notifications). Replace each with the real implementation in its own file.

import (
	"context"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// bucketState tracks the buckets (partitions of spool.messages) known to exist.
type bucketState struct {
	width time.Duration
}

// notifyState is the LISTEN/NOTIFY and poll machinery.
type notifyState struct{}

func (e *Engine) startNotify(ctx context.Context) error { return nil }

func (e *Engine) MessagesAppend(ctx context.Context, p *storage.MessagesAppendParams) (*storage.MessagesAppendResult, error) {
	return nil, errTODO
}
func (e *Engine) MessagesRead(ctx context.Context, p *storage.MessagesReadParams) ([]*storage.Message, error) {
	return nil, errTODO
}
func (e *Engine) NotifyRegister(fn func(storage.Notification)) func() { return func() {} }
func (e *Engine) RetentionApply(ctx context.Context) (*storage.RetentionResult, error) {
	return nil, errTODO
}
func (e *Engine) TopicStats(ctx context.Context, name string) (*storage.TopicStats, error) {
	return nil, errTODO
}

// announce tells NotifyRegister callbacks of this instance (at once) and other instances (through
// NOTIFY, coalesced) about n. Call it after the transaction that made n true committed.
func (e *Engine) announce(n storage.Notification) {}
