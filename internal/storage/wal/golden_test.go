package wal

import (
	"bytes"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/policy"
	"github.com/spoolmq/spool/internal/storage/wal/substate"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestGoldenFormats pins the bytes of every state record type and of a snapshot (STYLE C11): an
// accidental format change fails here. Regenerate with go test -run TestGoldenFormats -update
// only for an intended, versioned change.
func TestGoldenFormats(t *testing.T) {
	t.Parallel()
	at := time.Unix(1700000000, 5).UTC()
	msg := storage.Message{Topic: "a.b", Partition: 1, Offset: 9, Key: []byte("k"), Headers: map[string]string{"h": "v"},
		Payload: []byte("pay"), PublishedAt: at, ProducerID: "pid", ExpiresAt: at.Add(time.Hour)}
	de := &storage.DLQEntry{ID: 2, SubscriptionID: 3, Message: msg, Reason: storage.DLQMaxDeliveries, Attempts: 5, LastError: "lease expired", DeadAt: at}
	cfg := storage.TopicConfig{Partitions: 2}.WithDefaults()
	// The records pin the bytes of a config written before dedup_window existed (JSON metadata
	// gains fields without a format version); TestGoldenDedupWindowDefault checks how it reads.
	cfg.DedupWindow = 0
	sub := storage.Subscription{ID: 3, Topic: "a.b", Group: "g", State: storage.Active, Start: storage.StartPosition{Kind: storage.FromNow}, CreatedAt: at, UpdatedAt: at}
	records := []struct {
		name string
		b    []byte
	}{
		{"marker", []byte{recMarker}},
		{"topic create", encodeJSON(recTopicCreate, &topicCreateRec{Topic: storage.Topic{Name: "a.b", Config: cfg, CreatedAt: at}, Subs: []subRec{{Sub: sub, Starts: []int64{0, 0}}}})},
		{"topic update", encodeJSON(recTopicUpdate, &topicUpdateRec{Name: "a.b", Config: cfg, Renames: []subRename{{ID: 3, Group: "h"}}, At: at})},
		{"topic delete", encodeJSON(recTopicDelete, &topicDeleteRec{Name: "a.b", At: at})},
		{"binding create", encodeJSON(recBindingCreate, &storage.Binding{Group: "g", Pattern: "a.#", CreatedAt: at})},
		{"binding delete", encodeJSON(recBindingDelete, &bindingDeleteRec{Group: "g", Pattern: "a.#"})},
		{"subscription create", encodeJSON(recSubCreate, &subRec{Sub: sub, Starts: []int64{4, 5}})},
		{"subscription update", encodeJSON(recSubUpdate, &subUpdateRec{ID: 3, State: storage.Paused, At: at})},
		{"subscription delete", encodeJSON(recSubDelete, &subDeleteRec{ID: 3, At: at})},
		{"claim", encodeClaim(3, []claimItem{{claimDeliver, 0, 7, 1}, {claimReplayed, 1, 9, 2}, {claimDelay, 0, 8, at.UnixNano()}, {claimComplete, 0, 9, 0}}, []cursorItem{{0, 10}})},
		{"ack", encodeAck(3, []storage.DeliveryRef{{Partition: 0, Offset: 7}, {Partition: 1, Offset: 300}})},
		{"nack", encodeNack(3, []nackItem{{0, 7, at.UnixNano(), false, false}, {1, 9, 0, true, false}})},
		{"dead-letter", encodeDLQ(3, de)},
		{"dlq replay", encodeDLQIDs(recDLQReplay, 3, at.UnixNano(), []int64{2, 4})},
		{"dlq purge", encodeDLQIDs(recDLQPurge, 3, 0, []int64{2})},
		{"retention", encodeRetention([]floorItem{{3, 1, 40}}, []dlqExpiry{{3, []int64{2}}})},
		{"subscription ids", encodeSubIDs(17)},
		{"clean close", []byte{recCleanClose}},
		{"unclean restart", []byte{recUnclean}},
		{"claim horizon", encodeHorizon(3, []horizonItem{{0, 1031}, {1, 1 << 40}})},
		{"failure", encodeFailures(3, []failureItem{{0, 7, false, policy.Failure{Member: "m", Reason: "bad", At: at.UnixNano()}}, {1, 9, true, policy.Failure{Member: "n", At: 1}}})},
		{"dead-letter poison", encodeDLQ(3, &storage.DLQEntry{ID: 5, SubscriptionID: 3, Message: msg, Reason: storage.DLQPoison, Attempts: 2,
			LastError: "bad", DeadAt: at, Rule: storage.RuleSameReason,
			Failures: []storage.DeliveryFailure{{Member: "m", Reason: "bad", At: at}, {Member: "n", Reason: "bad", At: at}}})},
	}
	var out bytes.Buffer
	for _, r := range records {
		fmt.Fprintf(&out, "%s\n%s\n", r.name, hex.EncodeToString(r.b))
	}
	e := bareEngine()
	e.applyTopicCreate(&topicCreateRec{Topic: storage.Topic{Name: "a.b", Config: cfg, CreatedAt: at}, Subs: []subRec{{Sub: sub, Starts: []int64{0, 0}}}})
	e.bindings[bindingKey{"g", "a.#"}] = &storage.Binding{Group: "g", Pattern: "a.#", CreatedAt: at}
	st := e.subs[3].st
	st.Deliver(0, 0, "m", 1)
	st.Deliver(0, 1, "m", 1)
	st.Deliver(0, 2, "m", 1)
	st.Ack(0, 1, 3)
	st.SetHorizon(0, 1027)
	st.SetHorizon(1, 1024)
	st.UncleanRestart() // suspect offsets, attempts 2
	st.Delay(1, 0, at.UnixNano())
	st.DeadLetterAt(1, 5, 2) // DLQ entry 2 (de)
	st.DeadLetterAt(1, 6, 0) // 3
	st.DLQPurge([]int64{3})
	st.DeadLetterAt(1, 7, 0) // 4
	st.DLQPurge([]int64{4})
	st.Replay(1, 7, 4, at.UnixNano())
	st.RestoreFailure(0, 0, false, policy.Failure{Member: "m", Reason: "bad", At: at.UnixNano()}) // version 4
	st.RestoreFailure(1, 7, true, policy.Failure{Member: "n", At: 1})
	fmt.Fprintf(&out, "snapshot\n%s\n", hex.EncodeToString(e.encodeSnapshotLocked(42)))

	path := filepath.Join("testdata", fmt.Sprintf("formats_v%d.golden", snapshotVersion))
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (create it with go test -run TestGoldenFormats -update)", err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("state record or snapshot bytes changed (%s); if intended, bump the format version and regenerate with -update.\ngot:\n%s", path, out.String())
	}
	// And the golden bytes still decode to the same state.
	e2 := bareEngine()
	if _, err := e2.decodeSnapshot(e.encodeSnapshotLocked(42)); err != nil {
		t.Fatal(err)
	}
	if parts, _ := e2.subs[3].st.Export(); len(parts[0].Pending[0].Failures) != 1 || parts[0].Pending[0].Failures[0].Reason != "bad" {
		t.Fatalf("failure history after a snapshot round trip: %+v", parts[0].Pending[0])
	}
	for _, r := range records[1:] {
		if err := e2.applyRecord(r.b); err != nil {
			t.Fatalf("replay %s: %v", r.name, err)
		}
	}
}

