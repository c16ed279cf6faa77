package main

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/errmap"
)

// TestStopperSharesOneDeadline: every step of the shutdown gets the deadline the first one got,
// so shutdown_timeout bounds them together; the parent's cancellation (the signal) does not end
// them.
func TestStopperSharesOneDeadline(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	cancel()
	stopCtx := stopper(parent, time.Minute)
	first, c1 := stopCtx()
	defer c1()
	second, c2 := stopCtx()
	defer c2()
	d1, ok1 := first.Deadline()
	d2, ok2 := second.Deadline()
	if !ok1 || !ok2 || !d1.Equal(d2) {
		t.Fatalf("deadlines %v (%v) and %v (%v), want one", d1, ok1, d2, ok2)
	}
	if first.Err() != nil {
		t.Fatalf("step context ended with its parent: %v", first.Err())
	}
}

// TestReadinessWhileShuttingDown: from the start of a shutdown /readyz's check answers CLOSED, a
// retryable code (a load balancer sends new clients elsewhere), not INTERNAL; before it, the
// broker's readiness.
func TestReadinessWhileShuttingDown(t *testing.T) {
	var down atomic.Bool
	brokerErr := errors.New("broker not ready")
	ready := readiness(&down, func() error { return brokerErr })
	if err := ready(); err != brokerErr {
		t.Fatalf("before the shutdown: %v, want the broker's %v", err, brokerErr)
	}
	down.Store(true)
	pe := errmap.ErrorFrom(ready())
	if pe == nil || pe.Name != "CLOSED" || !pe.Retryable {
		t.Fatalf("shutting down: %+v, want a retryable CLOSED", pe)
	}
}
