package protocol

import (
	"bytes"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current encoders")

func goldenPath(s sample) string {
	return filepath.Join("testdata", fmt.Sprintf("%02x_%s.golden", uint16(s.msg.Opcode()), s.name))
}

func TestSamplesCoverEveryOpcode(t *testing.T) {
	t.Parallel()
	seen := map[Opcode]bool{}
	for _, s := range samples() {
		seen[s.msg.Opcode()] = true
	}
	for op := range opcodeNames {
		if !seen[op] {
			t.Errorf("no sample for %s: add one to samples()", op)
		}
	}
	if n := len(allMessageTypes()); n != len(opcodeNames) {
		t.Errorf("allMessageTypes has %d types, opcodeNames %d", n, len(opcodeNames))
	}
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	for _, s := range samples() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			body, err := s.msg.Encode(nil)
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			got, err := newMessage(s.msg.Opcode())
			if err != nil {
				t.Fatal(err)
			}
			if err := got.Decode(body); err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !reflect.DeepEqual(got, s.msg) {
				t.Fatalf("decode(encode(x)) != x\n got: %#v\nwant: %#v", got, s.msg)
			}
			again, err := got.Encode(nil)
			if err != nil || !bytes.Equal(again, body) {
				t.Fatalf("re-encoding differs (err %v)", err)
			}
		})
	}
}

// Zero values round-trip too, and encode into a non-empty dst appends without touching it.
func TestRoundTripZeroAndAppend(t *testing.T) {
	t.Parallel()
	for _, zero := range allMessageTypes() {
		t.Run(zero.Opcode().String(), func(t *testing.T) {
			t.Parallel()
			prefix := []byte("prefix")
			out, err := zero.Encode(bytes.Clone(prefix))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(out, prefix) {
				t.Fatal("Encode changed dst's existing bytes")
			}
			got, _ := newMessage(zero.Opcode())
			if err := got.Decode(out[len(prefix):]); err != nil {
				t.Fatalf("decode: %v", err)
			}
			want := zero
			if e, ok := zero.(*Error); ok && e.Code == 0 {
				want = &Error{} // code 0 is not in the table: Name stays empty
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got %#v, want %#v", got, want)
			}
		})
	}
}

// Decode replaces the receiver: stale fields of an earlier decode do not survive.
func TestDecodeResetsReceiver(t *testing.T) {
	t.Parallel()
	m := &Publish{Topic: "old", Messages: []PublishMessage{{Payload: []byte("x")}}}
	body, _ := (&Publish{Topic: "new"}).Encode(nil)
	if err := m.Decode(body); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m, &Publish{Topic: "new"}) {
		t.Fatalf("got %#v", m)
	}
	if err := m.Decode([]byte{1}); err == nil {
		t.Fatal("want an error")
	}
	if !reflect.DeepEqual(m, &Publish{}) {
		t.Fatalf("a failed decode must leave the zero value, got %#v", m)
	}
}

// The bytes of every frame type are part of the contract (STYLE.md C11). Regenerate on purpose
// with: go test ./protocol -run TestGolden -update
func TestGolden(t *testing.T) {
	t.Parallel()
	for _, s := range samples() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			frame, err := AppendFrame(nil, s.corr, s.msg)
			if err != nil {
				t.Fatal(err)
			}
			path := goldenPath(s)
			if *update {
				if err := os.WriteFile(path, frame, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run: go test ./protocol -run TestGolden -update)", err)
			}
			if !bytes.Equal(frame, want) {
				t.Fatalf("the encoding of %s changed: this breaks every deployed client.\n"+
					"If the change is intended (a new protocol version), regenerate with: go test ./protocol -run TestGolden -update\n"+
					"got:\n%s\nwant:\n%s", s.name, hex.Dump(frame), hex.Dump(want))
			}
		})
	}
}

// Every golden file belongs to a sample, so a renamed sample does not leave a stale file behind.
func TestGoldenFilesHaveSamples(t *testing.T) {
	t.Parallel()
	want := map[string]bool{}
	for _, s := range samples() {
		want[goldenPath(s)] = true
	}
	files, err := filepath.Glob(filepath.Join("testdata", "*.golden"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !want[f] {
			t.Errorf("%s has no sample; delete it or add the sample", f)
		}
	}
}

// A hand-written frame pins the framing itself, independently of the encoders.
func TestFrameLayout(t *testing.T) {
	t.Parallel()
	frame, err := AppendFrame(nil, 0x01020304, &Unsubscribe{Handle: 0x0a0b0c0d})
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{
		0x00, 0x00, 0x00, 0x0c, // length: 8 header bytes + 4 body bytes
		0x00, 0x04, // opcode Unsubscribe
		0x00, 0x00, // flags
		0x01, 0x02, 0x03, 0x04, // correlation id
		0x0a, 0x0b, 0x0c, 0x0d, // handle
	}
	if !bytes.Equal(frame, want) {
		t.Fatalf("got % x\nwant % x", frame, want)
	}
	if string(Preamble[:]) != "\x00SPL" {
		t.Fatalf("preamble changed: % x", Preamble)
	}
}

func TestEncodeErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		msg   Message
		field string
	}{
		{"invalid utf8", &Publish{Topic: "a\xffb"}, "topic"},
		{"invalid utf8 header", &Publish{Topic: "t", Messages: []PublishMessage{{Headers: map[string]string{"k": "\xc3"}}}}, "messages.headers"},
		{"negative duration", &Nack{Delay: -1}, "delay"},
		{"duration too long", &Extend{Duration: MaxDuration + 1}, "duration"},
		{"epoch", &Heartbeat{Time: ts(0).Add(0)}, ""},
		{"time out of range", &Heartbeat{Time: ts(0).AddDate(500, 0, 0)}, "time"},
		{"start kind", &Subscribe{Start: StartPosition{Kind: 9}}, "start.kind"},
		{"group mode", &Subscribe{Mode: 7}, "mode"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dst := []byte("keep")
			out, err := c.msg.Encode(dst)
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("want ErrInvalidArgument, got %v", err)
			}
			if !strings.Contains(err.Error(), c.field) {
				t.Errorf("error %q does not name field %q", err, c.field)
			}
			if string(out) != "keep" {
				t.Fatalf("dst not restored: %q", out)
			}
		})
	}
}

