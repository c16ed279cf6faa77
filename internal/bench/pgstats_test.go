package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/testutil"
)

// pgFixture is a fresh schema t_bench_<random> shaped like the broker's: a messages table
// range-partitioned by time (two partitions) and a leases table of 20 rows. The schema is
// dropped at the end of the test.
type pgFixture struct {
	url, schema string
	conn        *pgx.Conn
}

func newPGFixture(t *testing.T) *pgFixture {
	t.Helper()
	url := testutil.DatabaseURL(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	f := &pgFixture{url: url, schema: "t_bench_" + hex.EncodeToString(b[:])}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect to TEST_DATABASE_URL: %v", err)
	}
	f.conn = conn
	t.Cleanup(func() {
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{f.schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", f.schema, err)
		}
		_ = conn.Close(ctx)
	})
	f.exec(t, `CREATE SCHEMA {s}`,
		`CREATE TABLE {s}.messages (id bigint NOT NULL, at timestamptz NOT NULL, payload bytea) PARTITION BY RANGE (at)`,
		`CREATE INDEX ON {s}.messages (id)`,
		`CREATE TABLE {s}.messages_b1 PARTITION OF {s}.messages FOR VALUES FROM ('2020-01-01') TO ('2021-01-01')`,
		`CREATE TABLE {s}.messages_b2 PARTITION OF {s}.messages FOR VALUES FROM ('2021-01-01') TO ('2022-01-01')`,
		`CREATE TABLE {s}.leases (id int PRIMARY KEY, n int NOT NULL) WITH (autovacuum_enabled = off)`,
		`INSERT INTO {s}.leases SELECT g, 0 FROM generate_series(1, 20) g`,
		`INSERT INTO {s}.messages SELECT g, '2020-06-01', '\x00' FROM generate_series(1, 30) g`,
		`SELECT pg_stat_force_next_flush()`)
	return f
}

// exec runs statements, {s} standing for the quoted schema name.
func (f *pgFixture) exec(t *testing.T, stmts ...string) {
	t.Helper()
	for _, q := range stmts {
		q = strings.ReplaceAll(q, "{s}", pgx.Identifier{f.schema}.Sanitize())
		if _, err := f.conn.Exec(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// waitStats polls pg_stat_user_tables until table's n_tup_upd reaches upd (the statistics reach
// other sessions when the writing backend flushes them).
func (f *pgFixture) waitStats(t *testing.T, table string, upd int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var got int64
		err := f.conn.QueryRow(context.Background(),
			`SELECT COALESCE(sum(n_tup_upd), 0)::bigint FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`,
			f.schema, table).Scan(&got)
		if err != nil {
			t.Fatal(err)
		}
		if got >= upd {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s.%s: n_tup_upd %d, want %d", f.schema, table, got, upd)
		}
		f.exec(t, `SELECT pg_stat_force_next_flush()`)
	}
}

// TestPGMonitor reads the statistics of a fresh schema around a window in which the test
// updates, inserts, deletes, creates a partition of messages and drops one: the window's
// counter deltas, the WAL, the dead tuples, the dropped partition and the series.
func TestPGMonitor(t *testing.T) {
	t.Parallel()
	f := newPGFixture(t)
	m := startPGMonitor(f.url, f.schema, time.Hour)
	m.windowStart(time.Now())
	// The window start snapshot is taken by the sampling goroutine: wait for it.
	select {
	case <-m.started:
	case <-time.After(30 * time.Second):
		t.Fatal("no window start snapshot")
	}
	f.exec(t,
		`UPDATE {s}.leases SET n = n + 1 WHERE id <= 10`,
		`DELETE FROM {s}.leases WHERE id > 17`,
		`CREATE TABLE {s}.messages_b3 PARTITION OF {s}.messages FOR VALUES FROM ('2022-01-01') TO ('2023-01-01')`,
		`INSERT INTO {s}.messages SELECT g, '2022-06-01', '\x00' FROM generate_series(1, 40) g`,
		`DROP TABLE {s}.messages_b1`,
		`SELECT pg_stat_force_next_flush()`)
	f.waitStats(t, "leases", 10)
	m.windowEnd()
	res := m.finish(100)
	out, _ := json.MarshalIndent(res, "", "  ")
	t.Logf("%s", out)

	if res.ErrorCount != 0 || !res.Window || res.Schema != f.schema || res.Messages != 100 {
		t.Fatalf("result: %+v", res)
	}
	if res.WALBytes <= 0 || res.WALBytesPerMessage != float64(res.WALBytes)/100 || res.WALRecords <= 0 {
		t.Fatalf("WAL: %d bytes, %v per message, %d records", res.WALBytes, res.WALBytesPerMessage, res.WALRecords)
	}
	tables := map[string]PGTable{}
	for _, tb := range res.Tables {
		tables[tb.Name] = tb
	}
	if len(tables) != 2 {
		t.Fatalf("tables %+v, want messages and leases", res.Tables)
	}
	l, msg := tables["leases"], tables["messages"]
	if l.Updated != 10 || l.Deleted != 3 || l.Inserted != 0 || l.HotUpdated > l.Updated || l.LiveTuples != 17 ||
		l.DeadTuples < 1 || l.DeadTuples > 13 || l.SizeBytes <= 0 {
		t.Fatalf("leases: %+v", l)
	}
	if msg.Partitions != 2 || msg.DroppedPartitions != 1 || msg.Inserted != 40 || msg.LiveTuples != 40 || msg.SizeBytes <= 0 {
		t.Fatalf("messages: %+v", msg)
	}
	if res.DeadTuples != l.DeadTuples+msg.DeadTuples || res.TotalBytes != l.SizeBytes+msg.SizeBytes {
		t.Fatalf("sums: dead %d, bytes %d", res.DeadTuples, res.TotalBytes)
	}
	var phases []string
	for _, s := range res.Samples {
		phases = append(phases, s.Phase)
		if s.Error != "" || s.TotalBytes <= 0 || s.MessagesBytes <= 0 || s.MessagesBytes >= s.TotalBytes {
			t.Fatalf("sample %+v", s)
		}
	}
	if got := strings.Join(phases, ","); got != "start,window start,window end,end" {
		t.Fatalf("phases %s", got)
	}
	if first, last := res.Samples[0], res.Samples[3]; first.Partitions != 2 || last.Partitions != 2 ||
		first.WALBytes != 0 || last.WALBytes < res.WALBytes {
		t.Fatalf("first sample %+v, last %+v", first, last)
	}

	var buf bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&buf, format, args...) }
	res.writeSummary(p)
	t.Log("\n" + buf.String())
	for _, want := range []string{"bytes per message published (100)", "messages (2 part., 1 dropped)", "window end"} {
		if !strings.Contains(buf.String(), want) {
			t.Fatalf("summary lacks %q", want)
		}
	}
}

