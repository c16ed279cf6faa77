package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// TestBatchesOnTheWire: an ordered member subscribed with batch_size 2 and credit 1 gets a
// publish's run of 4 messages of one key as one batch (batch_offset and batch_len on every
// delivery, past the credit); an Ack of part of it is refused INVALID_ARGUMENT naming the batch,
// a Nack of the whole redelivers it whole, and an Ack of the whole lets the next batch come.
// batch_size is refused for a shared member and above 1000; a version-3 session cannot send it.
func TestBatchesOnTheWire(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, func(c *broker.Config) { c.RebalanceDelay = -1 })
	if _, err := e.b.CreateTopic(context.Background(), "o", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	c := e.dial(nil)
	c.expectErr(&protocol.Subscribe{Topic: "o", Group: "s", BatchSize: 2}, protocol.CodeInvalidArgument)
	c.expectErr(&protocol.Subscribe{Topic: "o", Group: "g", Mode: protocol.GroupOrdered, BatchSize: 1001}, protocol.CodeInvalidArgument)
	c.subscribe(&protocol.Subscribe{Topic: "o", Group: "g", MemberID: "a", Mode: protocol.GroupOrdered, MaxInFlight: 1,
		BatchSize: 2, Start: protocol.StartPosition{Kind: protocol.StartFromBeginning}})
	eventually(t, "a owns both partitions", func() error {
		a, err := e.b.GroupAssignment(context.Background(), "o", "g")
		if err != nil || len(a.Members["a"]) != 2 {
			return fmt.Errorf("assignment %+v, %v", a, err)
		}
		return nil
	})
	run := func(key string, n int) []protocol.PublishMessage {
		var ms []protocol.PublishMessage
		for i := range n {
			ms = append(ms, protocol.PublishMessage{Partition: 1, Key: []byte(key), Payload: fmt.Appendf(nil, "%s-%d", key, i)})
		}
		return ms
	}
	expectOK[*protocol.PublishOK](c, &protocol.Publish{Topic: "o", Messages: run("k", 4)})
	expectOK[*protocol.PublishOK](c, &protocol.Publish{Topic: "o", Messages: run("j", 1)})
	check := func(ds []protocol.Delivery, from int64, attempt uint32) {
		t.Helper()
		for i, d := range ds {
			if d.Partition != 1 || d.Offset != from+int64(i) || d.BatchOffset != from || d.BatchLen != uint32(len(ds)) || d.Attempt != attempt {
				t.Fatalf("delivery %d: %+v, want offset %d in the batch of %d from %d, attempt %d", i, d, from+int64(i), len(ds), from, attempt)
			}
		}
	}
	batch := c.deliveriesN(4)
	check(batch, 0, 1)
	er := c.expectErr(&protocol.Ack{Refs: refs(batch[:3]...)}, protocol.CodeInvalidArgument)
	if !strings.Contains(er.Message, "whole batch") {
		t.Fatalf("partial ack refused with %q: want it to say the whole batch must be acked", er.Message)
	}
	c.expectErr(&protocol.Nack{Refs: refs(batch[1])}, protocol.CodeInvalidArgument)
	if nack := expectOK[*protocol.NackOK](c, &protocol.Nack{Refs: refs(batch...)}); nack.Nacked != 4 {
		t.Fatalf("NackOK %+v, want 4 nacked", nack)
	}
	again := c.deliveriesN(4)
	check(again, 0, 2)
	if ack := expectOK[*protocol.AckOK](c, &protocol.Ack{Refs: refs(again...)}); ack.Acked != 4 {
		t.Fatalf("AckOK %+v, want 4 acked", ack)
	}
	check(c.deliveriesN(1), 4, 1)

	old := e.dial(&protocol.Hello{ClientName: "old", MinVersion: protocol.Version2, MaxVersion: protocol.Version3})
	if err := old.w.WriteMessage(9, &protocol.Subscribe{Topic: "o", Group: "g", Mode: protocol.GroupOrdered, BatchSize: 2}); !errors.Is(err, protocol.ErrInvalidArgument) {
		t.Fatalf("batch_size on a version-3 session: %v, want an encoding error", err)
	}
}
