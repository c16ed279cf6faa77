package wal

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/policy"
	"github.com/spoolmq/spool/internal/storage/wal/substate"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

// Snapshot file format (see docs/storage.md, "State log and snapshot"). Part of the on-disk
// format; never change: add a version instead.
const (
	snapshotMagic = "SPOOLSNP"
	// snapshotVersion is the version written. Versions 1 (no claim horizon) and 2 (DLQ entries and
	// replayed copies with their messages, moved to DLQ logs at Open) and 3 (no failure
	// histories: poison rules) are still read.
	snapshotVersion = 4
	snapshotPrefix  = "snapshot-"
	snapshotExt     = ".bin"
	// snapshotHeaderBytes: magic, version u32, state log index u64.
	snapshotHeaderBytes = 8 + 4 + 8
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// maxDoneSpan bounds how far above its floor a partition's completed offsets may reach in a
// snapshot (a bitset of 2^31 bits is 256 MiB): larger values are damage, not state.
const maxDoneSpan = 1 << 31

// snapshotMeta is the JSON part of a snapshot: metadata, rare and small.
type snapshotMeta struct {
	Topics        []storage.Topic        `json:"topics"`
	Bindings      []storage.Binding      `json:"bindings"`
	Subscriptions []storage.Subscription `json:"subscriptions"`
	// Assignments of ORDERED subscriptions (ordered.go), ID order.
	Assignments []*storage.Assignment `json:"assignments,omitempty"`
	// Completions are the completion records of refcount topics' subscriptions (completion.go),
	// ID then partition order; omitted when there are none, so other snapshots keep their bytes.
	Completions []snapshotCompletions `json:"completions,omitempty"`
}

// snapshotCompletions are the completion runs of one subscription partition: Runs holds
// (lo, hi, at unix ns, state) per run.
type snapshotCompletions struct {
	Sub       int64   `json:"sub"`
	Partition int32   `json:"partition"`
	Runs      []int64 `json:"runs"`
}

func snapshotName(index int64) string {
	return fmt.Sprintf("%s%020d%s", snapshotPrefix, index, snapshotExt)
}

// snapshotState is the persistent state exported for a snapshot: taken with Engine.mu held
// exclusively, encoded after it is released.
type snapshotState struct {
	nextSubID int64
	metaJSON  []byte
	subs      []snapshotSub // ID order
	// dlqSynced are the DLQ logs with appends queued: the snapshot is written once they are durable,
	// so that every DLQ entry it holds is in its DLQ log.
	dlqSynced []*dlqLog
}

// snapshotSub is one subscription's delivery state in a snapshotState.
type snapshotSub struct {
	id    int64
	parts []substate.PartState
	dlq   substate.DLQState
}

// encodeSnapshotLocked encodes the whole persistent state. e.mu must be held exclusively (so no
// subscription mutex is held by anyone).
func (e *Engine) encodeSnapshotLocked(index int64) []byte {
	return e.exportSnapshotLocked().encode(index)
}

// exportSnapshotLocked captures the whole persistent state for a snapshot. e.mu must be held
// exclusively (so no subscription mutex is held by anyone). The DLQ entries are not part of it
// (they are in the DLQ logs), only which IDs are in each DLQ; the encoding is done by encode once
// the lock is released.
func (e *Engine) exportSnapshotLocked() *snapshotState {
	var meta snapshotMeta
	for _, t := range e.topics {
		meta.Topics = append(meta.Topics, t.meta)
	}
	slices.SortFunc(meta.Topics, func(a, b storage.Topic) int { return strings.Compare(a.Name, b.Name) })
	for _, b := range e.sortedBindingsLocked() {
		meta.Bindings = append(meta.Bindings, *b)
	}
	var withState []*sub
	for _, s := range e.subs {
		if s.meta.Ephemeral {
			continue
		}
		meta.Subscriptions = append(meta.Subscriptions, s.meta)
		if s.asg != nil {
			meta.Assignments = append(meta.Assignments, s.asg.Clone())
		}
		if s.st != nil {
			withState = append(withState, s)
		}
		for p, runs := range s.rc {
			c := snapshotCompletions{Sub: s.meta.ID, Partition: p, Runs: make([]int64, 0, 4*len(runs))}
			for _, r := range runs {
				c.Runs = append(c.Runs, r.lo, r.hi, r.at, int64(r.state))
			}
			meta.Completions = append(meta.Completions, c)
		}
	}
	slices.SortFunc(meta.Completions, func(a, b snapshotCompletions) int {
		return cmp.Or(cmp.Compare(a.Sub, b.Sub), cmp.Compare(a.Partition, b.Partition))
	})
	slices.SortFunc(meta.Subscriptions, func(a, b storage.Subscription) int { return cmp.Compare(a.ID, b.ID) })
	slices.SortFunc(meta.Assignments, func(a, b *storage.Assignment) int { return cmp.Compare(a.SubscriptionID, b.SubscriptionID) })
	slices.SortFunc(withState, func(a, b *sub) int { return cmp.Compare(a.meta.ID, b.meta.ID) })
	metaJSON, err := json.Marshal(&meta)
	if err != nil {
		panic(fmt.Sprintf("wal: marshal snapshot metadata: %v", err))
	}
	st := &snapshotState{nextSubID: e.nextSubID, metaJSON: metaJSON, subs: make([]snapshotSub, len(withState))}
	for i, s := range withState {
		parts, dlq := s.st.Export()
		st.subs[i] = snapshotSub{id: s.meta.ID, parts: parts, dlq: dlq}
		if s.dlq != nil && s.dlq.busy() {
			st.dlqSynced = append(st.dlqSynced, s.dlq)
		}
	}
	return st
}

// encode encodes the exported state as a snapshot file of state log index index.
func (st *snapshotState) encode(index int64) []byte {
	en := enc{b: make([]byte, 0, 4096+len(st.metaJSON))}
	en.b = append(en.b, snapshotMagic...)
	en.b = binary.LittleEndian.AppendUint32(en.b, snapshotVersion)
	en.b = binary.LittleEndian.AppendUint64(en.b, uint64(index))
	en.uvarint(uint64(st.nextSubID))
	en.bytes(st.metaJSON)
	en.uvarint(uint64(len(st.subs)))
	for _, s := range st.subs {
		en.uvarint(uint64(s.id))
		en.uvarint(uint64(s.dlq.Next))
		en.uvarint(uint64(len(s.parts)))
		for _, ps := range s.parts {
			en.uvarint(uint64(ps.Floor))
			en.uvarint(uint64(ps.Cursor))
			en.uvarint(uint64(ps.Horizon))
			en.uvarint(uint64(ps.Suspect))
			en.uvarint(uint64(len(ps.Done)))
			prev := ps.Floor
			for _, r := range ps.Done {
				en.uvarint(uint64(r[0] - prev))
				en.uvarint(uint64(r[1] - r[0]))
				prev = r[1]
			}
			en.uvarint(uint64(len(ps.Pending)))
			for _, es := range ps.Pending {
				en.uvarint(uint64(es.Offset))
				en.uvarint(uint64(es.Attempt))
				en.varint(es.Due)
				en.failures(es.Failures)
			}
			en.uvarint(uint64(len(ps.Replayed)))
			for _, es := range ps.Replayed {
				en.uvarint(uint64(es.Offset))
				en.uvarint(uint64(es.Attempt))
				en.varint(es.Due)
				en.uvarint(uint64(es.DLQ))
				en.failures(es.Failures)
			}
		}
		en.uvarint(uint64(len(s.dlq.Live)))
		prev := int64(0)
		for _, r := range s.dlq.Live {
			en.uvarint(uint64(r[0] - prev))
			en.uvarint(uint64(r[1] - r[0]))
			prev = r[1]
		}
	}
	return binary.LittleEndian.AppendUint32(en.b, crc32.Checksum(en.b, castagnoli))
}

// decodeSnapshot checks a snapshot file's framing and checksum and loads it into the (empty)
// engine maps. It returns the state log index replay continues from.
func (e *Engine) decodeSnapshot(b []byte) (int64, error) {
	if len(b) < snapshotHeaderBytes+4 || string(b[:8]) != snapshotMagic {
		return 0, errors.New("bad magic or short file")
	}
	version := binary.LittleEndian.Uint32(b[8:12])
	if version < 1 || version > snapshotVersion {
		return 0, fmt.Errorf("unsupported snapshot version %d", version)
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return 0, errors.New("checksum mismatch")
	}
	index := int64(binary.LittleEndian.Uint64(b[12:20]))
	if index < 0 {
		return 0, fmt.Errorf("state log index %d out of range", index)
	}
	d := dec{b: body[snapshotHeaderBytes:]}
	nextSubID := int64(d.uvarint())
	var meta snapshotMeta
	if err := json.Unmarshal(d.bytes(), &meta); err != nil && d.err == nil {
		return 0, fmt.Errorf("metadata: %w", err)
	}
	for _, t := range meta.Topics {
		e.topics[t.Name] = &topic{meta: t, subs: make(map[int64]*sub)}
	}
	for _, b := range meta.Bindings {
		e.bindings[bindingKey{b.Group, b.Pattern}] = &b
	}
	for _, m := range meta.Subscriptions {
		s := &sub{meta: m}
		e.subs[m.ID] = s
		if t := e.topics[m.Topic]; t != nil && m.State != storage.Deleted {
			s.topic = t
			t.subs[m.ID] = s
		}
	}
	for _, a := range meta.Assignments {
		e.applyAssign(a)
	}
	for _, c := range meta.Completions {
		s := e.subs[c.Sub]
		if s == nil || len(c.Runs)%4 != 0 {
			return 0, fmt.Errorf("completion records of subscription %d: unknown subscription or damaged runs", c.Sub)
		}
		if s.rc == nil {
			s.rc = completions{}
		}
		runs := make([]crun, 0, len(c.Runs)/4)
		for i := 0; i < len(c.Runs); i += 4 {
			runs = append(runs, crun{lo: c.Runs[i], hi: c.Runs[i+1], at: c.Runs[i+2], state: uint8(c.Runs[i+3])})
		}
		s.rc[c.Partition] = runs
	}
	e.nextSubID = max(nextSubID, 1)
	n := d.count(4)
	for range n {
		id := int64(d.uvarint())
		nextDLQ := int64(d.uvarint())
		parts := make([]substate.PartState, d.count(5))
		for i := range parts {
			ps := &parts[i]
			ps.Floor = int64(d.uvarint())
			ps.Cursor = int64(d.uvarint())
			if version >= 2 {
				ps.Horizon = int64(d.uvarint())
				ps.Suspect = int64(d.uvarint())
			}
			ps.Done = make([][2]int64, d.count(2))
			prev := ps.Floor
			for j := range ps.Done {
				start := prev + int64(d.uvarint())
				end := start + int64(d.uvarint())
				if start < prev || end < start || end-ps.Floor > maxDoneSpan {
					return 0, fmt.Errorf("subscription %d: done run [%d, %d) out of range", id, start, end)
				}
				ps.Done[j] = [2]int64{start, end}
				prev = end
			}
			ps.Pending = make([]substate.EntryState, d.count(3))
			for j := range ps.Pending {
				ps.Pending[j] = substate.EntryState{Offset: int64(d.uvarint()), Attempt: int(d.uvarint()), Due: d.varint()}
				if version >= 4 {
					ps.Pending[j].Failures = d.failures()
				}
			}
			ps.Replayed = make([]substate.EntryState, d.count(4))
			for j := range ps.Replayed {
				es := substate.EntryState{Offset: int64(d.uvarint()), Attempt: int(d.uvarint()), Due: d.varint()}
				if version >= 3 {
					if es.DLQ = int64(d.uvarint()); es.DLQ < 1 && d.err == nil {
						return 0, fmt.Errorf("subscription %d: replayed copy of offset %d without a DLQ ID", id, es.Offset)
					}
				} else {
					// The message was in the snapshot: recovery moves it to the DLQ log
					// (dlqRecover) and gives the copy its ID there.
					m := new(storage.Message)
					d.message(m)
					e.dlqMigrate = append(e.dlqMigrate, dlqMigrateCopy{sub: id, partition: int32(i), offset: es.Offset, msg: m})
					es.DLQ = -1
				}
				if version >= 4 {
					es.Failures = d.failures()
				}
				ps.Replayed[j] = es
			}
		}
		dlq := substate.DLQState{Next: nextDLQ}
		var old []*storage.DLQEntry
		if version >= 3 {
			dlq.Live = make([][2]int64, d.count(2))
			prev := int64(0)
			for j := range dlq.Live {
				start := prev + int64(d.uvarint())
				end := start + int64(d.uvarint())
				if start < prev || end < start || end > nextDLQ {
					return 0, fmt.Errorf("subscription %d: DLQ run [%d, %d) out of range", id, start, end)
				}
				dlq.Live[j] = [2]int64{start, end}
				prev = end
			}
		} else {
			// The entries were in the snapshot: recovery appends them to the DLQ log.
			old = make([]*storage.DLQEntry, d.count(8))
			for j := range old {
				old[j] = d.dlqEntry(id)
				if n := len(dlq.Live); n > 0 && dlq.Live[n-1][1] == old[j].ID {
					dlq.Live[n-1][1]++
				} else {
					dlq.Live = append(dlq.Live, [2]int64{old[j].ID, old[j].ID + 1})
				}
			}
		}
		if d.err != nil {
			break
		}
		if s := e.subs[id]; s != nil && s.topic != nil && s.meta.State != storage.Cancelled {
			s.st = substate.Import(parts, dlq)
			if len(old) > 0 {
				e.dlqPend[id] = old // ID order
			}
		}
	}
	if version < 3 {
		e.dlqMigrated = true
	}
	if err := d.done("snapshot"); err != nil {
		return 0, err
	}
	// A subscription without saved state (cancelled) keeps none; a live one always has some.
	for _, s := range e.subs {
		if s.st == nil && s.topic != nil && s.meta.State != storage.Cancelled {
			s.st = substate.New(make([]int64, s.topic.meta.Config.Partitions))
		}
	}
	return index, nil
}

// snapshot writes a snapshot of the whole state and compacts the state log. With final (Close)
// it runs on a closed engine.
func (e *Engine) snapshot(final bool) error {
	e.snapMu.Lock()
	defer e.snapMu.Unlock()

	e.mu.Lock()
	if (!final && e.closed) || e.failedErr() != nil {
		e.mu.Unlock()
		return nil
	}
	// The marker's index K is where replay resumes: every record queued before it (all changes
	// the snapshot holds, since changes queue their records with e.mu held) has an index < K, every
	// later one > K. The state is exported now and encoded once the lock is released; the index
	// is only known once the marker is written, so the header is patched afterwards.
	if e.dlqStalled.Load() > 0 {
		e.mu.Unlock()
		return errDLQHeld // the state log keeps what rebuilds the records waiting for room
	}
	st := e.exportSnapshotLocked()
	type result struct {
		index int64
		err   error
	}
	ch := make(chan result, 1)
	e.committer.AppendAsync(e.state, []wlog.Record{{Timestamp: e.clock.Now().UnixNano(), Body: []byte{recMarker}}},
		func(first int64, err error) { ch <- result{first, err} })
	e.stateBytes.Store(0)
	e.mu.Unlock()

	if e.snapshotEncodeHook != nil {
		e.snapshotEncodeHook()
	}
	data := st.encode(0)
	r := <-ch
	if r.err != nil {
		e.fail(fmt.Errorf("wal: state log append: %w", r.err))
		return r.err
	}
	for _, dl := range st.dlqSynced {
		<-dl.settled()
		if dl.held() {
			return errDLQHeld // the state log keeps what rebuilds its records
		}
	}
	if err := e.failedErr(); err != nil {
		return err // a DLQ log append failed: the snapshot could name entries it lacks
	}
	binary.LittleEndian.PutUint64(data[12:20], uint64(r.index))
	binary.LittleEndian.PutUint32(data[len(data)-4:], crc32.Checksum(data[:len(data)-4], castagnoli))
	if err := e.writeSnapshotFile(r.index, data); err != nil {
		return err
	}
	if err := e.state.Cut(); err != nil {
		return fmt.Errorf("wal: cut state log: %w", err)
	}
	recs, bytes, err := e.state.DeleteBefore(r.index)
	if err != nil {
		return fmt.Errorf("wal: compact state log: %w", err)
	}
	e.logger.Debug("wal snapshot written", slog.Int64("index", r.index), slog.Int("bytes", len(data)),
		slog.Int64("state_records_deleted", recs), slog.Int64("state_bytes_deleted", bytes))
	return nil
}

// writeSnapshotFile writes data as the snapshot at index: temp file, fsync, rename, fsync dir;
// then removes older snapshots.
func (e *Engine) writeSnapshotFile(index int64, data []byte) error {
	path := filepath.Join(e.dir, snapshotName(index))
	tmp := path + ".tmp"
	f, err := e.fs.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("wal: create snapshot: %w", err)
	}
	_, err = f.WriteAt(data, 0)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = e.fs.Rename(tmp, path)
	}
	if err == nil {
		err = e.fs.SyncDir(e.dir)
	}
	if err != nil {
		_ = e.fs.Remove(tmp)
		return fmt.Errorf("wal: write snapshot %s: %w", path, err)
	}
	files, _ := e.snapshotFiles()
	for _, old := range files {
		if old.index != index {
			if err := e.fs.Remove(old.path); err != nil {
				e.logger.Warn("wal: remove old snapshot", slog.String("path", old.path), slog.Any("error", err))
			}
		}
	}
	return nil
}

