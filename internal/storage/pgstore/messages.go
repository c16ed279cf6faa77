package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
)

// messageOverhead is added to a message's Size in spool.partitions.bytes (TopicStats.Bytes,
// RetentionResult.BytesDeleted): roughly the tuple header and the fixed-width columns of its row.
const messageOverhead = 64

// appendSize is Message.Size of an AppendMessage: key, header names and values, payload.
func appendSize(m *storage.AppendMessage) int {
	n := len(m.Key) + len(m.Payload)
	for k, v := range m.Headers {
		n += len(k) + len(v)
	}
	return n
}

// pgText reports whether s can be stored in a PostgreSQL text or jsonb string: valid UTF-8
// without NUL.
func pgText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// partShare is the share of one partition in an append.
type partShare struct {
	partition int32
	idx       []int // positions in the batch
	bytes     int64
	first     int64
	at        time.Time
}

// appendPlan is a validated append: the topic row and the messages grouped by partition, in
// ascending partition order (the lock order of spool.partitions rows).
type appendPlan struct {
	topic *topicRow
	// guard: the topic was not loaded but remembered; takeOffsetsSQL checks its partition rows'
	// gen.
	guard bool
	// seq orders the transaction after the one before in its lane (nil: none).
	seq *appendSeq
	// predicted: the rows go in first at the offsets guessed (each share's first) with the
	// publish time guessed (every share's at), and the partitions' rows are taken last
	// (appendpredict.go).
	predicted bool
	shares    []*partShare
	// rows are the column arrays of the INSERT, in batch order.
	partition  []int32
	back       []int64 // offset = partition's new next_offset - back
	key        [][]byte
	headers    []*string
	payload    [][]byte
	producerID []*string
	notBefore  []pgtype.Timestamptz
	expiresAt  []pgtype.Timestamptz
	size       []int32
	linked     []bool
	// linkedOf is the Linked bit of each message of the batch, by batch index (nil: none).
	linkedOf []bool
	// stored counts the rows: the messages that are not duplicates.
	stored int
	// Producer ids claimed by this append and their rows' positions (setPositionsSQL).
	idID   []string
	idPart []int32
	idBack []int64
	// newIDs counts the claimed ids that are new rows of spool.producer_ids; xid is the
	// transaction's id once it took offsets (appendInTx): after its commit, the instance adds
	// newIDs to its estimate of the table (idCount).
	newIDs int64
	xid    string
	// dups: the messages not stored, by batch index; dupOf[i] >= 0 for an earlier message of the
	// batch with the same id, else dupPos[i] is the stored message's position.
	dups   []bool
	dupOf  []int
	dupPos []storage.MessagePosition
}

// prepareAppend validates what does not need the topic and ensures the bucket of the publish
// time, which it returns (outside any transaction: see ensureBucket).
func (e *Engine) prepareAppend(ctx context.Context, p *storage.MessagesAppendParams) (time.Time, error) {
	if err := validateAppend(p); err != nil {
		return time.Time{}, err
	}
	if err := e.checkOpen(); err != nil {
		return time.Time{}, err
	}
	now := e.clockNow()
	if err := e.ensureBucket(ctx, now); err != nil {
		return time.Time{}, err
	}
	return now, nil
}

// validateAppend checks the parameters that do not need the topic.
func validateAppend(p *storage.MessagesAppendParams) error {
	if p == nil || len(p.Messages) == 0 {
		return invalid("no messages to append")
	}
	if err := names.ValidateTopic(p.Topic); err != nil {
		return validName(err)
	}
	for i := range p.Messages {
		m := &p.Messages[i]
		for k, v := range m.Headers {
			if !pgText(k) || !pgText(v) {
				return invalid("message %d: header %q: names and values must be valid UTF-8 without NUL", i, k)
			}
		}
		if !pgText(m.ProducerID) {
			return invalid("message %d: producer id must be valid UTF-8 without NUL", i)
		}
		if len(m.ProducerID) > storage.MaxProducerIDLen {
			return invalid("message %d: producer id is %d bytes, at most %d allowed", i, len(m.ProducerID), storage.MaxProducerIDLen)
		}
	}
	return nil
}

// defaultDedupWindowNS is storage.DefaultDedupWindow in the SQL of topics whose config has no
// dedup_window (created before it existed).
var defaultDedupWindowNS = strconv.FormatInt(int64(storage.DefaultDedupWindow), 10)

// claimIDsSQL claims the producer ids $2 (distinct, sorted: the lock order of the rows) of topic
// $1 at $3 (see migrations/0006_producer_ids.sql): new ids are inserted, expired ones taken over,
// both with partition -1 until setPositionsSQL; it returns the ids claimed, and whether each is a
// new row (xmax 0: inserted, not updated; Config.MaxProducerIDs counts rows). Any other id is a
// duplicate (dupPositionsSQL). A row another transaction holds is waited for, at most
// claimLockTimeout (loadTopicClaim): one an application's transaction claimed and has not ended
// (PublishTx, spool.publish) would otherwise hold up the append, and the topic's publishes
// combined with or queued behind it, for as long as that transaction stays open.
var claimIDsSQL = `INSERT INTO spool.producer_ids AS d (topic_id, producer_id, expires_at, partition, "offset", published_at)
SELECT t.id, v.id, $3::timestamptz + coalesce(nullif((t.config->>'dedup_window')::bigint, 0), ` + defaultDedupWindowNS + `) / 1000 * interval '1 microsecond',
	-1, -1, $3::timestamptz
FROM spool.topics t CROSS JOIN unnest($2::text[]) AS v(id)
WHERE t.name = $1
ORDER BY v.id
ON CONFLICT (topic_id, producer_id) DO UPDATE
	SET expires_at = excluded.expires_at, partition = -1, "offset" = -1, published_at = excluded.published_at
	WHERE d.expires_at <= $3::timestamptz
RETURNING d.producer_id, d.xmax = 0`

