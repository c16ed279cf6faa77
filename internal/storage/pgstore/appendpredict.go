package pgstore

import (
	"errors"
	"sync"
	"time"
)

// A lane's publish transaction holds its partitions' rows from its takeOffsetsSQL to the end of
// its COMMIT, and the next transaction of the partition waits for them: the partition commits one
// transaction at a time, and whatever a transaction does while it holds the rows lengthens that
// chain. So when the instance knows where a partition stands (its own last append to it took the
// offsets up to next, with publish time at), a lane transaction inserts its rows first, at the
// offsets that follow, and takes the rows last, just before its COMMIT (takePredictedSQL): its
// INSERT runs while the transaction before still commits, and the rows are held only for the
// UPDATE and the commit's flush (pgbench of the two shapes, 4 rows of 1 KiB, 2-4 sessions on
// one partition: +23-31% transactions a second; 100 rows: +22-39%).
//
// The guess is checked on the row once it is locked: the partition's next offset must be the one
// guessed and its last publish time not after the rows'. Then every offset below the rows' is
// taken by a committed transaction (the row is the latest committed version) and the rows follow
// them, exactly as if the offsets had been taken first; the rows' publish time is not before any
// earlier one of the partition. Otherwise (another instance, the sequencer or a failed
// transaction moved the partition) the statement fails, the transaction writes nothing, and its
// calls queue again like after errLaneBroken; the partition's guesses stop for predictMissPause,
// so that an instance that shares a partition with others takes the rows first, as before.

// predictMissPause is how long a partition is not guessed after a wrong guess.
const predictMissPause = time.Second

// maxPredicted bounds the partitions an instance keeps guesses for; past it they are forgotten
// (the next append of each takes its rows first and is remembered again).
const maxPredicted = 1 << 16

// errPredictionMissed: a lane transaction's guessed offsets were not the partition's; nothing was
// written, its calls queue again.
var errPredictionMissed = errors.New("pgstore: the partition moved since its last append")

// predictMarker is the text takePredictedSQL fails to cast when the guess was wrong; goneMarker
// when the partition row is gone or its gen changed (no row updated).
const (
	predictMarker = "spool: partition moved"
	goneMarker    = "spool: partition row gone"
)

type partKey struct {
	topic     int64
	partition int32
}

// partNext is where a partition stood after this instance's last append to it.
type partNext struct {
	next int64
	at   time.Time
}

// predictions holds the instance's guesses (see above).
type predictions struct {
	mu     sync.Mutex
	next   map[partKey]partNext
	missed map[partKey]time.Time
	// off: no guesses (tests of the lanes' order with the rows taken first).
	off bool
}

// guess sets the offsets of plan's shares (first) and the rows' publish time (at, one for all) when
// every partition of plan is known and none missed lately, and reports whether it did.
func (pr *predictions) guess(plan *appendPlan, now time.Time) bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.off {
		return false
	}
	at := now
	for _, s := range plan.shares {
		k := partKey{plan.topic.id, s.partition}
		n, ok := pr.next[k]
		if !ok {
			return false
		}
		if t, ok := pr.missed[k]; ok {
			if !now.Before(t) && now.Sub(t) < predictMissPause {
				return false
			}
			delete(pr.missed, k)
		}
		if n.at.After(at) {
			at = n.at
		}
	}
	for _, s := range plan.shares {
		s.first = pr.next[partKey{plan.topic.id, s.partition}].next
		s.at = at
	}
	return true
}

// took records where plan's partitions stand once its transaction holds their rows: the next
// append of the lane guesses from it (it fails if this one does not commit, see laneTurn).
func (pr *predictions) took(plan *appendPlan) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.next == nil || len(pr.next) >= maxPredicted {
		pr.next = map[partKey]partNext{}
	}
	for _, s := range plan.shares {
		pr.next[partKey{plan.topic.id, s.partition}] = partNext{next: s.first + int64(len(s.idx)), at: s.at}
	}
}

// failed forgets plan's partitions after its transaction failed (whatever it had guessed or
// taken); missed pauses their guesses too.
func (pr *predictions) failed(plan *appendPlan, missed bool, now time.Time) {
	if plan == nil {
		return
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	for _, s := range plan.shares {
		k := partKey{plan.topic.id, s.partition}
		delete(pr.next, k)
		if missed {
			if pr.missed == nil || len(pr.missed) >= maxPredicted {
				pr.missed = map[partKey]time.Time{}
			}
			pr.missed[k] = now
		}
	}
}

// forgetTopic drops the guesses of a topic that changed.
func (pr *predictions) forgetTopic(id int64) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	for k := range pr.next {
		if k.topic == id {
			delete(pr.next, k)
		}
	}
}

// insertPredictedSQL inserts a batch at the offsets guessed ($3, per row) with the publish time
// $12; otherwise as insertMessagesSQL (whose parameter numbers it keeps).
const insertPredictedSQL = `INSERT INTO spool.messages
	(topic_id, partition, "offset", published_at, key, headers, payload, producer_id, not_before, expires_at, size, linked)
SELECT $1, v.partition, v.off, $12::timestamptz, v.key, v.headers::jsonb,
	substring($14::bytea FROM v.pstart FOR v.plen), v.producer_id, v.not_before, v.expires_at, v.size, v.linked
FROM unnest($2::int[], $3::bigint[], $4::bytea[], $5::text[], $6::int[], $13::int[], $7::text[], $8::timestamptz[], $9::timestamptz[], $10::int[], $11::bool[])
	AS v(partition, off, key, headers, pstart, plen, producer_id, not_before, expires_at, size, linked)`

// takePredictedSQL is takeOffsetsSQL for rows inserted at guessed offsets: it also fails the
// statement (and so the transaction) when the partition's next offset before it was not $8 or its
// last publish time was after $4 (the rows' time, so greatest() returns it), and when no row was
// updated (the row is gone, or its gen is not $7), since the rows are already inserted.
const takePredictedSQL = `WITH u AS (UPDATE spool.partitions SET
	next_offset = next_offset + $3,
	last_published_at = greatest(last_published_at, $4::timestamptz),
	low_published_at = coalesce(low_published_at, greatest(last_published_at, $4::timestamptz)),
	bytes = bytes + $5
WHERE topic_id = $1 AND partition = $2 AND ($7::bigint IS NULL OR gen = $7::bigint)
RETURNING next_offset - $3 AS first, last_published_at AS at, pg_current_xact_id()::text AS xid,
	CASE WHEN $6::text IS NOT NULL AND pg_xact_status($6::text::xid8) IS DISTINCT FROM 'committed' THEN '` + laneMarker + `'
		WHEN next_offset - $3 <> $8::bigint OR last_published_at <> $4::timestamptz THEN '` + predictMarker + `'
		ELSE '1' END AS ok)
SELECT u.first, u.at, u.xid, coalesce(u.ok, '` + goneMarker + `')::int FROM (VALUES (1)) AS one LEFT JOIN u ON true`
