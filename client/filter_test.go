package client

import (
	"context"
	"errors"
	"testing"

	"github.com/spoolmq/spool/protocol"
)

// TestSubscribeFilterWire: SubscribeParams.Filter travels in Subscribe on a version-3 session; on
// a version-2 session (an older broker) Subscribe with a filter fails with INVALID_ARGUMENT and
// sends nothing.
func TestSubscribeFilterWire(t *testing.T) {
	t.Parallel()
	t.Run("Version3", func(t *testing.T) {
		t.Parallel()
		_, c, p := pipeClient(t, nil)
		_, sub := subscribePipe(t, c, p, SubscribeParams{Topic: "orders", Group: "g", Filter: "region=eu"},
			func(context.Context, *Delivery) error { return nil })
		if sub.Filter != "region=eu" {
			t.Fatalf("Subscribe on the wire: %+v", sub)
		}
	})
	t.Run("Version2", func(t *testing.T) {
		t.Parallel()
		_, c, _ := pipeClient(t, func(ok *protocol.HelloOK) { ok.Version = protocol.Version2 })
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		_, err := c.Subscribe(ctx, SubscribeParams{Topic: "orders", Group: "g", Filter: "region=eu"},
			func(context.Context, *Delivery) error { return nil })
		if !errors.Is(err, protocol.ErrInvalidArgument) {
			t.Fatalf("Subscribe with a filter on version 2: %v, want INVALID_ARGUMENT", err)
		}
	})
}
