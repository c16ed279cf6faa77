package protocol

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// goldenFrames returns the frames of testdata/*.golden, the fuzz seeds (STYLE.md C14).
func goldenFrames(f *testing.F) [][]byte {
	f.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "*.golden"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no golden files (%v)", err)
	}
	var frames [][]byte
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		frames = append(frames, b)
	}
	return frames
}

// checkDecoded asserts what every successfully decoded message must satisfy: it encodes without
// error, and decoding that encoding gives an equal value whose encoding is the same bytes.
func checkDecoded(t *testing.T, m Message) {
	t.Helper()
	body, err := m.Encode(nil)
	if err != nil {
		t.Fatalf("%s decoded but does not encode: %v", m.Opcode(), err)
	}
	again, err := newMessage(m.Opcode())
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Decode(body); err != nil {
		t.Fatalf("%s: decode(encode(x)) failed: %v", m.Opcode(), err)
	}
	if !reflect.DeepEqual(again, m) {
		t.Fatalf("%s: decode(encode(x)) != x\n got %#v\nwant %#v", m.Opcode(), again, m)
	}
	body2, err := again.Encode(nil)
	if err != nil || !bytes.Equal(body, body2) {
		t.Fatalf("%s: unstable encoding (%v)", m.Opcode(), err)
	}
}

// checkDecodedVersion is checkDecoded in the layout of version v: a message decoded in it
// encodes in it and decodes back to itself.
func checkDecodedVersion(t *testing.T, m Message, v uint16) {
	t.Helper()
	frame, err := AppendFrameVersion(nil, 1, m, v)
	if err != nil {
		t.Fatalf("%s decoded in version %d but does not encode in it: %v", m.Opcode(), v, err)
	}
	again, err := newMessage(m.Opcode())
	if err != nil {
		t.Fatal(err)
	}
	if vm, ok := again.(versioned); ok {
		err = vm.decodeVersion(frame[HeaderSize:], v)
	} else {
		err = again.Decode(frame[HeaderSize:])
	}
	if err != nil {
		t.Fatalf("%s: version %d decode(encode(x)) failed: %v", m.Opcode(), v, err)
	}
	if !reflect.DeepEqual(again, m) {
		t.Fatalf("%s: version %d decode(encode(x)) != x\n got %#v\nwant %#v", m.Opcode(), v, again, m)
	}
}

// FuzzFrameDecode feeds bytes to a Reader, as a connection would, and decodes every frame it
// yields with the decoders of both directions: no panic, no allocation past the frame (the
// reader's max frame size bounds it), and every decoded message round-trips.
func FuzzFrameDecode(f *testing.F) {
	frames := goldenFrames(f)
	var all []byte
	for _, fr := range frames {
		f.Add(fr)
		all = append(all, fr...)
		f.Add(fr[:len(fr)/2])
	}
	f.Add(all)
	f.Add(append(append([]byte(nil), Preamble[:]...), frames[0]...))
	f.Fuzz(func(t *testing.T, data []byte) {
		rd := NewReader(bytes.NewReader(data), 1<<20)
		for range 64 {
			fr, err := rd.ReadFrame()
			if err != nil {
				return
			}
			if fr.Size() > rd.MaxFrameSize() {
				t.Fatalf("frame of %d bytes passed the max %d", fr.Size(), rd.MaxFrameSize())
			}
			if m, err := DecodeClient(fr); err == nil {
				checkDecoded(t, m)
			}
			if m, err := DecodeServer(fr); err == nil {
				checkDecoded(t, m)
			}
			// Each side decodes in the negotiated version's layout, any of the range.
			for v := MinVersion; v <= MaxVersion; v++ {
				if m, err := DecodeClientVersion(fr, v); err == nil {
					checkDecodedVersion(t, m, v)
				}
				if m, err := DecodeServerVersion(fr, v); err == nil {
					checkDecodedVersion(t, m, v)
				}
			}
		}
	})
}

// FuzzMessageDecode fuzzes the body decoders directly (the opcode is the first two bytes), which
// reaches deep into bodies faster than going through frame lengths.
func FuzzMessageDecode(f *testing.F) {
	for _, fr := range goldenFrames(f) {
		f.Add(append(append([]byte(nil), fr[4:6]...), fr[HeaderSize:]...))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		m, err := newMessage(Opcode(binary.BigEndian.Uint16(data)))
		if err != nil {
			return
		}
		if err := m.Decode(data[2:]); err != nil {
			return
		}
		checkDecoded(t, m)
	})
}
