package floor

import (
	"context"
	"fmt"
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
	round  string // the statement
	lens   []int32
	keep   bool // close keeps the schema (tests read it)
}

// newPGSink connects to url and makes the schema's tables afresh.
func newPGSink(url, schema string) (*pgSink, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	s := pgx.Identifier{schema}.Sanitize()
	setup := strings.ReplaceAll(`DROP SCHEMA IF EXISTS {s} CASCADE;
CREATE SCHEMA {s};
CREATE TABLE {s}.head (id int PRIMARY KEY, next bigint NOT NULL);
INSERT INTO {s}.head VALUES (1, 0);
CREATE TABLE {s}.log (off bigint PRIMARY KEY, payload bytea NOT NULL);`, "{s}", s)
	if _, err := conn.Exec(ctx, setup); err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("make schema %s: %w", schema, err)
	}
	// $1: the round's frames (4-byte length, payload) end to end; $2: their payload lengths.
	round := strings.ReplaceAll(`WITH h AS (
	UPDATE {s}.head SET next = next + cardinality($2::int4[]) WHERE id = 1
	RETURNING next - cardinality($2::int4[]) AS first),
f AS (
	SELECT i, n, sum(n + 4) OVER (ORDER BY i) - n AS start FROM unnest($2::int4[]) WITH ORDINALITY AS u(n, i)),
ins AS (
	INSERT INTO {s}.log (off, payload)
	SELECT h.first + f.i - 1, substring($1::bytea FROM (f.start + 1)::int FOR f.n) FROM h, f)
SELECT first FROM h`, "{s}", s)
	return &pgSink{conn: conn, schema: schema, round: round}, nil
}

// commit inserts the round; a request's off is its message's offset in the log.
func (p *pgSink) commit(batch []*request, buf []byte) error {
	p.lens = p.lens[:0]
	for _, r := range batch {
		p.lens = append(p.lens, int32(len(r.frame)-4))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var first int64
	if err := p.conn.QueryRow(ctx, p.round, buf, p.lens).Scan(&first); err != nil {
		return err
	}
	for i, r := range batch {
		r.off = first + int64(i)
	}
	return nil
}

// close drops the schema (unless keep) and closes the connection.
func (p *pgSink) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	if !p.keep {
		_, err = p.conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{p.schema}.Sanitize()+" CASCADE")
	}
	if cerr := p.conn.Close(ctx); err == nil {
		err = cerr
	}
	return err
}
