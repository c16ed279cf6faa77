// Command pgqueue measures a plain PostgreSQL queue, the baseline that docs/benchmarks.md puts
// beside `spool bench` on the PostgreSQL engine (issue 20): a table with a bigserial id, publishers
// that INSERT (each statement its own transaction, committed synchronously) and consumers that
// take rows with DELETE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING. No
// offsets, no commit-order guarantee, no redelivery: what a team would write by hand.
//
// Modes (1 KiB payloads by default; every connection is its own):
//
//	pgqueue -mode sync -publishers 10                 publishers each wait for their INSERT
//	pgqueue -mode sync -publishers 10 -batch 100      the same, 100 rows per INSERT
//	pgqueue -mode e2e -rate 10000 -consumers 4        open loop at a fixed rate, consumed at once
//	pgqueue -mode e2e -rate 2000 -groups 16 -consumers 1
//	                                                  fan-out by hand: one table per group, each
//	                                                  publish inserts into every table in one
//	                                                  transaction, consumers per group
//	pgqueue -mode drain -messages 100000 -consumers 4 preload, then drain
//
// It works in the schema -schema (dropped and created at the start). Latencies: publish (INSERT
// until its commit returned) and end to end (the publish time carried in the payload until a
// consumer's DELETE returned it).
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

type config struct {
	url, schema, mode            string
	publishers, consumers, batch int
	groups, size, messages       int
	rate                         float64
	duration, warmup             time.Duration
}

func main() {
	var c config
	flag.StringVar(&c.url, "url", os.Getenv("TEST_DATABASE_URL"), "PostgreSQL URL (default $TEST_DATABASE_URL)")
	flag.StringVar(&c.schema, "schema", "pgqueue_bench", "schema to (re)create")
	flag.StringVar(&c.mode, "mode", "sync", "sync, e2e or drain")
	flag.IntVar(&c.publishers, "publishers", 10, "publisher connections")
	flag.IntVar(&c.consumers, "consumers", 4, "consumer connections per group")
	flag.IntVar(&c.batch, "batch", 1, "rows per INSERT (sync) / per DELETE (consumers take up to 100)")
	flag.IntVar(&c.groups, "groups", 1, "e2e: queue tables, each publish goes to all of them")
	flag.IntVar(&c.size, "size", 1024, "payload bytes (at least 16)")
	flag.IntVar(&c.messages, "messages", 100000, "drain: messages to preload")
	flag.Float64Var(&c.rate, "rate", 10000, "e2e: messages per second (open loop)")
	flag.DurationVar(&c.duration, "duration", 30*time.Second, "measured time")
	flag.DurationVar(&c.warmup, "warmup", 5*time.Second, "time before measuring")
	flag.Parse()
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "pgqueue:", err)
		os.Exit(1)
	}
}

func run(c config) error {
	if c.url == "" {
		return fmt.Errorf("no -url and no $TEST_DATABASE_URL")
	}
	if c.size < 16 || c.publishers < 1 || c.consumers < 1 || c.batch < 1 || c.groups < 1 || c.rate <= 0 {
		return fmt.Errorf("bad flags: -size >= 16, -publishers, -consumers, -batch, -groups >= 1, -rate > 0")
	}
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(c.url)
	if err != nil {
		return err
	}
	pcfg.MaxConns = int32(c.publishers + c.consumers*c.groups + 2)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	s := pgx.Identifier{c.schema}.Sanitize()
	ddl := fmt.Sprintf("DROP SCHEMA IF EXISTS %s CASCADE; CREATE SCHEMA %s;", s, s)
	for g := range c.groups {
		ddl += fmt.Sprintf("CREATE TABLE %s.q%d (id bigserial PRIMARY KEY, payload bytea NOT NULL);", s, g)
	}
	if _, err := pool.Exec(ctx, ddl); err != nil {
		return err
	}
	fmt.Printf("pgqueue %s: %d publishers, %d consumers x %d groups, batch %d, %d-byte payloads\n",
		c.mode, c.publishers, c.consumers, c.groups, c.batch, c.size)
	switch c.mode {
	case "sync":
		return runSync(ctx, pool, c)
	case "e2e":
		return runE2E(ctx, pool, c)
	case "drain":
		return runDrain(ctx, pool, c)
	}
	return fmt.Errorf("unknown -mode %q", c.mode)
}

