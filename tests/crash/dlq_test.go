package crash

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal"
)

const (
	dlqTopic    = "crash.dlq"
	dlqChildEnv = "SPOOL_CRASH_DLQ_DIR"
)

// runDLQChild publishes to dlqTopic and dead-letters every message group "dlq" gets, while another
// goroutine purges and replays DLQ entries, until it is killed. It prints "PUB <payload> <partition>
// <offset>" after a publish returned, "DLQ <partition> <offset>" after the nack that dead-lettered
// it returned, "TOUCH <id> <partition> <offset>" before it purges or replays one entry and
// "PURGED|REPLAYED <id> <partition> <offset>" after that returned.
func runDLQChild(dir string) error {
	eng, err := wal.Open(dir, wal.Config{StateLogSnapshotBytes: 256 << 10}) // snapshots often
	if err != nil {
		return err
	}
	ctx := context.Background()
	sub, err := eng.SubscriptionGetByGroup(ctx, dlqTopic, "dlq")
	if err != nil {
		return err
	}
	emit := newEmitter()
	run := os.Getenv("SPOOL_CRASH_RUN")
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			for n := 0; ; n++ {
				payload := fmt.Sprintf("r%s-w%d-n%d-%s", run, w, n, strings.Repeat("x", n%200))
				res, err := eng.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: dlqTopic,
					Messages: []storage.AppendMessage{{Partition: storage.PartitionAuto, Key: []byte(payload), Payload: []byte(payload)}}})
				if err != nil {
					emit("ERR " + err.Error())
					return
				}
				emit(fmt.Sprintf("PUB %s %d %d", payload, res.Positions[0].Partition, res.Positions[0].Offset))
			}
		})
	}
	wg.Go(func() {
		for {
			res, err := eng.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: "child", Max: 20})
			if err != nil {
				emit("ERR " + err.Error())
				return
			}
			if len(res.Deliveries) == 0 {
				time.Sleep(time.Millisecond) // a load generator, not a test
				continue
			}
			refs := make([]storage.DeliveryRef, 0, len(res.Deliveries))
			for _, d := range res.Deliveries {
				refs = append(refs, d.Ref())
			}
			nr, err := eng.DeliveriesNack(ctx, &storage.DeliveriesNackParams{SubscriptionID: sub.ID, Member: "child", Refs: refs, ToDLQ: true})
			if err == nil && nr.DeadLettered != len(refs) {
				err = fmt.Errorf("dead-lettered %d of %d (not held: %v)", nr.DeadLettered, len(refs), nr.NotHeld)
			}
			if err != nil {
				emit("ERR " + err.Error())
				return
			}
			for _, r := range refs {
				emit(fmt.Sprintf("DLQ %d %d", r.Partition, r.Offset))
			}
		}
	})
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
		for {
			time.Sleep(2 * time.Millisecond)
			st, err := eng.SubscriptionStats(ctx, sub.ID)
			if err != nil || st.DeadLettered == 0 {
				continue
			}
			list, err := eng.DLQList(ctx, &storage.DLQListParams{SubscriptionID: sub.ID, AfterID: rng.Int64N(st.DeadLettered * 2), Limit: 1})
			if err != nil {
				emit("ERR " + err.Error())
				return
			}
			if len(list) == 0 {
				continue
			}
			d := list[0]
			// Before the call: a purge or replay the kill interrupts may or may not be applied.
			emit(fmt.Sprintf("TOUCH %d %d %d", d.ID, d.Message.Partition, d.Message.Offset))
			what := "PURGED"
			var n int
			if rng.IntN(2) == 0 {
				n, err = eng.DLQPurge(ctx, &storage.DLQPurgeParams{SubscriptionID: sub.ID, IDs: []int64{d.ID}})
			} else {
				what = "REPLAYED"
				n, err = eng.DLQReplay(ctx, &storage.DLQReplayParams{SubscriptionID: sub.ID, IDs: []int64{d.ID}})
			}
			if err != nil || n != 1 {
				emit(fmt.Sprintf("ERR %s of %d: %d, %v", what, d.ID, n, err))
				return
			}
			emit(fmt.Sprintf("%s %d %d %d", what, d.ID, d.Message.Partition, d.Message.Offset))
		}
	})
	wg.Wait()
	return errors.New("child stopped")
}

