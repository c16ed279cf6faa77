package pgstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/spoolmq/spool/internal/storage"
)

// The bound on the producer ids spool.producer_ids remembers (Config.MaxProducerIDs, all topics
// together, like the embedded engine's wal.Config.MaxProducerIDs). Counting the table on every
// publish would cost a scan of up to the bound per publish, so each instance keeps an estimate:
// the rows counted by its last count (at Open, after each maintenance pass and each
// RetentionApply, after their prune of expired ids), plus the rows its own broker publishes
// inserted since. A publish that claims new ids (inserted rows, not repeats or expired ids taken
// over) past the bound is refused with storage.ErrRateLimited inside its transaction, which then
// writes nothing. The rows other instances, PublishTx and spool.publish inserted count from the
// next count on: the table can pass the bound by what they insert within one maintenance interval.

// countProducerIDsSQL counts the rows of spool.producer_ids not expired at $2, at most $1 (the
// scan stops there; an expired row is room: a publish takes it over, the prune deletes it), and
// returns the snapshot of the count: which publish transactions it saw (pg_current_snapshot).
const countProducerIDsSQL = `SELECT (SELECT count(*) FROM (SELECT FROM spool.producer_ids WHERE expires_at > $2 LIMIT $1) s),
	pg_current_snapshot()::text`

// idCount is an instance's estimate of the rows of spool.producer_ids.
type idCount struct {
	refresh sync.Mutex // serializes counts
	mu      sync.Mutex
	counted int64 // rows seen by the last count
	// added are the rows inserted since by this instance's publishes that committed. While a
	// count runs, pending holds them by transaction: the count's snapshot tells which it saw.
	added    int64
	counting bool
	pending  []idAdd
	snap     *pgSnapshot // of the last count (nil: none yet)
}

// idAdd is the rows a committed publish transaction inserted.
type idAdd struct {
	xid uint64
	n   int64
}

// estimate returns the rows the instance believes spool.producer_ids holds.
func (c *idCount) estimate() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counted + c.added
}

// add records that transaction xid (committed) inserted n rows.
func (c *idCount) add(xid string, n int64) {
	if n <= 0 {
		return
	}
	x, err := strconv.ParseUint(xid, 10, 64)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil && c.snap != nil && c.snap.sees(x) {
		return // the last count saw its rows
	}
	c.added += n
	if c.counting && err == nil {
		c.pending = append(c.pending, idAdd{x, n})
	}
}

// start marks the start of a count: the publishes that commit from now on are kept in pending.
func (c *idCount) start() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counting, c.pending = true, nil
}

// set records a count of n rows taken with snapshot snap (nil: the count failed, the estimate
// stays): of the publishes that committed since the count started, those it saw leave added.
// Those that committed before it started, it saw.
func (c *idCount) set(n int64, snap *pgSnapshot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if snap != nil {
		c.counted, c.snap, c.added = n, snap, 0
		for _, a := range c.pending {
			if !snap.sees(a.xid) {
				c.added += a.n
			}
		}
	}
	c.counting, c.pending = false, nil
}

// pgSnapshot is a pg_snapshot: transactions below xmin had ended, those from xmax on had not
// started, and those of xip were running when it was taken.
type pgSnapshot struct {
	xmin, xmax uint64
	xip        map[uint64]bool
}

// parseSnapshot parses pg_snapshot's text form "xmin:xmax:xip1,xip2,...".
func parseSnapshot(s string) (*pgSnapshot, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return nil, fmt.Errorf("pgstore: snapshot %q: not xmin:xmax:xip", s)
	}
	var snap pgSnapshot
	var err error
	if snap.xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return nil, fmt.Errorf("pgstore: snapshot %q: %w", s, err)
	}
	if snap.xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return nil, fmt.Errorf("pgstore: snapshot %q: %w", s, err)
	}
	if parts[2] != "" {
		snap.xip = map[uint64]bool{}
		for _, f := range strings.Split(parts[2], ",") {
			x, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("pgstore: snapshot %q: %w", s, err)
			}
			snap.xip[x] = true
		}
	}
	return &snap, nil
}

// sees reports whether the snapshot sees the changes of transaction x, which committed.
func (s *pgSnapshot) sees(x uint64) bool {
	return x < s.xmin || (x < s.xmax && !s.xip[x])
}

// countProducerIDs counts spool.producer_ids (up to one row past the bound) and makes that the
// instance's estimate.
func (e *Engine) countProducerIDs(ctx context.Context) error {
	c := &e.ids
	c.refresh.Lock()
	defer c.refresh.Unlock()
	c.start()
	var n int64
	var text string
	if err := e.pool.QueryRow(ctx, e.sql(countProducerIDsSQL), e.cfg.MaxProducerIDs+1, e.clockNow()).Scan(&n, &text); err != nil {
		c.set(0, nil)
		return fmt.Errorf("pgstore: count producer ids: %w", err)
	}
	snap, err := parseSnapshot(text)
	c.set(n, snap) // nil on error: the estimate stays
	return err
}

// checkNewIDs refuses a publish to topic that inserts n new producer ids past the bound
// (storage.ErrRateLimited: its transaction writes nothing).
func (e *Engine) checkNewIDs(topic string, n int64) error {
	if n == 0 {
		return nil
	}
	max := int64(e.cfg.MaxProducerIDs)
	if have := e.ids.estimate(); have+n > max {
		return fmt.Errorf("%w: topic %q: %d new producer ids, and the database remembers about %d of at most %d (postgres.max_producer_ids) until their dedup_window ends: retry later, shorten dedup_window or publish without producer ids",
			storage.ErrRateLimited, topic, n, have, max)
	}
	return nil
}
