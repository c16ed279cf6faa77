package wal

import (
	"errors"
	"fmt"
	"log/slog"
	"syscall"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

// Damaged partitions. A partition whose log is damaged (storage.ErrCorrupt: at Open, or met by a
// later read) is unavailable: every operation that needs its log returns unavailable's error,
// claims skip it, stats and the spool_partition_damaged metric show it. The other partitions and
// topics work normally. The operator repairs it with `spool data truncate` (broker stopped).

// damaged returns the cause of the partition's damage, nil when it is healthy.
func (p *partition) damaged() error {
	if d := p.damage.Load(); d != nil {
		return *d
	}
	return nil
}

// markDamaged records that the partition's log is damaged (cause wraps storage.ErrCorrupt with
// the file and offset) and logs it at ERROR the first time.
func (e *Engine) markDamaged(topic string, p *partition, cause error) {
	if p.damage.CompareAndSwap(nil, &cause) {
		attrs := []any{slog.String("topic", topic), slog.Int("partition", int(p.index))}
		if ce := (*wlog.CorruptError)(nil); errors.As(cause, &ce) {
			attrs = append(attrs, slog.String("file", ce.Path), slog.Int64("offset", ce.Offset))
		}
		e.logger.Error("wal: partition damaged, unavailable until repaired (spool data verify, spool data truncate)",
			append(attrs, slog.Any("error", cause))...)
	}
}

// unavailable is the error of an operation that needs the log of damaged partition p: no path in
// what clients see (IOError.Public), the cause for the logs.
func unavailable(topic string, p *partition) error {
	return &storage.IOError{Kind: storage.ErrUnavailable,
		Reason: fmt.Sprintf("partition %d of topic %q is damaged and unavailable until repaired", p.index, topic),
		Err:    fmt.Errorf("%w: %w", storage.ErrPartitionDamaged, p.damaged())}
}

// readFailure turns err, a failed read of partition p's log, into unavailable's error when it
// is damage (marking the partition), and into a storage.IOError (STORAGE_UNAVAILABLE, "too many
// open files") when the segment's file, closed while idle (Config.MaxOpenFiles), could not be
// opened again; other errors are returned as they are.
func (e *Engine) readFailure(topic string, p *partition, err error) error {
	switch {
	case errors.Is(err, storage.ErrCorrupt):
		e.markDamaged(topic, p, err)
		return unavailable(topic, p)
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return ioFailure(err, false)
	}
	return err
}

// healthyParts returns the partitions of t a claim may read: Params.Partitions (all when nil)
// without the damaged ones; nil (no filter) when none is damaged.
func healthyParts(t *topic, want []int32) []int32 {
	any := false
	for _, p := range t.parts {
		if p.damaged() != nil {
			any = true
			break
		}
	}
	if !any {
		return nil
	}
	out := []int32{}
	if want == nil {
		for _, p := range t.parts {
			if p.damaged() == nil {
				out = append(out, p.index)
			}
		}
		return out
	}
	for _, q := range want {
		if q < 0 || int(q) >= len(t.parts) || t.parts[q].damaged() == nil { // the policy refuses out of range
			out = append(out, q)
		}
	}
	return out
}
