package bench

import (
	"context"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// preciseBelow is the longest wait done with nanosleep: longer waits first sleep on a Go timer
// (interruptible by ctx) until preciseBelow before the deadline.
const preciseBelow = 2 * time.Millisecond

// sleepUntil sleeps until t with nanosleep(2) on a locked thread whose timer slack is 1 ns: a
// few tens of microseconds late, where a Go timer in an idle process wakes about a millisecond
// late (the runtime's netpoller waits in whole milliseconds).
func sleepUntil(ctx context.Context, t time.Time) error {
	if d := time.Until(t) - preciseBelow; d > 0 {
		tm := time.NewTimer(d)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			return ctx.Err()
		}
	}
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	for d > 0 {
		ts := unix.NsecToTimespec(int64(d))
		if err := unix.Nanosleep(&ts, nil); err != nil && err != unix.EINTR {
			return err
		}
		d = time.Until(t)
	}
	return ctx.Err()
}
