package floor

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultSchema is the schema of the PostgreSQL floor's tables; it is dropped and made again at
// the start of a run and dropped at its end.
const DefaultSchema = "spool_floor"

// pgSink commits each round in PostgreSQL as one statement on one connection, autocommitted
// (synchronous_commit as the server sets it): it takes the round's offsets from a head row, as a
// log must to keep them gapless in commit order, and inserts one row per frame. It is what a
// broker in front of PostgreSQL cannot do with less: one round trip and one commit per round,
// the frames' bytes sent as one parameter.
type pgSink struct {
	conn   *pgx.Conn
	schema string
	head   int32  // the head row, one per committer (as a partition)
	round  string // the statement
	lens   []int32
	drop   bool // close drops the schema (the first sink, unless a test reads the rows)
}

// newPGSinks connects n times to url and makes the schema's tables afresh, with n head rows.
func newPGSinks(url, schema string, n int) ([]sink, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := pgx.Identifier{schema}.Sanitize()
	setup := strings.ReplaceAll(`DROP SCHEMA IF EXISTS {s} CASCADE;
CREATE SCHEMA {s};
CREATE TABLE {s}.head (id int PRIMARY KEY, next bigint NOT NULL);
INSERT INTO {s}.head SELECT i, 0 FROM generate_series(1, $1::int) AS i;
CREATE TABLE {s}.log (head int, off bigint, payload bytea NOT NULL, PRIMARY KEY (head, off));`, "{s}", s)
	// $1: the round's frames (4-byte length, payload) end to end; $2: their payload lengths;
	// $3: the head row.
	round := strings.ReplaceAll(`WITH h AS (
	UPDATE {s}.head SET next = next + cardinality($2::int4[]) WHERE id = $3
	RETURNING next - cardinality($2::int4[]) AS first),
f AS (
	SELECT i, n, sum(n + 4) OVER (ORDER BY i) - n AS start FROM unnest($2::int4[]) WITH ORDINALITY AS u(n, i)),
ins AS (
	INSERT INTO {s}.log (head, off, payload)
	SELECT $3, h.first + f.i - 1, substring($1::bytea FROM (f.start + 1)::int FOR f.n) FROM h, f)
SELECT first FROM h`, "{s}", s)
	var sinks []sink
	fail := func(err error) ([]sink, error) {
		for _, sk := range sinks {
			sk.close()
		}
		return nil, err
	}
	for i := range n {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return fail(err)
		}
		sinks = append(sinks, &pgSink{conn: conn, schema: schema, head: int32(i + 1), round: round, drop: i == 0})
		if i > 0 {
			continue
		}
		// Setup runs as one simple-protocol batch, its parameter interpolated.
		if _, err := conn.Exec(ctx, strings.ReplaceAll(setup, "$1", strconv.Itoa(n)), pgx.QueryExecModeSimpleProtocol); err != nil {
			return fail(fmt.Errorf("make schema %s: %w", schema, err))
		}
	}
	return sinks, nil
}

// commit inserts the round; a request's off is its first message's offset in the log.
func (p *pgSink) commit(batch []*request, buf []byte) error {
	p.lens = p.lens[:0]
	for _, r := range batch {
		for f := r.frame; len(f) >= 4; {
			n := binary.BigEndian.Uint32(f)
			p.lens = append(p.lens, int32(n))
			f = f[4+n:]
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var first int64
	if err := p.conn.QueryRow(ctx, p.round, buf, p.lens, p.head).Scan(&first); err != nil {
		return err
	}
	for _, r := range batch {
		r.off = first
		for f := r.frame; len(f) >= 4; first++ {
			f = f[4+binary.BigEndian.Uint32(f):]
		}
	}
	return nil
}

// close drops the schema (the first sink) and closes the connection.
func (p *pgSink) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	if p.drop {
		_, err = p.conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{p.schema}.Sanitize()+" CASCADE")
	}
	if cerr := p.conn.Close(ctx); err == nil {
		err = cerr
	}
	return err
}
