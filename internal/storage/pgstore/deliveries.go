package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/policy"
)

// Delivery state in memory: what one delivery operation loads of a subscription (under its
// sub_partitions locks), changes, and writes back in one batch. See migrations/0002_deliveries.sql
// for the tables.

// Row states of spool.deliveries (and spool.dlq.replay).
const (
	stLeased  = "leased"
	stWaiting = "waiting"
	stAcked   = "acked"
)

// dref is a (partition, offset) pair, a map key.
type dref struct {
	p int32
	o int64
}

// drow is a row of spool.deliveries.
type drow struct {
	partition int32
	offsets   []int64 // sorted (rowOf searches them)
	state     string
	attempt   int
	member    string
	due       time.Time
	// failures is the history its offsets share (poison rules: poison.go).
	failures []policy.Failure

	stored  bool  // the row exists in the database
	key     int64 // its lo there
	changed bool
	removed map[int64]bool // offsets taken out of offsets
}

// live returns the offsets of the row that were not removed.
func (r *drow) live() []int64 {
	if len(r.removed) == 0 {
		return r.offsets
	}
	out := make([]int64, 0, len(r.offsets))
	for _, o := range r.offsets {
		if !r.removed[o] {
			out = append(out, o)
		}
	}
	return out
}

// dreplay is a replayed DLQ entry (spool.dlq with replay set).
type dreplay struct {
	id        int64
	partition int32
	offset    int64
	state     string
	attempt   int
	member    string
	due       time.Time
	failures  []policy.Failure // poison rules (poison.go)

	changed bool
	acked   bool // delete the entry
	dead    *dlqOutcome
}

// dlqOutcome is why an entry goes (back) to the DLQ.
type dlqOutcome struct {
	reason  storage.DLQReason
	lastErr string
	attempt int
	// rule is the poison rule that fired (reason poison); failures the history (poison.go).
	rule     storage.PoisonRule
	failures []policy.Failure
}

// dpart is a subscription partition: its sub_partitions row and the topic partition's bounds.
type dpart struct {
	p             int32
	floor, cursor int64
	hw, low       int64
	cursor0       int64 // cursor as loaded
	touched       bool  // floor or cursor may have changed
	// skips are the runs at or above the cursor that a refcount join marked done (skipruns.go),
	// sorted; the cursor jumps over them (newClaim.skipRuns).
	skips [][2]int64
}

// deadItem is a message of the log to copy into the DLQ.
type deadItem struct {
	p int32
	o int64
	dlqOutcome
}

// dstate is the loaded delivery state of one subscription.
type dstate struct {
	sub     *subRow
	cfg     storage.TopicConfig
	parts   []*dpart // partition order
	partOf  map[int32]*dpart
	rows    []*drow // see rowOf
	replays []*dreplay
	replay  map[dref]*dreplay
	dead    []deadItem
	// acked are the refs the operation acked (completion records of refcount topics).
	acked []dref
	// asg is the assignment of an ORDERED subscription (ordered.go), nil before the first one.
	asg *storage.Assignment
	// allRows: the load read every delivery row of the subscription at or above its partitions'
	// floors (every waiting one too), so the save knows the new floors (floors).
	allRows bool
	waiting int // waiting rows loaded
}

// Which delivery rows a load reads.
type loadMode int

const (
	loadDue    loadMode = iota // every row (claims, acks, nacks and extends, which share transactions: combine.go)
	loadMember                 // the member's leased rows (release)
)

// loadState reads subscription id with its topic's configuration, locks its sub_partitions rows
// (FOR UPDATE, partition order), and reads the partitions' bounds, the delivery rows of mode and
// the replayed DLQ entries, in one round trip. It fails with storage.ErrSubscriptionNotFound, and
// with storage.ErrSubscriptionNotActive for a CANCELLED subscription. With async, the transaction
// commits without waiting for its WAL flush: only releases use it (a crash that forgets a release
// leaves the lease to expire, and the message comes back later with a higher attempt). The
// transactions of the lanes (claims, acks, nacks and extends: combine.go) commit synchronously:
// a claim is durable before its deliveries leave the broker, so a database crash never hands a
// message out again with the same attempt number, and an extended lease never shrinks back.
func (e *Engine) loadState(ctx context.Context, tx pgx.Tx, id int64, mode loadMode, member string, want loadWant, async bool) (*dstate, error) {
	b := &pgx.Batch{}
	if async {
		b.Queue("SET LOCAL synchronous_commit = off")
	}
	ids := []int64{id}
	e.queueLoad(b, ids, mode, member, []loadWant{want})
	br := tx.SendBatch(ctx, b)
	if async {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, fmt.Errorf("pgstore: subscription %d: load delivery state: %w", id, err)
		}
	}
	states, errs, err := e.readStates(br, ids, mode, []loadWant{want})
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("pgstore: subscription %d: load delivery state: %w", id, cerr)
	}
	if err != nil {
		return nil, err
	}
	if errs[0] != nil {
		return nil, errs[0]
	}
	return states[0], nil
}

// loadQueries is the number of statements queueLoad queues (and readStates reads).
const loadQueries = 6

// queueLoad queues the loadQueries statements that read (and lock) the delivery state of
// subscriptions ids (ascending: the lock order), wants[i] being what ids[i] needs of its waiting
// rows and replayed entries (see loadState). Each statement reads every subscription: a lane's
// transaction of many subscriptions (combine.go) costs six statements to load, not six per
// subscription. PostgreSQL's CPU per executed statement (executor start, expressions, catalog
// lookups, protocol messages) was most of its time in a 16-group fan-out.
func (e *Engine) queueLoad(b *pgx.Batch, ids []int64, mode loadMode, member string, wants []loadWant) {
	lims := make([]int32, len(ids)) // -1: every waiting row
	var rs []int64
	var rps []int32
	var ros []int64
	for i, w := range wants {
		lims[i] = int32(w.waiting)
		for j := range w.ps {
			rs, rps, ros = append(rs, ids[i]), append(rps, w.ps[j]), append(ros, w.os[j])
		}
	}
	if rs == nil {
		rs, rps, ros = []int64{}, []int32{}, []int64{}
	}
	b.Queue(e.sql(`SELECT s.id, s.topic_id, s.topic, s.state, (SELECT t.config FROM spool.topics t WHERE t.id = s.topic_id), s.ordering
		FROM spool.subscriptions s WHERE s.id = ANY ($1::bigint[])`), ids)
	// The locks are taken in the order of the rows (LockRows runs above the sort): subscriptions
	// in id order, each one's partitions in order.
	b.Queue(e.sql(`SELECT sub_id, partition, ack_floor, cursor, skips FROM spool.sub_partitions
		WHERE sub_id = ANY ($1::bigint[]) ORDER BY sub_id, partition FOR UPDATE`), ids)
	b.Queue(e.sql(`SELECT s.id, p.partition, p.next_offset, p.low_offset FROM spool.subscriptions s
		JOIN spool.partitions p ON p.topic_id = s.topic_id WHERE s.id = ANY ($1::bigint[])`), ids)
	// Every live row lists offsets at or above its partition's ack floor (the floor is the lowest
	// listed offset, or the cursor), so the scans start at the floor in the primary key: the
	// versions of rows acked below it (dead until vacuum) are never visited. (OFFSET 0 keeps the
	// planner from flattening the lateral subquery into a join that scans every row of sub_id.)
	const rowCols = `SELECT sp.sub_id, d.partition, d.lo, d.offsets, d.state, d.attempt, d.member, d.due, d.failures
		FROM spool.sub_partitions sp
		CROSS JOIN LATERAL (SELECT * FROM spool.deliveries x
			WHERE x.sub_id = sp.sub_id AND x.partition = sp.partition AND x.lo >= sp.ack_floor OFFSET 0) d
		WHERE `
	switch mode {
	case loadDue:
		// The rows the transaction can need: a subscription has few leased and acked rows (the
		// members' credit bounds the leased ones), but the consumers of a backlog that they nack
		// with a delay leave one waiting row per nacked batch, thousands, which every
		// transaction would read. So: every leased and acked row, and the want.waiting waiting
		// ones due first (see loadWant); the rows of other waiting offsets that its acks name
		// are read afterwards (loadAckedRows).
		b.Queue(e.sql(rowCols+`sp.sub_id = ANY ($1::bigint[]) AND d.state <> 'waiting'
UNION ALL
SELECT w.* FROM unnest($1::bigint[], $2::int[]) AS u(id, lim) CROSS JOIN LATERAL (`+rowCols+`sp.sub_id = u.id AND d.state = 'waiting'
	ORDER BY d.due, d.partition, d.lo LIMIT nullif(u.lim, -1)) w`), ids, lims)
	case loadMember:
		b.Queue(e.sql(rowCols+`sp.sub_id = ANY ($1::bigint[]) AND d.state = 'leased' AND d.member = $2`), ids, member)
	}
	b.Queue(e.sql(loadReplayedSQL), ids, lims, rs, rps, ros)
	b.Queue(e.sql(assignmentQuery), ids) // ordered.go
}