// claimLockTimeout bounds the wait of claimIDsSQL for a producer id's row that another
// transaction holds (lock_timeout).
const claimLockTimeout = "1s"

// errProducerIDHeld marks the claim of a producer id whose row another transaction held past
// claimLockTimeout: a combined append's calls run again alone (rerunAlone), and the one with that
// id fails with storage.ErrUnavailable (retryable).
var errProducerIDHeld = errors.New("pgstore: a producer id of the publish is held by an open transaction")

// claimErr wraps an error of claimIDsSQL: a lock timeout becomes errProducerIDHeld.
func claimErr(topic string, err error) error {
	if pgCode(err) == "55P03" { // lock_not_available
		return &storage.IOError{Kind: storage.ErrUnavailable, Reason: "a producer id of the publish is being published by an open transaction, retry",
			Err: fmt.Errorf("%w (topic %q): %w", errProducerIDHeld, topic, err)}
	}
	return fmt.Errorf("pgstore: claim producer ids of %q: %w", topic, err)
}

// dupPositionsSQL reads the positions of the ids of $2 that claimIDsSQL did not claim (run right
// after it in the same transaction: its own claims still have partition -1).
const dupPositionsSQL = `SELECT d.producer_id, d.partition, d."offset", d.published_at
FROM spool.producer_ids d JOIN spool.topics t ON t.id = d.topic_id
WHERE t.name = $1 AND d.producer_id = ANY($2::text[]) AND d.partition >= 0`

// setPositionsSQL records the positions of the messages whose ids the append claimed, computed
// like insertMessagesSQL's offsets (for the sequencer, of the staged messages whose ids their
// transaction claimed: rows still without an offset).
const setPositionsSQL = `UPDATE spool.producer_ids d SET partition = v.partition, "offset" = p.next_offset - v.back,
	published_at = p.last_published_at
FROM unnest($2::text[], $3::int[], $4::bigint[]) AS v(id, partition, back)
JOIN spool.partitions p ON p.topic_id = $1 AND p.partition = v.partition
WHERE d.topic_id = $1 AND d.producer_id = v.id AND d."offset" = -1`

