package wal

import (
	"context"

	"github.com/spoolmq/spool/internal/storage"
)

// DLQList lists a subscription's dead-lettered messages in ID order, after AfterID, at most Limit
// (default 100) and readBatchBytes of messages (at least one), read from its DLQ log. A CANCELLED subscription has none.
func (e *Engine) DLQList(ctx context.Context, params *storage.DLQListParams) ([]*storage.DLQEntry, error) {
	if err := params.Check(); err != nil {
		return nil, err
	}
	limit := params.Limit
	if limit == 0 {
		limit = 100
	}
	// Every entry dead-lettered before the call is readable.
	if err := e.dlqDurable(ctx, params.SubscriptionID); err != nil {
		return nil, err
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return nil, storage.ErrClosed
	}
	s, err := e.subLocked(params.SubscriptionID)
	if err != nil {
		return nil, err
	}
	out := []*storage.DLQEntry{}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st == nil || s.dlq == nil {
		return out, nil
	}
	entries, err := s.dlq.read(s.meta.ID, s.st.DLQIDs(params.AfterID, limit), readBatchBytes)
	if err != nil {
		return nil, err
	}
	for _, d := range entries {
		if d != nil { // nil: dead-lettered after the call began, not durable yet
			out = append(out, d)
		}
	}
	return out, nil
}

// DLQPurge removes DLQ entries (all of them when IDs is empty) and returns how many. Durable when
// it returns.
func (e *Engine) DLQPurge(ctx context.Context, params *storage.DLQPurgeParams) (int, error) {
	if err := params.Check(); err != nil {
		return 0, err
	}
	return e.dlqMove(ctx, params.SubscriptionID, params.IDs, false)
}

// DLQRecovered returns, per subscription, the messages Open dead-lettered (leases lost in the
// restart on their max_deliveries-th delivery) and forgets them: later calls return none.
func (e *Engine) DLQRecovered(ctx context.Context) ([]storage.DeadLetterCount, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, storage.ErrClosed
	}
	out := e.openDead
	e.openDead = nil
	return out, nil
}

// DLQReplay moves DLQ entries (all of them when IDs is empty) back to their subscription only,
// due at once with a fresh attempt count, and returns how many. A replayed message is delivered
// from the entry's copy in the DLQ log, so it does not matter whether the partition log still
// holds it. Durable when it returns.
func (e *Engine) DLQReplay(ctx context.Context, params *storage.DLQReplayParams) (int, error) {
	if err := params.Check(); err != nil {
		return 0, err
	}
	return e.dlqMove(ctx, params.SubscriptionID, params.IDs, true)
}

// defaultDLQIDsPerRecord bounds the IDs of one DLQ replay, purge or retention record (10 bytes
// each at most), so that a record stays below maxRecordBytes however long the DLQ.
const defaultDLQIDsPerRecord = 1 << 20

func (e *Engine) dlqMove(ctx context.Context, id int64, ids []int64, replay bool) (int, error) {
	if replay {
		// A replay reads the entries: every entry dead-lettered before the call is readable.
		if err := e.dlqDurable(ctx, id); err != nil {
			return 0, err
		}
	}
	e.mu.RLock()
	if err := e.checkLocked(); err != nil {
		e.mu.RUnlock()
		return 0, err
	}
	s, err := e.subWithState(id)
	if err != nil {
		e.mu.RUnlock()
		return 0, err
	}
	s.mu.Lock()
	sel := s.st.DLQSelect(ids)
	var ch <-chan error
	if len(sel) > 0 {
		nowNs := e.now().UnixNano()
		typ, at := recDLQPurge, int64(0)
		if replay {
			sel = e.replayDLQLocked(s, sel, nowNs, false)
			typ, at = recDLQReplay, nowNs
		} else {
			s.st.DLQPurge(sel)
		}
		// Records of at most Config.dlqIDsPerRecord IDs (a record is at most maxRecordBytes).
		var recs recordBatch
		for rest := sel; len(rest) > 0; {
			k := min(len(rest), e.cfg.dlqIDsPerRecord)
			recs = append(recs, encodeDLQIDs(typ, id, at, rest[:k]))
			rest = rest[k:]
		}
		ch = e.queueStates(s, recs, true, nil)
	}
	s.mu.Unlock()
	e.mu.RUnlock()
	if err := wait(ctx, ch); err != nil {
		return 0, err
	}
	return len(sel), nil
}
