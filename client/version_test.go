package client

import (
	"context"
	"fmt"
	"testing"

	"github.com/spoolmq/spool/protocol"
)

// TestOlderBrokerDeliveries: against a broker whose highest protocol version is older than the
// client's (HelloOK chooses it), the client decodes every pushed frame in that version's layout:
// a version-2 or version-3 Deliver has no batch fields, and the handler gets each delivery and
// acks it rather than dropping the frame as undecodable.
func TestOlderBrokerDeliveries(t *testing.T) {
	t.Parallel()
	for _, v := range []uint16{protocol.Version2, protocol.Version3} {
		t.Run(fmt.Sprintf("Version%d", v), func(t *testing.T) {
			t.Parallel()
			_, c, p := pipeClient(t, func(ok *protocol.HelloOK) { ok.Version = v })
			got := make(chan string, 1)
			subscribePipe(t, c, p, SubscribeParams{Topic: "orders", Group: "g", MaxInFlight: 1}, func(_ context.Context, d *Delivery) error {
				got <- fmt.Sprintf("%s@%d", d.Payload, d.Offset)
				return nil
			})
			for i := range 3 {
				p.write(0, &protocol.Deliver{Deliveries: []protocol.Delivery{delivery(1, int64(i), "old")}})
				if s, want := recv(t, got, "handler"), fmt.Sprintf("old@%d", i); s != want {
					t.Fatalf("handler got %q, want %q", s, want)
				}
				corr, ack := expect[*protocol.Ack](p)
				if len(ack.Refs) != 1 || ack.Refs[0].Offset != int64(i) {
					t.Fatalf("ack %d: %+v", i, ack.Refs)
				}
				p.write(corr, &protocol.AckOK{Acked: 1})
			}
		})
	}
}