// producerIDs returns the distinct producer ids of a batch, sorted.
func producerIDs(msgs []storage.AppendMessage) []string {
	var ids []string
	for i := range msgs {
		if msgs[i].ProducerID != "" {
			ids = append(ids, msgs[i].ProducerID)
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// loadTopicClaim is loadTopic (FOR SHARE) and, in the same round trip, the claim of the batch's
// producer ids: it returns the topic, the ids claimed, the positions of the others and how many
// of the claimed ids are new rows.
func (e *Engine) loadTopicClaim(ctx context.Context, tx pgx.Tx, name string, ids []string, now time.Time) (*topicRow, map[string]bool, map[string]storage.MessagePosition, int64, error) {
	b := &pgx.Batch{}
	b.Queue(e.sql("SELECT id, name, config, created_at, gen FROM spool.topics WHERE name = $1"+forShare.clause()), name)
	b.Queue("SET LOCAL lock_timeout = '" + claimLockTimeout + "'")
	b.Queue(e.sql(claimIDsSQL), name, ids, now)
	b.Queue("SET LOCAL lock_timeout TO DEFAULT")
	b.Queue(e.sql(dupPositionsSQL), name, ids)
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	var t topicRow
	var cfg []byte
	err := br.QueryRow().Scan(&t.id, &t.name, &cfg, &t.createdAt, &t.gen)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, nil, 0, fmt.Errorf("%w: %q", storage.ErrTopicNotFound, name)
	}
	if err != nil {
		return nil, nil, nil, 0, fmt.Errorf("pgstore: load topic %q: %w", name, err)
	}
	if err := json.Unmarshal(cfg, &t.cfg); err != nil {
		return nil, nil, nil, 0, fmt.Errorf("%w: topic %q: config: %v", storage.ErrCorrupt, name, err)
	}
	if _, err := br.Exec(); err != nil {
		return nil, nil, nil, 0, fmt.Errorf("pgstore: claim producer ids of %q: %w", name, err)
	}
	claimed := map[string]bool{}
	rows, err := br.Query()
	if err != nil {
		return nil, nil, nil, 0, claimErr(name, err)
	}
	var inserted int64
	for rows.Next() {
		var id string
		var isNew bool
		if err := rows.Scan(&id, &isNew); err != nil {
			rows.Close()
			return nil, nil, nil, 0, fmt.Errorf("pgstore: claim producer ids of %q: %w", name, err)
		}
		claimed[id] = true
		if isNew {
			inserted++
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, nil, 0, claimErr(name, err)
	}
	if _, err := br.Exec(); err != nil {
		return nil, nil, nil, 0, fmt.Errorf("pgstore: claim producer ids of %q: %w", name, err)
	}
	known := map[string]storage.MessagePosition{}
	rows, err = br.Query()
	if err != nil {
		return nil, nil, nil, 0, fmt.Errorf("pgstore: read producer ids of %q: %w", name, err)
	}
	for rows.Next() {
		var id string
		var pos storage.MessagePosition
		if err := rows.Scan(&id, &pos.Partition, &pos.Offset, &pos.PublishedAt); err != nil {
			rows.Close()
			return nil, nil, nil, 0, fmt.Errorf("pgstore: read producer ids of %q: %w", name, err)
		}
		pos.PublishedAt = pos.PublishedAt.UTC()
		if pos.Offset < 0 {
			pos.PublishedAt = time.Time{} // staged (PublishTx, spool.publish), not sequenced yet
		}
		pos.Duplicate = true
		known[id] = pos
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, nil, 0, fmt.Errorf("pgstore: read producer ids of %q: %w", name, err)
	}
	return &t, claimed, known, inserted, nil
}

// planAppend loads and locks the topic (FOR SHARE: it cannot change or go away until the
// transaction ends), claims the batch's producer ids (in the same round trip), validates the
// batch against the topic's configuration and assigns partitions to the messages that are not
// duplicates.
//
// calls, when not nil, holds the index in p.Messages where each combined call starts (ascending,
// calls[0] == 0): the keyless messages of each call go together to a partition of their own, as
// they would alone.
//
// remembered, when not nil, is the topic as an earlier append loaded it (rememberTopic): a batch
// without producer ids for a topic that does not block writes without subscriptions is planned
// from it without a round trip, and appendInTx checks in the same round trip as the writes that
// the topic is still what it was (takeOffsetsSQL's gen; errTopicChanged otherwise, nothing
// written).
func (e *Engine) planAppend(ctx context.Context, tx pgx.Tx, p *storage.MessagesAppendParams, now time.Time, calls []int, remembered *topicRow) (*appendPlan, error) {
	var t *topicRow
	var claimed map[string]bool
	var known map[string]storage.MessagePosition
	var inserted int64
	var err error
	ids := producerIDs(p.Messages)
	guard := remembered != nil && len(ids) == 0 && !blocksWrites(remembered.cfg.WithDefaults())
	switch {
	case guard:
		t = remembered
	case len(ids) > 0:
		t, claimed, known, inserted, err = e.loadTopicClaim(ctx, tx, p.Topic, ids, now.Truncate(time.Microsecond))
	default:
		t, err = e.loadTopic(ctx, tx, p.Topic, forShare)
	}
	if err != nil {
		return nil, err
	}
	if !guard {
		e.rememberTopic(t)
	}
	cfg := t.cfg.WithDefaults()
	n := cfg.Partitions
	msgs := p.Messages
	for i := range msgs {
		m := &msgs[i]
		size := appendSize(m)
		outOfRange := m.Partition != storage.PartitionAuto && (m.Partition < 0 || int(m.Partition) >= n)
		if guard && (size > cfg.MaxMessageBytes || outOfRange) {
			return nil, errTopicChanged // the topic as it is now decides (a grown topic takes it)
		}
		if size > cfg.MaxMessageBytes {
			return nil, fmt.Errorf("%w: message %d of the batch is %d bytes, topic %q allows %d",
				storage.ErrMessageTooLarge, i, size, p.Topic, cfg.MaxMessageBytes)
		}
		if outOfRange {
			return nil, invalid("message %d: partition %d out of range, topic %q has %d", i, m.Partition, p.Topic, n)
		}
	}
	if blocksWrites(cfg) {
		var active bool
		if err := tx.QueryRow(ctx, e.sql("SELECT EXISTS (SELECT 1 FROM spool.subscriptions WHERE topic_id = $1 AND state = 'ACTIVE')"),
			t.id).Scan(&active); err != nil {
			return nil, fmt.Errorf("pgstore: append to %q: %w", p.Topic, err)
		}
		if !active {
			return nil, fmt.Errorf("%w: topic %q", storage.ErrNoSubscriptions, p.Topic)
		}
	}
	// New ids past Config.MaxProducerIDs: refused, the transaction writes nothing.
	if err := e.checkNewIDs(p.Topic, inserted); err != nil {
		return nil, err
	}

	plan := &appendPlan{topic: t, guard: guard, newIDs: inserted}
	if claimed != nil {
		plan.dups = make([]bool, len(msgs))
		plan.dupOf = make([]int, len(msgs))
		plan.dupPos = make([]storage.MessagePosition, len(msgs))
		first := map[string]int{}
		for i := range msgs {
			plan.dupOf[i] = -1
			id := msgs[i].ProducerID
			if id == "" {
				continue
			}
			if j, ok := first[id]; ok {
				plan.dups[i], plan.dupOf[i] = true, j
				continue
			}
			first[id] = i
			if claimed[id] {
				continue
			}
			pos, ok := known[id]
			if !ok {
				return nil, fmt.Errorf("pgstore: append to %q: producer id %q neither claimed nor found", p.Topic, id)
			}
			plan.dups[i], plan.dupPos[i] = true, pos
		}
	}
	byPart := map[int32]*partShare{}
	keyless := int32(-1)
	nextCall := 1 // index in calls of the next call's start
	for i := range msgs {
		if nextCall < len(calls) && i == calls[nextCall] {
			keyless = -1 // the next call's keyless messages pick a partition of their own
			nextCall++
		}
		if plan.dups != nil && plan.dups[i] {
			continue
		}
		m := &msgs[i]
		part := m.Partition
		if part == storage.PartitionAuto {
			if len(m.Key) > 0 {
				part = storage.PartitionForKey(m.Key, n)
			} else {
				if keyless < 0 {
					keyless = int32((e.bucket.rr.Add(1) - 1) % uint32(n))
				}
				part = keyless
			}
		}
		s := byPart[part]
		if s == nil {
			s = &partShare{partition: part}
			byPart[part] = s
			plan.shares = append(plan.shares, s)
		}
		s.idx = append(s.idx, i)
	}
	slices.SortFunc(plan.shares, func(a, b *partShare) int { return int(a.partition) - int(b.partition) })
	plan.linkedOf = planLinks(msgs, plan.shares, calls)

	// The rows, in share order (a row's offset comes from its partition and back, not its place).
	k := 0
	for _, s := range plan.shares {
		k += len(s.idx)
	}
	plan.stored = k
	plan.partition = make([]int32, k)
	plan.back = make([]int64, k)
	plan.key = make([][]byte, k)
	plan.headers = make([]*string, k)
	plan.payload = make([][]byte, k)
	plan.producerID = make([]*string, k)
	plan.notBefore = make([]pgtype.Timestamptz, k)
	plan.expiresAt = make([]pgtype.Timestamptz, k)
	plan.size = make([]int32, k)
	plan.linked = make([]bool, k)
	r := 0
	for _, s := range plan.shares {
		for j, i := range s.idx {
			m := &msgs[i]
			size := appendSize(m)
			s.bytes += int64(size + messageOverhead)
			plan.partition[r] = s.partition
			plan.back[r] = int64(len(s.idx) - j)
			plan.key[r] = m.Key
			if len(m.Headers) > 0 {
				b, err := json.Marshal(m.Headers)
				if err != nil {
					return nil, invalid("message %d: headers: %v", i, err)
				}
				h := string(b)
				plan.headers[r] = &h
			}
			if m.Payload == nil {
				plan.payload[r] = []byte{}
			} else {
				plan.payload[r] = m.Payload
			}
			if m.ProducerID != "" {
				plan.producerID[r] = &m.ProducerID
				plan.idID = append(plan.idID, m.ProducerID)
				plan.idPart = append(plan.idPart, s.partition)
				plan.idBack = append(plan.idBack, plan.back[r])
			}
			plan.notBefore[r] = optTime(m.NotBefore)
			plan.expiresAt[r] = optTime(m.ExpiresAt)
			plan.size[r] = int32(size)
			plan.linked[r] = plan.linkedOf[i]
			r++
		}
	}
	return plan, nil
}

// blocksWrites reports whether appends to a topic of configuration cfg must find an ACTIVE
// subscription.
func blocksWrites(cfg storage.TopicConfig) bool {
	return cfg.Semantics == storage.PubSub && cfg.BlockWritesOnZeroSubscriptions
}

func optTime(t time.Time) pgtype.Timestamptz {
	if t.IsZero() {
		return pgtype.Timestamptz{}
	}
	return pgtype.Timestamptz{Time: t, Valid: true}
}

// takeOffsetsSQL reserves n offsets of one partition and moves its publish time forward: the
// message time is max(now, last_published_at), so published_at never decreases in a partition.
// The row lock it takes is held until the transaction ends: the next publisher to the partition
// waits, which is what keeps the visible offsets a gapless prefix. It returns the transaction's
// id too. When $6 is not null, the transaction $6 (the one of the lane that held the row before,
// see laneTurn; it has ended once this one has the row) must have committed: else the text
// laneMarker cast to int fails the statement (22P02), which aborts the rest of the pipeline,
// COMMIT included. When $7 is not null (a plan made from a remembered topic), the row must still
// have gen $7 (migration 0018), checked on the row as it is once locked: if it changed or went
// away, no row is returned, and insertMessagesSQL, given the same gen, inserts nothing.
const takeOffsetsSQL = `UPDATE spool.partitions SET
	next_offset = next_offset + $3,
	last_published_at = greatest(last_published_at, $4::timestamptz),
	low_published_at = coalesce(low_published_at, greatest(last_published_at, $4::timestamptz)),
	bytes = bytes + $5
WHERE topic_id = $1 AND partition = $2 AND ($7::bigint IS NULL OR gen = $7::bigint)
RETURNING next_offset - $3, last_published_at, pg_current_xact_id()::text,
	(CASE WHEN $6::text IS NULL OR pg_xact_status($6::text::xid8) = 'committed' THEN '1' ELSE '` + laneMarker + `' END)::int`

// laneMarker is the text takeOffsetsSQL fails to cast when the transaction before did not commit.
const laneMarker = "spool: lane broken"

// errLaneBroken: the transaction before in the lane did not commit: nothing was written, the
// calls queue again (laneTurn).
var errLaneBroken = errors.New("pgstore: the publish transaction before did not commit")

// appendSeq orders an append transaction after the one before in its lane (laneTurn): per
// partition, the id of the lane's transaction that held the row before (it must have committed),
// the end of the one before (the cache is filled in offset order), and the function told this
// transaction's id per partition once it holds their rows. Nil for an append of its own.
type appendSeq struct {
	expect map[int32]string
	prev   <-chan struct{}
	took   func(after map[int32]string)
}

// insertMessagesSQL inserts a batch; each row's offset is computed from its partition's (already
// advanced) next_offset, and its published_at is the partition's last_published_at. With $12
// (takeOffsetsSQL's gen) only into partitions whose row has that gen: the rows takeOffsetsSQL
// locked, or none (a topic changed since its plan: nothing is written, the COMMIT sent with it
// commits an empty transaction). The payloads come as one bytea, $14, each row's from its start
// (1-based) and length in $6 and $13 (concatPayloads): pgx encodes a bytea[] element by element
// through reflection, growing its buffer as it goes, and that encoding lies on the lane's
// critical path. $14 is the last parameter, so that pgx's parameter buffer grows once for it.
const insertMessagesSQL = `INSERT INTO spool.messages
	(topic_id, partition, "offset", published_at, key, headers, payload, producer_id, not_before, expires_at, size, linked)
SELECT $1, v.partition, p.next_offset - v.back, p.last_published_at, v.key, v.headers::jsonb,
	substring($14::bytea FROM v.pstart FOR v.plen), v.producer_id, v.not_before, v.expires_at, v.size, v.linked
FROM unnest($2::int[], $3::bigint[], $4::bytea[], $5::text[], $6::int[], $13::int[], $7::text[], $8::timestamptz[], $9::timestamptz[], $10::int[], $11::bool[])
	AS v(partition, back, key, headers, pstart, plen, producer_id, not_before, expires_at, size, linked)
JOIN spool.partitions p ON p.topic_id = $1 AND p.partition = v.partition AND ($12::bigint IS NULL OR p.gen = $12::bigint)`

// concatPayloads returns payloads one after the other, with the start (1-based) and length of
// each (insertMessagesSQL's $14, $6 and $13).
func concatPayloads(payloads [][]byte) (cat []byte, starts, lens []int32) {
	total := 0
	for _, pl := range payloads {
		total += len(pl)
	}
	cat = make([]byte, 0, total)
	starts, lens = make([]int32, len(payloads)), make([]int32, len(payloads))
	for i, pl := range payloads {
		starts[i], lens[i] = int32(len(cat))+1, int32(len(pl))
		cat = append(cat, pl...)
	}
	return cat, starts, lens
}

// errTopicChanged: the topic a plan was made from (a remembered one) changed or went away before
// the append's transaction locked its partition rows; nothing was written.
var errTopicChanged = errors.New("pgstore: topic changed since it was remembered")

// appendInTx appends a validated plan inside tx, in one round trip: one UPDATE per partition (in
// partition order; for a plan made from a remembered topic, checking the topic's gen), one
// INSERT for the whole batch and, when notify is not empty, a pg_notify of that payload
// (delivered when tx commits). It returns the positions and records the publish time of each
// partition in the plan.
func (e *Engine) appendInTx(ctx context.Context, tx pgx.Tx, plan *appendPlan, nmsgs int, now time.Time, notify string) (*storage.MessagesAppendResult, error) {
	now = now.Truncate(time.Microsecond)
	res := &storage.MessagesAppendResult{Positions: make([]storage.MessagePosition, nmsgs)}
	if plan.stored == 0 {
		// Duplicates only: nothing to write (a pipelined transaction still sends its COMMIT).
		if pt, ok := tx.(*pipeTx); ok {
			if err := pt.SendBatch(ctx, &pgx.Batch{}).Close(); err != nil {
				return nil, err
			}
		}
		plan.fillDups(res)
		return res, nil
	}
	b := &pgx.Batch{}
	var gen *int64
	if plan.guard {
		gen = &plan.topic.gen
	}
	expect := func(s *partShare) *string {
		if plan.seq != nil {
			if x, ok := plan.seq.expect[s.partition]; ok {
				return &x
			}
		}
		return nil
	}
	cat, starts, lens := concatPayloads(plan.payload)
	if plan.predicted {
		// The rows first, at the offsets guessed; the partitions' rows last (appendpredict.go).
		at := plan.shares[0].at // the same for every share (guess)
		offs := make([]int64, len(plan.back))
		r := 0
		for _, s := range plan.shares {
			for j := range s.idx {
				offs[r] = s.first + int64(j)
				r++
			}
		}
		b.Queue(e.sql(insertPredictedSQL), plan.topic.id, plan.partition, offs, plan.key, plan.headers, starts,
			plan.producerID, plan.notBefore, plan.expiresAt, plan.size, plan.linked, at, lens, cat)
		for _, s := range plan.shares {
			b.Queue(e.sql(takePredictedSQL), plan.topic.id, s.partition, int64(len(s.idx)), at, s.bytes, expect(s), gen, s.first)
		}
	} else {
		for _, s := range plan.shares {
			b.Queue(e.sql(takeOffsetsSQL), plan.topic.id, s.partition, int64(len(s.idx)), now, s.bytes, expect(s), gen)
		}
		b.Queue(e.sql(insertMessagesSQL), plan.topic.id, plan.partition, plan.back, plan.key, plan.headers, starts,
			plan.producerID, plan.notBefore, plan.expiresAt, plan.size, plan.linked, gen, lens, cat)
	}
	if len(plan.idID) > 0 {
		b.Queue(e.sql(setPositionsSQL), plan.topic.id, plan.idID, plan.idPart, plan.idBack)
	}
	if notify != "" {
		b.Queue("SELECT pg_notify($1, $2)", e.channel(), notify)
	}
	var br pgx.BatchResults
	if pt, ok := tx.(*pipeTx); ok && plan.seq != nil && plan.seq.took != nil {
		// The UPDATEs' results come back as soon as they ran (the rows are held): the lane's next
		// transaction starts then (laneTurn).
		n := len(plan.shares)
		if plan.predicted {
			n++ // the INSERT's
		}
		var err error
		if br, err = pt.sendFlushed(ctx, b, n); err != nil {
			return nil, err
		}
	} else {
		br = tx.SendBatch(ctx, b)
	}
	var tag pgconn.CommandTag
	if plan.predicted {
		var err error
		if tag, err = br.Exec(); err != nil {
			br.Close()
			return nil, err
		}
	}
	var xid string
	for _, s := range plan.shares {
		var at time.Time
		var one int
		if err := br.QueryRow().Scan(&s.first, &at, &xid, &one); err != nil {
			br.Close()
			var pe *pgconn.PgError
			gone := errors.As(err, &pe) && pe.Code == "22P02" && strings.Contains(pe.Message, goneMarker)
			if (gone || errors.Is(err, pgx.ErrNoRows)) && plan.guard {
				return nil, errTopicChanged
			}
			if gone || errors.Is(err, pgx.ErrNoRows) {
				return nil, fmt.Errorf("pgstore: topic %q has no partition %d row", plan.topic.name, s.partition)
			}
			if pe != nil && pe.Code == "22P02" && strings.Contains(pe.Message, laneMarker) {
				return nil, errLaneBroken
			}
			if pe != nil && pe.Code == "22P02" && strings.Contains(pe.Message, predictMarker) {
				return nil, errPredictionMissed
			}
			return nil, err
		}
		s.at = at.UTC()
	}
	plan.xid = xid
	if plan.seq != nil && plan.seq.took != nil {
		e.predict.took(plan)
		after := make(map[int32]string, len(plan.shares))
		for _, s := range plan.shares {
			after[s.partition] = xid
		}
		plan.seq.took(after)
	}
	if !plan.predicted {
		var err error
		if tag, err = br.Exec(); err != nil {
			br.Close()
			return nil, err
		}
	}
	if len(plan.idID) > 0 {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return nil, fmt.Errorf("pgstore: record producer ids: %w", err)
		}
	}
	if notify != "" {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return nil, err
		}
	}
	if err := br.Close(); err != nil {
		return nil, err
	}
	if tag.RowsAffected() != int64(plan.stored) {
		return nil, fmt.Errorf("pgstore: append to %q inserted %d rows of %d", plan.topic.name, tag.RowsAffected(), plan.stored)
	}
	for _, s := range plan.shares {
		for j, i := range s.idx {
			res.Positions[i] = storage.MessagePosition{Partition: s.partition, Offset: s.first + int64(j), PublishedAt: s.at}
		}
	}
	plan.fillDups(res)
	return res, nil
}

// fillDups sets the positions of the messages that were not stored, once the others are known.
func (plan *appendPlan) fillDups(res *storage.MessagesAppendResult) {
	for i, dup := range plan.dups {
		if dup && plan.dupOf[i] < 0 {
			res.Positions[i] = plan.dupPos[i]
		}
	}
	for i, j := range plan.dupOf {
		if j >= 0 {
			res.Positions[i] = res.Positions[j]
			res.Positions[i].Duplicate = true
		}
	}
}

// maxShareTime is the latest publish time of a plan's partitions (after a failed insert: the
// bucket it needs).
func maxShareTime(plan *appendPlan) time.Time {
	var t time.Time
	if plan == nil {
		return t
	}
	for _, s := range plan.shares {
		if s.at.After(t) {
			t = s.at
		}
	}
	return t
}

// recreateBuckets handles an insert that found no bucket: dropped by retention since we learned
// it, or the partition's time is ahead of our clock. It forgets what it knew of the buckets of now
// and of the plan's publish times and ensures them again.
func (e *Engine) recreateBuckets(ctx context.Context, now time.Time, plan *appendPlan) error {
	e.setBucketKnown(e.bucketStart(now), false)
	if err := e.ensureBucket(ctx, now); err != nil {
		return err
	}
	if t := maxShareTime(plan); !t.IsZero() {
		e.setBucketKnown(e.bucketStart(t), false)
		if err := e.ensureBucket(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// isNoPartition reports the error of an insert into spool.messages whose published_at has no
// bucket (or a check violation of a bucket being detached).
func isNoPartition(err error) bool { return pgCode(err) == "23514" }

// MessagesAppend appends a batch of messages to a topic and returns once it committed.
// Everything is validated before anything is written: sizes against max_message_bytes
// (storage.ErrMessageTooLarge), explicit partitions (storage.ErrInvalidArgument), header names,
// values and producer ids that PostgreSQL cannot store as text (valid UTF-8 without NUL) or
// longer than storage.MaxProducerIDLen (storage.ErrInvalidArgument) and, for a PUB_SUB topic with
// block_writes_on_zero_subscriptions, the presence of an ACTIVE subscription
// (storage.ErrNoSubscriptions, checked while the topic row is locked). Messages whose producer id
// the topic saw within its dedup_window are not stored (spool.producer_ids, migrations/0006).
// Keyed messages go to storage.PartitionForKey; the keyless messages of one call go together to
// the next partition in round-robin order. PublishedAt is the engine clock, made
// non-decreasing per partition (also across instances). Safe for concurrent use.
//
// Concurrent calls for the same topic share transactions (appendcombine.go): while one
// transaction of the topic runs, the calls that arrive wait and the next transaction appends all
// of them, each getting the answer it would have got alone. A call that fails on its own (a
// message too large, a bad partition) fails alone.
//
// The call (bucket creation included) is bounded by Config.TxTimeout: past it, the transaction is
// abandoned and rolled back, and the call fails with txTimeout's error (TIMEOUT, retryable). A
// timeout while the batch carrying the COMMIT waits leaves the outcome unknown (see runOps): the
// publisher retries, and the messages without a producer id may then be stored twice, which
// at-least-once allows; those with one are answered as duplicates (planAppend).
func (e *Engine) MessagesAppend(ctx context.Context, p *storage.MessagesAppendParams) (*storage.MessagesAppendResult, error) {
	if err := validateAppend(p); err != nil {
		return nil, err
	}
	return withTxTimeout(e, ctx, "publish", func(ctx context.Context) (*storage.MessagesAppendResult, error) {
		return e.submitAppend(ctx, p)
	})
}

// appendTx appends p (the calls of a combined transaction, see planAppend) in one transaction
// and returns once it committed; the messages go to the cache and the topic is announced.
func (e *Engine) appendTx(ctx context.Context, p *storage.MessagesAppendParams, calls []int, seq *appendSeq) (*storage.MessagesAppendResult, error) {
	now, err := e.prepareAppend(ctx, p)
	if err != nil {
		return nil, err
	}
	var res *storage.MessagesAppendResult
	var topicID int64
	var stored int
	var linkedOf []bool
	var newIDs int64
	var xid string
	remembered := e.rememberedTopic(p.Topic)
	for attempt := 0; ; attempt++ {
		var plan *appendPlan
		// One round trip (BEGIN, the topic's guard, the offsets, the rows and COMMIT) when the
		// topic is remembered and the plan needs nothing from the database (planAppend), else
		// two: BEGIN with the topic's row (and the producer ids' claims), then the rest.
		err := e.pipeTx(ctx, func(tx pgx.Tx) error {
			var err error
			plan, err = e.planAppend(ctx, tx, p, now, calls, remembered)
			if err != nil {
				return err
			}
			finalBatch(tx)
			plan.seq = seq
			if seq != nil && plan.stored > 0 {
				if plan.predicted = e.predict.guess(plan, now.Truncate(time.Microsecond)); plan.predicted {
					e.appendGuesses.Add(1)
				}
			}
			res, err = e.appendInTx(ctx, tx, plan, len(p.Messages), now, "")
			topicID, stored, linkedOf = plan.topic.id, plan.stored, plan.linkedOf
			newIDs, xid = plan.newIDs, plan.xid
			return err
		})
		if err != nil {
			e.predict.failed(plan, errors.Is(err, errPredictionMissed), now)
		}
		if errors.Is(err, errPredictionMissed) {
			// Nothing written; the partitions are not guessed again for a while: take their rows
			// first this time.
			e.appendMisses.Add(1)
			attempt--
			continue
		}
		if errors.Is(err, errTopicChanged) && remembered != nil {
			e.predict.forgetTopic(remembered.id)
			e.forgetTopic(p.Topic)
			remembered = nil
			attempt--
			continue
		}
		if err != nil && attempt == 0 && isNoPartition(err) {
			if err := e.recreateBuckets(ctx, now, plan); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, wrapAppendErr(p.Topic, err)
		}
		break
	}
	e.ids.add(xid, newIDs) // committed
	if seq != nil {
		waitPrev(seq.prev) // the cache takes a partition's messages in offset order
	}
	if stored > 0 {
		e.cacheAppended(topicID, p, res, linkedOf)
		e.announce(storage.Notification{Kind: storage.NotifyMessages, Topic: p.Topic})
	}
	return res, nil
}

// cacheAppended puts the messages an append committed into the message cache, per partition in
// offset order.
func (e *Engine) cacheAppended(topicID int64, p *storage.MessagesAppendParams, res *storage.MessagesAppendResult, linkedOf []bool) {
	if e.cache == nil {
		return
	}
	byPart := map[int32][]*storage.Message{}
	for i, pos := range res.Positions {
		if pos.Duplicate {
			continue // not stored by this append
		}
		m := appendedMessage(p.Topic, &p.Messages[i], pos)
		m.Linked = linkedOf != nil && linkedOf[i]
		byPart[pos.Partition] = append(byPart[pos.Partition], m)
	}
	for part, ms := range byPart {
		// Positions of one partition are in batch order, which is offset order.
		e.cache.put(topicID, part, ms)
	}
}

// wrapAppendErr adds context to errors that are not storage sentinels.
func wrapAppendErr(topic string, err error) error {
	if isStorageErr(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("pgstore: append to topic %q: %w", topic, err)
}

// readBatchBytes bounds the messages one MessagesRead returns by their stored size (key, headers
// and payload), at least one, as one log read of the embedded engine is bounded: Limit 1000 of
// 8 MiB messages is not 8 GB in memory. Callers page on after the last message returned.
const readBatchBytes = storage.ReadBatchBytes

// MessagesRead reads up to Limit (default 100) retained messages of a partition from Offset
// (from the first retained one when Offset is below it), at most readBatchBytes of them (at least
// one), without leasing them, in one statement (one snapshot). An Offset above the high-water
// mark fails with storage.ErrOffsetOutOfRange; at the high-water mark the result is empty. A partition the topic does not have fails with
// storage.ErrInvalidArgument. It does not wait for messages to come. Bounded by Config.TxTimeout
// (past it: TIMEOUT, retryable).
func (e *Engine) MessagesRead(ctx context.Context, p *storage.MessagesReadParams) ([]*storage.Message, error) {
	if p == nil {
		return nil, invalid("nil params")
	}
	if p.Offset < 0 || p.Limit < 0 {
		return nil, invalid("offset and limit must not be negative, got %d and %d", p.Offset, p.Limit)
	}
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	return withTxTimeout(e, ctx, "read", func(ctx context.Context) ([]*storage.Message, error) {
		return e.messagesRead(ctx, p)
	})
}

// messagesRead runs MessagesRead with ctx bounded by Config.TxTimeout.
func (e *Engine) messagesRead(ctx context.Context, p *storage.MessagesReadParams) ([]*storage.Message, error) {
	limit := p.Limit
	if limit == 0 {
		limit = 100
	}
	rows, err := e.pool.Query(ctx, e.sql(`
		SELECT pt.low_offset, pt.next_offset, m.partition, m."offset", m.published_at, m.key, m.headers, m.payload, m.producer_id, m.not_before, m.expires_at
		FROM spool.topics t
		LEFT JOIN spool.partitions pt ON pt.topic_id = t.id AND pt.partition = $2
		LEFT JOIN LATERAL (
			-- The first row, then the next ones while their running size stays within $5.
			SELECT * FROM (
				SELECT m.*, row_number() OVER w AS n, sum(m.size) OVER w AS upto
				FROM spool.messages m
				WHERE m.topic_id = t.id AND m.partition = $2
				  AND m."offset" >= greatest($3, pt.low_offset) AND m."offset" < pt.next_offset
				  AND m.published_at >= coalesce(pt.low_published_at, '-infinity')
				WINDOW w AS (ORDER BY m."offset" ROWS UNBOUNDED PRECEDING)
				ORDER BY m."offset" LIMIT $4
			) m WHERE m.n = 1 OR m.upto <= $5
		) m ON true
		WHERE t.name = $1
		ORDER BY m."offset"`), p.Topic, p.Partition, p.Offset, limit, readBatchBytes)
	if err != nil {
		return nil, e.mapErr(fmt.Errorf("pgstore: read %q partition %d: %w", p.Topic, p.Partition, err))
	}
	defer rows.Close()
	out := []*storage.Message{}
	found := false
	for rows.Next() {
		found = true
		var low, next *int64
		var part *int32
		var off *int64
		var at pgtype.Timestamptz
		var key, headers, payload []byte
		var producerID *string
		var notBefore, expiresAt pgtype.Timestamptz
		if err := rows.Scan(&low, &next, &part, &off, &at, &key, &headers, &payload, &producerID, &notBefore, &expiresAt); err != nil {
			return nil, e.mapErr(fmt.Errorf("pgstore: read %q partition %d: %w", p.Topic, p.Partition, err))
		}
		if low == nil {
			return nil, invalid("partition %d out of range for topic %q", p.Partition, p.Topic)
		}
		if p.Offset > *next {
			return nil, fmt.Errorf("%w: offset %d is above the high-water mark %d of topic %q partition %d",
				storage.ErrOffsetOutOfRange, p.Offset, *next, p.Topic, p.Partition)
		}
		if off == nil {
			continue // no message in range
		}
		m := &storage.Message{Topic: p.Topic, Partition: *part, Offset: *off, PublishedAt: at.Time, Key: key, Payload: payload}
		if err := fillMsg(m, headers, producerID, notBefore, expiresAt); err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, e.mapErr(fmt.Errorf("pgstore: read %q partition %d: %w", p.Topic, p.Partition, err))
	}
	if !found {
		return nil, fmt.Errorf("%w: %q", storage.ErrTopicNotFound, p.Topic)
	}
	return out, nil
}

// TopicStats describes a topic's partitions from spool.partitions: LowOffset is low_offset,
// HighWater next_offset, Bytes the stored size (message Size plus a fixed per-row overhead) of the
// retained messages, Messages the sum of HighWater - LowOffset. Bounded by Config.TxTimeout (past
// it: TIMEOUT, retryable).
func (e *Engine) TopicStats(ctx context.Context, name string) (*storage.TopicStats, error) {
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	return withTxTimeout(e, ctx, "topic stats", func(ctx context.Context) (*storage.TopicStats, error) {
		return e.topicStats(ctx, name)
	})
}

// topicStats runs TopicStats with ctx bounded by Config.TxTimeout.
func (e *Engine) topicStats(ctx context.Context, name string) (*storage.TopicStats, error) {
	rows, err := e.pool.Query(ctx, e.sql(`
		SELECT p.partition, p.low_offset, p.next_offset, p.bytes
		FROM spool.topics t LEFT JOIN spool.partitions p ON p.topic_id = t.id
		WHERE t.name = $1 ORDER BY p.partition`), name)
	if err != nil {
		return nil, e.mapErr(fmt.Errorf("pgstore: topic stats %q: %w", name, err))
	}
	defer rows.Close()
	ts := &storage.TopicStats{Topic: name, Partitions: []storage.PartitionStats{}}
	found := false
	for rows.Next() {
		found = true
		var part *int32
		var low, next, bytes *int64
		if err := rows.Scan(&part, &low, &next, &bytes); err != nil {
			return nil, e.mapErr(fmt.Errorf("pgstore: topic stats %q: %w", name, err))
		}
		if part == nil {
			continue
		}
		ps := storage.PartitionStats{Partition: *part, LowOffset: *low, HighWater: *next, Bytes: *bytes}
		ts.Partitions = append(ts.Partitions, ps)
		ts.Messages += ps.HighWater - ps.LowOffset
		ts.Bytes += ps.Bytes
	}
	if err := rows.Err(); err != nil {
		return nil, e.mapErr(fmt.Errorf("pgstore: topic stats %q: %w", name, err))
	}
	if !found {
		return nil, fmt.Errorf("%w: %q", storage.ErrTopicNotFound, name)
	}
	return ts, nil
}

// planLinks computes the Linked bits of a plan's stored messages, by batch index: each call of a
// combined append (calls: the batch index where each starts; nil: one call) is its own publish
// (storage.LinkRuns), and its share of a partition gets consecutive offsets.
func planLinks(msgs []storage.AppendMessage, shares []*partShare, calls []int) []bool {
	partOf := make([]int32, len(msgs))
	for i := range partOf {
		partOf[i] = -1
	}
	for _, s := range shares {
		for _, i := range s.idx {
			partOf[i] = s.partition
		}
	}
	out := make([]bool, len(msgs))
	bounds := append(slices.Clone(calls), len(msgs))
	if len(calls) == 0 || calls[0] != 0 {
		bounds = append([]int{0}, bounds...)
	}
	for c := 0; c+1 < len(bounds); c++ {
		lo, hi := bounds[c], bounds[c+1]
		l := storage.LinkRuns(hi-lo, func(i int) int32 { return partOf[lo+i] }, func(i int) []byte { return msgs[lo+i].Key })
		copy(out[lo:hi], l)
	}
	return out
}
