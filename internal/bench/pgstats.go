package bench

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgTimeout bounds the connection to PostgreSQL and each statistics snapshot.
const pgTimeout = 10 * time.Second

// maxPGErrors bounds the errors a PGResult keeps (the rest are counted).
const maxPGErrors = 20

// messagesTable is the partitioned table of the broker's schema whose partitions (time buckets
// that retention drops) are counted and summed as one.
const messagesTable = "messages"

// PGResult are the PostgreSQL figures of a run (Config.PGURL): the WAL written and the tables'
// tuple counters over the measured window, dead tuples and sizes at the end, and a series of
// samples of the schema's size taken every Config.PGSample during the run.
//
// The window runs from the end of the warm-up to the last publish acknowledgement. The WAL is the
// whole cluster's (pg_current_wal_lsn): anything else writing to the same PostgreSQL counts. The
// tuple counters come from pg_stat_user_tables, which backends update about once a second (up to
// 10 s late when idle), so deltas may miss the last second of the window; the counters of a
// partition dropped during the window go with it (DroppedPartitions).
type PGResult struct {
	// Schema is the broker's schema; SampleSeconds the interval of the series (Config.PGSample).
	Schema        string  `json:"schema"`
	SampleSeconds float64 `json:"sample_interval_s"`
	// Window reports that both window snapshots were read; the window figures are 0 otherwise.
	Window        bool    `json:"window_measured"`
	WindowSeconds float64 `json:"window_s"`
	// Messages is the divisor of the per-message figures: the messages published in the
	// measured time (Result.Publish.Messages).
	Messages int64 `json:"messages"`
	// WALBytes is the WAL written in the window (pg_wal_lsn_diff of pg_current_wal_lsn at its
	// ends); WALBytesPerMessage is WALBytes / Messages.
	WALBytes           int64   `json:"wal_bytes"`
	WALBytesPerMessage float64 `json:"wal_bytes_per_message"`
	// WALRecords and WALFullPageImages are pg_stat_wal deltas over the window (cluster-wide).
	WALRecords        int64 `json:"wal_records"`
	WALFullPageImages int64 `json:"wal_full_page_images"`
	// LiveTuples, DeadTuples (n_live_tup, n_dead_tup) and TotalBytes (pg_total_relation_size:
	// heap, indexes and TOAST) summed over the schema's tables at the end of the run, before the
	// topic is deleted.
	LiveTuples int64 `json:"live_tuples"`
	DeadTuples int64 `json:"dead_tuples"`
	TotalBytes int64 `json:"total_bytes"`
	// Tables are the schema's tables, largest first; the partitions of <schema>.messages are
	// summed in its row.
	Tables []PGTable `json:"tables"`
	// Samples is the series: one at the start of the run, one every Config.PGSample, one at each
	// end of the window and one at the end.
	Samples []PGSample `json:"samples"`
	// Errors are the first errors reading statistics; ErrorCount counts them all.
	Errors     []string `json:"errors,omitempty"`
	ErrorCount int      `json:"error_count"`
}

// PGTable is one table of the schema: its counters at the end of the run and the deltas of its
// tuple counters over the window.
type PGTable struct {
	Name string `json:"name"`
	// Partitions counts the partitions of a partitioned table at the end of the run;
	// DroppedPartitions those dropped during the window (their counters are lost).
	Partitions        int `json:"partitions,omitempty"`
	DroppedPartitions int `json:"dropped_partitions,omitempty"`
	// At the end of the run.
	SizeBytes  int64 `json:"size_bytes"`
	LiveTuples int64 `json:"live_tuples"`
	DeadTuples int64 `json:"dead_tuples"`
	// WindowStartBytes and WindowEndBytes are its size (pg_total_relation_size) at the window's
	// ends (0 when a snapshot is missing), WindowMidBytes at the first sample taken at or after
	// its middle (0 without one: the window was shorter than Config.PGSample).
	WindowStartBytes int64 `json:"window_start_bytes"`
	WindowMidBytes   int64 `json:"window_mid_bytes,omitempty"`
	WindowEndBytes   int64 `json:"window_end_bytes"`
	// Deltas over the window: n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, autovacuum_count.
	Inserted    int64 `json:"inserted"`
	Updated     int64 `json:"updated"`
	HotUpdated  int64 `json:"hot_updated"`
	Deleted     int64 `json:"deleted"`
	Autovacuums int64 `json:"autovacuums"`
}

