package pgstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/spoolmq/spool/internal/storage"
)

// Transactional publishes (PublishTx, SQL spool.publish) stage their messages in spool.staged
// inside the application's transaction, without an offset and without the partition row lock
// (migrations/0007_staged.sql): an application that publishes and then works for 50 ms no longer
// holds up every other publisher of the partition. Once the application commits, a sequencer moves
// the committed rows into the log: one transaction takes the oldest staged rows (DELETE ...
// RETURNING, which sees committed rows only) and appends them as a broker append does (appendInTx:
// the partition row locks, gapless offsets, the producer ids' positions), then the topics are
// announced.
//
// Every instance runs a sequencer (sequencerLoop), woken by the notification the application's
// transaction sends at commit ("staged") and by a timer (Config.PollInterval). Sequencing
// transactions run one at a time per schema: each first tries an advisory transaction lock
// (pg_try_advisory_xact_lock: an instance that finds it held tries again a few milliseconds
// later instead of blocking a pooled connection, since the holder may not see the rows that woke
// it), and its DELETE runs after it holds the lock, so it sees every row committed before the
// previous sequencing transaction ended. A wake-up ends with the first transaction that took
// fewer rows than its bounds (no extra empty transaction). Rows are taken in staging (id) order
// among the committed ones, per partition: the transaction locks the partition rows of the oldest
// staged rows with SKIP LOCKED and takes only the rows of the partitions it holds, so a topic
// whose partition rows are held (a topic delete or update) waits alone and the others go on
// (after a few skips in a row, one transaction waits for the rows: seqSkipsBeforeWait).
// The order between concurrent transactions is thus staging order among committed rows, not
// commit order; a transaction that commits before another one publishes gets the lower offset
// (its row has the lower id and is visible whenever the later one is); messages of one transaction
// keep their order; offsets stay gapless (invariant 2 only needs that per partition). There is no
// election and no failover: an instance that dies mid-transaction rolls it back and the next
// wake-up of any instance sequences the rows.
//
// The costs: every transactional message is written twice (staged, then logged) and deleted once
// from spool.staged (vacuumed after a fixed number of changes); it becomes visible to consumers
// one sequencing transaction after the commit (a notification, or the awake instance's poll, and
// three round trips, a few milliseconds; the poll interval when notifications are lost); and its
// offset is not known to the application (PublishTx and spool.publish answer offset -1 / NULL).

// stagedPayload is the notification a staging transaction sends on the schema's channel at
// commit. parsePayload rejects it as malformed, so older instances ignore it.
const stagedPayload = "staged"

// A NOTIFY takes a database-wide lock at commit, held through the commit's WAL flush: staging
// transactions that all notified committed one after the other, database-wide (migration 0020).
// So an instance whose sequencer took staged messages looks for more every seqPollEvery until
// seqAwakeFor after the last it took, and publishes settings.sequencer_awake_until (seconds since
// the epoch, database clock) a little short of that; a staging transaction notifies only past it
// (stagedNotifySQL, and spool.publish since 0020). One that read the time just before it passed
// and commits after the instance stopped looking waits for the next notification or
// PollInterval. An instance that closes while awake sets the time back; one that dies leaves
// publishers quiet until it passes (the others still look every PollInterval).
const (
	seqPollEvery = 5 * time.Millisecond
	seqAwakeFor  = 5 * time.Second
)

// stagedNotifySQL wakes the sequencers at commit unless one is awake (see seqAwakeFor).
const stagedNotifySQL = `SELECT pg_notify($1, $2) WHERE coalesce((SELECT s.value::double precision
	FROM spool.settings s WHERE s.key = 'sequencer_awake_until'), 0) < extract(epoch FROM clock_timestamp())`

// markAwakeSQL publishes until when this instance looks for staged messages ($1 seconds from now,
// database clock).
const markAwakeSQL = `UPDATE spool.settings SET value = (extract(epoch FROM clock_timestamp()) + $1::double precision)::text
	WHERE key = 'sequencer_awake_until'`

// stagedWaitingSQL tells whether a committed staged message waits (the oldest, by the primary key).
const stagedWaitingSQL = `SELECT EXISTS (SELECT 1 FROM spool.staged ORDER BY id LIMIT 1)`

