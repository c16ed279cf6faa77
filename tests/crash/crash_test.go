// Package crash kills a process that publishes with durable acks at random moments, many times in a
// row, and checks after every restart that each acknowledged publish is in the log exactly once and
// is delivered to every subscription that requires it, and that an acknowledged ack is never undone.
// dedup_test.go kills a publisher with producer ids between the commit and the answer, on both
// engines, and checks that its retries never store a second copy.
package crash

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal"
)

const (
	topic      = "crash.test"
	partitions = 3
	childEnv   = "SPOOL_CRASH_CHILD_DIR"
)

// TestMain turns the test binary into the child process when childEnv is set.
func TestMain(m *testing.M) {
	if store := os.Getenv(dedupStoreEnv); store != "" {
		if err := runDedupChild(store); err != nil {
			fmt.Fprintln(os.Stdout, "ERR", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	if dir := os.Getenv(dlqChildEnv); dir != "" {
		if err := runDLQChild(dir); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	if dir := os.Getenv(childEnv); dir != "" {
		if err := runChild(dir); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runChild publishes from several goroutines and consumes group "consumer" until it is killed. It
// prints "PUB <payload> <partition> <offset>" after each publish returned, "GOT <partition>
// <offset>" when group "consumer" received a message (before acking it), and "ACK <partition>
// <offset>" after each ack of group "consumer" returned.
func runChild(dir string) error {
	eng, err := wal.Open(dir, wal.Config{})
	if err != nil {
		return err
	}
	ctx := context.Background()
	sub, err := eng.SubscriptionGetByGroup(ctx, topic, "consumer")
	if err != nil {
		return err
	}
	emit := newEmitter()
	run := os.Getenv("SPOOL_CRASH_RUN")
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for n := 0; ; n++ {
				payload := fmt.Sprintf("r%s-w%d-n%d", run, w, n)
				msgs := []storage.AppendMessage{{Partition: storage.PartitionAuto, Key: []byte(payload), Payload: []byte(payload)}}
				if n%3 == 0 { // some batches too
					for i := range 4 {
						p := fmt.Sprintf("%s-b%d", payload, i)
						msgs = append(msgs, storage.AppendMessage{Partition: storage.PartitionAuto, Key: []byte(p), Payload: []byte(p)})
					}
				}
				res, err := eng.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: topic, Messages: msgs})
				if err != nil {
					emit("ERR " + err.Error())
					return
				}
				for i, pos := range res.Positions {
					emit(fmt.Sprintf("PUB %s %d %d", msgs[i].Payload, pos.Partition, pos.Offset))
				}
			}
		})
	}
	wg.Go(func() {
		for {
			res, err := eng.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub.ID, Member: "child", Max: 50})
			if err != nil {
				emit("ERR " + err.Error())
				return
			}
			if len(res.Deliveries) == 0 {
				time.Sleep(time.Millisecond) // nothing to do: poll (the child is a load generator, not a test)
				continue
			}
			refs := make([]storage.DeliveryRef, 0, len(res.Deliveries))
			for _, d := range res.Deliveries {
				refs = append(refs, d.Ref())
				// Reported before the ack is sent: a message acked by a killed child was reported.
				emit(fmt.Sprintf("GOT %d %d", d.Partition, d.Offset))
			}
			if _, err := eng.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: sub.ID, Member: "child", Refs: refs}); err != nil {
				emit("ERR " + err.Error())
				return
			}
			for _, r := range refs {
				emit(fmt.Sprintf("ACK %d %d", r.Partition, r.Offset))
			}
		}
	})
	wg.Wait()
	return errors.New("publishers stopped")
}

type pos struct {
	partition int32
	offset    int64
}

