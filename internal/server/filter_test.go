package server

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// publishRegions publishes one message per region (header region, payload "<region>-<i>").
func (c *bclient) publishRegions(topic string, regions ...string) {
	c.t.Helper()
	msgs := make([]protocol.PublishMessage, len(regions))
	for i, r := range regions {
		msgs[i] = protocol.PublishMessage{Partition: protocol.PartitionAuto, Headers: map[string]string{"region": r},
			Payload: []byte(r + "-" + string(rune('0'+i)))}
	}
	expectOK[*protocol.PublishOK](c, &protocol.Publish{Topic: topic, Messages: msgs})
}

// TestSubscribeFilter: over real TCP, two members of one group with filters get only their
// messages, what neither matches is completed for the group (counted), and a bad filter is
// INVALID_ARGUMENT with its position. A version-2 session cannot send a filter and still
// subscribes without one.
func TestSubscribeFilter(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	filtered := map[string]int{}
	e := newEnv(t, nil, func(bc *broker.Config) {
		bc.OnFiltered = func(topic, group string, n int) {
			mu.Lock()
			defer mu.Unlock()
			filtered[topic+"/"+group] += n
		}
	})
	c := e.dial(nil)
	if c.hello.Version != protocol.MaxVersion {
		t.Fatalf("negotiated version %d", c.hello.Version)
	}
	pe := c.expectErr(&protocol.Subscribe{Topic: "orders", Group: "g", Filter: "region in (eu"}, protocol.CodeInvalidArgument)
	if !strings.Contains(pe.Message, "at byte 13") {
		t.Fatalf("error without the position: %q", pe.Message)
	}
	c.subscribe(&protocol.Subscribe{Topic: "orders", Group: "g", MemberID: "eu", MaxInFlight: 10, Filter: "region=eu"})
	other := e.dial(nil)
	other.subscribe(&protocol.Subscribe{Topic: "orders", Group: "g", MemberID: "us", MaxInFlight: 10, Filter: "region in (us,ca)"})
	if m, err := e.memberInfo("eu"); err != nil || m.Filter != "region=eu" {
		t.Fatalf("member info %+v, %v", m, err)
	}
	c.publishRegions("orders", "eu", "us", "ap", "eu", "ca", "ap")
	gotEU := c.deliveriesN(2)
	gotUS := other.deliveriesN(2)
	if p := payloadsOf(gotEU); !slices.Equal(p, []string{"eu-0", "eu-3"}) {
		t.Fatalf("eu got %v", p)
	}
	if p := payloadsOf(gotUS); !slices.Equal(p, []string{"us-1", "ca-4"}) {
		t.Fatalf("us got %v", p)
	}
	for _, d := range append(gotEU, gotUS...) {
		if d.Attempt != 1 {
			t.Fatalf("delivery %+v has attempt %d", d, d.Attempt)
		}
	}
	expectOK[*protocol.AckOK](c, &protocol.Ack{Refs: refs(gotEU...)})
	expectOK[*protocol.AckOK](other, &protocol.Ack{Refs: refs(gotUS...)})
	// "orders" was auto-created as a QUEUE topic: the group shares its queue subscription.
	if st := e.groupStats("orders", ""); st.Pending != 0 {
		t.Fatalf("pending %d after the acks: the ap messages were not completed", st.Pending)
	}
	mu.Lock()
	n := filtered["orders/"+storage.QueueGroup]
	mu.Unlock()
	if n != 2 {
		t.Fatalf("filtered %d, want 2", n)
	}

	// A version-2 client: no filter field on the wire.
	old := e.dial(&protocol.Hello{ClientName: "old", MinVersion: protocol.Version2, MaxVersion: protocol.Version2})
	if old.hello.Version != protocol.Version2 {
		t.Fatalf("negotiated version %d", old.hello.Version)
	}
	old.subscribe(&protocol.Subscribe{Topic: "orders", Group: "g", MemberID: "v2", MaxInFlight: 1})
	c.publishRegions("orders", "zz")
	if p := payloadsOf(old.deliveriesN(1)); !slices.Equal(p, []string{"zz-0"}) {
		t.Fatalf("the version-2 member (no filter: everything) got %v", p)
	}
}

// TestTextSubscribeFilter: SUBSCRIBE ... FILTER <expression> in the text mode.
func TestTextSubscribeFilter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fastPublisherIdle, nil)
	c := e.dialText()
	c.send("SUBSCRIBE t FILTER region=")
	if l := c.expect("ERR INVALID_ARGUMENT "); !strings.Contains(l, "filter: at byte 7") {
		t.Fatalf("error without the position: %q", l)
	}
	c.send("SUBSCRIBE t FROM_BEGINNING FILTER region in (eu, us) AND !test")
	c.expect("OK subscribed t")
	p := e.dial(nil)
	msgs := []protocol.PublishMessage{
		{Partition: protocol.PartitionAuto, Headers: map[string]string{"region": "eu", "test": "1"}, Payload: []byte("eu-test")},
		{Partition: protocol.PartitionAuto, Headers: map[string]string{"region": "ap"}, Payload: []byte("ap")},
		{Partition: protocol.PartitionAuto, Headers: map[string]string{"region": "us"}, Payload: []byte("us")},
	}
	expectOK[*protocol.PublishOK](p, &protocol.Publish{Topic: "t", Messages: msgs})
	c.expect("MESSAGE t us")
	c.send("PING")
	c.expect("OK PONG")
}