// insertSQL inserts one row per payload into every group's table, in one statement per table.
func insertSQL(c config) []string {
	var qs []string
	for g := range c.groups {
		qs = append(qs, fmt.Sprintf("INSERT INTO %s.q%d (payload) SELECT unnest($1::bytea[])", pgx.Identifier{c.schema}.Sanitize(), g))
	}
	return qs
}

// publish inserts payloads into every group's table in one transaction.
func publish(ctx context.Context, conn *pgxpool.Conn, qs []string, payloads [][]byte) error {
	if len(qs) == 1 {
		_, err := conn.Exec(ctx, qs[0], payloads)
		return err
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	for _, q := range qs {
		b.Queue(q, payloads)
	}
	b.Queue("COMMIT")
	return conn.SendBatch(ctx, b).Close()
}

// payload is size bytes starting with the time it was made (ns).
func payload(size int) []byte {
	p := make([]byte, size)
	binary.BigEndian.PutUint64(p, uint64(time.Now().UnixNano()))
	return p
}

// latencies collects durations.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return "none"
	}
	slices.Sort(l.d)
	q := func(f float64) time.Duration { return l.d[min(len(l.d)-1, int(math.Ceil(f*float64(len(l.d))))-1)] }
	return fmt.Sprintf("p50 %s p99 %s p99.9 %s max %s (%d)", q(0.5).Round(10*time.Microsecond), q(0.99).Round(10*time.Microsecond),
		q(0.999).Round(10*time.Microsecond), l.d[len(l.d)-1].Round(10*time.Microsecond), len(l.d))
}

// runSync: publishers each wait for their INSERT, for warmup + duration.
func runSync(ctx context.Context, pool *pgxpool.Pool, c config) error {
	qs := insertSQL(c)
	var measuring, stop atomic.Bool
	var sent atomic.Int64
	lat := &latencies{}
	errs := make(chan error, c.publishers)
	var wg sync.WaitGroup
	for range c.publishers {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		wg.Go(func() {
			defer conn.Release()
			for !stop.Load() {
				ps := make([][]byte, c.batch)
				for i := range ps {
					ps[i] = payload(c.size)
				}
				t0 := time.Now()
				if err := publish(ctx, conn, qs, ps); err != nil {
					errs <- err
					return
				}
				if measuring.Load() {
					lat.add(time.Since(t0))
					sent.Add(int64(c.batch))
				}
			}
		})
	}
	time.Sleep(c.warmup)
	measuring.Store(true)
	t0 := time.Now()
	time.Sleep(c.duration)
	measuring.Store(false)
	el := time.Since(t0)
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	fmt.Printf("published %.0f msg/s (%d in %s); publish latency %s\n", float64(sent.Load())/el.Seconds(), sent.Load(), el.Round(time.Millisecond), lat)
	return nil
}