type snapshotFile struct {
	index int64
	path  string
}

// snapshotFiles lists the snapshot files, newest first, and removes leftover temp files.
func (e *Engine) snapshotFiles() ([]snapshotFile, error) {
	ents, err := e.fs.ReadDir(e.dir)
	if err != nil {
		return nil, err
	}
	var out []snapshotFile
	for _, ent := range ents {
		name := ent.Name()
		if !strings.HasPrefix(name, snapshotPrefix) {
			continue
		}
		if strings.HasSuffix(name, ".tmp") {
			_ = e.fs.Remove(filepath.Join(e.dir, name))
			continue
		}
		digits, ok := strings.CutSuffix(strings.TrimPrefix(name, snapshotPrefix), snapshotExt)
		if !ok {
			continue
		}
		idx, err := strconv.ParseInt(digits, 10, 64)
		if err != nil || idx < 0 {
			continue
		}
		out = append(out, snapshotFile{idx, filepath.Join(e.dir, name)})
	}
	slices.SortFunc(out, func(a, b snapshotFile) int { return cmp.Compare(b.index, a.index) })
	return out, nil
}

func (e *Engine) readFile(path string) ([]byte, error) {
	f, err := e.fs.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	b := make([]byte, st.Size())
	n, err := f.ReadAt(b, 0)
	if err != nil && !(errors.Is(err, io.EOF) && n == len(b)) {
		return nil, err
	}
	return b, nil
}