// TestCrashDLQ kills a process that dead-letters, purges and replays DLQ entries (whose messages
// live in DLQ logs) at random moments, and checks after every restart that every entry it reported
// dead-lettered is in the DLQ with its message, that no purged or replayed entry is, and that IDs
// are never reused.
func TestCrashDLQ(t *testing.T) {
	iterations := 20
	if testing.Short() {
		iterations = 5
	}
	rng := seededRNG(t)
	dir := t.TempDir()
	ctx := context.Background()
	createTopic(t, dir, dlqTopic, 2, "dlq")

	published := map[pos]string{}
	dead := map[pos]bool{}    // reported dead-lettered
	touched := map[pos]bool{} // an entry of it was (maybe) purged or replayed: it may not be in the DLQ
	gone := map[int64]bool{}  // IDs reported purged or replayed
	maxID := int64(0)         // the highest ID seen
	entries := 0
	for it := range iterations {
		for _, l := range runChildAndKill(t, dlqChildEnv, dir, it, time.Duration(50+rng.IntN(300))*time.Millisecond) {
			f := strings.Fields(l)
			switch {
			case len(f) == 4 && f[0] == "PUB":
				published[parsePos(f[2], f[3])] = f[1]
			case len(f) == 3 && f[0] == "DLQ":
				dead[parsePos(f[1], f[2])] = true
			case len(f) == 4 && (f[0] == "TOUCH" || f[0] == "PURGED" || f[0] == "REPLAYED"):
				id, _ := strconv.ParseInt(f[1], 10, 64)
				touched[parsePos(f[2], f[3])] = true
				if f[0] != "TOUCH" {
					gone[id] = true
				}
			case strings.HasPrefix(l, "ERR"):
				t.Fatalf("iteration %d: child error: %s", it, l)
			}
		}
		eng, err := wal.Open(dir, wal.Config{})
		if err != nil {
			t.Fatalf("iteration %d: reopen: %v", it, err)
		}
		sub, err := eng.SubscriptionGetByGroup(ctx, dlqTopic, "dlq")
		if err != nil {
			t.Fatal(err)
		}
		inDLQ := map[pos]bool{}
		after, n := int64(0), 0
		for {
			list, err := eng.DLQList(ctx, &storage.DLQListParams{SubscriptionID: sub.ID, AfterID: after, Limit: 500})
			if err != nil {
				t.Fatalf("iteration %d: list: %v", it, err)
			}
			if len(list) == 0 {
				break
			}
			for _, d := range list {
				if d.ID <= after {
					t.Fatalf("iteration %d: DLQ ID %d after %d", it, d.ID, after)
				}
				after = d.ID
				n++
				if gone[d.ID] {
					t.Fatalf("iteration %d: DLQ entry %d was purged or replayed and is back", it, d.ID)
				}
				p := pos{d.Message.Partition, d.Message.Offset}
				if want, ok := published[p]; ok && string(d.Message.Payload) != want {
					t.Fatalf("iteration %d: DLQ entry %d of %v holds %q, the message was %q", it, d.ID, p, d.Message.Payload, want)
				}
				inDLQ[p] = true
				maxID = max(maxID, d.ID)
			}
		}
		for p := range dead {
			if !touched[p] && !inDLQ[p] {
				t.Fatalf("iteration %d: %v was dead-lettered and is not in the DLQ (%d listed, %d dead, %d gone)", it, p, n, len(dead), len(gone))
			}
		}
		st, err := eng.SubscriptionStats(ctx, sub.ID)
		if err != nil || st.DeadLettered != int64(n) {
			t.Fatalf("iteration %d: stats %+v (%v), listed %d", it, st, err, n)
		}
		entries = n
		if err := eng.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d iterations: %d dead-lettered, %d purged or replayed, %d entries at the end, highest ID %d",
		iterations, len(dead), len(gone), entries, maxID)
	if len(dead) == 0 || len(gone) == 0 {
		t.Fatal("nothing was dead-lettered, purged or replayed")
	}
}
