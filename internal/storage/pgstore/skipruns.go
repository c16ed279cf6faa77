package pgstore

import (
	"fmt"
	"slices"

	"github.com/spoolmq/spool/internal/storage"
)

// Skip runs (spool.sub_partitions.skips, migration 0017): the runs of offsets at or above a
// subscription partition's cursor that a refcount join marked done (queueSkips), stored as
// flattened [lo, hi) pairs, so that a join costs in the runs, not in the offsets they cover.
// Claims jump the cursor over a run (newClaim.skipRuns), acks of offsets in one are already done,
// and the figures that count done offsets ahead of the cursor count them (skipCountSQL).

// runsFrom returns the runs of a skips column (flattened pairs, nil for NULL) at or above from,
// a run that straddles from cut to start there.
func runsFrom(flat []int64, from int64) [][2]int64 {
	var runs [][2]int64
	for i := 0; i+1 < len(flat); i += 2 {
		lo, hi := max(flat[i], from), flat[i+1]
		if lo < hi {
			runs = append(runs, [2]int64{lo, hi})
		}
	}
	return runs
}

// flatRuns is the skips column of runs (nil: NULL).
func flatRuns(runs [][2]int64) []int64 {
	if len(runs) == 0 {
		return nil
	}
	flat := make([]int64, 0, 2*len(runs))
	for _, r := range runs {
		flat = append(flat, r[0], r[1])
	}
	return flat
}

// mergeRuns returns the union of a and b as sorted, disjoint runs; runs that touch are joined.
func mergeRuns(a, b [][2]int64) [][2]int64 {
	return storage.NormalizeRuns(slices.Concat(a, b))
}

// skipCountSQL is an SQL expression: how many offsets of [lo, hi) the runs of the skips column
// col cover (lo, hi and col are SQL expressions).
func skipCountSQL(col, lo, hi string) string {
	return fmt.Sprintf(`(SELECT coalesce(sum(greatest(least(%[1]s[i + 1], %[3]s) - greatest(%[1]s[i], %[2]s), 0)), 0)::bigint
		FROM generate_series(1, coalesce(cardinality(%[1]s), 0), 2) AS i)`, col, lo, hi)
}

// trimSkipsSQL is an SQL expression: the skips column col without the runs that end at or below
// cur (a claim's cursor passed them).
func trimSkipsSQL(col, cur string) string {
	return fmt.Sprintf(`CASE WHEN %[1]s IS NULL THEN NULL ELSE nullif(ARRAY(SELECT %[1]s[i + k]
		FROM generate_series(1, cardinality(%[1]s), 2) AS i, (VALUES (0), (1)) AS v(k)
		WHERE %[1]s[i + 1] > %[2]s ORDER BY i, k), '{}') END`, col, cur)
}

// inRun reports whether offset o is in one of runs (sorted).
func inRun(runs [][2]int64, o int64) bool {
	_, found := slices.BinarySearchFunc(runs, o, func(r [2]int64, o int64) int {
		if r[1] <= o {
			return -1
		}
		if r[0] > o {
			return 1
		}
		return 0
	})
	return found
}