// sequenceBatch and sequenceBytes bound the staged rows one sequencing transaction takes (the
// first is taken whatever its size).
const (
	sequenceBatch = 4096
	sequenceBytes = 8 << 20
)

// stageSQL inserts a planned batch into spool.staged in plan order (per partition, batch order).
const stageSQL = `INSERT INTO spool.staged (topic_id, partition, key, headers, payload, producer_id, not_before, expires_at, size)
SELECT $1, v.partition, v.key, v.headers::jsonb, v.payload, v.producer_id, v.not_before, v.expires_at, v.size
FROM unnest($2::int[], $3::bytea[], $4::text[], $5::bytea[], $6::text[], $7::timestamptz[], $8::timestamptz[], $9::int[])
	WITH ORDINALITY AS v(partition, key, headers, payload, producer_id, not_before, expires_at, size, ord)
ORDER BY v.ord`

// stageIDsSQL records the partition of the staged messages whose producer ids the batch claimed
// ("offset" stays -1 until sequenced): a duplicate published meanwhile is answered with it.
const stageIDsSQL = `UPDATE spool.producer_ids d SET partition = v.partition
FROM unnest($2::text[], $3::int[]) AS v(id, partition)
WHERE d.topic_id = $1 AND d.producer_id = v.id`

// stageInTx stages a validated plan inside tx, in one round trip, and returns the positions:
// the partitions, offset -1 (assigned when the message is sequenced).
func (e *Engine) stageInTx(ctx context.Context, tx pgx.Tx, plan *appendPlan, nmsgs int) (*storage.MessagesAppendResult, error) {
	res := &storage.MessagesAppendResult{Positions: make([]storage.MessagePosition, nmsgs)}
	if plan.stored > 0 {
		b := &pgx.Batch{}
		b.Queue(e.sql(stageSQL), plan.topic.id, plan.partition, plan.key, plan.headers, plan.payload,
			plan.producerID, plan.notBefore, plan.expiresAt, plan.size)
		if len(plan.idID) > 0 {
			b.Queue(e.sql(stageIDsSQL), plan.topic.id, plan.idID, plan.idPart)
		}
		b.Queue(e.sql(stagedNotifySQL), e.channel(), stagedPayload)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return nil, err
		}
		for _, s := range plan.shares {
			for _, i := range s.idx {
				res.Positions[i] = storage.MessagePosition{Partition: s.partition, Offset: -1}
			}
		}
	}
	plan.fillDups(res)
	return res, nil
}

// wakeSequencer makes the sequencer run (soon) without blocking.
func (e *Engine) wakeSequencer() {
	select {
	case e.seqWake <- struct{}{}:
	default:
	}
}

// seqRetryMin and seqRetryMax bound the wait before the sequencer tries again when another
// instance holds the sequencing lock or a partition row was held elsewhere (doubling in between).
// The cap is short: a partition that broker appends keep busy is free only between two of their
// transactions (under a pipelining lane, hardly ever: see seqSkipsBeforeWait).
const (
	seqRetryMin = 5 * time.Millisecond
	seqRetryMax = 100 * time.Millisecond
)