// PGSample is one point of the series.
type PGSample struct {
	// Elapsed is the time since the first sample (before the run's topic was created).
	Elapsed float64 `json:"elapsed_s"`
	// Phase is start, warm-up, window start, measured, window end, after (the drain) or end.
	Phase string `json:"phase"`
	// TotalBytes sums pg_total_relation_size over the schema's tables and the partitions of
	// <schema>.messages; MessagesBytes is the partitions' share.
	TotalBytes    int64 `json:"total_bytes"`
	MessagesBytes int64 `json:"messages_bytes"`
	// Partitions is the number of partitions of <schema>.messages.
	Partitions int `json:"messages_partitions"`
	// LiveTuples and DeadTuples are summed over the schema's tables.
	LiveTuples int64 `json:"live_tuples"`
	DeadTuples int64 `json:"dead_tuples"`
	// WALBytes is the WAL written since the first sample (cluster-wide).
	WALBytes int64 `json:"wal_bytes"`
	// Error says why the sample is incomplete.
	Error string `json:"error,omitempty"`
}

// pgRel is one relation's statistics in a snapshot.
type pgRel struct {
	name                                          string
	msgPart                                       bool // a partition of <schema>.messages
	live, dead, ins, upd, hot, del, autovac, size int64
}

// pgSnapshot is the statistics read at one time.
type pgSnapshot struct {
	at             time.Time
	wal            int64 // bytes since 0/0
	walOK          bool
	walRecs, walFP int64 // pg_stat_wal
	walStatOK      bool
	rels           map[int64]pgRel // by OID; nil if unread
}

// statsQuery reads the tables of schema $1 and the partitions of $1.messages (wherever they are).
const statsQuery = `
SELECT c.oid::bigint, c.relname::text, p.relid IS NOT NULL,
       COALESCE(s.n_live_tup, 0), COALESCE(s.n_dead_tup, 0), COALESCE(s.n_tup_ins, 0),
       COALESCE(s.n_tup_upd, 0), COALESCE(s.n_tup_hot_upd, 0), COALESCE(s.n_tup_del, 0),
       COALESCE(s.autovacuum_count, 0), COALESCE(pg_total_relation_size(c.oid), 0)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_partition_tree(to_regclass(format('%I.%I', $1::text, $2::text))) p
       ON p.relid = c.oid AND p.isleaf AND p.level > 0
LEFT JOIN pg_stat_all_tables s ON s.relid = c.oid
WHERE (n.nspname = $1 AND c.relkind IN ('r', 'p', 'm')) OR p.relid IS NOT NULL`

// pgMonitor reads PostgreSQL statistics during a run. Its methods are safe for concurrent use.
type pgMonitor struct {
	schema string
	every  time.Duration
	origin time.Time

	startReq chan time.Time // the window start, once
	started  chan struct{}  // closed when the window start snapshot was taken
	stop     chan struct{}
	done     chan struct{}

	mu       sync.Mutex // guards what follows; held across a snapshot (conn is not concurrent)
	conn     *pgx.Conn  // nil when the connection failed
	res      PGResult
	first    *pgSnapshot
	winStart *pgSnapshot
	winEnd   *pgSnapshot
	// measured are the samples taken inside the window (pgTables reads the table sizes of the
	// one at its middle).
	measured []*pgSnapshot
	ended    bool
}

// startPGMonitor connects to url, takes the first sample and starts sampling every interval. A
// connection error is recorded in the result, not returned: the run goes on without statistics.
func startPGMonitor(url, schema string, every time.Duration) *pgMonitor {
	m := &pgMonitor{schema: schema, every: every, origin: time.Now(),
		startReq: make(chan time.Time, 1), started: make(chan struct{}), stop: make(chan struct{}),
		done: make(chan struct{})}
	m.res.Schema, m.res.SampleSeconds = schema, every.Seconds()
	ctx, cancel := context.WithTimeout(context.Background(), pgTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		m.addError(fmt.Errorf("connect: %w", err))
		close(m.done)
		return m
	}
	m.conn = conn
	m.mu.Lock()
	m.first = m.sampleLocked("start")
	m.mu.Unlock()
	go m.loop()
	return m
}