// TestGoldenFormatsV1V2: the records of format versions 1 and 2 are still written with the same
// bytes, and their snapshots still load: version 1 (no claim horizon) with horizons at 0 (the
// first claim of each partition then waits for a horizon record); both with their DLQ entries,
// which held the messages, in the DLQ index and noted for the DLQ log (dlqRecover appends them).
func TestGoldenFormatsV1V2(t *testing.T) {
	t.Parallel()
	cur, err := os.ReadFile(filepath.Join("testdata", fmt.Sprintf("formats_v%d.golden", snapshotVersion)))
	if err != nil {
		t.Fatal(err)
	}
	parse := func(b []byte) map[string]string {
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		m := map[string]string{}
		for i := 0; i+1 < len(lines); i += 2 {
			m[lines[i]] = lines[i+1]
		}
		return m
	}
	now := parse(cur)
	for _, version := range []int{1, 2} {
		b, err := os.ReadFile(filepath.Join("testdata", fmt.Sprintf("formats_v%d.golden", version)))
		if err != nil {
			t.Fatal(err)
		}
		old := parse(b)
		for name, hx := range old {
			if name == "snapshot" {
				continue
			}
			if now[name] != hx {
				t.Errorf("record %q: version %d bytes %s, now %s", name, version, hx, now[name])
			}
		}
		snap, err := hex.DecodeString(old["snapshot"])
		if err != nil {
			t.Fatal(err)
		}
		e := bareEngine()
		idx, err := e.decodeSnapshot(snap)
		if err != nil || idx != 42 {
			t.Fatalf("version %d snapshot: index %d, %v", version, idx, err)
		}
		st := e.subs[3].st
		parts, dlq := st.Export()
		if version == 1 {
			for i, ps := range parts {
				if ps.Horizon != 0 || ps.Suspect != 0 {
					t.Errorf("partition %d: horizon %d suspect %d, want 0", i, ps.Horizon, ps.Suspect)
				}
			}
		}
		equal(t, parts[0].Cursor, int64(3), "cursor from the old snapshot")
		if !reflect.DeepEqual(dlq, substate.DLQState{Next: 3, Live: [][2]int64{{2, 3}}}) {
			t.Errorf("version %d: DLQ index %+v", version, dlq)
		}
		if p := e.dlqPend[3]; len(p) != 1 || p[0].ID != 2 || string(p[0].Message.Payload) != "pay" {
			t.Errorf("version %d: DLQ entries for the DLQ log %+v", version, p)
		}
		if !e.dlqMigrated {
			t.Errorf("version %d: no new snapshot asked for", version)
		}
	}
}

