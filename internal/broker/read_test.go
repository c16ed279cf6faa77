package broker

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// TestReadMessages: ReadMessages pages through a partition by offset and from a publish time
// (the first message at or after it, by binary search), returns nothing past the end, refuses bad
// bounds, and changes no delivery state: a group's pending, lag and cursor are the same after
// any number of reads, and its member then receives every message at its first attempt.
func TestReadMessages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.createTopic("read", storage.TopicConfig{Semantics: storage.PubSub})
	if _, err := e.engine.SubscriptionCreate(e.ctx(), &storage.SubscriptionCreateParams{Topic: "read", Group: "g",
		Start: storage.StartPosition{Kind: storage.FromBeginning}}); err != nil {
		t.Fatal(err)
	}
	start := e.clock.Now()
	const n = 37
	for i := range n { // message i is published at start + i seconds
		e.publishN("read", fmt.Sprintf("m%d", i), 1)
		e.clock.Advance(time.Second)
	}
	before, err := e.b.Group(e.ctx(), "read", "g")
	if err != nil {
		t.Fatal(err)
	}
	offsets := func(ms []*storage.Message) []int64 {
		var out []int64
		for _, m := range ms {
			out = append(out, m.Offset)
		}
		return out
	}
	read := func(p ReadParams) []*storage.Message {
		t.Helper()
		p.Topic = "read"
		ms, err := e.b.ReadMessages(e.ctx(), p)
		if err != nil {
			t.Fatalf("ReadMessages(%+v): %v", p, err)
		}
		return ms
	}
	// Paging by offset.
	var all []int64
	for off := int64(0); ; {
		ms := read(ReadParams{Offset: off, Limit: 10})
		if len(ms) == 0 {
			break
		}
		all = append(all, offsets(ms)...)
		off = ms[len(ms)-1].Offset + 1
	}
	if len(all) != n || all[0] != 0 || all[n-1] != n-1 {
		t.Fatalf("paging read offsets %v", all)
	}
	if ms := read(ReadParams{}); len(ms) != n || string(ms[5].Payload) != "m5-0" {
		t.Fatalf("default read: %d messages", len(ms))
	}
	// From a time: exactly on a publish time, between two, before the first, after the last.
	for _, c := range []struct {
		at   time.Time
		want int64 // first offset; -1: nothing
	}{
		{start.Add(20 * time.Second), 20},
		{start.Add(20*time.Second + time.Millisecond), 21},
		{start.Add(-time.Hour), 0},
		{start.Add(time.Duration(n-1) * time.Second), n - 1},
		{start.Add(time.Hour), -1},
	} {
		ms := read(ReadParams{Time: c.at, Limit: 1})
		switch {
		case c.want < 0 && len(ms) != 0:
			t.Errorf("read from %s: %v, want nothing", c.at, offsets(ms))
		case c.want >= 0 && (len(ms) != 1 || ms[0].Offset != c.want):
			t.Errorf("read from %s: %v, want offset %d", c.at, offsets(ms), c.want)
		}
	}
	if ms := read(ReadParams{Offset: n + 5}); len(ms) != 0 {
		t.Fatalf("read past the end: %v", offsets(ms))
	}
	for _, p := range []ReadParams{{Topic: "read", Limit: MaxReadLimit + 1}, {Topic: "read", Offset: -1},
		{Topic: "read", Partition: 1}, {Topic: "read", Partition: -1}, {Topic: "read..x"}} {
		if _, err := e.b.ReadMessages(e.ctx(), p); !errors.Is(err, storage.ErrInvalidArgument) {
			t.Errorf("ReadMessages(%+v): %v, want INVALID_ARGUMENT", p, err)
		}
	}
	if _, err := e.b.ReadMessages(e.ctx(), ReadParams{Topic: "nope"}); !errors.Is(err, storage.ErrTopicNotFound) {
		t.Errorf("read of an unknown topic: %v", err)
	}
	// No delivery state changed.
	after, err := e.b.Group(e.ctx(), "read", "g")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(after.Stats, before.Stats) || after.Stats.Pending != n || after.Stats.Lag != n {
		t.Fatalf("group stats after reads %+v, before %+v (want pending and lag %d)", *after.Stats, *before.Stats, n)
	}
	m := e.subscribe(SubscribeParams{Pattern: "read", Group: "g", MaxInFlight: n})
	for i, d := range recv(t, m, n) {
		if d.Attempt != 1 || d.Message.Offset != int64(i) {
			t.Fatalf("delivery %d: offset %d attempt %d", i, d.Message.Offset, d.Attempt)
		}
	}
}
