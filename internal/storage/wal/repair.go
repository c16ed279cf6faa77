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
	lock, err := lockForRepair(dir)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	pdir := filepath.Join(dir, topicsDir, topic, strconv.Itoa(p))
	if st, err := os.Stat(pdir); p < 0 || err != nil || !st.IsDir() {
		return nil, fmt.Errorf("%w: no log of topic %q partition %d in %s", storage.ErrInvalidArgument, topic, p, dir)
	}
	d, err := wlog.Inspect(pdir, repairOptions())
	if err != nil || d == nil || !apply {
		return d, err
	}
	if err := wlog.Truncate(pdir, d); err != nil {
		return nil, err
	}
	return d, nil
}
