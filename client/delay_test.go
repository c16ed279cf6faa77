package client

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/spoolmq/spool/protocol"
)

// TestPublishDelayField: Message.Delay reaches a version-6 broker as the Publish's relative
// delay (no NotBefore: the broker counts it on its own clock), and an older broker, which has no
// delay field, as NotBefore = this machine's clock + Delay. Both Delay and NotBefore set is
// refused: by the client before sending to an older broker, by a version-6 broker otherwise.
func TestPublishDelayField(t *testing.T) {
	t.Parallel()
	const delay = 90 * time.Second
	for _, v := range []uint16{protocol.Version5, protocol.Version6} {
		t.Run(fmt.Sprintf("version=%d", v), func(t *testing.T) {
			t.Parallel()
			_, c, p := pipeClient(t, func(ok *protocol.HelloOK) { ok.Version = v })
			ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
			defer cancel()
			done := make(chan error, 1)
			before := time.Now()
			go func() {
				_, err := c.Publish(ctx, "later", Message{Payload: []byte("x"), Delay: delay, TTL: time.Hour})
				if err != nil {
					t.Errorf("publish: %v", err)
					_ = p.nc.Close() // the peer's read fails at once
				}
				done <- err
			}()
			corr, req := expect[*protocol.Publish](p)
			after := time.Now()
			m := req.Messages[0]
			if v >= protocol.Version6 {
				if m.Delay != delay || !m.NotBefore.IsZero() || m.TTL != time.Hour {
					t.Fatalf("sent delay %s not_before %v ttl %s, want delay %s and no not_before", m.Delay, m.NotBefore, m.TTL, delay)
				}
			} else if m.Delay != 0 || m.NotBefore.Before(before.Add(delay).Truncate(time.Millisecond)) || m.NotBefore.After(after.Add(delay)) {
				t.Fatalf("sent delay %s not_before %v to a version-%d broker, want not_before between %v and %v",
					m.Delay, m.NotBefore, v, before.Add(delay), after.Add(delay))
			}
			p.write(corr, &protocol.PublishOK{Partitions: 1, Positions: []protocol.Position{{Offset: 0, PublishTime: time.Now()}}})
			if err := <-done; err != nil {
				t.Fatal(err)
			}

			both := Message{Payload: []byte("x"), Delay: delay, NotBefore: time.Now().Add(delay)}
			if v < protocol.Version6 {
				if _, err := c.Publish(ctx, "later", both); !errors.Is(err, protocol.ErrInvalidArgument) {
					t.Fatalf("Delay and NotBefore to a version-%d broker: %v, want INVALID_ARGUMENT", v, err)
				}
				return
			}
			go func() {
				_, err := c.Publish(ctx, "later", both)
				done <- err
			}()
			corr, req = expect[*protocol.Publish](p)
			if m := req.Messages[0]; m.Delay != delay || m.NotBefore.IsZero() {
				t.Fatalf("sent %+v, want both fields for the broker to refuse", m)
			}
			p.write(corr, protocol.ErrInvalidArgument.Errorf("message 0 has both not_before and delay"))
			if err := <-done; !errors.Is(err, protocol.ErrInvalidArgument) {
				t.Fatalf("Delay and NotBefore: %v, want INVALID_ARGUMENT", err)
			}
		})
	}
}
