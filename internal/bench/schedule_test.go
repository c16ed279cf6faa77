package bench

import (
	"context"
	"errors"
	"testing"
	"time"
)

// fakeClock is a clock whose sleeps only move its time; a "broker" stall moves it too.
type fakeClock struct{ now time.Time }

func (f *fakeClock) Now() time.Time { return f.now }

func (f *fakeClock) SleepUntil(ctx context.Context, t time.Time) error {
	if t.After(f.now) {
		f.now = t
	}
	return ctx.Err()
}

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

// TestScheduleShowsStall is the coordinated-omission test: a broker that stalls for 200 ms on
// one message of a 1,000 msg/s schedule. Measured from the intended send time, every message due
// during the stall waited for it: 200 messages show latencies from 200 ms down to 1 ms, so p99 is
// 180 ms. Measured from the actual send time (what a closed-loop generator sees), only the one
// message that was in flight is slow and p99 is 0: the stall is hidden.
func TestScheduleShowsStall(t *testing.T) {
	t.Parallel()
	clk := &fakeClock{now: t0}
	s := Schedule{Start: t0, Rate: 1000, Count: 2000}
	open, closed := NewHistogram(), NewHistogram()
	sent := make([]time.Time, 0, s.Count)
	st, err := s.Run(context.Background(), clk, func(i int64, intended time.Time) error {
		if want := s.Intended(i); !intended.Equal(want) {
			t.Fatalf("message %d: intended %v, want %v", i, intended, want)
		}
		if clk.now.Before(intended) {
			t.Fatalf("message %d sent at %v, before its intended time %v", i, clk.now, intended)
		}
		actual := clk.now
		sent = append(sent, actual)
		if i == 500 {
			clk.now = clk.now.Add(200 * time.Millisecond) // the broker stalls
		}
		received := clk.now // delivered as soon as the send returns
		open.RecordDuration(received.Sub(intended))
		closed.RecordDuration(received.Sub(actual))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Sent != 2000 || open.Count() != 2000 {
		t.Fatalf("sent %d, recorded %d", st.Sent, open.Count())
	}
	// The schedule did not move: after the stall the messages went out at once until it caught
	// up, then on time again.
	if !sent[501].Equal(t0.Add(700*time.Millisecond)) || !sent[699].Equal(t0.Add(700*time.Millisecond)) || !sent[700].Equal(s.Intended(700)) {
		t.Fatalf("sends after the stall at %v, %v, %v", sent[501].Sub(t0), sent[699].Sub(t0), sent[700].Sub(t0))
	}
	if got := open.QuantileDuration(0.99); got < 175*time.Millisecond || got > 185*time.Millisecond {
		t.Fatalf("open-loop p99 = %v, want about 180ms", got)
	}
	if got := open.QuantileDuration(0.95); got < 95*time.Millisecond || got > 105*time.Millisecond {
		t.Fatalf("open-loop p95 = %v, want about 100ms", got)
	}
	if got := open.Max(); time.Duration(got) != 200*time.Millisecond {
		t.Fatalf("open-loop max = %v, want 200ms", time.Duration(got))
	}
	if got := closed.QuantileDuration(0.99); got != 0 {
		t.Fatalf("closed-loop p99 = %v: the contrast this test shows is gone", got)
	}
	// The sender's lag shows the stall too: message 501 went out 199 ms late.
	if got := time.Duration(st.Lag.Max()); got != 199*time.Millisecond {
		t.Fatalf("max lag %v, want 199ms", got)
	}
}

// TestScheduleOnTime: with a sender that never blocks, every message goes out exactly at its
// intended time (lag 0), at the rate asked, and Run ends at the schedule's last message.
func TestScheduleOnTime(t *testing.T) {
	t.Parallel()
	clk := &fakeClock{now: t0.Add(-time.Second)}
	s := Schedule{Start: t0, Rate: 10_000, Count: 10_000}
	var last time.Time
	st, err := s.Run(context.Background(), clk, func(i int64, intended time.Time) error {
		if !clk.now.Equal(intended) {
			t.Fatalf("message %d sent at %v, intended %v", i, clk.now, intended)
		}
		if i > 0 && intended.Sub(last) != 100*time.Microsecond {
			t.Fatalf("message %d: %v after the previous one, want 100µs", i, intended.Sub(last))
		}
		last = intended
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Sent != 10_000 || st.Lag.Max() != 0 {
		t.Fatalf("sent %d, max lag %d", st.Sent, st.Lag.Max())
	}
	if want := t0.Add(time.Second - 100*time.Microsecond); !st.Finished.Equal(want) || !s.End().Equal(t0.Add(time.Second)) {
		t.Fatalf("finished %v, end %v", st.Finished, s.End())
	}
}

func TestScheduleStops(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	clk := &fakeClock{now: t0}
	s := Schedule{Start: t0, Rate: 100, Count: 100}
	st, err := s.Run(context.Background(), clk, func(i int64, _ time.Time) error {
		if i == 10 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || st.Sent != 10 {
		t.Fatalf("send error: sent %d, err %v", st.Sent, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, err = s.Run(ctx, clk, func(i int64, _ time.Time) error {
		if i == 20 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) || st.Sent != 21 {
		t.Fatalf("cancelled: sent %d, err %v", st.Sent, err)
	}
	if _, err := (Schedule{Start: t0, Count: 1}).Run(context.Background(), clk, nil); err == nil {
		t.Fatal("rate 0 accepted")
	}
}

// TestSystemClockSleepsUntil: the real clock never returns before the time asked, and returns at
// once for a time in the past or when ctx ends.
func TestSystemClockSleepsUntil(t *testing.T) {
	t.Parallel()
	var c SystemClock
	for _, d := range []time.Duration{-time.Millisecond, 0, 50 * time.Microsecond, 3 * time.Millisecond} {
		until := time.Now().Add(d)
		if err := c.SleepUntil(context.Background(), until); err != nil {
			t.Fatal(err)
		}
		if now := time.Now(); now.Before(until) {
			t.Fatalf("SleepUntil(+%v) returned %v early", d, until.Sub(now))
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.SleepUntil(ctx, time.Now().Add(time.Hour)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled sleep returned %v", err)
	}
}

// TestGroupRecorder: first receipts are measured after the warm-up only, duplicates and messages
// of other runs are counted apart.
func TestGroupRecorder(t *testing.T) {
	t.Parallel()
	g := newGroupRecorder("bench-0", 7, t0, 1000, 10)
	payload := func(run, seq uint64, intended int64) []byte {
		p := make([]byte, StampSize+10)
		Stamp{Run: run, Seq: seq, Intended: intended}.Put(p)
		return p
	}
	g.observe(payload(7, 0, 500), 900)   // warm-up: received, not measured
	g.observe(payload(7, 1, 1000), 1300) // measured: 300 ns
	g.observe(payload(7, 1, 1000), 5000) // duplicate
	g.observe(payload(8, 2, 1000), 1100) // another run
	g.observe(payload(7, 99, 1000), 1100)
	g.observe([]byte("short"), 1100)
	g.observe(payload(7, 2, 2000), 2700) // measured: 700 ns
	if g.received != 3 || g.inWindow != 2 || g.duplicates != 1 || g.foreign != 3 || g.lastAt != 2700 {
		t.Fatalf("received %d measured %d duplicates %d foreign %d last %d", g.received, g.inWindow, g.duplicates, g.foreign, g.lastAt)
	}
	if g.lat.Count() != 2 || g.lat.Min() != 300 || g.lat.Max() != 700 {
		t.Fatalf("latencies: count %d min %d max %d", g.lat.Count(), g.lat.Min(), g.lat.Max())
	}
	st, err := ReadStamp(payload(7, 5, -3))
	if err != nil || st != (Stamp{Run: 7, Seq: 5, Intended: -3}) {
		t.Fatalf("stamp round trip: %+v %v", st, err)
	}
}
