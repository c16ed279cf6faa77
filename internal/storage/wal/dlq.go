package wal

import (
	"context"

	"github.com/spoolmq/spool/internal/storage"
)

// DLQList lists a subscription's dead-lettered messages in ID order, after AfterID, at most Limit
// (default 100). A CANCELLED subscription has none.
func (e *Engine) DLQList(ctx context.Context, params *storage.DLQListParams) ([]*storage.DLQEntry, error) {
	if err := params.Check(); err != nil {
		return nil, err
	}
	limit := params.Limit
	if limit == 0 {
		limit = 100
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
	if s.st == nil {
		return out, nil
	}
	for _, d := range s.st.DLQ(params.AfterID, limit) {
		c := *d
		out = append(out, &c)
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

// DLQReplay moves DLQ entries (all of them when IDs is empty) back to their subscription only,
// due at once with a fresh attempt count, and returns how many. A replayed message is delivered
// from the entry's copy, so it does not matter whether the log still holds it. Durable when it
// returns.
func (e *Engine) DLQReplay(ctx context.Context, params *storage.DLQReplayParams) (int, error) {
	if err := params.Check(); err != nil {
		return 0, err
	}
	return e.dlqMove(ctx, params.SubscriptionID, params.IDs, true)
}

func (e *Engine) dlqMove(ctx context.Context, id int64, ids []int64, replay bool) (int, error) {
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
		var rec []byte
		if replay {
			s.st.DLQReplay(sel, nowNs)
			rec = encodeDLQIDs(recDLQReplay, id, nowNs, sel)
		} else {
			s.st.DLQPurge(sel)
			rec = encodeDLQIDs(recDLQPurge, id, 0, sel)
		}
		ch = e.queueStates(s, recordBatch{rec}, true, nil)
	}
	s.mu.Unlock()
	e.mu.RUnlock()
	if err := wait(ctx, ch); err != nil {
		return 0, err
	}
	return len(sel), nil
}