func TestCrashDurableAcks(t *testing.T) {
	iterations := 25
	if testing.Short() {
		iterations = 5
	}
	rng := seededRNG(t)
	dir := t.TempDir()

	// Set up the topic with two groups: "consumer" is consumed by the child, "verifier" only by us.
	createTopic(t, dir, topic, partitions, "consumer", "verifier")

	published := map[string]pos{} // every acknowledged publish
	childAcked := map[pos]bool{}  // every acknowledged ack of group "consumer"
	childGot := map[pos]bool{}    // every delivery to group "consumer" the child reported
	verified := map[string]bool{} // delivered to "verifier" (and acked by us)
	for it := range iterations {
		lines := runAndKill(t, dir, it, time.Duration(20+rng.IntN(300))*time.Millisecond)
		newPubs := 0
		for _, l := range lines {
			f := strings.Fields(l)
			switch {
			case len(f) == 4 && f[0] == "PUB":
				if old, dup := published[f[1]]; dup {
					t.Fatalf("payload %s published twice (%v)", f[1], old)
				}
				published[f[1]] = parsePos(f[2], f[3])
				newPubs++
			case len(f) == 3 && f[0] == "ACK":
				childAcked[parsePos(f[1], f[2])] = true
			case len(f) == 3 && f[0] == "GOT":
				childGot[parsePos(f[1], f[2])] = true
			case strings.HasPrefix(l, "ERR"):
				t.Fatalf("iteration %d: child error: %s", it, l)
			}
		}
		if newPubs == 0 {
			t.Logf("iteration %d: killed before any publish was acknowledged", it)
		}
		verify(t, dir, it, published, childAcked, childGot, verified, it == iterations-1)
	}
	t.Logf("%d iterations, %d acknowledged publishes, %d acknowledged acks", iterations, len(published), len(childAcked))
	if len(published) == 0 {
		t.Fatal("no publish was ever acknowledged")
	}
}

// runAndKill starts the child, lets it run for d, kills it with SIGKILL and returns the lines it
// printed.
func runAndKill(t *testing.T, dir string, it int, d time.Duration) []string {
	t.Helper()
	return runChildAndKill(t, childEnv, dir, it, d)
}

