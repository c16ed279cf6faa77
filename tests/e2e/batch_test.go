package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/spoolmq/spool/client"
	"github.com/spoolmq/spool/protocol"
)

// Per-key transactional batches (issue 17 item 4) against real spool serve processes.

// TestBatches: on the embedded engine, see batchScenario.
func TestBatches(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.start()
	batchScenario(t, b)
}

// TestPGBatches: batchScenario on the PostgreSQL engine.
func TestPGBatches(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	b := newPGBroker(t, url, freshSchema(t, url))
	b.start()
	batchScenario(t, b)
}

// batchLine is what the scenario reads of a `spool sub --batch --json` line.
type batchLine struct {
	Partition   int32  `json:"partition"`
	Offset      int64  `json:"offset"`
	Key         string `json:"key"`
	Attempt     int    `json:"attempt"`
	BatchOffset int64  `json:"batch_offset"`
	BatchLen    int    `json:"batch_len"`
}

// seenBatch is one batch handed to the Go member's handler.
type seenBatch struct {
	partition int32
	offsets   []int64
	keys      []string
	attempt   int
	partErr   error // the refused ack of its first delivery alone (first attempt only)
}

// batchScenario: a keyed 3-partition topic; each publish writes a run of 5 messages of one key
// to one partition (3 runs per partition). A `spool sub --ordered --batch 2` member gets every
// run as one batch of 5 (never split, batch fields on every line), in per-partition order. A Go
// member of another group (SubscribeBatch, batch size 2) fails the first batch of each partition:
// the whole batch comes back (attempt 2) before the partition's later offsets; its ack of one
// delivery of a batch is refused INVALID_ARGUMENT.
func batchScenario(t *testing.T, b *broker) {
	const topic, parts, runLen, runs = "bat", 3, 5, 3
	b.createTopic(topic, map[string]any{"semantics": "PUB_SUB", "partitions": parts})
	pub := b.dialClient()
	for r := range runs {
		for p := range int32(parts) {
			msgs := make([]client.Message, runLen)
			for i := range msgs {
				msgs[i] = client.Message{PinPartition: true, Partition: p, Key: fmt.Appendf(nil, "k%d-%d", p, r),
					Payload: fmt.Appendf(nil, "p%d-r%d-%d", p, r, i)}
			}
			if _, err := pub.PublishBatch(ctx(t), topic, msgs); err != nil {
				t.Fatalf("publish: %v", err)
			}
		}
	}
	const total = parts * runLen * runs

	// 1. spool sub --ordered --batch 2: batch size below the runs, credit 2 (its default).
	s := startSub(t, b, "--group", "g", "--ordered", "--batch", "2", "--from", "beginning", "--json", topic)
	s.waitLines(t, "sub printed every message", total)
	next := map[int32]int64{}
	byBatch := map[[2]int64][]batchLine{}
	for line := range strings.SplitSeq(strings.TrimSuffix(s.out.String(), "\n"), "\n") {
		var l batchLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("sub printed %q: %v", line, err)
		}
		if l.Offset != next[l.Partition] {
			t.Fatalf("partition %d: offset %d after %d: out of order", l.Partition, l.Offset, next[l.Partition]-1)
		}
		next[l.Partition]++
		if l.BatchLen != runLen || l.BatchOffset != l.Offset-l.Offset%runLen {
			t.Fatalf("line %q: want the batch of its publish (%d from offset %d)", line, runLen, l.Offset-l.Offset%runLen)
		}
		k := [2]int64{int64(l.Partition), l.BatchOffset}
		if bs := byBatch[k]; len(bs) > 0 && bs[0].Key != l.Key {
			t.Fatalf("batch %v mixes keys %q and %q", k, bs[0].Key, l.Key)
		}
		byBatch[k] = append(byBatch[k], l)
	}
	if len(byBatch) != parts*runs {
		t.Fatalf("%d batches, want %d", len(byBatch), parts*runs)
	}

	// 2. A Go member of group h: the first batch of each partition fails once.
	var mu sync.Mutex
	var seen []seenBatch
	failed := map[int32]bool{}
	done := make(chan struct{})
	acked := 0
	c := b.dialClient()
	sub, err := c.SubscribeBatch(ctx(t), client.SubscribeParams{Topic: topic, Group: "h", Ordered: true, BatchSize: 2, Start: client.FromBeginning()},
		func(hctx context.Context, batch []*client.Delivery) error {
			sb := seenBatch{partition: batch[0].Partition, attempt: batch[0].Attempt}
			for _, d := range batch {
				sb.offsets = append(sb.offsets, d.Offset)
				sb.keys = append(sb.keys, string(d.Key))
			}
			mu.Lock()
			first := !failed[sb.partition]
			failed[sb.partition] = true
			mu.Unlock()
			var herr error
			if first {
				sb.partErr = batch[0].Ack(hctx)
				herr = errors.New("downstream unavailable")
			}
			mu.Lock()
			seen = append(seen, sb)
			if herr == nil {
				if acked += len(batch); acked == total {
					close(done)
				}
			}
			mu.Unlock()
			return herr
		}, client.NackDelay(0))
	if err != nil {
		t.Fatalf("SubscribeBatch: %v", err)
	}
	defer func() { _ = sub.Close(ctx(t)) }()
	select {
	case <-done:
	case <-ctx(t).Done():
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("the Go member acked %d of %d messages; batches %+v", acked, total, seen)
	}
	mu.Lock()
	defer mu.Unlock()
	for p := range int32(parts) {
		var got []string
		for _, sb := range seen {
			if sb.partition != p {
				continue
			}
			if sb.partErr != nil && !errors.Is(sb.partErr, protocol.ErrInvalidArgument) {
				t.Fatalf("partition %d: ack of one delivery of a batch: %v, want INVALID_ARGUMENT", p, sb.partErr)
			}
			if sb.attempt == 1 && sb.offsets[0] == 0 && sb.partErr == nil {
				t.Fatalf("partition %d: the ack of one delivery of the first batch was accepted", p)
			}
			if slices.ContainsFunc(sb.keys, func(k string) bool { return k != sb.keys[0] }) {
				t.Fatalf("partition %d: batch %v mixes keys %v", p, sb.offsets, sb.keys)
			}
			got = append(got, fmt.Sprintf("%v@%d", sb.offsets, sb.attempt))
		}
		want := []string{"[0 1 2 3 4]@1", "[0 1 2 3 4]@2", "[5 6 7 8 9]@1", "[10 11 12 13 14]@1"}
		if !slices.Equal(got, want) {
			t.Fatalf("partition %d: batches %v, want %v (the nacked batch whole, first)", p, got, want)
		}
	}
}
