package protocol

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// TestSubscribeFilterVersions: Subscribe's filter exists from version 3. A version-2 session
// encodes and decodes the version-2 layout (no filter field); a filter cannot be sent to a
// version-2 peer; the two layouts do not decode as each other.
func TestSubscribeFilterVersions(t *testing.T) {
	plain := &Subscribe{Topic: "orders", Group: "g", MaxInFlight: 5}
	v2, err := appendFrame(nil, 7, plain, Version2)
	if err != nil {
		t.Fatal(err)
	}
	v3, err := appendFrame(nil, 7, plain, Version3)
	if err != nil {
		t.Fatal(err)
	}
	// Version 3 adds an empty string (a u32 length 0) at the end.
	if len(v3) != len(v2)+4 || !bytes.Equal(v3[HeaderSize:len(v2)], v2[HeaderSize:]) {
		t.Fatalf("version 3 layout is not version 2's plus the filter:\n%x\n%x", v2, v3)
	}

	r := NewReader(bytes.NewReader(v2), 0)
	r.SetVersion(Version2)
	_, m, err := r.ReadClientMessage()
	if err != nil {
		t.Fatalf("version-2 reader: %v", err)
	}
	if got := m.(*Subscribe); *got != *plain {
		t.Fatalf("decoded %+v, want %+v", got, plain)
	}
	if _, _, err := NewReader(bytes.NewReader(v2), 0).ReadClientMessage(); !errors.Is(err, ErrMalformedFrame) {
		t.Fatalf("version-2 body read as version 3: %v, want MALFORMED_FRAME", err)
	}
	r = NewReader(bytes.NewReader(v3), 0)
	r.SetVersion(Version2)
	if _, _, err := r.ReadClientMessage(); !errors.Is(err, ErrMalformedFrame) {
		t.Fatalf("version-3 body read as version 2: %v, want MALFORMED_FRAME (trailing bytes)", err)
	}

	var buf bytes.Buffer
	w := NewWriter(&buf, 0)
	w.SetVersion(Version2)
	filtered := &Subscribe{Topic: "orders", Filter: "region=eu"}
	if err := w.WriteMessage(1, filtered); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("filter for a version-2 peer: %v, want an encoding error", err)
	}
	if w.Buffered() != 0 {
		t.Fatalf("a refused message left %d bytes buffered", w.Buffered())
	}
	w.SetVersion(Version3)
	if err := w.WriteMessage(1, filtered); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	r = NewReader(&buf, 0)
	r.SetVersion(Version3)
	_, m, err = r.ReadClientMessage()
	if err != nil || m.(*Subscribe).Filter != "region=eu" {
		t.Fatalf("version 3 round trip: %+v, %v", m, err)
	}
}

