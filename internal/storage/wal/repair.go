package wal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

// Offline tools on a data directory, with no engine running on it (they hold its LOCK): `spool
// data verify` and `spool data truncate`.

// LogReport is the result of reading one log of a data directory.
type LogReport struct {
	// Topic and Partition name a partition log; Topic is "" for the engine's state log and for a
	// DLQ log.
	Topic     string
	Partition int
	// DLQ is the subscription ID of a DLQ log, 0 for the other logs.
	DLQ int64
	Dir string
	// Damage is the first damage and what cutting the log there gives up; nil when healthy.
	Damage *wlog.Damage
}

// repairOptions are the options the offline tools open logs with.
func repairOptions() wlog.Options { return wlog.Options{MaxRecordBytes: maxRecordBytes} }

// lockForRepair takes the LOCK of the data directory dir, which must exist and hold a state log.
func lockForRepair(dir string) (*os.File, error) {
	if st, err := os.Stat(filepath.Join(dir, stateDir)); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("%w: %s is not a data directory of the embedded engine (no %s directory)",
			storage.ErrInvalidArgument, dir, stateDir)
	}
	return lockDir(dir)
}

// VerifyDir reads every record of every log of the data directory dir (the state log, then each
// partition log, topics and partitions in order, then each DLQ log, by subscription ID), checking
// every checksum. It refuses to run
// while an engine holds the directory (ErrDirInUse). Opening a log applies the recovery an
// engine's Open does (a torn tail cleared, a missing index of a sealed segment rewritten);
// nothing else is changed.
func VerifyDir(dir string) ([]LogReport, error) {
	lock, err := lockForRepair(dir)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	out := []LogReport{{Partition: -1, Dir: filepath.Join(dir, stateDir)}}
	topics, err := os.ReadDir(filepath.Join(dir, topicsDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("wal: list topics: %w", err)
	}
	for _, t := range topics {
		if !t.IsDir() {
			continue
		}
		parts, err := os.ReadDir(filepath.Join(dir, topicsDir, t.Name()))
		if err != nil {
			return nil, fmt.Errorf("wal: list partitions of %s: %w", t.Name(), err)
		}
		var ps []int
		for _, p := range parts {
			if n, err := strconv.Atoi(p.Name()); err == nil && p.IsDir() {
				ps = append(ps, n)
			}
		}
		slices.Sort(ps)
		for _, p := range ps {
			out = append(out, LogReport{Topic: t.Name(), Partition: p, Dir: filepath.Join(dir, topicsDir, t.Name(), strconv.Itoa(p))})
		}
	}
	dlqs, err := os.ReadDir(filepath.Join(dir, dlqDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("wal: list DLQ logs: %w", err)
	}
	var subs []int64
	for _, d := range dlqs {
		if id, err := strconv.ParseInt(d.Name(), 10, 64); err == nil && id > 0 && d.IsDir() {
			subs = append(subs, id)
		}
	}
	slices.Sort(subs)
	for _, id := range subs {
		out = append(out, LogReport{Partition: -1, DLQ: id, Dir: filepath.Join(dir, dlqDir, strconv.FormatInt(id, 10))})
	}
	for i := range out {
		if out[i].Damage, err = wlog.Inspect(out[i].Dir, repairOptions()); err != nil {
			return nil, fmt.Errorf("wal: verify %s: %w", out[i].Dir, err)
		}
	}
	return out, nil
}

// TruncatePartition inspects the log of partition p of topic in the data directory dir and
// returns its first damage (nil when it is healthy). With apply, it cuts the log there
// (wlog.Truncate): the partition then ends at Damage.Index. Subscription positions above that
// are clamped by the next Open of the engine. It refuses to run while an engine holds the
// directory (ErrDirInUse).
func TruncatePartition(dir, topic string, p int, apply bool) (*wlog.Damage, error) {
	if err := names.ValidateTopic(topic); err != nil {
		return nil, fmt.Errorf("%w: %v", storage.ErrInvalidArgument, err)
	}
	name := fmt.Sprintf("log of topic %q partition %d", topic, p)
	if p < 0 {
		return nil, fmt.Errorf("%w: no %s in %s", storage.ErrInvalidArgument, name, dir)
	}
	return truncateLog(dir, filepath.Join(topicsDir, topic, strconv.Itoa(p)), name, apply)
}

// TruncateDLQ inspects the DLQ log of subscription sub in the data directory dir and returns its
// first damage (nil when it is healthy). With apply, it cuts the log there: the entries from ID
// Damage.Index+1 on are given up (a record's index is its entry's ID minus one), and the next
// Open of the engine drops them from the subscription's DLQ, with the replayed copies they held
// (dlqRecover), so that the broker starts with the entries before the damage. It refuses to run
// while an engine holds the directory (ErrDirInUse).
func TruncateDLQ(dir string, sub int64, apply bool) (*wlog.Damage, error) {
	name := fmt.Sprintf("DLQ log of subscription %d", sub)
	if sub <= 0 {
		return nil, fmt.Errorf("%w: no %s in %s", storage.ErrInvalidArgument, name, dir)
	}
	return truncateLog(dir, filepath.Join(dlqDir, strconv.FormatInt(sub, 10)), name, apply)
}

// truncateLog inspects the log at rel (relative to the data directory dir; name says which) and,
// with apply, cuts it at its first damage, holding the directory's LOCK.
func truncateLog(dir, rel, name string, apply bool) (*wlog.Damage, error) {
	lock, err := lockForRepair(dir)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	ldir := filepath.Join(dir, rel)
	if st, err := os.Stat(ldir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("%w: no %s in %s", storage.ErrInvalidArgument, name, dir)
	}
	d, err := wlog.Inspect(ldir, repairOptions())
	if err != nil || d == nil || !apply {
		return d, err
	}
	if err := wlog.Truncate(ldir, d); err != nil {
		return nil, err
	}
	return d, nil
}
