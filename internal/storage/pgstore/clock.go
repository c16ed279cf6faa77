package pgstore

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// The database's clock (the product brief, 2b: on PostgreSQL, leases, retention, heartbeats and
// FROM_TIMESTAMP use the database's clock). Without a Config.Clock, every time the engine writes
// or compares is the database's clock as this instance estimates it: the engine reads
// clock_timestamp() when it opens and with each instance heartbeat, bracketed by two readings of
// its own clock, and extrapolates from the best reading with its monotonic clock. So no publish or
// delivery transaction pays a round trip for the time, and instances with skewed clocks agree
// within their round trips to the database (a lease of one instance is never taken over by
// another before it expired by the database's clock, beyond that margin; invariant 3).
//
// A reading taken at local times t1 (sent) and t2 (answered) says the database's clock was db at
// some instant between them: at the midpoint it was db within ±(t2-t1)/2. Extrapolating by the
// monotonic clock (which NTP slews but never steps, so a step of the wall clock changes nothing)
// adds at most clockDrift per elapsed second. A new reading replaces the one in use when it is
// as precise, or when the two disagree by more than their bounds together (the one in use went
// wrong: a suspended machine, whose monotonic clock stopped, or a stepped database clock). When
// a replacement moves the engine's time backwards (by its precision, or by a step), what
// depends on order tolerates it as it tolerates skewed instances: a partition's publish time is
// greatest(the new time, its last_published_at) under the row lock (takeOffsetsSQL), a guessed
// append writes at the later of the new time and where this instance's last append left the
// partition (appendpredict.go). A suspended machine's estimate lags (its leases last longer by
// the database's clock, never shorter) until the next heartbeat's reading.

// clockDrift bounds how fast the local monotonic clock and the database's clock drift apart
// (200 ppm: well beyond a crystal's, with or without NTP).
const clockDrift = 200e-6

// clockSkewWarn is the offset between the instance's wall clock and the database's past which
// the engine logs a warning (the times it stores are right; the host's clock is not).
const clockSkewWarn = time.Second

// clockSamples is how many readings Open takes (the first may include a connection's setup).
const clockSamples = 3

// clockReading is one reading of the database's clock.
type clockReading struct {
	// local is this instance's clock at the midpoint of the round trip (with its monotonic
	// reading), db the database's clock_timestamp(), rtt the round trip.
	local time.Time
	db    time.Time
	rtt   time.Duration
}

// at is the database's time at local time t by this reading.
func (r *clockReading) at(t time.Time) time.Time { return r.db.Add(t.Sub(r.local)) }

// bound is how far at(t) may be from the database's time.
func (r *clockReading) bound(t time.Time) time.Duration {
	age := t.Sub(r.local)
	if age < 0 {
		age = -age
	}
	return r.rtt/2 + time.Duration(float64(age)*clockDrift)
}

// dbTime estimates the database's clock.
type dbTime struct {
	// local is the instance's clock (time.Now; tests skew it).
	local func() time.Time
	cur   atomic.Pointer[clockReading]
	// mu orders the updates; warned is the offset last logged as a warning (0: none).
	mu     sync.Mutex
	warned time.Duration
}

// now is the database's time as estimated; the local clock until a first reading.
func (c *dbTime) now() time.Time { return c.at(c.local()) }

// at is the database's time at local time t as estimated.
func (c *dbTime) at(t time.Time) time.Time {
	if r := c.cur.Load(); r != nil {
		return r.at(t)
	}
	return t
}

// observe records a reading of the database's clock db taken between local times t1 and t2, and
// reports whether it replaced the one in use.
func (c *dbTime) observe(log *slog.Logger, t1, t2, db time.Time) bool {
	rtt := t2.Sub(t1)
	if rtt < 0 {
		return false // the local clock misbehaved (only a wall clock without monotonic reading)
	}
	r := &clockReading{local: t1.Add(rtt / 2), db: db, rtt: rtt}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur := c.cur.Load(); cur != nil {
		off, within := r.db.Sub(cur.at(r.local)), cur.bound(r.local)+r.rtt/2
		switch {
		case off.Abs() > within:
			log.Info("pgstore: the database's clock moved from this instance's estimate; taking the new reading",
				"moved", off, "round_trip", r.rtt)
		case r.rtt/2 > cur.bound(r.local):
			return false // less precise than the reading in use
		}
	}
	c.cur.Store(r)
	// The wall clock's offset (Sub of a time without monotonic reading uses the wall clock).
	skew := r.db.Sub(r.local.Round(0))
	switch {
	case skew.Abs() > clockSkewWarn && (c.warned == 0 || (skew-c.warned).Abs() > clockSkewWarn):
		c.warned = skew
		log.Warn("pgstore: this instance's clock is off the database's; the engine uses the database's clock, but check NTP on this host",
			"database_minus_local", skew, "round_trip", r.rtt)
	case skew.Abs() <= clockSkewWarn && c.warned != 0:
		c.warned = 0
		log.Info("pgstore: this instance's clock agrees with the database's again", "database_minus_local", skew)
	}
	return true
}

// clockNow is the engine's clock: Config.Clock when one was given, else the database's
// (dbTime.now).
func (e *Engine) clockNow() time.Time {
	if e.dbClock {
		return e.dbc.now()
	}
	return e.clock.Now()
}

// readDBClock takes clockSamples readings of the database's clock (Open).
func (e *Engine) readDBClock(ctx context.Context) error {
	if !e.dbClock {
		return nil
	}
	for range clockSamples {
		var db time.Time
		t1 := e.dbc.local()
		if err := e.pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&db); err != nil {
			return fmt.Errorf("pgstore: read the database's clock: %w", err)
		}
		e.dbc.observe(e.log, t1, e.dbc.local(), db)
	}
	return nil
}