// TestBatchFieldsVersions: Subscribe.batch_size and the deliveries' batch fields exist from
// version 4. Earlier layouts are unchanged and refuse to encode a batch; a version-4 delivery
// outside its batch, or with a batch too long, does not decode.
func TestBatchFieldsVersions(t *testing.T) {
	plain := &Subscribe{Topic: "orders", Group: "g", Mode: GroupOrdered, MaxInFlight: 5}
	v3, err := appendFrame(nil, 7, plain, Version3)
	if err != nil {
		t.Fatal(err)
	}
	v4, err := appendFrame(nil, 7, plain, Version4)
	if err != nil {
		t.Fatal(err)
	}
	if len(v4) != len(v3)+4 || !bytes.Equal(v4[HeaderSize:len(v3)], v3[HeaderSize:]) {
		t.Fatalf("version 4 Subscribe is not version 3's plus batch_size:\n%x\n%x", v3, v4)
	}
	for _, v := range []uint16{Version2, Version3} {
		if _, err := appendFrame(nil, 7, &Subscribe{Topic: "orders", Mode: GroupOrdered, BatchSize: 10}, v); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("batch_size for a version-%d peer: %v, want an encoding error", v, err)
		}
	}

	d := Delivery{Handle: 1, SubscriptionID: 2, Topic: "orders", Partitions: 1, Offset: 12, Attempt: 1, LeaseDeadline: t2, PublishTime: t1}
	old, err := appendFrame(nil, 0, &Deliver{Deliveries: []Delivery{d}}, Version3)
	if err != nil {
		t.Fatal(err)
	}
	r := NewReader(bytes.NewReader(old), 0)
	r.SetVersion(Version3)
	if _, m, err := r.ReadServerMessage(); err != nil || !reflect.DeepEqual(m.(*Deliver).Deliveries[0], d) {
		t.Fatalf("version-3 Deliver round trip: %+v, %v", m, err)
	}
	// A client decodes a pushed frame in the negotiated layout: MaxVersion's would read batch
	// fields a version-3 broker never sends.
	if m, err := DecodeServerVersion(Frame{Opcode: OpDeliver, Body: old[HeaderSize:]}, Version3); err != nil || !reflect.DeepEqual(m.(*Deliver).Deliveries[0], d) {
		t.Fatalf("DecodeServerVersion of a version-3 Deliver: %+v, %v", m, err)
	}
	if _, err := DecodeServer(Frame{Opcode: OpDeliver, Body: old[HeaderSize:]}); !errors.Is(err, ErrMalformedFrame) {
		t.Fatalf("DecodeServer (version %d) of a version-3 Deliver: %v, want a decode error", MaxVersion, err)
	}
	batched := d
	batched.BatchLen, batched.BatchOffset = 3, 10
	if _, err := appendFrame(nil, 0, &Deliver{Deliveries: []Delivery{batched}}, Version3); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a batch delivery for a version-3 peer: %v, want an encoding error", err)
	}
	f, err := appendFrame(nil, 0, &Deliver{Deliveries: []Delivery{batched}}, Version4)
	if err != nil {
		t.Fatal(err)
	}
	if _, m, err := NewReader(bytes.NewReader(f), 0).ReadServerMessage(); err != nil || !reflect.DeepEqual(m.(*Deliver).Deliveries[0], batched) {
		t.Fatalf("version-4 Deliver round trip: %+v, %v", m, err)
	}
	if got := (&Deliver{Deliveries: []Delivery{batched}}); len(f) != DeliverOverhead+got.Deliveries[0].EncodedLen() {
		t.Fatalf("frame of %d bytes, EncodedLen says %d", len(f), DeliverOverhead+got.Deliveries[0].EncodedLen())
	}
	for _, bad := range []struct {
		len uint32
		off int64
	}{{3, 13}, {3, 9}, {MaxBatchLen + 1, 12}, {0, 5}, {2, -1}} {
		x := d
		x.BatchLen, x.BatchOffset = bad.len, bad.off
		if _, err := appendFrame(nil, 0, &Deliver{Deliveries: []Delivery{x}}, Version4); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("encode batch_len %d batch_offset %d for offset 12: %v, want an encoding error", bad.len, bad.off, err)
		}
		// The same bytes forged: the decoder refuses them.
		body := bytes.Clone(f[HeaderSize:])
		binary.BigEndian.PutUint32(body[len(body)-12:], bad.len)
		binary.BigEndian.PutUint64(body[len(body)-8:], uint64(bad.off))
		if bad.len == 0 {
			continue // a 0 length has no offset field: covered by the encoder
		}
		if err := new(Deliver).Decode(body); !errors.Is(err, ErrMalformedFrame) {
			t.Fatalf("decode batch_len %d batch_offset %d for offset 12: %v, want MALFORMED_FRAME", bad.len, bad.off, err)
		}
	}
}