// TestPGMonitorErrors: a database that cannot be reached is reported in the result, and a schema
// without tables gives empty figures, not errors.
func TestPGMonitorErrors(t *testing.T) {
	t.Parallel()
	m := startPGMonitor("postgres://nobody@127.0.0.1:1/none?connect_timeout=5&sslmode=disable", "spool", time.Second)
	m.windowStart(time.Now())
	m.windowEnd()
	res := m.finish(10)
	if res.ErrorCount != 1 || len(res.Errors) != 1 || !strings.Contains(res.Errors[0], "connect") || res.Window || len(res.Samples) != 0 {
		t.Fatalf("unreachable: %+v", res)
	}
	if again := m.finish(10); again.ErrorCount != 1 {
		t.Fatalf("second finish: %+v", again)
	}
}

// TestPGTables: deltas per table over the window, with a partition created in the window (its
// counters count from 0) and one dropped (counted as dropped; its counters are lost).
func TestPGTables(t *testing.T) {
	t.Parallel()
	start := &pgSnapshot{rels: map[int64]pgRel{
		1: {name: "leases", upd: 100, hot: 50, del: 5, ins: 10, dead: 7, size: 8192},
		2: {name: "messages_a", msgPart: true, ins: 1000, size: 1 << 20},
		3: {name: "messages_b", msgPart: true, ins: 500, size: 1 << 20},
		4: {name: "messages", size: 0},
	}}
	end := &pgSnapshot{rels: map[int64]pgRel{
		1: {name: "leases", upd: 160, hot: 80, del: 9, ins: 10, autovac: 1, size: 12288},
		3: {name: "messages_b", msgPart: true, ins: 900, size: 2 << 20},
		4: {name: "messages"},
		5: {name: "messages_c", msgPart: true, ins: 300, size: 1 << 20},
	}}
	final := &pgSnapshot{rels: map[int64]pgRel{
		1: {name: "leases", dead: 3, live: 10, size: 16384},
		3: {name: "messages_b", msgPart: true, live: 900, size: 2 << 20},
		4: {name: "messages"},
		5: {name: "messages_c", msgPart: true, live: 300, size: 1 << 20},
	}}
	mid := &pgSnapshot{rels: map[int64]pgRel{
		1: {name: "leases", size: 10240},
		3: {name: "messages_b", msgPart: true, size: 1 << 20},
		5: {name: "messages_c", msgPart: true, size: 1 << 20},
	}}
	got := pgTables(start, mid, end, final)
	want := []PGTable{
		{Name: "messages", Partitions: 2, DroppedPartitions: 1, SizeBytes: 3 << 20, LiveTuples: 1200,
			WindowStartBytes: 2 << 20, WindowMidBytes: 2 << 20, WindowEndBytes: 3 << 20, Inserted: 700},
		{Name: "leases", SizeBytes: 16384, LiveTuples: 10, DeadTuples: 3, WindowStartBytes: 8192, WindowMidBytes: 10240,
			WindowEndBytes: 12288, Updated: 60, HotUpdated: 30, Deleted: 4, Autovacuums: 1},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
	// Without a window, the end figures only.
	got = pgTables(nil, nil, end, final)
	if len(got) != 2 || got[0].Inserted != 0 || got[1].Updated != 0 || got[1].DeadTuples != 3 {
		t.Fatalf("no window: %+v", got)
	}
}

func TestFmtBytes(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 5 << 30: "5.0 GiB", -2048: "-2.0 KiB"} {
		if got := fmtBytes(n); got != want {
			t.Errorf("fmtBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
