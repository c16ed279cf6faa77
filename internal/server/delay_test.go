package server

import (
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage/storagetest"
	"github.com/spoolmq/spool/internal/storage/wal"
	"github.com/spoolmq/spool/protocol"
)

// TestPublishDelay: a version-6 Publish's delay counts on the broker's clock (a fake one, an
// hour behind the test's, as a skewed client would see it) from the broker's receipt: the
// message is not delivered before that time plus the delay, and is after. A message with both a
// delay and a not_before is refused; a version-5 session's not_before works as before.
func TestPublishDelay(t *testing.T) {
	t.Parallel()
	clock := storagetest.NewFakeClock(time.Now().Add(-time.Hour).Truncate(time.Millisecond))
	e := newEnvWAL(t, wal.Config{Clock: clock}, func(c *Config) { c.Clock = clock }, func(c *broker.Config) { c.Clock = clock })
	const delay = 10 * time.Minute

	c := e.dial(nil)
	if c.hello.Version != protocol.Version6 {
		t.Fatalf("negotiated version %d, want 6", c.hello.Version)
	}
	pub := func(m protocol.PublishMessage) {
		t.Helper()
		m.Partition = protocol.PartitionAuto
		expectOK[*protocol.PublishOK](c, &protocol.Publish{Topic: "later", Messages: []protocol.PublishMessage{m}})
	}
	// marker publishes an undelayed message and waits for its delivery: the delayed one, stored
	// before it on the same partition, would have come first (or with it) had it been due.
	marker := func(name string) {
		t.Helper()
		pub(protocol.PublishMessage{Payload: []byte(name)})
		ds := c.deliveriesN(1)
		if got := payloadsOf(ds); got[0] != name {
			t.Fatalf("delivered %q, want only the marker %q: the delayed message came early", got, name)
		}
		expectOK[*protocol.AckOK](c, &protocol.Ack{Refs: refs(ds...)}) // no lease to expire as the clock moves
	}
	c.expectErr(&protocol.Publish{Topic: "later", Messages: []protocol.PublishMessage{
		{Partition: protocol.PartitionAuto, Payload: []byte("both"), Delay: delay, NotBefore: clock.Now().Add(delay)},
	}}, protocol.CodeInvalidArgument)
	c.subscribe(&protocol.Subscribe{Topic: "later", Group: "g", MaxInFlight: 100})

	pub(protocol.PublishMessage{Payload: []byte("delayed"), Delay: delay})
	marker("m1")
	clock.Advance(delay - time.Millisecond)
	marker("m2")
	clock.Advance(time.Millisecond)
	ds := c.deliveriesN(1)
	if got := payloadsOf(ds); got[0] != "delayed" {
		t.Fatalf("delivered %q once the delay elapsed, want the delayed message", got)
	}
	expectOK[*protocol.AckOK](c, &protocol.Ack{Refs: refs(ds...)})

	old := e.dial(&protocol.Hello{ClientName: "old", MinVersion: protocol.Version2, MaxVersion: protocol.Version5})
	if old.hello.Version != protocol.Version5 {
		t.Fatalf("negotiated version %d, want 5", old.hello.Version)
	}
	expectOK[*protocol.PublishOK](old, &protocol.Publish{Topic: "later", Messages: []protocol.PublishMessage{
		{Partition: protocol.PartitionAuto, Payload: []byte("absolute"), NotBefore: clock.Now().Add(delay)},
	}})
	marker("m3")
	clock.Advance(delay)
	if got := payloadsOf(c.deliveriesN(1)); got[0] != "absolute" {
		t.Fatalf("delivered %q once not_before passed, want the version-5 message", got)
	}
}
