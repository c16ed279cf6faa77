package main

import (
	"testing"
	"time"
)

// TestPubDelayIsRelative: --delay goes to the broker as a relative delay, counted on its clock
// from its receipt of the message: the message carries no not-before time computed on this
// machine's clock, which a skew between the two would move.
func TestPubDelayIsRelative(t *testing.T) {
	t.Parallel()
	p := &publisher{o: &pubOptions{topic: "t", delay: 30 * time.Second, ttl: time.Hour}}
	m := p.message([]byte("x"), 1)
	if m.Delay != 30*time.Second || !m.NotBefore.IsZero() || m.TTL != time.Hour {
		t.Fatalf("message with delay %s not_before %v ttl %s, want delay 30s, no not_before, ttl 1h", m.Delay, m.NotBefore, m.TTL)
	}
}
