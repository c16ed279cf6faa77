package protocol

import (
	"bytes"
	"errors"
	"testing"
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
	_, m, err = NewReader(&buf, 0).ReadClientMessage()
	if err != nil || m.(*Subscribe).Filter != "region=eu" {
		t.Fatalf("version 3 round trip: %+v, %v", m, err)
	}
}
