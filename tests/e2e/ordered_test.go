package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spoolmq/spool/client"
	"github.com/spoolmq/spool/protocol"
)

// Ordered groups (issue 17 items 3 and 6) against real spool serve processes.

// TestOrderedGroup: a 6-partition topic, three `spool sub --ordered` members, keyed messages; a
// fourth member (the Go client) joins, one sub is SIGKILLed. Every message is delivered, each
// member sees each partition in offset order, the generation grows at each change, and the
// fourth member's ack of a partition it lost is refused STALE_GENERATION.
func TestOrderedGroup(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.start()
	orderedScenario(t, []*broker{b, b, b, b})
}

// TestPGOrderedGroupTwoBrokers is TestOrderedGroup with its members on two broker instances
// sharing one PostgreSQL database: they share one assignment and one generation.
func TestPGOrderedGroupTwoBrokers(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	schema := freshSchema(t, url)
	b0, b1 := newPGBroker(t, url, schema), newPGBroker(t, url, schema)
	b0.start()
	b1.start()
	orderedScenario(t, []*broker{b0, b1, b0, b1})
}

// orderedGroupView is what the scenario reads of GET .../groups/{group}.
type orderedGroupView struct {
	Mode       string             `json:"mode"`
	Generation int64              `json:"generation"`
	Assignment map[string][]int32 `json:"assignment"`
}

// orderedScenario runs the scenario with the three subs on brokers[0..2] and the Go member on
// brokers[3]; the topic is created and read through brokers[0].
func orderedScenario(t *testing.T, brokers []*broker) {
	const topic, group, parts = "ord", "g", 6
	admin := brokers[0]
	admin.createTopic(topic, map[string]any{"semantics": "PUB_SUB", "partitions": parts})
	group3 := func(n int, why string) orderedGroupView {
		t.Helper()
		var g orderedGroupView
		eventually(t, why, func() error {
			g = orderedGroupView{}
			if err := admin.getJSON("/api/v1/topics/"+topic+"/groups/"+group, &g); err != nil {
				return err
			}
			covered := 0
			for _, ps := range g.Assignment {
				covered += len(ps)
			}
			if g.Mode != "ordered" || len(g.Assignment) != n || covered != parts {
				return fmt.Errorf("group %+v, want %d members covering %d partitions", g, n, parts)
			}
			return nil
		})
		return g
	}

	subs := make([]*subProc, 3)
	for i := range subs {
		subs[i] = startSub(t, brokers[i], "--group", group, "--ordered", "--from", "beginning", "--json", topic)
	}
	g1 := group3(3, "three subs assigned")

	pub := admin.dialClient()
	next := 0
	publish := func(n int) {
		t.Helper()
		for range n {
			p := int32(next % parts)
			m := client.Message{Key: fmt.Appendf(nil, "k%d", p), PinPartition: true, Partition: p, Payload: fmt.Appendf(nil, "m-%d", next)}
			if _, err := pub.Publish(ctx(t), topic, m); err != nil {
				t.Fatalf("publish: %v", err)
			}
			next++
		}
	}
	publish(60)
	waitDelivered := func(why string, extra func() map[string]bool) {
		t.Helper()
		eventually(t, why, func() error {
			got := map[string]bool{}
			for _, s := range subs {
				for _, d := range subLines(t, s) {
					got[d.Payload] = true
				}
			}
			for p := range extra() {
				got[p] = true
			}
			for i := range next {
				if p := fmt.Sprintf("m-%d", i); !got[p] {
					return fmt.Errorf("%s not delivered (%d of %d)", p, len(got), next)
				}
			}
			return nil
		})
	}
	none := func() map[string]bool { return nil }
	waitDelivered("first 60 delivered", none)

	// The fourth member, "zz", sorts after the subs' generated ids ("m-..."): with four members
	// round robin gives it partition 3, with three partitions 2 and 5. It holds its first
	// delivery of partition 3 unacked and acks the others.
	var mu sync.Mutex
	zzGot := map[string]bool{}
	var held *client.Delivery
	gotHeld := make(chan struct{})
	zz := brokers[3].dialClient()
	subscribe(t, zz, client.SubscribeParams{Topic: topic, Group: group, Ordered: true},
		func(hctx context.Context, d *client.Delivery) error {
			mu.Lock()
			zzGot[string(d.Payload)] = true
			first := held == nil && d.Partition == 3
			if first {
				held = d
			}
			mu.Unlock()
			if first {
				close(gotHeld)
				return nil
			}
			if err := d.Ack(hctx); err != nil && !errors.Is(err, protocol.ErrStaleGeneration) {
				t.Errorf("zz ack %s: %v", d.Payload, err)
			}
			return nil
		}, client.ManualAck(), client.MemberID("zz"))
	g2 := group3(4, "four members assigned")
	if g2.Generation <= g1.Generation || !slices.Equal(g2.Assignment["zz"], []int32{3}) {
		t.Fatalf("after the join: generation %d (was %d), zz owns %v", g2.Generation, g1.Generation, g2.Assignment["zz"])
	}
	publish(60)
	recvDelivery(t, gotHeld, "zz's first delivery of partition 3")

	// SIGKILL one sub: its connection drops, the group rebalances to three members.
	if err := subs[0].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-subs[0].exited
	g3 := group3(3, "three members after the kill")
	if g3.Generation <= g2.Generation || slices.Contains(g3.Assignment["zz"], 3) {
		t.Fatalf("after the kill: generation %d (was %d), zz owns %v", g3.Generation, g2.Generation, g3.Assignment["zz"])
	}
	// The old owner of partition 3 cannot ack what it held; its new owner gets it.
	if err := held.Ack(ctx(t)); !errors.Is(err, protocol.ErrStaleGeneration) {
		t.Fatalf("zz's ack of partition 3 after losing it: %v, want STALE_GENERATION", err)
	}
	publish(60)
	zzSeen := func() map[string]bool {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]bool{}
		for p := range zzGot {
			if p != string(held.Payload) { // held was never acked: it must reach another member
				out[p] = true
			}
		}
		return out
	}
	waitDelivered("all 180 delivered", zzSeen)
	heldAgain := false
	for _, s := range subs[1:] {
		for _, d := range subLines(t, s) {
			heldAgain = heldAgain || d.Payload == string(held.Payload)
		}
	}
	if !heldAgain {
		t.Fatalf("%s (held by zz when it lost partition 3) never reached another member", held.Payload)
	}
	// Per-partition order: each sub saw each partition's offsets in increasing order (a
	// redelivery after a rebalance may repeat the last one).
	for i, s := range subs {
		last := map[int32]int64{}
		for _, d := range subLines(t, s) {
			if l, ok := last[d.Partition]; ok && d.Offset < l {
				t.Fatalf("sub %d: partition %d offset %d after %d", i, d.Partition, d.Offset, l)
			}
			last[d.Partition] = d.Offset
			if !strings.HasPrefix(d.Key, "k") || d.Key != fmt.Sprintf("k%d", d.Partition) {
				t.Fatalf("sub %d: key %q on partition %d", i, d.Key, d.Partition)
			}
		}
	}
}

