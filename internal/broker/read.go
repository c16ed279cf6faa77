package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
)

// Bounds of ReadMessages.
const (
	// DefaultReadLimit is the page size of a read that does not give one.
	DefaultReadLimit = 100
	// MaxReadLimit bounds one read.
	MaxReadLimit = 1000
)

// ReadParams select the messages ReadMessages returns.
type ReadParams struct {
	Topic     string
	Partition int32
	// Offset is the first offset to read (below the first retained one: from there). Ignored
	// when Time is set.
	Offset int64
	// Time, when not zero, starts at the first message of the partition published at or after
	// it (broker clock).
	Time time.Time
	// Limit is the most messages to return, 1 to MaxReadLimit; 0 means DefaultReadLimit.
	Limit int
}

// ReadMessages returns retained messages of one partition, in offset order, without consuming
// them: no subscription, lease, cursor or ack floor changes (an operator browsing a topic, as
// `nats stream view` or RabbitMQ's "get messages" allow). A start past the partition's end
// returns nothing.
func (b *Broker) ReadMessages(ctx context.Context, p ReadParams) ([]*storage.Message, error) {
	if err := b.checkRunning(); err != nil {
		return nil, err
	}
	start := b.trace.now()
	if err := names.ValidateTopic(p.Topic); err != nil {
		return nil, invalidName(err)
	}
	switch {
	case p.Limit < 0 || p.Limit > MaxReadLimit:
		return nil, invalid("read limit must be between 1 and %d, got %d", MaxReadLimit, p.Limit)
	case p.Offset < 0:
		return nil, invalid("read offset must not be negative, got %d", p.Offset)
	case p.Partition < 0:
		return nil, invalid("partition must not be negative, got %d", p.Partition)
	}
	limit := p.Limit
	if limit == 0 {
		limit = DefaultReadLimit
	}
	offset := p.Offset
	if !p.Time.IsZero() {
		var err error
		if offset, err = b.offsetAt(ctx, p.Topic, p.Partition, p.Time); err != nil {
			return nil, err
		}
	}
	msgs, err := b.engine.MessagesRead(ctx, &storage.MessagesReadParams{Topic: p.Topic, Partition: p.Partition, Offset: offset, Limit: limit})
	if took, slow := b.trace.isSlow(start); slow {
		b.trace.logSlow(ctx, "read", took, slog.String("topic", p.Topic), slog.Int("partition", int(p.Partition)))
	}
	if errors.Is(err, storage.ErrOffsetOutOfRange) {
		return nil, nil // past the end: nothing yet
	}
	if err != nil {
		return nil, fmt.Errorf("broker: read %s partition %d: %w", p.Topic, p.Partition, err)
	}
	return msgs, nil
}

// offsetAt returns the offset of the first message of a partition published at or after t, or
// the partition's end. Publish times are non-decreasing inside a partition, so a binary search
// over offsets finds it with about log2(messages) one-message reads.
func (b *Broker) offsetAt(ctx context.Context, topic string, part int32, t time.Time) (int64, error) {
	read := func(off int64) (*storage.Message, error) {
		ms, err := b.engine.MessagesRead(ctx, &storage.MessagesReadParams{Topic: topic, Partition: part, Offset: off, Limit: 1})
		if errors.Is(err, storage.ErrOffsetOutOfRange) || err == nil && len(ms) == 0 {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("broker: read %s partition %d: %w", topic, part, err)
		}
		return ms[0], nil
	}
	first, err := read(0)
	if err != nil || first == nil {
		return 0, err // an empty partition: reading from 0 returns nothing
	}
	if !first.PublishedAt.Before(t) {
		return first.Offset, nil
	}
	stats, err := b.engine.TopicStats(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("broker: read %s: %w", topic, err)
	}
	if int(part) >= len(stats.Partitions) {
		return 0, invalid("partition %d out of range, topic %q has %d", part, topic, len(stats.Partitions))
	}
	// msg(lo) was published before t; hi is the end or a message published at or after t.
	lo, hi := first.Offset, max(stats.Partitions[part].HighWater, first.Offset+1)
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		m, err := read(mid)
		switch {
		case err != nil:
			return 0, err
		case m == nil || !m.PublishedAt.Before(t):
			hi = mid
		default:
			lo = min(m.Offset, hi-1) // past mid only if retention removed mid meanwhile
		}
	}
	return hi, nil
}
