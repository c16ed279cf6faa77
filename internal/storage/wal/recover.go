package wal

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

// recover rebuilds the engine state at Open: snapshot, state log replay, partition logs, then the
// restart rules (leases are gone; a message lost on its max_deliveries-th lease goes to the DLQ).
func (e *Engine) recover() error {
	var err error
	stateOpts := e.logOptions()
	stateOpts.KeepSpare = true // acks and claims go on when the disk fills or descriptors run out: one segment in reserve, open
	stateOpts.PinActive = true // and never fail to reopen its file (Config.MaxOpenFiles)
	e.state, err = wlog.Open(filepath.Join(e.dir, stateDir), stateOpts)
	if err != nil {
		return fmt.Errorf("wal: open state log: %w", err)
	}
	if err := e.findDLQLogs(); err != nil {
		return err
	}
	from, err := e.loadSnapshot()
	if err != nil {
		return err
	}
	if next := e.state.NextIndex(); from > next {
		// The snapshot's marker and the records before it were lost with the page cache
		// (UnsafeNoSync and a machine crash). Pad the log so new records get indexes above the
		// snapshot's, or a later recovery would skip them.
		e.logger.Warn("wal: state log shorter than its snapshot, padding", slog.Int64("next", next), slog.Int64("snapshot", from))
		pad := make([]wlog.Record, from-next)
		for i := range pad {
			pad[i] = wlog.Record{Timestamp: e.clock.Now().UnixNano(), Body: []byte{recMarker}}
		}
		if _, err := e.committer.Append(context.Background(), e.state, pad); err != nil {
			return fmt.Errorf("wal: pad state log: %w", err)
		}
	}
	var replayed, bytes int64
	clean := false // the log ends with a clean-close record
	err = e.state.Scan(from, func(i int64, rec wlog.Record) (bool, error) {
		e.replayAt = rec.Timestamp // the time of the record's operation (completion records)
		if err := e.applyRecord(rec.Body); err != nil {
			return false, fmt.Errorf("%w: wal: state log record %d: %v", storage.ErrCorrupt, i, err)
		}
		clean = len(rec.Body) == 1 && rec.Body[0] == recCleanClose
		replayed++
		bytes += int64(len(rec.Body)) + wlog.FrameHeaderBytes
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("wal: replay state log: %w", err)
	}
	if err := e.dlqRecover(); err != nil {
		return err
	}
	for _, t := range e.topics {
		if err := e.openTopicLogs(t, 0); err != nil {
			return err
		}
	}
	e.removeOrphans()
	now := e.now()
	for _, t := range e.topics {
		if err := e.rebuildDedup(t, now); err != nil {
			return err
		}
	}
	// The first record of this run, durable before Open returns: after an unclean shutdown the
	// rule of applyUnclean (applied now and on every later replay of the record); after a clean
	// one a marker, so that the log no longer ends with the clean-close record.
	first := []byte{recMarker}
	if !clean && replayed > 0 {
		e.logger.Warn("wal: the engine was not closed cleanly: attempt counts of messages in flight are raised by one")
		e.applyUnclean()
		first = []byte{recUnclean}
	}
	recs := []wlog.Record{{Timestamp: now.UnixNano(), Body: first}}
	for _, s := range e.subs {
		if s.st == nil || s.topic == nil {
			continue
		}
		for i, p := range s.topic.parts {
			pi := int32(i)
			if p.damaged() != nil {
				continue // damaged: its state waits for the repair (clamped at the next Open)
			}
			if hw := p.log.NextIndex(); s.st.Cursor(pi) > hw || s.st.Floor(pi) > hw {
				e.logger.Warn("wal: subscription state beyond the log's end (records lost), clamped",
					slog.Int64("subscription", s.meta.ID), slog.Int("partition", i), slog.Int64("high_water", hw))
				s.st.Clamp(pi, hw)
			}
			if first := p.log.FirstIndex(); s.st.Floor(pi) < first {
				s.st.ForceFloor(pi, first)
			}
		}
		// Leases were lost with the restart. Messages on their last allowed delivery are
		// dead-lettered as an expiry would have; the others are due at once (restored that way).
		maxDel := s.topic.meta.Config.MaxDeliveries
		dead := 0
		for _, en := range s.st.Exhausted(maxDel, func(p int32) bool { return s.topic.parts[p].damaged() == nil }) {
			// A delivery never carries an attempt above max_deliveries, so that is all it can
			// have had (an unclean restart may have counted one more).
			en.Attempt = min(en.Attempt, maxDel)
			if rec := e.deadLetterLocked(s, en, storage.DLQMaxDeliveries, "lease lost in an engine restart", now); rec != nil && !s.meta.Ephemeral {
				recs = append(recs, wlog.Record{Timestamp: now.UnixNano(), Body: rec})
				dead++
			}
		}
		if dead > 0 {
			e.openDead = append(e.openDead, storage.DeadLetterCount{SubscriptionID: s.meta.ID, Topic: s.meta.Topic,
				Group: s.meta.Group, Messages: dead})
		}
		e.flushDLQLocked(s)
	}
	slices.SortFunc(e.openDead, func(a, b storage.DeadLetterCount) int { return cmp.Compare(a.SubscriptionID, b.SubscriptionID) })
	if _, err := e.committer.Append(context.Background(), e.state, recs); err != nil {
		return fmt.Errorf("wal: record the restart: %w", err)
	}
	if dead := len(recs) - 1; dead > 0 {
		e.logger.Info("wal: messages on their last delivery when the engine stopped dead-lettered", slog.Int("messages", dead))
	}
	e.stateBytes.Store(bytes)
	if bytes >= e.cfg.StateLogSnapshotBytes || e.dlqMigrated {
		// dlqMigrated: an old snapshot's DLQ was moved to DLQ logs; a new snapshot records it.
		e.snapPending.Store(true)
		e.snapReq <- struct{}{}
	}
	e.logger.Info("wal state recovered", slog.Int64("snapshot_index", from), slog.Int64("records_replayed", replayed))
	return nil
}

func (e *Engine) topicDir(name string) string { return filepath.Join(e.dir, topicsDir, name) }

func (e *Engine) partitionDir(name string, p int) string {
	return filepath.Join(e.topicDir(name), strconv.Itoa(p))
}

// openTopicLogs opens (creating when missing) the partition logs from index from up to the
// topic's partition count.
func (e *Engine) openTopicLogs(t *topic, from int) error {
	for i := from; i < t.meta.Config.Partitions; i++ {
		p, err := e.openPartition(t.meta.Name, i)
		if err != nil {
			return err
		}
		t.parts = append(t.parts, p)
	}
	return nil
}

func (e *Engine) openPartition(name string, i int) (*partition, error) {
	dir := e.partitionDir(name, i)
	l, err := wlog.Open(dir, e.logOptions())
	if errors.Is(err, storage.ErrCorrupt) {
		// One damaged partition does not stop the engine: it is kept without a log, unavailable.
		p := &partition{index: int32(i), dir: dir}
		e.markDamaged(name, p, fmt.Errorf("wal: open partition log %s: %w", dir, err))
		return p, nil
	}
	if err != nil {
		return nil, fmt.Errorf("wal: open partition log %s: %w", dir, err)
	}
	p := &partition{index: int32(i), dir: dir, log: l}
	if segs := l.Segments(); len(segs) > 0 {
		for _, s := range segs {
			p.lastTS = max(p.lastTS, s.MaxTime)
		}
	}
	return p, nil
}

// removeOrphans removes topic directories (and partition directories) that the state does not
// know: left by a crash between creating them and persisting the topic, or between persisting a
// deletion and removing them.
func (e *Engine) removeOrphans() {
	root := filepath.Join(e.dir, topicsDir)
	ents, err := e.fs.ReadDir(root)
	if err != nil {
		e.logger.Warn("wal: list topics directory", slog.Any("error", err))
		return
	}
	for _, ent := range ents {
		t := e.topics[ent.Name()]
		if t == nil {
			e.logger.Warn("wal: removing directory of an unknown topic", slog.String("topic", ent.Name()))
			if err := e.discardDir(filepath.Join(root, ent.Name())); err != nil {
				e.logger.Warn("wal: remove orphan topic", slog.String("topic", ent.Name()), slog.Any("error", err))
			}
			continue
		}
		parts, err := e.fs.ReadDir(filepath.Join(root, ent.Name()))
		if err != nil {
			continue
		}
		for _, pe := range parts {
			if n, err := strconv.Atoi(pe.Name()); err == nil && n >= len(t.parts) {
				_ = e.removeAll(filepath.Join(root, ent.Name(), pe.Name()))
			}
		}
	}
}

// discardDir removes the directory tree at path (a deleted topic's) in the background: it moves
// it into trash/ under a name of its own, durably, so that a topic of the same name can be
// created at once, and wakes the trash loop, which frees it segment by segment (wlog.RemoveFile:
// ~35 ms per 64 MiB segment on a file system mounted with discard, which TopicDelete no longer
// waits for). If the move fails, it removes the tree itself.
func (e *Engine) discardDir(path string) error {
	trash := filepath.Join(e.dir, trashDir)
	dst := filepath.Join(trash, fmt.Sprintf("%d-%d", e.clock.Now().UnixNano(), e.trashSeq.Add(1)))
	err := e.fs.MkdirAll(trash, 0o755)
	if err == nil {
		err = e.fs.Rename(path, dst)
	}
	if err == nil {
		// The old name must be gone durably before a topic of the same name creates it again.
		err = errors.Join(e.fs.SyncDir(filepath.Dir(path)), e.fs.SyncDir(trash))
		select {
		case e.trashKick <- struct{}{}:
		default:
		}
		return err
	}
	if isNotExist(err) {
		return nil
	}
	e.logger.Warn("wal: move a deleted directory to the trash; removing it now", slog.String("dir", path), slog.Any("error", err))
	return e.removeAll(path)
}

// trashLoop empties trash/ at start and whenever discardDir moved a directory there, until Close,
// which stops it between two files (what is left is removed after the next Open).
func (e *Engine) trashLoop() {
	defer e.wg.Done()
	for {
		e.reapDLQs()
		ents, err := e.fs.ReadDir(filepath.Join(e.dir, trashDir))
		if err != nil && !isNotExist(err) {
			e.logger.Warn("wal: list the trash", slog.Any("error", err))
		}
		for _, ent := range ents {
			if err := e.removeAllUntil(filepath.Join(e.dir, trashDir, ent.Name()), e.quit); err != nil {
				if errors.Is(err, errStopped) {
					return
				}
				e.logger.Warn("wal: empty the trash", slog.String("dir", ent.Name()), slog.Any("error", err))
			}
		}
		select {
		case <-e.quit:
			return
		case <-e.trashKick:
		}
	}
}

// errStopped is returned by removeAllUntil when stop was closed.
var errStopped = errors.New("wal: stopped")

// removeAll removes a directory tree through the FS seam.
func (e *Engine) removeAll(path string) error { return e.removeAllUntil(path, nil) }

// removeAllUntil is removeAll, returning errStopped before the next file once stop is closed.
func (e *Engine) removeAllUntil(path string, stop <-chan struct{}) error {
	select {
	case <-stop:
		return errStopped
	default:
	}
	ents, err := e.fs.ReadDir(path)
	if err != nil {
		if isNotExist(err) {
			return nil
		}
		// A file, not a directory: a segment is freed in steps (wlog.RemoveFile), which a crash
		// may interrupt; what removeAll removes belongs to a deleted topic or partition, and
		// recovery removes what is left (removeOrphans).
		return wlog.RemoveFile(e.fs, path)
	}
	for _, ent := range ents {
		if err := e.removeAllUntil(filepath.Join(path, ent.Name()), stop); err != nil {
			return err
		}
	}
	if err := e.fs.Remove(path); err != nil && !isNotExist(err) {
		return err
	}
	return nil
}
