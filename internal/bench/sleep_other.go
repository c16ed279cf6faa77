//go:build !linux

package bench

import (
	"context"
	"time"
)

// sleepUntil sleeps until t on a Go timer (precise to about a millisecond when the process is
// idle).
func sleepUntil(ctx context.Context, t time.Time) error {
	tm := time.NewTimer(time.Until(t))
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