// sequencerLoop sequences staged messages when woken, every PollInterval, and while awake (see
// seqAwakeFor) whenever one waits, every seqPollEvery; until Close.
func (e *Engine) sequencerLoop() {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.PollInterval)
	defer t.Stop()
	poll := time.NewTicker(seqPollEvery)
	poll.Stop() // ticking only while awake
	defer poll.Stop()
	var awake, told time.Time // looking until awake; sequencer_awake_until says told
	defer func() {
		if time.Now().Before(told) {
			// Closing while publishers stay quiet for this instance: they notify the others again.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if _, err := e.pool.Exec(ctx, e.sql(markAwakeSQL), -1.0); err != nil {
				e.log.Debug("pgstore: mark the sequencer asleep", "err", err)
			}
		}
	}()
	polling := false
	for {
		if polling && !time.Now().Before(awake) {
			poll.Stop()
			polling = false
		}
		var pollC <-chan time.Time
		if polling {
			pollC = poll.C
		}
		select {
		case <-e.bgCtx.Done():
			return
		case <-e.seqWake:
		case <-t.C:
		case <-pollC:
			var waiting bool
			if err := e.pool.QueryRow(e.bgCtx, e.sql(stagedWaitingSQL)).Scan(&waiting); err != nil || !waiting {
				continue
			}
		}
		taken := e.sequenceAll()
		e.seqCycles.Add(1)
		if taken == 0 {
			continue
		}
		now := time.Now()
		awake = now.Add(seqAwakeFor)
		if !polling {
			poll.Reset(seqPollEvery)
			polling = true
		}
		if told.Sub(now) < seqAwakeFor/2 {
			// Publishers stay quiet until a second short of when this instance stops looking.
			if _, err := e.pool.Exec(e.bgCtx, e.sql(markAwakeSQL), (seqAwakeFor - time.Second).Seconds()); err != nil {
				e.log.Debug("pgstore: mark the sequencer awake", "err", err)
				continue
			}
			told = now.Add(seqAwakeFor - time.Second)
		}
	}
}

// seqSkipsBeforeWait is how many sequencing transactions in a row may skip held partition rows
// before one waits for them (takeStagedWaitSQL, at most seqLockTimeout). Skipping alone can
// starve a partition: a busy lane's next transaction already waits for the row when the one
// before commits, PostgreSQL hands it straight over, and the row is free only for an instant.
// The waiting transaction queues behind at most the lane's two transactions; the lane's next one
// queues behind it (its check of the one before, pg_xact_status, does not care about a sequencing
// transaction in between).
const seqSkipsBeforeWait = 3

// seqLockTimeout bounds a waiting sequencing transaction's wait for partition rows (lock_timeout);
// a row held longer (a topic delete or update) fails it, and the transactions after skip again.
const seqLockTimeout = "1s"