// loadReplayedSQL reads the replayed DLQ entries of subscriptions $1 that a transaction can need,
// through the partial indexes of the replayed entries (0005), never the entries of their DLQs nor
// every replayed entry (an operator who replays a DLQ of a million entries makes a million
// replayed entries, waiting): every leased one (few: the members' credit bounds them; claims
// expire them, releases give them back, nacks and extends need the lease), the $2 waiting ones
// of each due first (what claims take, and the earliest due time, for NextDue), and those at the
// positions ($3 subscriptions, $4 partitions, $5 offsets) that the transaction's acks, nacks and
// extends name (an ack completes a replayed copy in any state). See loadWant. The EXISTS, planned
// as a one-time filter, skips the rest when the subscriptions have no replayed entry, as nearly
// always: the three reads cost some 140 us of the database's CPU per delivery transaction with
// nothing to find (a 16-group fan-out, 2026-11-27), the probe of the empty partial index little.
const loadReplayedSQL = `SELECT * FROM (
	SELECT sub_id, id, partition, "offset", replay, replay_attempt, replay_member, replay_due, failures
		FROM spool.dlq WHERE sub_id = ANY ($1::bigint[]) AND replay = 'leased'
	UNION
	SELECT w.* FROM unnest($1::bigint[], $2::int[]) AS u(id, lim) CROSS JOIN LATERAL (
		SELECT sub_id, id, partition, "offset", replay, replay_attempt, replay_member, replay_due, failures
		FROM spool.dlq WHERE sub_id = u.id AND replay = 'waiting' ORDER BY replay_due, id LIMIT nullif(u.lim, -1)) w
	UNION
	SELECT q.sub_id, q.id, q.partition, q."offset", q.replay, q.replay_attempt, q.replay_member, q.replay_due, q.failures
		FROM unnest($3::bigint[], $4::int[], $5::bigint[]) AS r (s, p, o)
		JOIN spool.dlq q ON q.sub_id = r.s AND q.replay IS NOT NULL AND q.partition = r.p AND q."offset" = r.o
) x
WHERE EXISTS (SELECT FROM spool.dlq g WHERE g.sub_id = ANY ($1::bigint[]) AND g.replay IS NOT NULL)
ORDER BY sub_id, id`

// loadWant says which waiting delivery rows and replayed DLQ entries a load reads besides the
// leased (and acked) ones (queueLoad, loadReplayedSQL): of each, waiting, the first due (more than
// the transaction's claims can take, so that the earliest due time of those left is among them;
// all of them when a claim is limited to some partitions, since those due first may all be in
// others); and the replayed entries at refs.
type loadWant struct {
	waiting int // -1: all
	ps      []int32
	os      []int64
}

// minLoadWaiting is the fewest waiting rows (and replayed entries) a load of claims reads.
const minLoadWaiting = 256

// wantFor returns what the operations ops of one subscription need of its waiting rows and
// replayed entries.
func wantFor(ops []*dop) loadWant {
	w := loadWant{ps: []int32{}, os: []int64{}}
	add := func(refs []storage.DeliveryRef) {
		for _, r := range refs {
			w.ps, w.os = append(w.ps, r.Partition), append(w.os, r.Offset)
		}
	}
	claims, all := 0, false
	for _, op := range ops {
		switch {
		case op.claim != nil:
			claims += op.claim.Max
			// A claim limited to some partitions, or of an ordered subscription (a generation:
			// its partitions are presented in offset order), needs every waiting row.
			all = all || op.claim.Partitions != nil || op.claim.Generation != 0
		case op.nack != nil:
			add(op.nack.Refs)
		case op.extend != nil:
			add(op.extend.Refs)
		default:
			add(op.refs)
		}
	}
	switch {
	case all:
		w.waiting = -1
	case claims > 0:
		w.waiting = minLoadWaiting + 2*claims
	}
	return w
}

// readStates reads the results of queueLoad's statements for subscriptions ids (loaded with mode
// and wants), all of them also when it fails (so that the statements queued after them can be
// read next). states[i] is the state of ids[i], or nil when errs[i] says why its operations fail
// alone (storage.ErrSubscriptionNotFound, storage.ErrSubscriptionNotActive); err fails the
// transaction.
func (e *Engine) readStates(br pgx.BatchResults, ids []int64, mode loadMode, wants []loadWant) (states []*dstate, errs []error, err error) {
	cr := &countedResults{BatchResults: br}
	states, errs, err = e.readStatesFrom(cr, ids)
	for i, st := range states {
		if st != nil && mode == loadDue {
			lim := wants[i].waiting
			st.allRows = lim < 0 || st.waiting < lim // fewer than the limit: all of them
		}
	}
	for ; cr.n < loadQueries; cr.n++ {
		if _, xerr := br.Exec(); xerr != nil && err == nil {
			err = fmt.Errorf("pgstore: load delivery state: %w", xerr)
		}
	}
	return states, errs, err
}

// topicConfigs keeps the topic configurations delivery loads decoded, by their stored JSON: every
// delivery transaction reads the configuration of its subscriptions' topics, and decoding it took
// a twentieth of the broker's CPU in a 16-group fan-out. Equal text, equal configuration, so a
// changed configuration is a miss. At most maxTopicConfigs texts: past it the cache starts over.
type topicConfigs struct {
	mu sync.Mutex
	m  map[string]storage.TopicConfig
}

const maxTopicConfigs = 1024