// loop samples every m.every and takes the window start snapshot when it is due.
func (m *pgMonitor) loop() {
	defer close(m.done)
	tick := time.NewTicker(m.every)
	defer tick.Stop()
	var startTimer *time.Timer
	var startC <-chan time.Time
	defer func() {
		if startTimer != nil {
			startTimer.Stop()
		}
	}()
	for {
		select {
		case <-m.stop:
			return
		case at := <-m.startReq:
			startTimer = time.NewTimer(time.Until(at))
			startC = startTimer.C
		case <-startC:
			startC = nil
			m.mu.Lock()
			if m.winStart == nil && !m.ended {
				m.winStart = m.sampleLocked("window start")
				close(m.started)
			}
			m.mu.Unlock()
		case <-tick.C:
			m.mu.Lock()
			phase := "warm-up"
			switch {
			case m.winEnd != nil:
				phase = "after"
			case m.winStart != nil:
				phase = "measured"
			}
			if snap := m.sampleLocked(phase); phase == "measured" && snap.rels != nil {
				m.measured = append(m.measured, snap)
			}
			m.mu.Unlock()
		}
	}
}

// windowStart schedules the window start snapshot at at (at once if it passed). Call it once.
func (m *pgMonitor) windowStart(at time.Time) {
	select {
	case m.startReq <- at:
	default:
	}
}

// windowEnd takes the window end snapshot now.
func (m *pgMonitor) windowEnd() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.conn == nil || m.winEnd != nil {
		return
	}
	if m.winStart == nil {
		// The window closed before its start was read (a run cut short): no window figures.
		m.addErrorLocked(fmt.Errorf("the window ended before its start snapshot"))
	}
	m.winEnd = m.sampleLocked("window end")
}

// finish stops the sampling, takes the last sample, closes the connection and returns the
// figures; published is the number of messages published in the window.
func (m *pgMonitor) finish(published int64) *PGResult {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ended {
		r := m.res
		return &r
	}
	m.ended = true
	if m.conn == nil {
		r := m.res
		return &r
	}
	final := m.sampleLocked("end")
	ctx, cancel := context.WithTimeout(context.Background(), pgTimeout)
	defer cancel()
	_ = m.conn.Close(ctx)
	m.conn = nil

	r := &m.res
	r.Messages = published
	s, e := m.winStart, m.winEnd
	if s != nil && e != nil && s.walOK && e.walOK {
		r.Window = true
		r.WindowSeconds = e.at.Sub(s.at).Seconds()
		r.WALBytes = e.wal - s.wal
		if published > 0 {
			r.WALBytesPerMessage = float64(r.WALBytes) / float64(published)
		}
		if s.walStatOK && e.walStatOK {
			r.WALRecords, r.WALFullPageImages = e.walRecs-s.walRecs, e.walFP-s.walFP
		}
	}
	last := final
	if last.rels == nil {
		last = e
	}
	if last != nil && last.rels != nil {
		r.Tables = pgTables(s, m.middle(), e, last)
		for _, t := range r.Tables {
			r.LiveTuples += t.LiveTuples
			r.DeadTuples += t.DeadTuples
			r.TotalBytes += t.SizeBytes
		}
	}
	out := *r
	return &out
}

// middle returns the first sample taken at or after the middle of the window, nil without one.
func (m *pgMonitor) middle() *pgSnapshot {
	if m.winStart == nil || m.winEnd == nil {
		return nil
	}
	mid := m.winStart.at.Add(m.winEnd.at.Sub(m.winStart.at) / 2)
	for _, snap := range m.measured {
		if !snap.at.Before(mid) {
			return snap
		}
	}
	return nil
}