func TestHeartbeatEpochIsNotSet(t *testing.T) {
	t.Parallel()
	// The zero time.Time encodes as 0 ("not set"); the instant 1970-01-01T00:00:00Z cannot be sent.
	if _, err := (&Heartbeat{}).Encode(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := (&Heartbeat{Time: ts(0)}).Encode(nil); err == nil {
		t.Fatal("the epoch must not encode as 'not set'")
	}
}

func TestDurationRoundsUpToMilliseconds(t *testing.T) {
	t.Parallel()
	body, err := (&Extend{Duration: 1500 * 1000}).Encode(nil) // 1.5 ms
	if err != nil {
		t.Fatal(err)
	}
	var m Extend
	if err := m.Decode(body); err != nil {
		t.Fatal(err)
	}
	if m.Duration.Milliseconds() != 2 {
		t.Fatalf("got %s, want 2ms", m.Duration)
	}
}

func TestHeadersEncodeSorted(t *testing.T) {
	t.Parallel()
	h := map[string]string{}
	for i := range 40 { // more than the 16-key stack array
		h[fmt.Sprintf("k%02d", 39-i)] = "v"
	}
	a, _ := (&Hello{Properties: h}).Encode(nil)
	for range 5 {
		b, _ := (&Hello{Properties: h}).Encode(nil)
		if !bytes.Equal(a, b) {
			t.Fatal("equal maps must encode to equal bytes")
		}
	}
}

func TestDeliveryEncodedLen(t *testing.T) {
	t.Parallel()
	for _, s := range samples() {
		switch m := s.msg.(type) {
		case *Deliver:
			total := 0
			for i := range m.Deliveries {
				total += m.Deliveries[i].EncodedLen()
			}
			frame, _ := AppendFrame(nil, 0, m)
			if len(frame) != DeliverOverhead+total {
				t.Errorf("frame %d bytes, DeliverOverhead+sum(EncodedLen) = %d", len(frame), DeliverOverhead+total)
			}
		case *Publish:
			total := 0
			for i := range m.Messages {
				total += m.Messages[i].EncodedLen()
			}
			body, _ := m.Encode(nil)
			if want := 4 + len(m.Topic) + 4 + total; len(body) != want {
				t.Errorf("publish body %d bytes, want %d", len(body), want)
			}
		}
	}
}

func TestDeliveryRef(t *testing.T) {
	t.Parallel()
	d := Delivery{SubscriptionID: 7, Partition: 2, Offset: 9, Generation: 4}
	if got := d.Ref(); got != (Ref{SubscriptionID: 7, Partition: 2, Offset: 9, Generation: 4}) {
		t.Fatalf("got %+v", got)
	}
}

func TestMessageID(t *testing.T) {
	t.Parallel()
	// The partition count on the wire: 0 is unknown and keeps the partition.
	for _, c := range []struct {
		parts uint32
		id    string
	}{{0, "0:17"}, {1, "17"}, {4, "0:17"}} {
		if got := WireMessageID(c.parts, 0, 17); got != c.id {
			t.Errorf("WireMessageID(%d, 0, 17) = %q, want %q", c.parts, got, c.id)
		}
	}
	for _, c := range []struct {
		parts int
		p     int32
		o     int64
		id    string
	}{{1, 0, 17, "17"}, {4, 0, 17, "0:17"}, {4, 3, 0, "3:0"}} {
		if got := FormatMessageID(c.parts, c.p, c.o); got != c.id {
			t.Errorf("FormatMessageID(%d,%d,%d) = %q, want %q", c.parts, c.p, c.o, got, c.id)
		}
		p, o, err := ParseMessageID(c.id)
		if err != nil || p != c.p || o != c.o {
			t.Errorf("ParseMessageID(%q) = %d, %d, %v", c.id, p, o, err)
		}
	}
	for _, bad := range []string{"", "x", "-1", "1:-2", "1:2:3", ":", "99999999999:1"} {
		if _, _, err := ParseMessageID(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ParseMessageID(%q): want ErrInvalidArgument, got %v", bad, err)
		}
	}
}

func TestStartKindNames(t *testing.T) {
	t.Parallel()
	for k := StartFromNow; k <= StartFromMessageID; k++ {
		got, ok := ParseStartKind(strings.ToLower(k.String()))
		if !ok || got != k {
			t.Errorf("ParseStartKind(%q) = %v, %v", k.String(), got, ok)
		}
	}
	if _, ok := ParseStartKind("FROM_YESTERDAY"); ok {
		t.Error("unknown kind parsed")
	}
}