// loadSnapshot loads the newest usable snapshot: valid, and not older than the state log's first
// record (else records between them are gone). It returns the index replay starts from.
func (e *Engine) loadSnapshot() (int64, error) {
	files, err := e.snapshotFiles()
	if err != nil {
		return 0, fmt.Errorf("wal: list snapshots: %w", err)
	}
	first := e.state.FirstIndex()
	for _, f := range files {
		if f.index < first {
			e.logger.Warn("wal: snapshot older than the state log, ignored", slog.String("path", f.path))
			continue
		}
		b, err := e.readFile(f.path)
		if err == nil {
			var idx int64
			idx, err = e.decodeSnapshot(b)
			if err == nil {
				return idx, nil
			}
			e.resetMaps()
		}
		e.logger.Error("wal: snapshot unusable, trying an older one", slog.String("path", f.path), slog.Any("error", err))
	}
	if first > 0 {
		return 0, fmt.Errorf("%w: wal: no usable snapshot in %s and the state log starts at record %d", storage.ErrCorrupt, e.dir, first)
	}
	return 0, nil
}

func (e *Engine) resetMaps() {
	e.dlqPend = make(map[int64][]*storage.DLQEntry)
	e.dlqMigrate = nil
	e.dlqMigrated = false
	e.topics = make(map[string]*topic)
	e.subs = make(map[int64]*sub)
	e.bindings = make(map[bindingKey]*storage.Binding)
	e.nextSubID = 1
}

// failures writes an entry's failure history (version 4): uvarint n | n x (str member, str
// reason, varint at unix ns).
func (e *enc) failures(fs []policy.Failure) {
	e.uvarint(uint64(len(fs)))
	for _, f := range fs {
		e.str(f.Member)
		e.str(f.Reason)
		e.varint(f.At)
	}
}

// failures reads what enc.failures wrote, keeping the last storage.MaxFailureHistory.
func (d *dec) failures() []policy.Failure {
	n := d.count(3)
	var fs []policy.Failure
	for range n {
		fs = policy.AddFailure(fs, policy.Failure{Member: d.str(), Reason: d.str(), At: d.varint()})
	}
	return fs
}