// pgTables groups the relations of final by table (the partitions of messages in its row), with
// the deltas of their counters between start and end (none when either is missing) and their
// sizes at mid (a sample in the middle of the window; nil: none).
func pgTables(start, mid, end, final *pgSnapshot) []PGTable {
	key := func(r pgRel) string {
		if r.msgPart {
			return messagesTable
		}
		return r.name
	}
	byName := map[string]*PGTable{}
	row := func(name string) *PGTable {
		t := byName[name]
		if t == nil {
			t = &PGTable{Name: name}
			byName[name] = t
		}
		return t
	}
	for _, r := range final.rels {
		t := row(key(r))
		t.SizeBytes += r.size
		t.LiveTuples += r.live
		t.DeadTuples += r.dead
		if r.msgPart {
			t.Partitions++
		}
	}
	if start != nil && end != nil && start.rels != nil && end.rels != nil {
		for _, s := range start.rels {
			row(key(s)).WindowStartBytes += s.size
		}
		if mid != nil {
			for _, r := range mid.rels {
				row(key(r)).WindowMidBytes += r.size
			}
		}
		for oid, e := range end.rels {
			s := start.rels[oid] // zero for a relation created in the window
			t := row(key(e))
			t.WindowEndBytes += e.size
			t.Inserted += max(e.ins-s.ins, 0)
			t.Updated += max(e.upd-s.upd, 0)
			t.HotUpdated += max(e.hot-s.hot, 0)
			t.Deleted += max(e.del-s.del, 0)
			t.Autovacuums += max(e.autovac-s.autovac, 0)
		}
		for oid, s := range start.rels {
			if _, ok := end.rels[oid]; !ok && s.msgPart {
				row(messagesTable).DroppedPartitions++
			}
		}
	}
	out := make([]PGTable, 0, len(byName))
	for _, t := range byName {
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b PGTable) int {
		if c := cmp.Compare(b.SizeBytes, a.SizeBytes); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return out
}

// sampleLocked takes a snapshot and appends its sample to the series; m.mu is held.
func (m *pgMonitor) sampleLocked(phase string) *pgSnapshot {
	s := &pgSnapshot{at: time.Now()}
	smp := PGSample{Elapsed: s.at.Sub(m.origin).Seconds(), Phase: phase}
	if m.conn == nil {
		return s
	}
	ctx, cancel := context.WithTimeout(context.Background(), pgTimeout)
	defer cancel()
	var errs []string
	fail := func(what string, err error) {
		err = fmt.Errorf("%s sample at %.1f s, %s: %w", phase, smp.Elapsed, what, err)
		m.addErrorLocked(err)
		errs = append(errs, err.Error())
	}
	if err := m.conn.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint`).Scan(&s.wal); err != nil {
		fail("pg_current_wal_lsn", err)
	} else {
		s.walOK = true
	}
	if err := m.conn.QueryRow(ctx, `SELECT wal_records, wal_fpi FROM pg_stat_wal`).Scan(&s.walRecs, &s.walFP); err != nil {
		fail("pg_stat_wal", err)
	} else {
		s.walStatOK = true
	}
	rels, err := readRels(ctx, m.conn, m.schema)
	if err != nil {
		fail("table statistics", err)
	} else {
		s.rels = rels
	}
	for _, r := range s.rels {
		smp.TotalBytes += r.size
		smp.LiveTuples += r.live
		smp.DeadTuples += r.dead
		if r.msgPart {
			smp.MessagesBytes += r.size
			smp.Partitions++
		}
	}
	if s.walOK && m.first != nil && m.first.walOK {
		smp.WALBytes = s.wal - m.first.wal
	}
	if len(errs) > 0 {
		smp.Error = errs[0]
	}
	m.res.Samples = append(m.res.Samples, smp)
	return s
}

// readRels reads the statistics of the schema's tables.
func readRels(ctx context.Context, conn *pgx.Conn, schema string) (map[int64]pgRel, error) {
	rows, err := conn.Query(ctx, statsQuery, schema, messagesTable)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	rels := map[int64]pgRel{}
	for rows.Next() {
		var oid int64
		var r pgRel
		if err := rows.Scan(&oid, &r.name, &r.msgPart, &r.live, &r.dead, &r.ins, &r.upd, &r.hot, &r.del,
			&r.autovac, &r.size); err != nil {
			return nil, err
		}
		rels[oid] = r
	}
	return rels, rows.Err()
}

// addError records a statistics error.
func (m *pgMonitor) addError(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.addErrorLocked(err)
}

func (m *pgMonitor) addErrorLocked(err error) {
	m.res.ErrorCount++
	if len(m.res.Errors) < maxPGErrors {
		m.res.Errors = append(m.res.Errors, "bench: postgres statistics: "+err.Error())
	}
}