// subLine is what the scenario reads of a `spool sub --json` line.
type subLine struct {
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	Key       string `json:"key"`
	Payload   string `json:"payload"`
}

// subLines parses the complete lines a sub printed so far.
func subLines(t *testing.T, s *subProc) []subLine {
	t.Helper()
	out := s.out.String()
	if i := strings.LastIndexByte(out, '\n'); i >= 0 {
		out = out[:i]
	} else {
		return nil
	}
	var ls []subLine
	for line := range strings.SplitSeq(out, "\n") {
		var l subLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("sub printed %q: %v", line, err)
		}
		ls = append(ls, l)
	}
	return ls
}

// TestPGOrderedGroupBrokerKilled: an ordered group with one `spool sub --ordered` member on each
// of two broker instances sharing one PostgreSQL database. The second broker is SIGKILLed: its
// member never leaves, but the broker stops renewing it, so within the member timeout (the
// session timeout, 3 s here) plus a renewal interval the first broker's member owns every
// partition, and every message, also those published to the dead member's partitions after the
// kill, is delivered, each partition in offset order.
func TestPGOrderedGroupBrokerKilled(t *testing.T) {
	t.Parallel()
	const topic, group, parts = "ordk", "g", 4
	const memberTimeout = 3 * time.Second
	url := pgURL(t)
	schema := freshSchema(t, url)
	var brokers [2]*broker
	for i := range brokers {
		brokers[i] = newPGBroker(t, url, schema)
		brokers[i].env = append(brokers[i].env, "SPOOL_SERVER_HEARTBEAT_INTERVAL=1s", "SPOOL_SERVER_SESSION_TIMEOUT="+memberTimeout.String())
		brokers[i].start()
	}
	admin := brokers[0]
	admin.createTopic(topic, map[string]any{"semantics": "PUB_SUB", "partitions": parts})
	view := func(why string, ok func(g orderedGroupView) error) orderedGroupView {
		t.Helper()
		var g orderedGroupView
		eventually(t, why, func() error {
			g = orderedGroupView{}
			if err := admin.getJSON("/api/v1/topics/"+topic+"/groups/"+group, &g); err != nil {
				return err
			}
			covered := 0
			for _, ps := range g.Assignment {
				covered += len(ps)
			}
			if g.Mode != "ordered" || covered != parts {
				return fmt.Errorf("group %+v, want %d partitions covered", g, parts)
			}
			return ok(g)
		})
		return g
	}
	members := func(n int) func(g orderedGroupView) error {
		return func(g orderedGroupView) error {
			if len(g.Assignment) != n {
				return fmt.Errorf("%d members (%v), want %d", len(g.Assignment), g.Assignment, n)
			}
			return nil
		}
	}
	subs := []*subProc{
		startSub(t, brokers[0], "--group", group, "--ordered", "--from", "beginning", "--json", topic),
		startSub(t, brokers[1], "--group", group, "--ordered", "--from", "beginning", "--json", topic),
	}
	g1 := view("two members assigned", members(2))

	pub := admin.dialClient()
	next := 0
	publish := func(n int) {
		t.Helper()
		for range n {
			p := int32(next % parts)
			m := client.Message{Key: fmt.Appendf(nil, "k%d", p), PinPartition: true, Partition: p, Payload: fmt.Appendf(nil, "m-%d", next)}
			if _, err := pub.Publish(ctx(t), topic, m); err != nil {
				t.Fatalf("publish: %v", err)
			}
			next++
		}
	}
	waitDelivered := func(why string) {
		t.Helper()
		eventually(t, why, func() error {
			got := map[string]bool{}
			for _, s := range subs {
				for _, d := range subLines(t, s) {
					got[d.Payload] = true
				}
			}
			for i := range next {
				if p := fmt.Sprintf("m-%d", i); !got[p] {
					return fmt.Errorf("%s not delivered (%d of %d)", p, len(got), next)
				}
			}
			return nil
		})
	}
	publish(40)
	waitDelivered("first 40 delivered")

	// SIGKILL the second broker: its member stays in the assignment until it expires.
	killed := time.Now()
	brokers[1].kill()
	publish(40)
	g2 := view("the first broker's member owns every partition", members(1))
	took := time.Since(killed)
	t.Logf("takeover %s after the kill (member timeout %s), generation %d -> %d", took.Round(time.Millisecond), memberTimeout, g1.Generation, g2.Generation)
	for m := range g2.Assignment {
		if _, ok := g1.Assignment[m]; !ok {
			t.Fatalf("after the kill the assignment lists %q, not a member of %v", m, g1.Assignment)
		}
	}
	// Bound: the timeout, one renewal interval (a third of it) and generous room for a loaded
	// machine; without member liveness the takeover never happens.
	if limit := memberTimeout + memberTimeout/3 + 10*time.Second; took > limit {
		t.Fatalf("takeover took %s, more than %s", took, limit)
	}
	waitDelivered("all 80 delivered")
	for i, s := range subs {
		last := map[int32]int64{}
		for _, d := range subLines(t, s) {
			if l, ok := last[d.Partition]; ok && d.Offset < l {
				t.Fatalf("sub %d: partition %d offset %d after %d", i, d.Partition, d.Offset, l)
			}
			last[d.Partition] = d.Offset
			if d.Key != fmt.Sprintf("k%d", d.Partition) {
				t.Fatalf("sub %d: key %q on partition %d", i, d.Key, d.Partition)
			}
		}
	}
	// The killed broker's log says nothing of it; the survivor's says which members expired.
	if !strings.Contains(admin.logs.String(), "ordered group members expired") {
		t.Fatalf("the surviving broker did not log the expired members:\n%s", admin.logs.String())
	}
}