// runChildAndKill is runAndKill for the child selected by the environment variable env.
func runChildAndKill(t *testing.T, env, dir string, it int, d time.Duration) []string {
	t.Helper()
	c := startChild(t, env+"="+dir, "SPOOL_CRASH_RUN="+strconv.Itoa(it))
	timer := time.NewTimer(d)
	select {
	case <-timer.C:
	case <-c.done:
		t.Fatalf("iteration %d: child exited early", it)
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
	_ = c.cmd.Wait()
	lines := c.lines
	// The last line may be cut in the middle by the kill; a torn line is not a complete report.
	if n := len(lines); n > 0 && !complete(lines[n-1]) {
		lines = lines[:n-1]
	}
	return lines
}

func complete(l string) bool {
	f := strings.Fields(l)
	return len(f) == 4 && (f[0] == "PUB" || f[0] == "TOUCH" || f[0] == "PURGED" || f[0] == "REPLAYED") ||
		len(f) == 3 && (f[0] == "ACK" || f[0] == "GOT" || f[0] == "DLQ") || strings.HasPrefix(l, "ERR")
}

// readLog calls fn with every message of topic's partitions, in offset order per partition.
func readLog(t *testing.T, eng storage.Engine, topic string, it int, fn func(m *storage.Message)) {
	t.Helper()
	for p := range int32(partitions) {
		next := int64(0)
		for {
			msgs, err := eng.MessagesRead(context.Background(), &storage.MessagesReadParams{Topic: topic, Partition: p, Offset: next, Limit: 1000})
			if err != nil {
				t.Fatalf("iteration %d: read: %v", it, err)
			}
			if len(msgs) == 0 {
				break
			}
			for _, m := range msgs {
				next = m.Offset + 1
				fn(m)
			}
		}
	}
}

// verify reopens the engine after a kill and checks the log and the deliveries.
func verify(t *testing.T, dir string, it int, published map[string]pos, childAcked, childGot map[pos]bool, verified map[string]bool, final bool) {
	t.Helper()
	ctx := context.Background()
	eng, err := wal.Open(dir, wal.Config{})
	if err != nil {
		t.Fatalf("iteration %d: reopen: %v", it, err)
	}
	defer eng.Close()

	// 1. The log: offsets gapless from 0, every payload at most once, every acknowledged publish
	//    present exactly once at the position it was acknowledged with.
	seen := map[string]pos{}
	next := make([]int64, partitions)
	readLog(t, eng, topic, it, func(m *storage.Message) {
		p := m.Partition
		if m.Offset != next[p] {
			t.Fatalf("iteration %d: partition %d: offset %d after %d (gap)", it, p, m.Offset, next[p]-1)
		}
		next[p]++
		if old, dup := seen[string(m.Payload)]; dup {
			t.Fatalf("iteration %d: payload %s stored twice: %v and %d:%d", it, m.Payload, old, p, m.Offset)
		}
		seen[string(m.Payload)] = pos{p, m.Offset}
	})
	for payload, want := range published {
		got, ok := seen[payload]
		if !ok {
			t.Fatalf("iteration %d: acknowledged publish %s (%v) is lost", it, payload, want)
		}
		if got != want {
			t.Fatalf("iteration %d: acknowledged publish %s at %v, acknowledged as %v", it, payload, got, want)
		}
	}

	// 2. Group "verifier" gets every message not yet verified, each once: claim and ack all.
	vsub, err := eng.SubscriptionGetByGroup(ctx, topic, "verifier")
	if err != nil {
		t.Fatal(err)
	}
	drain(t, ctx, eng, vsub.ID, "verifier", func(d *storage.Delivery) {
		if verified[string(d.Payload)] {
			t.Fatalf("iteration %d: %s delivered again to verifier after its ack", it, d.Payload)
		}
		verified[string(d.Payload)] = true
	})
	for payload := range published {
		if !verified[payload] {
			t.Fatalf("iteration %d: acknowledged publish %s never delivered to group verifier", it, payload)
		}
	}

	// 3. Group "consumer": what the child acked must never come back. At the end, drain it: every
	//    acknowledged publish was acked by the child or is delivered now.
	csub, err := eng.SubscriptionGetByGroup(ctx, topic, "consumer")
	if err != nil {
		t.Fatal(err)
	}
	stats, err := eng.SubscriptionStats(ctx, csub.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, ps := range stats.Partitions {
		if ps.AckFloor > ps.HighWater {
			t.Fatalf("iteration %d: ack floor %d above high water %d", it, ps.AckFloor, ps.HighWater)
		}
	}
	if !final {
		// Peek without consuming: claim and release so the child's next run sees them again.
		res, err := eng.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: csub.ID, Member: "peek", Max: 100000})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range res.Deliveries {
			if childAcked[pos{d.Partition, d.Offset}] {
				t.Fatalf("iteration %d: %d:%d redelivered to group consumer after an acknowledged ack", it, d.Partition, d.Offset)
			}
		}
		if _, err := eng.DeliveriesRelease(ctx, &storage.DeliveriesReleaseParams{SubscriptionID: csub.ID, Member: "peek"}); err != nil {
			t.Fatal(err)
		}
		return
	}
	consumed := map[pos]bool{}
	for p := range childGot {
		consumed[p] = true
	}
	drain(t, ctx, eng, csub.ID, "drain", func(d *storage.Delivery) {
		p := pos{d.Partition, d.Offset}
		if childAcked[p] {
			t.Fatalf("%d:%d redelivered to group consumer after an acknowledged ack", d.Partition, d.Offset)
		}
		consumed[p] = true
	})
	for payload, p := range published {
		if !consumed[p] {
			t.Fatalf("acknowledged publish %s (%v) never delivered to group consumer", payload, p)
		}
	}
}

// drain claims the deliveries of subscription sub as member, passes each to check and acks them,
// until a claim returns nothing.
func drain(t *testing.T, ctx context.Context, eng storage.Engine, sub int64, member string, check func(d *storage.Delivery)) {
	t.Helper()
	for {
		res, err := eng.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: sub, Member: member, Max: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Deliveries) == 0 {
			return
		}
		refs := make([]storage.DeliveryRef, 0, len(res.Deliveries))
		for _, d := range res.Deliveries {
			check(d)
			refs = append(refs, d.Ref())
		}
		if _, err := eng.DeliveriesAck(ctx, &storage.DeliveriesAckParams{SubscriptionID: sub, Member: member, Refs: refs}); err != nil {
			t.Fatal(err)
		}
	}
}