// decode returns the configuration stored as raw.
func (c *topicConfigs) decode(raw []byte) (storage.TopicConfig, error) {
	c.mu.Lock()
	cfg, ok := c.m[string(raw)]
	c.mu.Unlock()
	if ok {
		return cfg, nil
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return storage.TopicConfig{}, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxTopicConfigs {
		c.m = make(map[string]storage.TopicConfig)
	}
	c.m[string(raw)] = cfg
	c.mu.Unlock()
	return cfg, nil
}

// countedResults counts the result sets taken from a batch.
type countedResults struct {
	pgx.BatchResults
	n int
}

func (c *countedResults) Query() (pgx.Rows, error) { c.n++; return c.BatchResults.Query() }
func (c *countedResults) QueryRow() pgx.Row        { c.n++; return c.BatchResults.QueryRow() }

func (e *Engine) readStatesFrom(br pgx.BatchResults, ids []int64) ([]*dstate, []error, error) {
	wrap := func(err error) error { // the ids of a large transaction would make a long line
		if len(ids) == 1 {
			return fmt.Errorf("pgstore: subscription %d: load delivery state: %w", ids[0], err)
		}
		return fmt.Errorf("pgstore: load delivery state of %d subscriptions: %w", len(ids), err)
	}
	states, errs := make([]*dstate, len(ids)), make([]error, len(ids))
	index := make(map[int64]int, len(ids))
	for i, id := range ids {
		index[id] = i
	}
	// of returns the loaded state of subscription id, nil for one whose operations fail.
	of := func(id int64) *dstate {
		if i, ok := index[id]; ok {
			return states[i]
		}
		return nil
	}
	// each scans every row of the next result with scan.
	each := func(scan func(rows pgx.Rows) error) error {
		rows, err := br.Query()
		if err != nil {
			if rows != nil {
				rows.Close()
			}
			return wrap(err)
		}
		defer rows.Close()
		for rows.Next() {
			if err := scan(rows); err != nil {
				return wrap(err)
			}
		}
		if err := rows.Err(); err != nil {
			return wrap(err)
		}
		return nil
	}

	found := make([]bool, len(ids))
	err := each(func(rows pgx.Rows) error {
		var cfg, ordering []byte
		var s subRow // only what delivery operations use: ID, topicID, Topic, State, the ordering
		var state string
		if err := rows.Scan(&s.ID, &s.topicID, &s.Topic, &state, &cfg, &ordering); err != nil {
			return err
		}
		i, ok := index[s.ID]
		if !ok {
			return nil
		}
		found[i] = true
		switch s.State = storage.SubscriptionState(state); s.State {
		case storage.Deleted:
			errs[i] = fmt.Errorf("%w: id %d", storage.ErrSubscriptionNotFound, s.ID)
			return nil
		case storage.Cancelled:
			errs[i] = fmt.Errorf("%w: subscription %d is %s", storage.ErrSubscriptionNotActive, s.ID, s.State)
			return nil
		}
		if err := scanOrdering(&s.Subscription, ordering); err != nil {
			return err
		}
		st := &dstate{sub: &s, partOf: map[int32]*dpart{}, replay: map[dref]*dreplay{}}
		var err error
		if st.cfg, err = e.topicCfgs.decode(cfg); err != nil {
			return fmt.Errorf("%w: topic of subscription %d: config: %v", storage.ErrCorrupt, s.ID, err)
		}
		states[i] = st
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	for i, id := range ids {
		if !found[i] {
			errs[i] = fmt.Errorf("%w: id %d", storage.ErrSubscriptionNotFound, id)
		}
	}
	if err := each(func(rows pgx.Rows) error {
		var id int64
		dp := &dpart{}
		var skips []int64
		if err := rows.Scan(&id, &dp.p, &dp.floor, &dp.cursor, &skips); err != nil {
			return err
		}
		if st := of(id); st != nil {
			dp.cursor0 = dp.cursor
			dp.skips = runsFrom(skips, dp.cursor)
			st.parts = append(st.parts, dp)
			st.partOf[dp.p] = dp
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	for i, st := range states {
		if st != nil && len(st.parts) == 0 {
			// Cancelled (or deleted) while this operation waited for its locks.
			states[i], errs[i] = nil, fmt.Errorf("%w: subscription %d has no delivery state", storage.ErrSubscriptionNotActive, ids[i])
		}
	}
	if err := each(func(rows pgx.Rows) error {
		var id int64
		var p int32
		var hw, low int64
		if err := rows.Scan(&id, &p, &hw, &low); err != nil {
			return err
		}
		if st := of(id); st != nil {
			if dp := st.partOf[p]; dp != nil {
				dp.hw, dp.low = hw, low
			}
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	if err := each(func(rows pgx.Rows) error {
		var id int64
		r, err := scanRow(rows, &id)
		if err != nil {
			return err
		}
		if st := of(id); st != nil {
			st.rows = append(st.rows, r)
			if r.state == stWaiting {
				st.waiting++
			}
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	if err := each(func(rows pgx.Rows) error {
		var id int64
		rp := &dreplay{}
		var due pgtype.Timestamptz
		var fs []byte
		if err := rows.Scan(&id, &rp.id, &rp.partition, &rp.offset, &rp.state, &rp.attempt, &rp.member, &due, &fs); err != nil {
			return err
		}
		if err := decodeFailures(fs, &rp.failures); err != nil {
			return err
		}
		rp.due = due.Time.UTC()
		if st := of(id); st != nil {
			st.replays = append(st.replays, rp)
			st.replay[dref{rp.partition, rp.offset}] = rp
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	if err := each(func(rows pgx.Rows) error { return readAssignment(rows, of) }); err != nil {
		return nil, nil, err
	}
	return states, errs, nil
}

// scanRow reads the columns lead points to, then a stored delivery row (partition, lo, offsets,
// state, attempt, member, due, failures).
func scanRow(rows pgx.Rows, lead ...any) (*drow, error) {
	r := &drow{stored: true}
	var fs []byte
	if err := rows.Scan(append(lead, &r.partition, &r.key, &r.offsets, &r.state, &r.attempt, &r.member, &r.due, &fs)...); err != nil {
		return nil, err
	}
	if err := decodeFailures(fs, &r.failures); err != nil {
		return nil, err
	}
	r.due = r.due.UTC()
	if !slices.IsSorted(r.offsets) {
		slices.Sort(r.offsets)
	}
	return r, nil
}

// rowOf returns the loaded row that lists offset o of partition p and has not had it taken
// out, or nil. It looks through the rows (their offsets are sorted) instead of keeping a map of
// every listed offset: a subscription whose consumers nacked a backlog with a delay has a
// waiting row per nacked batch, hundreds of thousands of offsets, and a map of them all, built by
// every transaction, cost more than its lookups (2,000 rows of 100: 69 ms a claim and ack).
func (st *dstate) rowOf(p int32, o int64) *drow {
	for _, r := range st.rows {
		if r.partition != p || len(r.offsets) == 0 || o < r.offsets[0] || o > r.offsets[len(r.offsets)-1] || r.removed[o] {
			continue
		}
		if _, ok := slices.BinarySearch(r.offsets, o); ok {
			return r
		}
	}
	return nil
}

// loadAckedRows reads the waiting rows that list offsets the acks among ops name and that the
// load left out (queueLoad reads only the waiting rows due first): an ack completes an offset
// in any state, also one whose lease expired, which is then waiting for its redelivery. A
// transaction whose acks name only loaded rows (the usual: the member acks what it holds) makes
// no query. The subscription's sub_partitions rows are locked, so the rows are as loaded.
func (e *Engine) loadAckedRows(ctx context.Context, tx pgx.Tx, st *dstate, ops []*dop) error {
	var ps []int32
	var os []int64
	for _, op := range ops {
		if !op.isAck() {
			continue
		}
		for _, r := range op.refs {
			dp := st.partOf[r.Partition]
			if dp == nil || r.Offset < dp.floor || r.Offset >= dp.cursor || st.replay[dref{r.Partition, r.Offset}] != nil ||
				st.rowOf(r.Partition, r.Offset) != nil {
				continue
			}
			ps, os = append(ps, r.Partition), append(os, r.Offset)
		}
	}
	if len(ps) == 0 {
		return nil
	}
	loaded := make(map[dref]bool, len(st.rows))
	for _, r := range st.rows {
		if r.stored {
			loaded[dref{r.partition, r.key}] = true
		}
	}
	b := &pgx.Batch{}
	b.Queue(e.sql(`SELECT DISTINCT d.partition, d.lo, d.offsets, d.state, d.attempt, d.member, d.due, d.failures
		FROM unnest($2::int[], $3::bigint[]) AS r (p, o)
		JOIN spool.sub_partitions sp ON sp.sub_id = $1 AND sp.partition = r.p
		JOIN spool.deliveries d ON d.sub_id = $1 AND d.partition = r.p AND d.lo >= sp.ack_floor AND d.lo <= r.o
			AND r.o = ANY (d.offsets)
		WHERE d.state = 'waiting'`), st.sub.ID, ps, os)
	br := tx.SendBatch(ctx, b) // a pipelined transaction has no Query
	err := readAckedRows(br, st, loaded)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgstore: subscription %d: load acked rows: %w", st.sub.ID, err)
	}
	return nil
}

// readAckedRows adds the rows of loadAckedRows's query that st has not loaded yet.
func readAckedRows(br pgx.BatchResults, st *dstate, loaded map[dref]bool) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		r, err := scanRow(rows)
		if err != nil {
			return err
		}
		if !loaded[dref{r.partition, r.key}] {
			st.rows = append(st.rows, r)
		}
	}
	return rows.Err()
}

// take removes offset o from its row and returns the row (nil if no loaded row lists it).
func (st *dstate) take(p int32, o int64) *drow {
	r := st.rowOf(p, o)
	if r == nil {
		return nil
	}
	if r.removed == nil {
		r.removed = map[int64]bool{}
	}
	r.removed[o] = true
	r.changed = true
	st.touch(p)
	return r
}

// add makes a new row.
func (st *dstate) add(p int32, offsets []int64, state string, attempt int, member string, due time.Time) *drow {
	if !slices.IsSorted(offsets) {
		offsets = slices.Sorted(slices.Values(offsets))
	}
	r := &drow{partition: p, offsets: offsets, state: state, attempt: attempt, member: member, due: due, changed: true}
	st.rows = append(st.rows, r)
	st.touch(p)
	return r
}

func (st *dstate) touch(p int32) {
	if dp := st.partOf[p]; dp != nil {
		dp.touched = true
	}
}

// moveOffsets gives offsets of row r (all live in it) a new state: in place when they are all of
// r's offsets, else split into a new row.
func (st *dstate) moveOffsets(r *drow, offsets []int64, state string, attempt int, member string, due time.Time) *drow {
	if len(offsets) == len(r.live()) {
		r.state, r.attempt, r.member, r.due, r.changed = state, attempt, member, due, true
		st.touch(r.partition)
		return r
	}
	for _, o := range offsets {
		st.take(r.partition, o)
	}
	nr := st.add(r.partition, slices.Clone(offsets), state, attempt, member, due)
	nr.failures = r.failures // a split keeps the history its offsets share
	return nr
}

// deadLetterOutcome queues offset o of partition p (already taken out of its row) for the DLQ
// with out (its failures: the row's history).
func (st *dstate) deadLetterOutcome(p int32, o int64, out dlqOutcome) {
	st.dead = append(st.dead, deadItem{p: p, o: o, dlqOutcome: out})
	st.touch(p)
}

// floors returns the ack floors of st's partitions after the operation (the lowest offset still
// listed in a row, or the cursor) that the loaded rows tell: each partition's where the load read
// every row (allRows), and otherwise those that stay where they were (the rows the load left out
// list offsets at or above the old floor, so a loaded row still at the old floor keeps it there).
// For the others the save's statement looks (with the look for every partition saved, the
// statement took 251-315 us a call in a 16-group fan-out; 217-228 us now).
func (st *dstate) floors() map[int32]int64 {
	fl := make(map[int32]int64, len(st.parts))
	for _, dp := range st.parts {
		fl[dp.p] = dp.cursor
	}
	for _, r := range st.rows {
		lo, ok := r.firstLive()
		if ok && lo < fl[r.partition] {
			fl[r.partition] = lo
		}
	}
	if !st.allRows {
		for _, dp := range st.parts {
			if fl[dp.p] != dp.floor {
				delete(fl, dp.p)
			}
		}
	}
	return fl
}

// firstLive returns the lowest offset of r that was not removed.
func (r *drow) firstLive() (int64, bool) {
	for _, o := range r.offsets {
		if !r.removed[o] {
			return o, true
		}
	}
	return 0, false
}

// save writes the changes back in one round trip: delivery rows (deletes, then updates, then
// inserts, so that primary keys never collide), DLQ entries, replayed entries, and the
// sub_partitions rows whose floor or cursor may have changed.
func (e *Engine) save(ctx context.Context, tx pgx.Tx, st *dstate, now time.Time) error {
	b := &pgx.Batch{}
	e.queueSave(b, []*dstate{st}, now)
	if b.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("pgstore: subscription %d: save delivery state: %w", st.sub.ID, err)
	}
	return nil
}

// queueSave queues the statements of save for the loaded states of states in b: one statement
// each for the delivery rows deleted, inserted and the sub_partitions rows of all of them (like
// queueLoad), one per changed row that stays, and the DLQ and completion statements of each.
// The deletes come before the updates and the inserts, so that a key a row leaves (its lo moves
// up) can be taken by a new row.
func (e *Engine) queueSave(b *pgx.Batch, states []*dstate, now time.Time) {
	var del struct {
		s  []int64
		p  []int32
		lo []int64
	}
	var ins struct {
		s, offsets []int64
		p, at, end []int32
		state, mem []string
		attempt    []int32
		due        []time.Time
		fails      []*string
	}
	var ups struct {
		s      []int64
		p      []int32
		cu, fl []int64
	}
	type upd struct {
		sub  int64
		r    *drow
		live []int64
	}
	var upds []upd // one statement each: rows that keep some of their offsets (few)
	for _, st := range states {
		id := st.sub.ID
		for _, r := range st.rows {
			if !r.changed {
				continue
			}
			live := r.live()
			slices.Sort(live)
			switch {
			case len(live) == 0 && r.stored:
				del.s, del.p, del.lo = append(del.s, id), append(del.p, r.partition), append(del.lo, r.key)
			case len(live) == 0:
			case r.stored:
				upds = append(upds, upd{id, r, live})
			default:
				ins.s, ins.p = append(ins.s, id), append(ins.p, r.partition)
				ins.at = append(ins.at, int32(len(ins.offsets)+1))
				ins.offsets = append(ins.offsets, live...)
				ins.end = append(ins.end, int32(len(ins.offsets)))
				ins.state, ins.attempt, ins.mem = append(ins.state, r.state), append(ins.attempt, int32(r.attempt)), append(ins.mem, r.member)
				ins.due, ins.fails = append(ins.due, r.due), append(ins.fails, encodeFailures(r.failures))
			}
		}
		floors := st.floors()
		for _, dp := range st.parts {
			if !dp.touched && dp.cursor == dp.cursor0 {
				continue
			}
			fl, known := floors[dp.p]
			if known && fl == dp.floor && dp.cursor == dp.cursor0 {
				continue // nothing to write
			}
			if !known {
				fl = -1 // the statement finds it
			}
			ups.s, ups.p, ups.cu, ups.fl = append(ups.s, id), append(ups.p, dp.p), append(ups.cu, dp.cursor), append(ups.fl, fl)
		}
	}
	if len(del.s) > 0 {
		// Each row is found by its whole primary key, then deleted by ctid: a join with the
		// unnest (the obvious form) gets a generic plan that visits every index entry of sub_id,
		// the dead versions of acked rows included (seen: 1.1 ms per DELETE, on the CPU). The rows
		// cannot move meanwhile: their subscription's sub_partitions rows are locked.
		b.Queue(e.sql(`DELETE FROM spool.deliveries d WHERE d.ctid = ANY (ARRAY(
			SELECT x.ctid FROM unnest($1::bigint[], $2::int[], $3::bigint[]) AS k(s, p, lo)
			CROSS JOIN LATERAL (SELECT ctid FROM spool.deliveries x WHERE x.sub_id = k.s AND x.partition = k.p AND x.lo = k.lo OFFSET 0) x))`),
			del.s, del.p, del.lo)
	}
	for _, u := range upds {
		b.Queue(e.sql(`UPDATE spool.deliveries SET lo = $4, offsets = $5, state = $6, attempt = $7, member = $8, due = $9, failures = $10
			WHERE sub_id = $1 AND partition = $2 AND lo = $3`),
			u.sub, u.r.partition, u.r.key, u.live[0], u.live, u.r.state, u.r.attempt, u.r.member, u.r.due, encodeFailures(u.r.failures))
	}
	if len(ins.s) > 0 {
		// Each row's offsets are the slice [at:end] of one flat array (arrays of arrays must all
		// have the same length).
		b.Queue(e.sql(`INSERT INTO spool.deliveries (sub_id, partition, lo, offsets, state, attempt, member, due, failures)
			SELECT r.s, r.p, ($3::bigint[])[r.at], ($3::bigint[])[r.at:r.e], r.st, r.a, r.m, r.due, r.f::jsonb
			FROM unnest($1::bigint[], $2::int[], $4::int[], $5::int[], $6::text[], $7::int[], $8::text[], $9::timestamptz[], $10::text[])
				AS r(s, p, at, e, st, a, m, due, f)`),
			ins.s, ins.p, ins.offsets, ins.at, ins.end, ins.state, ins.attempt, ins.mem, ins.due, ins.fails)
	}
	for _, st := range states {
		e.queueDead(b, st, now)
	}
	if len(ups.s) > 0 {
		// A floor the broker does not know (-1, see dstate.floors) is the lowest listed offset at
		// or above the old one (floors never go back: rows are made at or above the cursor, splits
		// keep their offsets), so the min(lo) scan skips the dead versions of rows acked below it.
		b.Queue(e.sql(`WITH f AS (
				SELECT c.s, c.p, c.cur, CASE WHEN c.fl >= 0 THEN c.fl ELSE least(c.cur, coalesce((SELECT min(d.lo) FROM spool.deliveries d
					WHERE d.sub_id = c.s AND d.partition = c.p AND d.lo >= (SELECT o.ack_floor FROM spool.sub_partitions o
						WHERE o.sub_id = c.s AND o.partition = c.p)), c.cur)) END AS floor
				FROM unnest($1::bigint[], $2::int[], $3::bigint[], $4::bigint[]) AS c(s, p, cur, fl))
			UPDATE spool.sub_partitions sp SET cursor = f.cur, ack_floor = f.floor, skips = `+trimSkipsSQL("sp.skips", "f.cur")+` FROM f
			WHERE sp.sub_id = f.s AND sp.partition = f.p AND (sp.cursor <> f.cur OR sp.ack_floor <> f.floor)`), ups.s, ups.p, ups.cu, ups.fl)
	}
}

// queueDead queues the DLQ statements of st (messages dead-lettered, replayed entries changed)
// and its completion records.
func (e *Engine) queueDead(b *pgx.Batch, st *dstate, now time.Time) {
	id := st.sub.ID
	if len(st.dead) > 0 {
		n := len(st.dead)
		ps, os, as := make([]int32, n), make([]int64, n), make([]int32, n)
		reasons, errs, rules, fails := make([]string, n), make([]string, n), make([]string, n), make([]*string, n)
		for i, d := range st.dead {
			ps[i], os[i], as[i], reasons[i], errs[i] = d.p, d.o, int32(d.attempt), string(d.reason), d.lastErr
			rules[i], fails[i] = string(d.rule), encodeFailures(d.failures)
		}
		// IDs in the order of the items: the inner query is sorted, nextval runs in the outer one.
		b.Queue(e.sql(`INSERT INTO spool.dlq (sub_id, id, topic_id, partition, "offset", published_at, key, headers, payload,
				producer_id, not_before, expires_at, reason, attempts, last_error, dead_at, rule, failures)
			SELECT $1, nextval('spool.dlq_ids'), x.* FROM (
				SELECT m.topic_id, m.partition, m."offset", m.published_at, m.key, m.headers, m.payload, m.producer_id,
					m.not_before, m.expires_at, r.reason, r.attempt, r.err, $8::timestamptz, r.rule, r.fails::jsonb
				FROM unnest($3::int[], $4::bigint[], $5::int[], $6::text[], $7::text[], $9::text[], $10::text[])
					WITH ORDINALITY AS r(p, o, attempt, reason, err, rule, fails, n)
				JOIN spool.messages m ON m.topic_id = $2 AND m.partition = r.p AND m."offset" = r.o
				ORDER BY r.n) x`), id, st.sub.topicID, ps, os, as, reasons, errs, now, rules, fails)
	}
	for _, rp := range st.replays {
		switch {
		case !rp.changed:
		case rp.acked:
			b.Queue(e.sql(`DELETE FROM spool.dlq WHERE sub_id = $1 AND id = $2`), id, rp.id)
		case rp.dead != nil:
			b.Queue(e.sql(`UPDATE spool.dlq SET id = nextval('spool.dlq_ids'), replay = NULL, replay_attempt = 0, replay_member = '',
				replay_due = NULL, reason = $3, attempts = $4, last_error = $5, dead_at = $6, rule = $7, failures = $8::jsonb
				WHERE sub_id = $1 AND id = $2`),
				id, rp.id, string(rp.dead.reason), rp.dead.attempt, rp.dead.lastErr, now, string(rp.dead.rule), encodeFailures(rp.dead.failures))
		default:
			b.Queue(e.sql(`UPDATE spool.dlq SET replay = $3, replay_attempt = $4, replay_member = $5, replay_due = $6, failures = $7::jsonb
				WHERE sub_id = $1 AND id = $2`), id, rp.id, rp.state, rp.attempt, rp.member, rp.due, encodeFailures(rp.failures))
		}
	}
	e.queueCompletions(b, st, now)
}

// msgCols are the columns scanMsg reads after partition and offset.
const msgCols = `m.published_at, m.key, m.headers, m.payload, m.producer_id, m.not_before, m.expires_at`

// scanMsg scans the columns lead points to, then partition, offset and msgCols into a message of
// topic.
func scanMsg(rows pgx.Rows, topic string, lead ...any) (*storage.Message, error) {
	m := &storage.Message{Topic: topic}
	var headers []byte
	var producerID *string
	var notBefore, expiresAt pgtype.Timestamptz
	dest := append(lead, &m.Partition, &m.Offset, &m.PublishedAt, &m.Key, &headers, &m.Payload, &producerID, &notBefore, &expiresAt)
	if err := rows.Scan(dest...); err != nil {
		return nil, err
	}
	if err := fillMsg(m, headers, producerID, notBefore, expiresAt); err != nil {
		return nil, err
	}
	return m, nil
}

// claimRotor rotates the partition a claim reads new messages from first.
var claimRotor atomic.Uint32

// DeliveriesClaim leases up to Max messages of an ACTIVE subscription to Member, in one
// transaction under the subscription's sub_partitions locks (members on every broker instance take
// turns): expired leases are processed first (waiting until their deadline plus
// storage.RedeliveryBackoff, or dead-lettered at max_deliveries), then due redeliveries and
// replayed DLQ entries go out (oldest due first; with AvoidMember not to the member that had them
// last), then new messages from the cursors, the partition read first rotating from one claim to
// the next. New messages past ExpiresAt are completed without a delivery; those whose NotBefore is
// in the future wait for it (attempt 0).
func (e *Engine) DeliveriesClaim(ctx context.Context, p *storage.DeliveriesClaimParams) (*storage.DeliveriesClaimResult, error) {
	if err := p.Check(); err != nil {
		return nil, err
	}
	op := &dop{sub: p.SubscriptionID, claim: p}
	if err := e.submit(ctx, op); err != nil {
		return nil, err
	}
	return op.claimRes, op.err
}

// redelivery is a message a claim delivers again: an offset of the log, or a replayed DLQ entry.
type redelivery struct {
	p       int32
	o       int64
	attempt int
	row     *drow
	rp      *dreplay
}

// claimOn runs claim p on the loaded state st of its subscription (it may read messages in tx);
// the caller saves st. It follows the plan of a policy.Claim (the rules are there; this presents
// the loaded rows to it, reads the messages and changes the rows). It fails before changing st,
// with a database error, or with missingMessage's error after changing st (then st must not be
// saved).
func (e *Engine) claimOn(ctx context.Context, tx pgx.Tx, st *dstate, p *storage.DeliveriesClaimParams, now time.Time) (*storage.DeliveriesClaimResult, error) {
	if st.sub.State != storage.Active {
		return nil, fmt.Errorf("%w: subscription %d is %s", storage.ErrSubscriptionNotActive, st.sub.ID, st.sub.State)
	}
	cfg := st.cfg
	p, maxInFlight, err := st.orderedParams(p)
	if err != nil {
		return nil, err
	}
	nc := &newClaim{st: st}
	pl := &nc.pl
	if err := pl.Start(policy.Input{Params: p, Topic: st.sub.Topic, Partitions: cfg.Partitions, AckWait: cfg.AckWait,
		MaxDeliveries: cfg.MaxDeliveries, Now: now.UnixNano(), Rotor: uint64(claimRotor.Add(1)), Resolution: time.Microsecond,
		MaxInFlight: maxInFlight, BatchSize: p.BatchSize}); err != nil {
		return nil, err
	}
	deadline := time.Unix(0, pl.Deadline()).UTC()

	// 1. Expired leases.
	dead := 0
	for _, r := range slices.Clone(st.rows) {
		if r.state != stLeased {
			continue
		}
		switch x, due := pl.Expire(r.due.UnixNano(), r.attempt); x {
		case policy.DeadLetter:
			for _, o := range slices.Clone(r.live()) {
				st.take(r.partition, o)
				st.deadLetterOutcome(r.partition, o, dlqOutcome{reason: storage.DLQMaxDeliveries, lastErr: policy.ExpiredError, attempt: r.attempt, failures: r.failures})
				dead++
			}
		case policy.Wait:
			r.state, r.due, r.changed = stWaiting, time.Unix(0, due).UTC(), true
		}
	}
	for _, rp := range st.replays {
		if rp.state != stLeased || rp.dead != nil || rp.acked {
			continue
		}
		switch x, due := pl.Expire(rp.due.UnixNano(), rp.attempt); x {
		case policy.DeadLetter:
			rp.changed = true
			rp.dead = &dlqOutcome{reason: storage.DLQMaxDeliveries, lastErr: policy.ExpiredError, attempt: rp.attempt, failures: rp.failures}
			delete(st.replay, dref{rp.partition, rp.offset})
			dead++
		case policy.Wait:
			rp.changed = true
			rp.state, rp.due = stWaiting, time.Unix(0, due).UTC()
		}
	}

	// 2. Due redeliveries, in the plan's order (due time, partition, offset); the waiting ones not
	// due yet count for NextDue.
	type cand struct {
		due    int64
		p      int32
		o      int64
		member string
		r      *drow
		rp     *dreplay
	}
	var cands []cand
	var again []redelivery
	if pl.Ordered() {
		again, nc.lanes = st.orderedRedeliveries(pl, p.Member, deadline)
	}
	for _, r := range st.rows {
		if pl.Ordered() {
			break // presented partition by partition above
		}
		live := r.live()
		if r.state != stWaiting || len(live) == 0 {
			continue
		}
		if due := r.due.UnixNano(); due > pl.Now() {
			pl.Waiting(due)
		} else {
			cands = append(cands, cand{due: due, p: r.partition, o: live[0], member: r.member, r: r})
		}
	}
	for _, rp := range st.replays {
		if pl.Ordered() || rp.dead != nil || rp.acked || rp.state != stWaiting {
			continue
		}
		if due := rp.due.UnixNano(); due > pl.Now() {
			pl.Waiting(due)
		} else {
			cands = append(cands, cand{due: due, p: rp.partition, o: rp.offset, member: rp.member, rp: rp})
		}
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if c := cmpInt(a.due, b.due); c != 0 {
			return c
		}
		if a.p != b.p {
			return cmpInt(int64(a.p), int64(b.p))
		}
		return cmpInt(a.o, b.o)
	})
	for _, c := range cands {
		n := 1
		if c.r != nil {
			n = len(c.r.live())
		}
		take, stop := pl.Redeliver(c.due, c.p, c.member, n)
		if stop {
			break
		}
		if take == 0 {
			continue
		}
		if rp := c.rp; rp != nil {
			rp.state, rp.attempt, rp.member, rp.due, rp.changed = stLeased, rp.attempt+1, p.Member, deadline, true
			again = append(again, redelivery{p: rp.partition, o: rp.offset, attempt: rp.attempt, rp: rp})
			continue
		}
		taken := slices.Clone(c.r.live()[:take])
		nr := st.moveOffsets(c.r, taken, stLeased, c.r.attempt+1, p.Member, deadline)
		for _, o := range taken {
			again = append(again, redelivery{p: nr.partition, o: o, attempt: nr.attempt, row: nr})
		}
	}

	// 3. New messages, from the partitions in the plan's order.
	for _, dp := range st.parts {
		if dp.cursor < dp.low {
			dp.cursor = dp.low // retention removed what this subscription had not consumed
		}
		nc.skipAcked(dp)
	}
	var order []*dpart
	for k := 0; ; k++ {
		q, ok := pl.Partition(k)
		if !ok {
			break
		}
		if dp := st.partOf[q]; dp != nil {
			order = append(order, dp)
		}
	}
	msgs, err := e.claimRead(ctx, tx, st, again, nc, order)
	if err != nil {
		return nil, err
	}
	res := &storage.DeliveriesClaimResult{DeadLettered: dead}
	for _, a := range again {
		m := msgs[dref{a.p, a.o}]
		if a.rp != nil {
			m = msgs[dref{-1 - a.p, a.rp.id}]
		}
		if m == nil {
			if a.rp == nil && a.o >= st.partOf[a.p].low {
				return nil, missingMessage(st, a.p, a.o)
			}
			// The message is gone (retention): nothing to deliver, it is done.
			if a.rp != nil {
				a.rp.acked = true
			} else {
				st.take(a.p, a.o)
			}
			continue
		}
		res.Deliveries = append(res.Deliveries, &storage.Delivery{Message: *m, SubscriptionID: st.sub.ID, Attempt: a.attempt, Member: p.Member, LeaseDeadline: deadline})
	}
	for _, m := range nc.fresh {
		res.Deliveries = append(res.Deliveries, &storage.Delivery{Message: *m, SubscriptionID: st.sub.ID, Attempt: 1, Member: p.Member, LeaseDeadline: deadline})
	}
	if maxInFlight > 0 {
		for _, d := range res.Deliveries {
			d.Generation = p.Generation
		}
	}
	for _, dp := range st.parts {
		if offs := nc.leased[dp.p]; len(offs) > 0 {
			st.add(dp.p, offs, stLeased, 1, p.Member, deadline)
		}
	}
	for _, k := range nc.delayKeys {
		st.add(k.p, nc.delayed[k], stWaiting, 0, "", k.due)
	}

	// NextDue: the plan has the waiting ones; the leases left are these.
	for _, r := range st.rows {
		if r.state == stLeased && len(r.live()) > 0 {
			pl.Leased(r.due.UnixNano())
		}
	}
	for _, rp := range st.replays {
		if rp.dead == nil && !rp.acked && rp.state == stLeased {
			pl.Leased(rp.due.UnixNano())
		}
	}
	res.NextDue = pl.NextDueTime()
	if pl.Batch() {
		storage.MarkBatches(res.Deliveries)
	}
	return res, nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// delayKey groups messages waiting for the same NotBefore in one row.
type delayKey struct {
	p   int32
	due time.Time
}

// newClaim is the progress of a claim through new messages.
type newClaim struct {
	st        *dstate
	pl        policy.Claim // the plan
	fresh     []*storage.Message
	leased    map[int32][]int64
	delayed   map[delayKey][]int64
	delayKeys []delayKey
	lanes     map[int32]*policy.Lane // an ordered claim's, by partition (ordered.go)
}

// room returns how many new messages of dp the claim may still lease: for an ordered claim, its
// lane's slots (0 when blocked by a waiting message).
func (nc *newClaim) room(dp *dpart) int {
	if l := nc.lanes[dp.p]; l != nil {
		return l.Slots()
	}
	return nc.pl.Remaining()
}

// skipRuns moves the cursor of dp over the skip runs it reached (a refcount join marked them
// done), never reading their messages. The acked rows inside the runs (none are made: acks of
// their offsets are already done) would be taken with them, in one sweep of the rows.
func (nc *newClaim) skipRuns(dp *dpart) {
	lo, n := dp.cursor, len(dp.skips)
	for len(dp.skips) > 0 && dp.skips[0][0] <= dp.cursor {
		dp.cursor = max(dp.cursor, dp.skips[0][1])
		dp.skips = dp.skips[1:]
	}
	if len(dp.skips) == n {
		return
	}
	// The runs passed cover [lo, cursor) together: one sweep of the rows for all of them.
	for _, r := range nc.st.rows {
		if r.partition == dp.p && r.state == stAcked {
			for _, o := range r.live() {
				if o >= lo && o < dp.cursor {
					nc.st.take(dp.p, o)
				}
			}
		}
	}
	nc.st.touch(dp.p)
}

// skipAcked moves the cursor of dp over offsets acked before their delivery, and over skip runs.
func (nc *newClaim) skipAcked(dp *dpart) {
	for dp.cursor < dp.hw {
		nc.skipRuns(dp)
		if dp.cursor >= dp.hw {
			return
		}
		r := nc.st.rowOf(dp.p, dp.cursor)
		if r == nil || r.state != stAcked {
			return
		}
		nc.st.take(dp.p, dp.cursor)
		dp.cursor++
	}
}

// ackedAhead counts the offsets at or above the cursor of dp that were acked before delivery.
func (nc *newClaim) ackedAhead(dp *dpart) int64 {
	var n int64
	for _, r := range nc.st.rows {
		if r.state == stAcked && r.partition == dp.p {
			for _, o := range r.live() {
				if o >= dp.cursor && o < dp.hw {
					n++
				}
			}
		}
	}
	return n
}

// take handles the new message m of partition dp (m.Offset >= dp.cursor) as the plan says. It
// reports false when the claim is full and m was left for later.
func (nc *newClaim) take(dp *dpart, m *storage.Message) bool {
	if !nc.pl.Batch() && nc.pl.Full() { // a batch claim's lane decides (Lane.Take)
		return false
	}
	if r := nc.st.rowOf(dp.p, m.Offset); r != nil {
		// Acked before delivery (an acked row); nothing else lists offsets at the cursor.
		dp.cursor = m.Offset + 1
		nc.st.take(dp.p, m.Offset)
		nc.pl.Skipped()
		return true
	}
	var out policy.Outcome
	if l := nc.lanes[dp.p]; l != nil {
		out = l.Take(m)
	} else if nc.lanes != nil {
		out = policy.Stop // not a partition of the ordered claim
	} else {
		out = nc.pl.Take(m)
	}
	switch out {
	case policy.Stop:
		return false
	case policy.Complete:
		nc.st.touch(dp.p)
	case policy.Delay:
		dk := delayKey{dp.p, m.NotBefore}
		if nc.delayed == nil {
			nc.delayed = map[delayKey][]int64{}
		}
		if nc.delayed[dk] == nil {
			nc.delayKeys = append(nc.delayKeys, dk)
		}
		nc.delayed[dk] = append(nc.delayed[dk], m.Offset)
	case policy.Lease:
		if nc.leased == nil {
			nc.leased = map[int32][]int64{}
		}
		nc.leased[dp.p] = append(nc.leased[dp.p], m.Offset)
		nc.fresh = append(nc.fresh, m)
	}
	dp.cursor = m.Offset + 1
	return true
}

// claimRead reads the messages of the redeliveries (keyed by position; replayed DLQ entries by
// {-1-partition, id}) and takes new messages from the partitions in order until the claim is full,
// every partition is read up to its high-water mark, or the scan limit is reached. The first read
// of new messages shares a round trip with the redeliveries.
func (e *Engine) claimRead(ctx context.Context, tx pgx.Tx, st *dstate, again []redelivery, nc *newClaim, order []*dpart) (map[dref]*storage.Message, error) {
	msgs := map[dref]*storage.Message{}
	topic := st.sub.Topic
	wrap := func(err error) error {
		return fmt.Errorf("pgstore: subscription %d: claim: %w", st.sub.ID, err)
	}
	var ps []int32
	var os, ids []int64
	for _, a := range again {
		if a.rp != nil {
			ids = append(ids, a.rp.id)
		} else {
			ps, os = append(ps, a.p), append(os, a.o)
		}
	}
	// A batch claim's lane that redelivered messages learns the Linked bit of the last one
	// before it reads new messages (Lane.Redelivered): its partition waits for round 1.
	var relink map[int32]bool
	if nc.pl.Batch() && len(again) > 0 {
		relink = map[int32]bool{}
		for _, a := range again {
			relink[a.p] = true
		}
	}
	for round := 0; ; round++ {
		b := &pgx.Batch{}
		if round == 0 && len(ps) > 0 {
			b.Queue(e.sql(`SELECT m.linked, m.partition, m."offset", `+msgCols+`
				FROM unnest($2::int[], $3::bigint[]) AS r(p, o)
				JOIN spool.messages m ON m.topic_id = $1 AND m.partition = r.p AND m."offset" = r.o`), st.sub.topicID, ps, os).
				Query(func(rows pgx.Rows) error {
					for rows.Next() {
						var linked bool
						m, err := scanMsg(rows, topic, &linked)
						if err != nil {
							return err
						}
						m.Linked = linked
						msgs[dref{m.Partition, m.Offset}] = m
					}
					return rows.Err()
				})
		}
		if round == 0 && len(ids) > 0 {
			b.Queue(e.sql(`SELECT m.id, m.partition, m."offset", `+msgCols+` FROM spool.dlq m WHERE m.sub_id = $1 AND m.id = ANY ($2)`),
				st.sub.ID, ids).
				Query(func(rows pgx.Rows) error {
					for rows.Next() {
						var id int64
						m, err := scanMsg(rows, topic, &id)
						if err != nil {
							return err
						}
						msgs[dref{-1 - m.Partition, id}] = m
					}
					return rows.Err()
				})
		}
		// Plan: read what the claim can still take, partition after partition; the message cache
		// answers first, the database reads what it does not hold.
		type planned struct {
			p   int32
			cur int64
			lim int32
		}
		var plan []planned
		alloc := nc.pl.Remaining()
		if nc.pl.Batch() {
			alloc = storage.MaxBatchMessages * len(order) // the lanes bound it (Lane.Slots)
		}
		if nc.pl.Batch() || !nc.pl.Full() {
			for _, dp := range order {
				avail := dp.hw - dp.cursor
				if len(dp.skips) > 0 {
					avail = min(avail, dp.skips[0][0]-dp.cursor) // up to the next run, skipped whole
				}
				if avail <= 0 || alloc <= 0 || nc.room(dp) <= 0 || (round == 0 && relink[dp.p]) {
					continue
				}
				want := min(int64(alloc), int64(nc.room(dp)), avail)
				lim := min(want+nc.ackedAhead(dp), avail)
				plan = append(plan, planned{dp.p, dp.cursor, int32(lim)})
				alloc -= int(want)
			}
		}
		got := map[int32][]*storage.Message{}
		var qp []int32
		var qc []int64
		var ql []int32
		for _, pl := range plan {
			ms := e.cache.get(st.sub.topicID, pl.p, pl.cur, int(pl.lim))
			if len(ms) == int(pl.lim) {
				got[pl.p] = ms
				continue
			}
			// The database reads what follows the cached run (often the last publish
			// transaction's messages, committed but not cached yet: at 10,000 msg/s with one
			// group, three quarters of what such claims wanted was cached already).
			got[pl.p] = ms
			n := int32(len(ms))
			qp, qc, ql = append(qp, pl.p), append(qc, pl.cur+int64(n)), append(ql, pl.lim-n)
		}
		if len(qp) > 0 {
			b.Queue(e.sql(`SELECT m.linked, m.partition, m."offset", `+msgCols+`
				FROM unnest($2::int[], $3::bigint[], $4::int[]) AS c(p, cur, n)
				CROSS JOIN LATERAL (
					SELECT * FROM spool.messages m
					WHERE m.topic_id = $1 AND m.partition = c.p AND m."offset" >= c.cur
					ORDER BY m."offset" LIMIT c.n) m`), st.sub.topicID, qp, qc, ql).
				Query(func(rows pgx.Rows) error {
					for rows.Next() {
						var linked bool
						m, err := scanMsg(rows, topic, &linked)
						if err != nil {
							return err
						}
						m.Linked = linked
						got[m.Partition] = append(got[m.Partition], m)
					}
					return rows.Err()
				})
		}
		if b.Len() > 0 {
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return nil, wrap(err)
			}
		}
		if round == 0 && relink != nil {
			for _, a := range again { // in offset order per partition
				if l := nc.lanes[a.p]; l != nil {
					m := msgs[dref{a.p, a.o}]
					l.Redelivered(a.rp == nil && m != nil && m.Linked)
				}
			}
			if len(plan) == 0 {
				continue
			}
		}
		if len(plan) == 0 {
			return msgs, nil
		}
		for _, q := range qp {
			slices.SortFunc(got[q], func(a, b *storage.Message) int { return cmpInt(a.Offset, b.Offset) })
			e.cache.put(st.sub.topicID, q, got[q])
		}
		for _, pl := range plan {
			dp := nc.st.partOf[pl.p]
			ms := got[pl.p]
			full := false
			for _, m := range ms {
				if m.Offset < dp.cursor {
					continue
				}
				if m.Offset > dp.cursor {
					return nil, missingMessage(st, dp.p, dp.cursor)
				}
				if !nc.take(dp, m) {
					full = true
					break
				}
			}
			if !full && int32(len(ms)) < pl.lim && dp.cursor < dp.hw {
				return nil, missingMessage(st, dp.p, dp.cursor)
			}
			nc.skipAcked(dp)
		}
		if !nc.pl.Batch() && nc.pl.Full() {
			return msgs, nil
		}
	}
}

// missingMessage is the error of a claim that did not find a message at or above its partition's
// low offset and below its high-water mark. Only retention removes messages, by raising the low
// offset first, so such a message is not readable for now (its bucket is being detached and
// attached again, see dropBuckets), never gone: the claim fails and changes nothing rather than
// let the cursor or the ack floor pass it (STORAGE_UNAVAILABLE; the broker's dispatcher claims
// again after its poll interval).
func missingMessage(st *dstate, p int32, o int64) error {
	return &storage.IOError{Kind: storage.ErrUnavailable, Reason: "message not readable, retry",
		Err: fmt.Errorf("%w: pgstore: subscription %d: message %d:%d of topic %q is not readable (above the partition's low offset %d)",
			errMessageMissing, st.sub.ID, p, o, st.sub.Topic, st.partOf[p].low)}
}

// errMessageMissing marks missingMessage's error: the claim changed its subscription's loaded state
// before it found the gap, so that state is not saved (opsTx fails the subscription's operations
// of the transaction, and only them).
var errMessageMissing = errors.New("message missing above the low offset")

// fillMsg completes a scanned message with its optional columns.
func fillMsg(m *storage.Message, headers []byte, producerID *string, notBefore, expiresAt pgtype.Timestamptz) error {
	m.PublishedAt = m.PublishedAt.UTC()
	if m.Payload == nil {
		m.Payload = []byte{}
	}
	if len(headers) > 0 {
		if err := json.Unmarshal(headers, &m.Headers); err != nil {
			return fmt.Errorf("%w: topic %q message %d:%d: headers: %v", storage.ErrCorrupt, m.Topic, m.Partition, m.Offset, err)
		}
	}
	if producerID != nil {
		m.ProducerID = *producerID
	}
	if notBefore.Valid {
		m.NotBefore = notBefore.Time.UTC()
	}
	if expiresAt.Valid {
		m.ExpiresAt = expiresAt.Time.UTC()
	}
	return nil
}

// DeliveriesAck completes messages of the subscription, delivered or not; durable when it returns
// (the transaction commits with synchronous_commit). A replayed DLQ copy of a message is completed
// first. Refs above the high-water mark or in partitions that do not exist are listed in Unknown.
// Acks and claims of one Engine are combined into shared transactions (see submit).
func (e *Engine) DeliveriesAck(ctx context.Context, p *storage.DeliveriesAckParams) (*storage.DeliveriesAckResult, error) {
	if err := p.Check(); err != nil {
		return nil, err
	}
	op := &dop{sub: p.SubscriptionID, refs: p.Refs, ackMember: p.Member, ackGeneration: p.Generation, ackBatch: p.Batch}
	if err := e.submit(ctx, op); err != nil {
		return nil, err
	}
	return op.ackRes, op.err
}

// ackOn runs the acks of batch, in order, on the loaded state st of their subscription; the caller
// saves st.
func ackOn(st *dstate, batch []*dop, now time.Time) {
	ahead := map[dref]bool{}
	for _, req := range batch {
		res := &storage.DeliveriesAckResult{}
		req.ackRes = res
		for _, r := range req.refs {
			k := dref{r.Partition, r.Offset}
			dp := st.partOf[r.Partition]
			if dp == nil || r.Offset < 0 {
				res.Unknown = append(res.Unknown, r)
				continue
			}
			if rp := st.replay[k]; rp != nil {
				rp.acked, rp.changed = true, true
				delete(st.replay, k)
				res.Acked++
				st.acked = append(st.acked, k)
				continue
			}
			if r.Offset < dp.floor || ahead[k] {
				res.AlreadyDone++
				continue
			}
			if row := st.rowOf(r.Partition, r.Offset); row != nil {
				if row.state == stAcked {
					res.AlreadyDone++
				} else {
					st.take(r.Partition, r.Offset)
					res.Acked++
					st.acked = append(st.acked, k)
				}
				continue
			}
			if r.Offset < dp.cursor || inRun(dp.skips, r.Offset) {
				res.AlreadyDone++
				continue
			}
			if r.Offset >= dp.hw {
				res.Unknown = append(res.Unknown, r)
				continue
			}
			ahead[k] = true
			res.Acked++
			st.acked = append(st.acked, k)
		}
	}
	// Acks of never-delivered messages: the cursor passes those at it, an acked row lists the
	// others until the cursor reaches them.
	byPart := map[int32][]int64{}
	for k := range ahead {
		byPart[k.p] = append(byPart[k.p], k.o)
	}
	for _, dp := range st.parts {
		offs := byPart[dp.p]
		if len(offs) == 0 {
			continue
		}
		slices.Sort(offs)
		for len(offs) > 0 && offs[0] == dp.cursor {
			dp.cursor++
			offs = offs[1:]
		}
		if len(offs) > 0 {
			st.add(dp.p, offs, stAcked, 0, "", now)
		}
	}
}

// held reports whether member holds the lease of a row or replayed entry at now.
func held(state, holder string, due time.Time, member string, now time.Time) bool {
	return state == stLeased && holder == member && now.Before(due)
}

// DeliveriesNack gives back messages Member holds: due again after Delay (at once when 0), or
// dead-lettered with ToDLQ (reason rejected) or on their max_deliveries-th delivery (reason
// max_deliveries), with Reason as the entry's last error. Refs the member does not hold are
// listed in NotHeld. Durable when it returns. Nacks share the transactions of claims and acks (see
// submit).
func (e *Engine) DeliveriesNack(ctx context.Context, p *storage.DeliveriesNackParams) (*storage.DeliveriesNackResult, error) {
	if err := p.Check(); err != nil {
		return nil, err
	}
	op := &dop{sub: p.SubscriptionID, nack: p}
	if err := e.submit(ctx, op); err != nil {
		return nil, err
	}
	return op.nackRes, op.err
}

// nackOn runs nack p on the loaded state st of its subscription; the caller saves st.
func nackOn(st *dstate, p *storage.DeliveriesNackParams, now time.Time) *storage.DeliveriesNackResult {
	res := &storage.DeliveriesNackResult{}
	due := now.Add(p.Delay).Truncate(time.Microsecond)
	maxDel := st.cfg.MaxDeliveries
	reason := storage.DLQMaxDeliveries
	if p.ToDLQ {
		reason = storage.DLQRejected
	}
	nacked := map[*drow][]int64{}
	seen := map[dref]bool{}
	poison := poisonNack{rules: st.cfg.PoisonRules, f: policy.Failure{Member: p.Member, Reason: p.Reason, At: now.UnixNano()}}
	for _, r := range p.Refs {
		k := dref{r.Partition, r.Offset}
		if rp := st.replay[k]; rp != nil {
			if !held(rp.state, rp.member, rp.due, p.Member, now) {
				res.NotHeld = append(res.NotHeld, r)
				continue
			}
			if p.GiveBack != "" {
				rp.state, rp.due, rp.attempt, rp.member, rp.changed = stWaiting, due, max(0, rp.attempt-1), p.GiveBack, true
				res.Nacked++
				continue
			}
			hist, rule := poison.fail(rp.failures)
			switch {
			case p.ToDLQ || rp.attempt >= maxDel:
				rp.dead, rp.changed = &dlqOutcome{reason: reason, lastErr: p.Reason, attempt: rp.attempt, failures: hist}, true
				delete(st.replay, k)
				res.DeadLettered++
			case rule != "":
				rp.dead, rp.changed = &dlqOutcome{reason: storage.DLQPoison, lastErr: p.Reason, attempt: rp.attempt, rule: rule, failures: hist}, true
				delete(st.replay, k)
				res.DeadLettered++
			default:
				rp.state, rp.due, rp.failures, rp.changed = stWaiting, due, hist, true
				res.Nacked++
			}
			continue
		}
		row := st.rowOf(r.Partition, r.Offset)
		if row == nil || seen[k] || !held(row.state, row.member, row.due, p.Member, now) {
			res.NotHeld = append(res.NotHeld, r)
			continue
		}
		if p.GiveBack != "" {
			seen[k] = true
			nacked[row] = append(nacked[row], r.Offset)
			res.Nacked++
			continue
		}
		hist, rule := poison.fail(row.failures)
		if p.ToDLQ || row.attempt >= maxDel || rule != "" {
			out := dlqOutcome{reason: reason, lastErr: p.Reason, attempt: row.attempt, failures: hist}
			if !p.ToDLQ && row.attempt < maxDel {
				out.reason, out.rule = storage.DLQPoison, rule
			}
			st.take(r.Partition, r.Offset)
			st.deadLetterOutcome(r.Partition, r.Offset, out)
			res.DeadLettered++
			continue
		}
		seen[k] = true
		nacked[row] = append(nacked[row], r.Offset)
		res.Nacked++
	}
	for _, row := range slices.Clone(st.rows) {
		if offs := nacked[row]; len(offs) > 0 && p.GiveBack != "" {
			st.moveOffsets(row, offs, stWaiting, max(0, row.attempt-1), p.GiveBack, due) // undone: see DeliveriesNackParams.GiveBack
		} else if len(offs) > 0 {
			hist, _ := poison.fail(row.failures)
			st.moveOffsets(row, offs, stWaiting, row.attempt, p.Member, due).failures = hist
		}
	}
	return res
}

// DeliveriesExtend sets the lease deadline of messages Member holds to now + Duration (the topic's
// ack_wait when 0), also when that is earlier than the current deadline. Extends share the
// transactions of claims and acks (see submit).
func (e *Engine) DeliveriesExtend(ctx context.Context, p *storage.DeliveriesExtendParams) (*storage.DeliveriesExtendResult, error) {
	if err := p.Check(); err != nil {
		return nil, err
	}
	op := &dop{sub: p.SubscriptionID, extend: p}
	if err := e.submit(ctx, op); err != nil {
		return nil, err
	}
	return op.extendRes, op.err
}

// extendOn runs extend p on the loaded state st of its subscription; the caller saves st.
func extendOn(st *dstate, p *storage.DeliveriesExtendParams, now time.Time) *storage.DeliveriesExtendResult {
	res := &storage.DeliveriesExtendResult{}
	d := p.Duration
	if d == 0 {
		d = st.cfg.AckWait
	}
	deadline := now.Add(d).Truncate(time.Microsecond)
	res.Deadline = deadline
	extended := map[*drow][]int64{}
	seen := map[dref]bool{}
	for _, r := range p.Refs {
		k := dref{r.Partition, r.Offset}
		if rp := st.replay[k]; rp != nil {
			if held(rp.state, rp.member, rp.due, p.Member, now) {
				rp.due, rp.changed = deadline, true
				if p.NewMember != "" {
					rp.member = p.NewMember
				}
				res.Extended++
			} else {
				res.NotHeld = append(res.NotHeld, r)
			}
			continue
		}
		row := st.rowOf(r.Partition, r.Offset)
		if row == nil || !held(row.state, row.member, row.due, p.Member, now) {
			res.NotHeld = append(res.NotHeld, r)
			continue
		}
		res.Extended++
		if !seen[k] {
			seen[k] = true
			extended[row] = append(extended[row], r.Offset)
		}
	}
	for _, row := range slices.Clone(st.rows) {
		if offs := extended[row]; len(offs) > 0 {
			member := row.member
			if p.NewMember != "" {
				member = p.NewMember // handed over (DeliveriesExtendParams.NewMember)
			}
			st.moveOffsets(row, offs, stLeased, row.attempt, member, deadline)
		}
	}
	return res
}

// DeliveriesRelease gives back every lease Member holds on the subscription (expired ones not yet
// processed included): due at once, attempts kept; those on their max_deliveries-th delivery go to
// the DLQ (reason max_deliveries, last error "member left"). It runs in a transaction of its own
// (not on a lane: a member leaves rarely), bounded by Config.TxTimeout like the lanes'
// (a member that leaves while the database does not answer would otherwise hold the broker's
// teardown of its connection); a release that timed out leaves the leases to expire.
func (e *Engine) DeliveriesRelease(ctx context.Context, p *storage.DeliveriesReleaseParams) (*storage.DeliveriesReleaseResult, error) {
	if err := p.Check(); err != nil {
		return nil, err
	}
	var topic string
	res, err := withTxTimeout(e, ctx, "release", func(ctx context.Context) (*storage.DeliveriesReleaseResult, error) {
		return e.release(ctx, p, &topic)
	})
	if err == nil && res.Released > 0 {
		e.announceToOthers(storage.Notification{Kind: storage.NotifyMessages, Topic: topic})
	}
	return res, err
}

// release runs DeliveriesRelease's transaction and sets *topic to the subscription's topic.
func (e *Engine) release(ctx context.Context, p *storage.DeliveriesReleaseParams, topic *string) (*storage.DeliveriesReleaseResult, error) {
	var res *storage.DeliveriesReleaseResult
	err := e.pipeTx(ctx, func(tx pgx.Tx) error {
		res = &storage.DeliveriesReleaseResult{}
		now := e.now()
		st, err := e.loadState(ctx, tx, p.SubscriptionID, loadMember, p.Member, loadWant{}, true)
		if err != nil {
			return err
		}
		*topic = st.sub.Topic
		maxDel := st.cfg.MaxDeliveries
		for _, r := range slices.Clone(st.rows) {
			if r.state != stLeased || r.member != p.Member {
				continue
			}
			live := slices.Clone(r.live())
			if r.attempt >= maxDel {
				for _, o := range live {
					st.take(r.partition, o)
					st.deadLetterOutcome(r.partition, o, dlqOutcome{reason: storage.DLQMaxDeliveries, lastErr: "member left", attempt: r.attempt, failures: r.failures})
				}
				res.DeadLettered += len(live)
				continue
			}
			r.state, r.due, r.changed = stWaiting, now, true
			res.Released += len(live)
		}
		for _, rp := range st.replays {
			if rp.state != stLeased || rp.member != p.Member {
				continue
			}
			rp.changed = true
			if rp.attempt >= maxDel {
				rp.dead = &dlqOutcome{reason: storage.DLQMaxDeliveries, lastErr: "member left", attempt: rp.attempt, failures: rp.failures}
				res.DeadLettered++
				continue
			}
			rp.state, rp.due = stWaiting, now
			res.Released++
		}
		return e.save(ctx, tx, st, now)
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// trimDeliveryState removes the delivery state of subscription partitions of (topicID,
// partition) below newLow and raises their ack floors and cursors to newLow (retention removed
// the messages below it). Called by RetentionApply inside its transaction, with the partition
// row locked. It locks the sub_partitions rows it changes first, in subscription order.
func (e *Engine) trimDeliveryState(ctx context.Context, tx pgx.Tx, topicID int64, partition int32, newLow int64) error {
	b := &pgx.Batch{}
	b.Queue(e.sql(`SELECT 1 FROM spool.sub_partitions sp JOIN spool.subscriptions s ON s.id = sp.sub_id
		WHERE s.topic_id = $1 AND sp.partition = $2 AND (sp.ack_floor < $3 OR sp.cursor < $3)
		ORDER BY sp.sub_id FOR UPDATE OF sp`), topicID, partition, newLow)
	b.Queue(e.sql(`DELETE FROM spool.deliveries d USING spool.subscriptions s
		WHERE s.topic_id = $1 AND d.sub_id = s.id AND d.partition = $2 AND d.lo < $3 AND d.offsets[cardinality(d.offsets)] < $3`),
		topicID, partition, newLow)
	b.Queue(e.sql(`UPDATE spool.deliveries d
		SET offsets = ARRAY(SELECT o FROM unnest(d.offsets) AS o WHERE o >= $3 ORDER BY o),
			lo = (SELECT min(o) FROM unnest(d.offsets) AS o WHERE o >= $3)
		WHERE d.partition = $2 AND d.lo < $3 AND d.sub_id IN (SELECT s.id FROM spool.subscriptions s WHERE s.topic_id = $1)`),
		topicID, partition, newLow)
	b.Queue(e.sql(`UPDATE spool.sub_partitions sp
		SET cursor = greatest(sp.cursor, $3),
			ack_floor = least(greatest(sp.cursor, $3), coalesce((SELECT min(d.lo) FROM spool.deliveries d
				WHERE d.sub_id = sp.sub_id AND d.partition = sp.partition), greatest(sp.cursor, $3)))
		WHERE sp.partition = $2 AND (sp.ack_floor < $3 OR sp.cursor < $3)
		  AND sp.sub_id IN (SELECT s.id FROM spool.subscriptions s WHERE s.topic_id = $1)`), topicID, partition, newLow)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("pgstore: topic %d partition %d: trim delivery state below %d: %w", topicID, partition, newLow, err)
	}
	return nil
}