// TestSubscribeRejoinVersions: Subscribe.rejoin exists from version 5, at the end of version 4's
// layout; a rejoin cannot be sent to an older peer.
func TestSubscribeRejoinVersions(t *testing.T) {
	plain := &Subscribe{Topic: "orders", Group: "g", MaxInFlight: 5}
	v4, err := appendFrame(nil, 7, plain, Version4)
	if err != nil {
		t.Fatal(err)
	}
	rejoin := &Subscribe{Topic: "orders", Group: "g", MaxInFlight: 5, Rejoin: 42}
	v5, err := appendFrame(nil, 7, rejoin, Version5)
	if err != nil {
		t.Fatal(err)
	}
	if len(v5) != len(v4)+8 || !bytes.Equal(v5[HeaderSize:len(v4)], v4[HeaderSize:]) ||
		binary.BigEndian.Uint64(v5[len(v4):]) != 42 {
		t.Fatalf("version 5 Subscribe is not version 4's plus rejoin:\n%x\n%x", v4, v5)
	}
	for _, v := range []uint16{Version2, Version3, Version4} {
		if _, err := appendFrame(nil, 7, rejoin, v); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("rejoin for a version-%d peer: %v, want an encoding error", v, err)
		}
	}
	r := NewReader(bytes.NewReader(v4), 0)
	r.SetVersion(Version4)
	if _, m, err := r.ReadClientMessage(); err != nil || *m.(*Subscribe) != *plain {
		t.Fatalf("version-4 round trip: %+v, %v", m, err)
	}
	if _, m, err := NewReader(bytes.NewReader(v5), 0).ReadClientMessage(); err != nil || *m.(*Subscribe) != *rejoin {
		t.Fatalf("version-5 round trip: %+v, %v", m, err)
	}
	if _, _, err := NewReader(bytes.NewReader(v4), 0).ReadClientMessage(); !errors.Is(err, ErrMalformedFrame) {
		t.Fatalf("version-4 body read as version 5: %v, want MALFORMED_FRAME", err)
	}
}

// TestPublishDelayVersions: PublishMessage.delay exists from version 6, at the end of each
// message of version 5's layout; version 5's bytes are unchanged (testdata/02_publish_v5.frame is
// the version-5 golden of the publish sample) and a delay cannot be sent to an older peer.
func TestPublishDelayVersions(t *testing.T) {
	var plain *Publish
	for _, s := range samples() {
		if s.name == "publish" {
			plain = s.msg.(*Publish)
		}
	}
	v5, err := appendFrame(nil, 2, plain, Version5)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join("testdata", "02_publish_v5.frame"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(v5, want) {
		t.Fatalf("the version-5 encoding of Publish changed:\n%s\nwant:\n%s", hex.Dump(v5), hex.Dump(want))
	}

	one := &Publish{Topic: "orders", Messages: []PublishMessage{{Partition: PartitionAuto, Payload: []byte("x"), TTL: time.Minute}}}
	old, err := appendFrame(nil, 2, one, Version5)
	if err != nil {
		t.Fatal(err)
	}
	delayed := &Publish{Topic: "orders", Messages: []PublishMessage{{Partition: PartitionAuto, Payload: []byte("x"), TTL: time.Minute, Delay: 1500 * time.Millisecond}}}
	v6, err := appendFrame(nil, 2, delayed, Version6)
	if err != nil {
		t.Fatal(err)
	}
	if len(v6) != len(old)+4 || !bytes.Equal(v6[HeaderSize:len(old)], old[HeaderSize:]) ||
		binary.BigEndian.Uint32(v6[len(old):]) != 1500 {
		t.Fatalf("version 6 Publish is not version 5's plus delay (ms):\n%x\n%x", old, v6)
	}
	for _, v := range []uint16{Version2, Version3, Version4, Version5} {
		if _, err := appendFrame(nil, 2, delayed, v); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("a delay for a version-%d peer: %v, want an encoding error", v, err)
		}
	}
	for _, d := range []time.Duration{-time.Second, MaxDuration + time.Millisecond} {
		bad := &Publish{Topic: "orders", Messages: []PublishMessage{{Payload: []byte("x"), Delay: d}}}
		if _, err := appendFrame(nil, 2, bad, Version6); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("delay %s: %v, want an encoding error", d, err)
		}
	}

	r := NewReader(bytes.NewReader(old), 0)
	r.SetVersion(Version5)
	if _, m, err := r.ReadClientMessage(); err != nil || !reflect.DeepEqual(m, one) {
		t.Fatalf("version-5 round trip: %+v, %v", m, err)
	}
	if _, m, err := NewReader(bytes.NewReader(v6), 0).ReadClientMessage(); err != nil || !reflect.DeepEqual(m, delayed) {
		t.Fatalf("version-6 round trip: %+v, %v", m, err)
	}
	if _, _, err := NewReader(bytes.NewReader(old), 0).ReadClientMessage(); !errors.Is(err, ErrMalformedFrame) {
		t.Fatalf("version-5 body read as version 6: %v, want MALFORMED_FRAME", err)
	}
	if got := delayed.Messages[0].EncodedLen(); len(v6) != HeaderSize+4+len("orders")+4+got {
		t.Fatalf("frame of %d bytes, EncodedLen says %d", len(v6), got)
	}
}
