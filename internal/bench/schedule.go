package bench

import (
	"context"
	"fmt"
	"time"
)

// Clock is the scheduler's time source. SystemClock is the real one; tests use a fake whose
// sleeps only move its time.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// SleepUntil returns at t or later, or when ctx ends (with its error).
	SleepUntil(ctx context.Context, t time.Time) error
}

// SystemClock is the real clock. Its sleeps are precise to a few tens of microseconds on Linux
// (see sleepUntil), where the Go runtime's timers wake up to a millisecond late when the process
// is idle: a load generator that sends every 100 µs must not add that to the latencies it
// measures.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// SleepUntil sleeps until t.
func (SystemClock) SleepUntil(ctx context.Context, t time.Time) error { return sleepUntil(ctx, t) }

// Schedule is an open-loop sending schedule: message i (from 0) is due at Start + i/Rate,
// whatever happened to the messages before it.
type Schedule struct {
	// Start is when message 0 is due.
	Start time.Time
	// Rate is the number of messages per second; above 0.
	Rate float64
	// Count is the number of messages.
	Count int64
}

// Intended returns the time message i is due.
func (s Schedule) Intended(i int64) time.Time {
	return s.Start.Add(time.Duration(float64(i) * float64(time.Second) / s.Rate))
}

// End returns the time the message after the last would be due: Start + Count/Rate.
func (s Schedule) End() time.Time { return s.Intended(s.Count) }

// SendFunc sends message i, which was due at intended. It may block (a synchronous publish, a
// full window): the schedule does not wait for it, the next messages are simply sent late.
type SendFunc func(i int64, intended time.Time) error

// RunStats describes how closely a run followed its schedule.
type RunStats struct {
	// Sent counts the messages sent (send returned nil).
	Sent int64
	// Lag records, per message, how late it was sent: the actual send time minus its intended
	// time, in nanoseconds.
	Lag *Histogram
	// Finished is when the last send returned.
	Finished time.Time
}

// Run sends the messages of s in order, each at its intended time or, when the sender is behind,
// at once: it never waits for a slow send to catch up (closed loop) and never moves the schedule.
// Every message carries its intended time (SendFunc), and a latency measured from it includes
// the time the message waited because the broker or the client stalled: no coordinated omission
// (Gil Tene, "How NOT to measure latency"). It stops at the first send error or when ctx ends.
func (s Schedule) Run(ctx context.Context, clk Clock, send SendFunc) (RunStats, error) {
	st := RunStats{Lag: NewHistogram()}
	if s.Rate <= 0 {
		return st, fmt.Errorf("bench: schedule rate must be above 0, got %v", s.Rate)
	}
	for i := range s.Count {
		due := s.Intended(i)
		now := clk.Now()
		if now.Before(due) {
			if err := clk.SleepUntil(ctx, due); err != nil {
				return st, err
			}
			now = clk.Now()
		} else if err := ctx.Err(); err != nil {
			return st, err
		}
		st.Lag.RecordDuration(now.Sub(due))
		if err := send(i, due); err != nil {
			st.Finished = clk.Now()
			return st, fmt.Errorf("bench: send message %d: %w", i, err)
		}
		st.Sent++
	}
	st.Finished = clk.Now()
	return st, nil
}