// sequenceAll runs sequencing transactions until one takes every committed row it found within
// its bounds. When another instance holds the sequencing lock (its snapshot may predate the rows
// that woke this one) or a partition row was held elsewhere (its rows were left), it tries again
// after a short wait, doubling up to seqRetryMax (bounded by PollInterval), instead of blocking a
// pooled connection on the lock; after seqSkipsBeforeWait transactions in a row that skipped
// held partitions, the next one waits for their rows. It returns how many staged rows it took.
func (e *Engine) sequenceAll() (taken int) {
	wait := seqRetryMin
	skips := 0 // transactions in a row that left rows of held partitions
	for e.bgCtx.Err() == nil {
		block := skips >= seqSkipsBeforeWait
		r, err := e.sequence(e.bgCtx, block)
		taken += r.taken
		if block {
			skips = 0 // a blocking try is followed by skipping ones again
		}
		if pgCode(err) == "55P03" { // lock_not_available: lockTimeout passed waiting for a row
			e.log.Debug("pgstore: sequencer waited too long for a partition row", "err", err)
			err, r = nil, seqRun{cands: 1} // as if skipped: try again after a wait
		}
		if err != nil {
			if e.bgCtx.Err() == nil {
				e.log.Warn("pgstore: sequencing staged messages failed", "err", err)
			}
			return
		}
		switch {
		case r.taken > 0 && r.more():
			wait = seqRetryMin
			continue
		case !r.busy && r.skipped() == 0:
			return
		}
		if r.skipped() > 0 {
			skips++
		}
		timer := time.NewTimer(wait)
		select {
		case <-e.bgCtx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		wait = min(2*wait, seqRetryMax, max(e.cfg.PollInterval, seqRetryMin))
	}
	return taken
}

// seqRun is what one sequencing transaction found.
type seqRun struct {
	busy bool // another transaction held the sequencing lock: nothing was looked at
	// cands: staged rows looked at (the oldest, at most sequenceBatch); eligible: those whose
	// partition row this transaction holds or whose partition is gone; taken: those sequenced or
	// dropped (eligible ones within sequenceBytes).
	cands, eligible, taken int
}

// more reports whether staged rows beyond the transaction's bounds may be waiting.
func (r seqRun) more() bool { return r.cands == sequenceBatch || r.taken < r.eligible }

// skipped is the number of rows left because another transaction held their partition row.
func (r seqRun) skipped() int { return r.cands - r.eligible }

// takeStagedSQL takes the oldest staged rows of the partitions it can lock: it looks at the
// oldest $1 rows (committed ones: the others are invisible), locks their partitions' rows with
// SKIP LOCKED (in topic and partition order; a partition held by a topic delete or update, or an
// append, is left for a later transaction: one locked topic does not stall the others), and
// deletes the rows of the partitions it holds or that are gone, in id order, at most $2 bytes past
// the first. Per partition, the rows taken are a prefix of its staged rows in id order, which is
// all invariant 2 needs. Every result row carries the counts (cands, eligible); without rows
// taken, one row with NULL id. A row whose topic or partition is gone has a NULL name.
const takeStagedSQL = `WITH c AS (
	SELECT id, topic_id, partition, size FROM spool.staged ORDER BY id LIMIT $1),
p AS (
	SELECT p.topic_id, p.partition FROM spool.partitions p
	WHERE (p.topic_id, p.partition) IN (SELECT topic_id, partition FROM c)
	ORDER BY p.topic_id, p.partition
	FOR UPDATE SKIP LOCKED),
e AS (
	SELECT c.id, c.size FROM c
	WHERE EXISTS (SELECT 1 FROM p WHERE p.topic_id = c.topic_id AND p.partition = c.partition)
		OR NOT EXISTS (SELECT 1 FROM spool.partitions x WHERE x.topic_id = c.topic_id AND x.partition = c.partition)),
s AS (
	DELETE FROM spool.staged WHERE id IN (
		SELECT id FROM (SELECT id, size, sum(size) OVER (ORDER BY id) AS upto FROM e) w
		WHERE upto - size < $2)
	RETURNING id, topic_id, partition, key, headers, payload, producer_id, not_before, expires_at, size, xact)
SELECT n.cands, n.eligible, s.id, s.topic_id, s.partition, s.key, s.headers::text, s.payload, s.producer_id, s.not_before, s.expires_at, s.size,
	s.xact::text::bigint,
	(SELECT t.name FROM spool.topics t JOIN spool.partitions p ON p.topic_id = t.id AND p.partition = s.partition
	 WHERE t.id = s.topic_id)
FROM (SELECT (SELECT count(*) FROM c) AS cands, (SELECT count(*) FROM e) AS eligible) n
LEFT JOIN s ON true`

// takeStagedWaitSQL is takeStagedSQL waiting for held partition rows instead of skipping them
// (run under seqLockTimeout; see seqSkipsBeforeWait).
var takeStagedWaitSQL = strings.Replace(takeStagedSQL, "FOR UPDATE SKIP LOCKED", "FOR UPDATE", 1)

// stagedRow is a row of spool.staged.
type stagedRow struct {
	id         int64
	topicID    int64
	partition  int32
	key        []byte
	headers    *string
	payload    []byte
	producerID *string
	notBefore  pgtype.Timestamptz
	expiresAt  pgtype.Timestamptz
	size       int32
	// xact is the staging transaction's id (migrations/0015_staged_xact.sql).
	xact  int64
	topic *string
}

// sequence runs one sequencing transaction (bounded by Config.TxTimeout) and returns what it
// found; with block, it waits for held partition rows (takeStagedWaitSQL).
func (e *Engine) sequence(ctx context.Context, block bool) (seqRun, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.TxTimeout)
	defer cancel()
	now := e.clockNow()
	if err := e.ensureBucket(ctx, now); err != nil {
		return seqRun{}, err
	}
	for attempt := 0; ; attempt++ {
		var plans []*appendPlan
		var drops []topicDrop
		var r seqRun
		err := e.pipeTx(ctx, func(tx pgx.Tx) error {
			var err error
			plans, drops, r, err = e.sequenceTx(ctx, tx, now, block)
			return err
		})
		if err != nil && attempt == 0 && isNoPartition(err) {
			for _, plan := range plans {
				if err := e.recreateBuckets(ctx, now, plan); err != nil {
					return seqRun{}, err
				}
			}
			continue
		}
		if err != nil {
			return seqRun{}, err
		}
		if r.busy {
			e.seqBusy.Add(1)
		} else if r.cands == 0 {
			e.seqEmpty.Add(1)
		}
		if r.skipped() > 0 {
			e.seqSkips.Add(1)
		}
		e.seqRows.Add(int64(r.taken))
		for _, d := range drops {
			e.dropped.add(d.topic, d.n)
		}
		for _, plan := range plans {
			e.announce(storage.Notification{Kind: storage.NotifyMessages, Topic: plan.topic.name})
		}
		return r, nil
	}
}