// consume takes rows of group g until stop and, once stop is set, the table is empty; it records
// the end-to-end latency of the messages published while measuring (their time is in [from, to)).
func consume(ctx context.Context, pool *pgxpool.Pool, c config, g int, stop *atomic.Bool, got *atomic.Int64, lat *latencies, from, to *atomic.Int64) error {
	q := fmt.Sprintf(`DELETE FROM %s.q%d WHERE id IN (SELECT id FROM %[1]s.q%[2]d ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED) RETURNING payload`,
		pgx.Identifier{c.schema}.Sanitize(), g)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	idle := 0
	for {
		rows, err := conn.Query(ctx, q)
		if err != nil {
			return err
		}
		n := 0
		now := time.Now().UnixNano()
		for rows.Next() {
			var p []byte
			if err := rows.Scan(&p); err != nil {
				rows.Close()
				return err
			}
			n++
			at := int64(binary.BigEndian.Uint64(p))
			if f, t := from.Load(), to.Load(); f != 0 && at >= f && (t == 0 || at < t) {
				lat.add(time.Duration(now - at))
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		got.Add(int64(n))
		if n > 0 {
			idle = 0
			continue
		}
		if stop.Load() {
			if idle++; idle > 3 {
				return nil
			}
		}
		time.Sleep(time.Millisecond) // a poll, as a hand-written queue does
	}
}

// runE2E publishes at c.rate (open loop: each publisher its share of the schedule, late sends go
// at once) while consumers drain every group's table.
func runE2E(ctx context.Context, pool *pgxpool.Pool, c config) error {
	qs := insertSQL(c)
	var stopPub, stopCons atomic.Bool
	var from, to, sent, got atomic.Int64
	lat, pubLat := &latencies{}, &latencies{}
	errs := make(chan error, c.publishers+c.consumers*c.groups)
	var cons sync.WaitGroup
	for g := range c.groups {
		for range c.consumers {
			cons.Go(func() {
				if err := consume(ctx, pool, c, g, &stopCons, &got, lat, &from, &to); err != nil {
					errs <- err
				}
			})
		}
	}
	start := time.Now()
	interval := time.Duration(float64(time.Second) * float64(c.publishers) / c.rate)
	var pubs sync.WaitGroup
	for k := range c.publishers {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		pubs.Go(func() {
			defer conn.Release()
			next := start.Add(interval * time.Duration(k) / time.Duration(c.publishers))
			for !stopPub.Load() {
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
				next = next.Add(interval)
				t0 := time.Now()
				if err := publish(ctx, conn, qs, [][]byte{payload(c.size)}); err != nil {
					errs <- err
					return
				}
				if f := from.Load(); f != 0 && t0.UnixNano() >= f && to.Load() == 0 {
					pubLat.add(time.Since(t0))
					sent.Add(1)
				}
			}
		})
	}
	time.Sleep(c.warmup)
	t0 := time.Now()
	from.Store(t0.UnixNano())
	time.Sleep(c.duration)
	to.Store(time.Now().UnixNano())
	el := time.Since(t0)
	stopPub.Store(true)
	pubs.Wait()
	lag := time.Now()
	stopCons.Store(true)
	cons.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	fmt.Printf("published %.0f msg/s of %.0f scheduled (%d in %s); publish latency %s\n",
		float64(sent.Load())/el.Seconds(), c.rate, sent.Load(), el.Round(time.Millisecond), pubLat)
	fmt.Printf("end to end (%d groups): %s; drained %s after the last publish\n", c.groups, lat, time.Since(lag).Round(time.Millisecond))
	return nil
}

// runDrain preloads c.messages into group 0's table, then measures how fast the consumers empty it.
func runDrain(ctx context.Context, pool *pgxpool.Pool, c config) error {
	q := fmt.Sprintf("INSERT INTO %s.q0 (payload) SELECT $1::bytea FROM generate_series(1, $2)", pgx.Identifier{c.schema}.Sanitize())
	if _, err := pool.Exec(ctx, q, payload(c.size), c.messages); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf("VACUUM ANALYZE %s.q0", pgx.Identifier{c.schema}.Sanitize())); err != nil {
		return err
	}
	var stop atomic.Bool
	stop.Store(true) // stop once empty
	var got, zero atomic.Int64
	lat := &latencies{}
	errs := make(chan error, c.consumers)
	var wg sync.WaitGroup
	t0 := time.Now()
	for range c.consumers {
		wg.Go(func() {
			if err := consume(ctx, pool, c, 0, &stop, &got, lat, &zero, &zero); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	el := time.Since(t0)
	close(errs)
	for err := range errs {
		return err
	}
	fmt.Printf("drained %d in %s: %.0f msg/s\n", got.Load(), el.Round(time.Millisecond), float64(got.Load())/el.Seconds())
	return nil
}