// TestGoldenDedupWindowDefault: a topic whose records were written before dedup_window existed (the
// golden topic create record) reads with the default window, and a written window survives a
// replay.
func TestGoldenDedupWindowDefault(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("testdata", fmt.Sprintf("formats_v%d.golden", snapshotVersion)))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var rec []byte
	for i := 0; i+1 < len(lines); i += 2 {
		if lines[i] == "topic create" {
			rec, err = hex.DecodeString(lines[i+1])
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if bytes.Contains(rec, []byte("dedup_window")) {
		t.Fatal("the golden topic create record has a dedup_window")
	}
	e := bareEngine()
	if err := e.applyRecord(rec); err != nil {
		t.Fatal(err)
	}
	if got := cloneTopic(e.topics["a.b"]).Config.DedupWindow; got != storage.DefaultDedupWindow {
		t.Fatalf("dedup_window of an old topic: %s, want the default %s", got, storage.DefaultDedupWindow)
	}
	cfg := storage.TopicConfig{DedupWindow: time.Hour}.WithDefaults()
	e2 := bareEngine()
	if err := e2.applyRecord(encodeJSON(recTopicCreate, &topicCreateRec{Topic: storage.Topic{Name: "c", Config: cfg}})); err != nil {
		t.Fatal(err)
	}
	if got := cloneTopic(e2.topics["c"]).Config.DedupWindow; got != time.Hour {
		t.Fatalf("dedup_window after replay: %s, want 1h", got)
	}
}

// TestGoldenFormatsV3: a version 3 snapshot (no failure histories) still loads, and every
// version 3 record keeps its bytes (the DLQ entry's poison tail is only written when set).
func TestGoldenFormatsV3(t *testing.T) {
	t.Parallel()
	parse := func(version int) map[string]string {
		b, err := os.ReadFile(filepath.Join("testdata", fmt.Sprintf("formats_v%d.golden", version)))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		m := map[string]string{}
		for i := 0; i+1 < len(lines); i += 2 {
			m[lines[i]] = lines[i+1]
		}
		return m
	}
	old, now := parse(3), parse(snapshotVersion)
	for name, hx := range old {
		if name != "snapshot" && now[name] != hx {
			t.Errorf("record %q: version 3 bytes %s, now %s", name, hx, now[name])
		}
	}
	snap, err := hex.DecodeString(old["snapshot"])
	if err != nil {
		t.Fatal(err)
	}
	e := bareEngine()
	if idx, err := e.decodeSnapshot(snap); err != nil || idx != 42 {
		t.Fatalf("version 3 snapshot: index %d, %v", idx, err)
	}
	parts, _ := e.subs[3].st.Export()
	equal(t, parts[0].Cursor, int64(3), "cursor from the version 3 snapshot")
	for _, ps := range parts {
		for _, es := range append(ps.Pending, ps.Replayed...) {
			if len(es.Failures) != 0 {
				t.Errorf("offset %d: failures %v from a version 3 snapshot", es.Offset, es.Failures)
			}
		}
	}
}