// sequenceTx takes the sequencing lock if it is free (else it returns busy), then the staged rows
// of the partitions it can lock (takeStagedSQL, run after the lock is held so that it sees every
// row committed before the previous sequencing transaction ended), and appends them, one topic
// after the other in id order (the lock order of the partition rows). It returns the plans
// appended, the rows of deleted topics it dropped and what it found.
func (e *Engine) sequenceTx(ctx context.Context, tx pgx.Tx, now time.Time, block bool) (plans []*appendPlan, drops []topicDrop, r seqRun, err error) {
	var locked bool
	if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", lockKey(e.schema, "sequencer")).Scan(&locked); err != nil {
		return nil, nil, r, fmt.Errorf("pgstore: sequencer lock: %w", err)
	}
	if !locked {
		r.busy = true
		return nil, nil, r, nil
	}
	b := &pgx.Batch{}
	take := takeStagedSQL
	if block {
		// Only the take waits under the short timeout; the appends after it hold their rows.
		b.Queue("SET LOCAL lock_timeout = '" + seqLockTimeout + "'")
		take = takeStagedWaitSQL
	}
	b.Queue(e.sql(take), sequenceBatch, sequenceBytes)
	if block {
		b.Queue("RESET lock_timeout")
	}
	br := tx.SendBatch(ctx, b)
	if block {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, nil, r, err
		}
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, nil, r, fmt.Errorf("pgstore: take staged messages: %w", err)
	}
	var staged []stagedRow
	for rows.Next() {
		var sr stagedRow
		var id, topicID *int64
		var part, size *int32
		var xact *int64
		if err := rows.Scan(&r.cands, &r.eligible, &id, &topicID, &part, &sr.key, &sr.headers, &sr.payload, &sr.producerID,
			&sr.notBefore, &sr.expiresAt, &size, &xact, &sr.topic); err != nil {
			rows.Close()
			_ = br.Close()
			return nil, nil, r, fmt.Errorf("pgstore: take staged messages: %w", err)
		}
		if id == nil {
			continue // none taken
		}
		sr.id, sr.topicID, sr.partition, sr.size, sr.xact = *id, *topicID, *part, *size, *xact
		staged = append(staged, sr)
	}
	rows.Close()
	var resetErr error
	if rows.Err() == nil && block {
		_, resetErr = br.Exec() // RESET
	}
	if err := errors.Join(rows.Err(), resetErr, br.Close()); err != nil {
		return nil, nil, r, fmt.Errorf("pgstore: take staged messages: %w", err)
	}
	r.taken = len(staged)
	slices.SortFunc(staged, func(a, b stagedRow) int {
		if a.topicID != b.topicID {
			return int(a.topicID - b.topicID)
		}
		return int(a.id - b.id)
	})
	for i := 0; i < len(staged); {
		j := i
		for j < len(staged) && staged[j].topicID == staged[i].topicID {
			j++
		}
		var rows []stagedRow
		for _, sr := range staged[i:j] {
			if sr.topic == nil {
				continue // its topic (or partition) was deleted after the commit
			}
			rows = append(rows, sr)
		}
		if len(rows) > 0 {
			plans = append(plans, stagedPlan(rows))
		}
		if dropped := j - i - len(rows); dropped > 0 {
			// TopicDelete deletes a topic's staged rows (or refuses): only a delete by an
			// instance that predates it leaves some. The name is gone with the topic.
			name := fmt.Sprintf("(deleted topic %d)", staged[i].topicID)
			e.log.Warn("pgstore: dropped committed transactional messages of a deleted topic", "topic", name, "messages", dropped)
			drops = append(drops, topicDrop{name, int64(dropped)})
		}
		i = j
	}
	for k, plan := range plans {
		if k == len(plans)-1 {
			finalBatch(tx)
		}
		if _, err := e.appendInTx(ctx, tx, plan, plan.stored, now, ""); err != nil {
			return plans, nil, r, err
		}
	}
	return plans, drops, r, nil
}

