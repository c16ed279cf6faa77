package pgstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
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
// transactions run one at a time per schema: each first takes an advisory transaction lock, and
// its DELETE runs after it holds the lock, so it sees every row committed before the previous
// sequencing transaction ended. A message whose transaction committed before another transaction
// staged its message thus gets the lower offset; messages of one transaction keep their order.
// There is no election and no failover: an instance that dies mid-transaction rolls it back and
// the next wake-up of any instance sequences the rows.
//
// The costs: every transactional message is written twice (staged, then logged) and deleted once
// from spool.staged (vacuumed after a fixed number of changes); it becomes visible to consumers
// one sequencing transaction after the commit (a notification and two round trips, a few
// milliseconds; the poll interval when notifications are lost); and its offset is not known to
// the application (PublishTx and spool.publish answer offset -1 / NULL).

// stagedPayload is the notification a staging transaction sends on the schema's channel at
// commit. parsePayload rejects it as malformed, so older instances ignore it.
const stagedPayload = "staged"

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
		b.Queue("SELECT pg_notify($1, $2)", e.channel(), stagedPayload)
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

// sequencerLoop sequences staged messages when woken and every PollInterval, until Close.
func (e *Engine) sequencerLoop() {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-e.bgCtx.Done():
			return
		case <-e.seqWake:
		case <-t.C:
		}
		// Until a transaction finds nothing: one that took rows may have left some (its bounds).
		for e.bgCtx.Err() == nil {
			n, err := e.sequence(e.bgCtx)
			if err != nil {
				if e.bgCtx.Err() == nil {
					e.log.Warn("pgstore: sequencing staged messages failed", "err", err)
				}
				break
			}
			if n == 0 {
				break
			}
		}
	}
}

// takeStagedSQL takes the oldest staged rows (committed ones: the others are invisible), at most
// $1 rows and, past the first, $2 bytes, with their topic's name; a row whose topic or partition
// is gone has a NULL name.
const takeStagedSQL = `WITH s AS (
	DELETE FROM spool.staged WHERE id IN (
		SELECT id FROM (
			SELECT id, size, sum(size) OVER (ORDER BY id) AS upto
			FROM (SELECT id, size FROM spool.staged ORDER BY id LIMIT $1) f) w
		WHERE upto - size < $2)
	RETURNING id, topic_id, partition, key, headers, payload, producer_id, not_before, expires_at, size)
SELECT s.id, s.topic_id, s.partition, s.key, s.headers::text, s.payload, s.producer_id, s.not_before, s.expires_at, s.size,
	(SELECT t.name FROM spool.topics t JOIN spool.partitions p ON p.topic_id = t.id AND p.partition = s.partition
	 WHERE t.id = s.topic_id)
FROM s`

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
	topic      *string
}

// sequence runs one sequencing transaction (bounded by Config.TxTimeout) and returns the number of
// staged rows it took.
func (e *Engine) sequence(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.TxTimeout)
	defer cancel()
	now := e.clock.Now()
	if err := e.ensureBucket(ctx, now); err != nil {
		return 0, err
	}
	for attempt := 0; ; attempt++ {
		var plans []*appendPlan
		var drops []topicDrop
		var n int
		err := e.pipeTx(ctx, func(tx pgx.Tx) error {
			var err error
			plans, drops, n, err = e.sequenceTx(ctx, tx, now)
			return err
		})
		if err != nil && attempt == 0 && isNoPartition(err) {
			for _, plan := range plans {
				if err := e.recreateBuckets(ctx, now, plan); err != nil {
					return 0, err
				}
			}
			continue
		}
		if err != nil {
			return 0, err
		}
		e.seqRows.Add(int64(n))
		for _, d := range drops {
			e.dropped.add(d.topic, d.n)
		}
		for _, plan := range plans {
			e.announce(storage.Notification{Kind: storage.NotifyMessages, Topic: plan.topic.name})
		}
		return n, nil
	}
}

// sequenceTx takes the staged rows under the sequencing lock and appends them, one topic after the
// other in id order (the lock order of the partition rows). It returns the plans appended and the
// number of rows taken.
func (e *Engine) sequenceTx(ctx context.Context, tx pgx.Tx, now time.Time) (plans []*appendPlan, drops []topicDrop, n int, err error) {
	b := &pgx.Batch{}
	b.Queue("SELECT pg_advisory_xact_lock($1)", lockKey(e.schema, "sequencer"))
	b.Queue(e.sql(takeStagedSQL), sequenceBatch, sequenceBytes)
	br := tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, nil, 0, fmt.Errorf("pgstore: sequencer lock: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, nil, 0, fmt.Errorf("pgstore: take staged messages: %w", err)
	}
	var staged []stagedRow
	for rows.Next() {
		var r stagedRow
		if err := rows.Scan(&r.id, &r.topicID, &r.partition, &r.key, &r.headers, &r.payload, &r.producerID,
			&r.notBefore, &r.expiresAt, &r.size, &r.topic); err != nil {
			rows.Close()
			_ = br.Close()
			return nil, nil, 0, fmt.Errorf("pgstore: take staged messages: %w", err)
		}
		staged = append(staged, r)
	}
	rows.Close()
	if err := errors.Join(rows.Err(), br.Close()); err != nil {
		return nil, nil, 0, fmt.Errorf("pgstore: take staged messages: %w", err)
	}
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
		for _, r := range staged[i:j] {
			if r.topic == nil {
				continue // its topic (or partition) was deleted after the commit
			}
			rows = append(rows, r)
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
			return plans, nil, 0, err
		}
	}
	return plans, drops, len(staged), nil
}

// topicDrop is a number of staged messages of a deleted topic that a sequencing transaction
// removed.
type topicDrop struct {
	topic string
	n     int64
}

// stagedPlan is the append plan of one topic's staged rows (sorted by id).
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