// topicDrop is a number of staged messages of a deleted topic that a sequencing transaction
// removed.
type topicDrop struct {
	topic string
	n     int64
}

// stagedPlan is the append plan of one topic's staged rows (sorted by id). Per partition, the
// rows of one staging transaction stay consecutive (transactions in the order of their first
// row, each one's rows in id order) and its runs of one key are linked (storage.LinkRuns): a
// transaction is one publish for per-key batches, within the rows one sequencing transaction
// takes (rows of a partition past its bounds go to the next one: a run is split at that cut).
// Offsets stay gapless; between concurrent transactions the order is still staging order, of
// their first rows.
func stagedPlan(rows []stagedRow) *appendPlan {
	plan := &appendPlan{topic: &topicRow{id: rows[0].topicID, name: *rows[0].topic}}
	byPart := map[int32]*partShare{}
	for i, r := range rows {
		s := byPart[r.partition]
		if s == nil {
			s = &partShare{partition: r.partition}
			byPart[r.partition] = s
			plan.shares = append(plan.shares, s)
		}
		s.idx = append(s.idx, i)
	}
	slices.SortFunc(plan.shares, func(a, b *partShare) int { return int(a.partition) - int(b.partition) })
	for _, s := range plan.shares {
		// Group by transaction, in the order of each one's first row (idx is in id order).
		first := map[int64]int{}
		for k, i := range s.idx {
			if _, ok := first[rows[i].xact]; !ok {
				first[rows[i].xact] = k
			}
		}
		slices.SortStableFunc(s.idx, func(a, b int) int { return first[rows[a].xact] - first[rows[b].xact] })
		linked := make([]bool, 0, len(s.idx))
		for k := 0; k < len(s.idx); {
			run := s.idx[k:]
			n := 0
			for n < len(run) && rows[run[n]].xact == rows[run[0]].xact {
				n++
			}
			linked = append(linked, storage.LinkRuns(n, func(int) int32 { return 0 }, func(i int) []byte { return rows[run[i]].key })...)
			k += n
		}
		for j, i := range s.idx {
			r := &rows[i]
			s.bytes += int64(r.size) + messageOverhead
			plan.partition = append(plan.partition, s.partition)
			plan.back = append(plan.back, int64(len(s.idx)-j))
			plan.key = append(plan.key, r.key)
			plan.headers = append(plan.headers, r.headers)
			plan.payload = append(plan.payload, r.payload)
			plan.producerID = append(plan.producerID, r.producerID)
			plan.notBefore = append(plan.notBefore, r.notBefore)
			plan.expiresAt = append(plan.expiresAt, r.expiresAt)
			plan.size = append(plan.size, r.size)
			plan.linked = append(plan.linked, linked[j])
			if r.producerID != nil {
				plan.idID = append(plan.idID, *r.producerID)
				plan.idPart = append(plan.idPart, s.partition)
				plan.idBack = append(plan.idBack, int64(len(s.idx)-j))
			}
		}
	}
	plan.stored = len(rows)
	return plan
}

// droppedCounts counts staged messages removed before they reached the log, by topic name.
type droppedCounts struct {
	mu sync.Mutex
	n  map[string]int64
}

// add counts n messages of topic removed.
func (d *droppedCounts) add(topic string, n int64) {
	if n <= 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n == nil {
		d.n = map[string]int64{}
	}
	d.n[topic] += n
}

// drain moves the counts into res as expired by storage.ExpiredTopicDeleted, topics by name.
func (d *droppedCounts) drain(res *storage.RetentionResult) {
	d.mu.Lock()
	n := d.n
	d.n = nil
	d.mu.Unlock()
	for _, topic := range slices.Sorted(maps.Keys(n)) {
		res.AddExpired(topic, storage.ExpiredTopicDeleted, n[topic])
	}
}
