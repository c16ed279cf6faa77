package record_test

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal/record"
)

// samples are messages whose encodings seed the fuzz corpus and the edge-case tests.
func samples() []*storage.Message {
	return []*storage.Message{
		{},
		{Payload: []byte("hello-world")},
		{Key: []byte("order-42"), Payload: []byte(`{"id":42}`), ProducerID: "p-1"},
		{Key: []byte("user-7"), Payload: []byte("in a run"), Linked: true},
		{
			Key:        []byte{0, 1, 2},
			Headers:    map[string]string{"trace": "abc", "content-type": "application/json", "": "empty name"},
			Payload:    bytes.Repeat([]byte{0xAB}, 300),
			ProducerID: "producer-7",
			NotBefore:  time.Date(2025, 3, 4, 5, 6, 7, 8, time.UTC),
			ExpiresAt:  time.Date(2262, 1, 1, 0, 0, 0, 999_999_999, time.UTC),
		},
		{ExpiresAt: time.Unix(0, 0)},                                  // the epoch is not the zero time
		{NotBefore: time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC)},         // before 1970
		{NotBefore: time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)}, // beyond UnixNano's range
	}
}

// equal compares the fields a record body carries. Times compare with Equal; nil and empty
// slices and maps are the same.
func equal(a, b *storage.Message) bool {
	return bytes.Equal(a.Key, b.Key) && bytes.Equal(a.Payload, b.Payload) && a.ProducerID == b.ProducerID &&
		a.NotBefore.Equal(b.NotBefore) && a.ExpiresAt.Equal(b.ExpiresAt) && maps.Equal(a.Headers, b.Headers) &&
		a.Linked == b.Linked
}

func describe(m *storage.Message) string {
	return fmt.Sprintf("{key %x producer %q nb %v exp %v headers %v payload %d bytes linked %v}",
		m.Key, m.ProducerID, m.NotBefore, m.ExpiresAt, m.Headers, len(m.Payload), m.Linked)
}

func TestRoundTripSamples(t *testing.T) {
	t.Parallel()
	for i, m := range samples() {
		b := record.AppendMessage([]byte("prefix"), m)
		if string(b[:6]) != "prefix" {
			t.Fatalf("sample %d: AppendMessage clobbered dst", i)
		}
		b = b[6:]
		if len(b) != record.Size(m) {
			t.Errorf("sample %d: Size = %d, encoding has %d bytes", i, record.Size(m), len(b))
		}
		got := storage.Message{Topic: "kept", Offset: 9}
		if err := record.DecodeMessage(b, &got); err != nil {
			t.Fatalf("sample %d: %v", i, err)
		}
		if !equal(&got, m) {
			t.Fatalf("sample %d: got %s, want %s", i, describe(&got), describe(m))
		}
		if got.Topic != "kept" || got.Offset != 9 {
			t.Fatalf("sample %d: DecodeMessage changed fields it does not own", i)
		}
	}
}

// randomMessage makes a message with every field sometimes empty and sometimes not.
func randomMessage(rng *rand.Rand) *storage.Message {
	randBytes := func(max int) []byte {
		if rng.IntN(4) == 0 {
			return nil
		}
		b := make([]byte, rng.IntN(max+1))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	randTime := func() time.Time {
		switch rng.IntN(4) {
		case 0:
			return time.Time{}
		case 1:
			return time.Unix(rng.Int64N(1<<40)-1<<39, rng.Int64N(1e9))
		case 2:
			return time.Date(1+rng.IntN(9999), time.Month(1+rng.IntN(12)), 1+rng.IntN(28), rng.IntN(24), 0, 0, rng.IntN(1e9), time.UTC)
		default:
			return time.Now()
		}
	}
	m := &storage.Message{
		Key:        randBytes(40),
		Payload:    randBytes(2000),
		ProducerID: string(randBytes(20)),
		NotBefore:  randTime(),
		ExpiresAt:  randTime(),
	}
	if n := rng.IntN(25); n > 0 && rng.IntN(3) > 0 {
		m.Headers = make(map[string]string, n)
		for range n {
			m.Headers[string(randBytes(12))] = string(randBytes(30))
		}
	}
	return m
}

var seedFlag = flag.Uint64("seed", 0, "seed of TestRoundTripRandom (0: from the clock)")

// TestRoundTripRandom is the property decode(encode(x)) == x over random messages.
func TestRoundTripRandom(t *testing.T) {
	t.Parallel()
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -seed %d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	var buf []byte
	for i := range 5000 {
		m := randomMessage(rng)
		buf = record.AppendMessage(buf[:0], m)
		var got storage.Message
		if err := record.DecodeMessage(buf, &got); err != nil {
			t.Fatalf("message %d (seed %d): %v", i, seed, err)
		}
		if !equal(&got, m) {
			t.Fatalf("message %d (seed %d): got %s, want %s", i, seed, describe(&got), describe(m))
		}
		// One encoding per message: re-encoding the decoded message gives the same bytes.
		if again := record.AppendMessage(nil, &got); !bytes.Equal(again, buf) {
			t.Fatalf("message %d (seed %d): re-encoding differs", i, seed)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	t.Parallel()
	valid := record.AppendMessage(nil, samples()[3])
	cases := map[string][]byte{
		"empty":             {},
		"type only":         {record.TypeMessageV1},
		"unknown type":      append([]byte{0x02}, valid[1:]...),
		"unknown flag":      append([]byte{record.TypeMessageV1, 0x80}, valid[2:]...),
		"trailing garbage":  append(append([]byte(nil), valid...), 0),
		"huge key length":   {record.TypeMessageV1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"varint overflow":   {record.TypeMessageV1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"huge header count": {record.TypeMessageV1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0},
		"unsorted headers":  {record.TypeMessageV1, 0, 0, 0, 2, 1, 'b', 0, 1, 'a', 0, 0},
		"duplicate header":  {record.TypeMessageV1, 0, 0, 0, 2, 1, 'a', 0, 1, 'a', 0, 0},
		"nanos too large":   {record.TypeMessageV1, 1, 0, 0, 2, 0x80, 0x94, 0xeb, 0xdc, 0x03, 0, 0},
		"flagged zero time": append([]byte{record.TypeMessageV1, 1, 0, 0},
			append(appendVarint(-62135596800), 0, 0, 0)...),
	}
	// Every proper prefix of a valid encoding is malformed.
	for n := range len(valid) {
		cases[fmt.Sprintf("prefix %d", n)] = valid[:n]
	}
	for name, b := range cases {
		var m storage.Message
		err := record.DecodeMessage(b, &m)
		if !errors.Is(err, storage.ErrCorrupt) {
			t.Errorf("%s: error = %v, want ErrCorrupt", name, err)
		}
	}
}

func appendVarint(v int64) []byte {
	u := uint64(v<<1) ^ uint64(v>>63)
	var b []byte
	for u >= 0x80 {
		b = append(b, byte(u)|0x80)
		u >>= 7
	}
	return append(b, byte(u))
}

// TestDecodedSlicesAlias documents that Key and Payload alias the input and that appending to
// them does not write into it.
func TestDecodedSlicesAlias(t *testing.T) {
	t.Parallel()
	b := record.AppendMessage(nil, &storage.Message{Key: []byte("k"), Payload: []byte("payload"), ProducerID: "p"})
	var m storage.Message
	if err := record.DecodeMessage(b, &m); err != nil {
		t.Fatal(err)
	}
	before := append([]byte(nil), b...)
	_ = append(m.Key, 'X')
	if !bytes.Equal(b, before) {
		t.Fatal("appending to the decoded key wrote into the input")
	}
	b[len(b)-1] = '!'
	if string(m.Payload) != "payloa!" {
		t.Fatalf("payload %q does not alias the input", m.Payload)
	}
}

func TestAppendMessageAllocs(t *testing.T) {
	m := samples()[3]
	buf := make([]byte, 0, 4096)
	allocs := testing.AllocsPerRun(100, func() { buf = record.AppendMessage(buf[:0], m) })
	if allocs != 0 {
		t.Fatalf("AppendMessage into a large enough buffer allocates %.0f times", allocs)
	}
}

// FuzzDecodeMessage: no panic on any input; whatever decodes re-encodes to a body that decodes
// to the same message; decoding never needs more memory than the input bounds.
func FuzzDecodeMessage(f *testing.F) {
	for _, m := range samples() {
		f.Add(record.AppendMessage(nil, m))
	}
	f.Add([]byte{record.TypeMessageV1, 3, 0, 0})
	f.Add([]byte(strings.Repeat("\x01", 40)))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m storage.Message
		if err := record.DecodeMessage(b, &m); err != nil {
			if !errors.Is(err, storage.ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		again := record.AppendMessage(nil, &m)
		if !bytes.Equal(again, b) {
			t.Fatalf("a decodable input is not the canonical encoding of its message:\n in  %x\n out %x", b, again)
		}
		var m2 storage.Message
		if err := record.DecodeMessage(again, &m2); err != nil || !equal(&m, &m2) {
			t.Fatalf("re-encoded message does not decode the same: %v", err)
		}
	})
}

func BenchmarkAppendMessage_1KiB(b *testing.B) {
	m := &storage.Message{Key: []byte("order-42"), Payload: make([]byte, 1024), Headers: map[string]string{"trace": "abc"}}
	buf := make([]byte, 0, 2048)
	b.SetBytes(int64(record.Size(m)))
	b.ReportAllocs()
	for b.Loop() {
		buf = record.AppendMessage(buf[:0], m)
	}
}

func BenchmarkDecodeMessage_1KiB(b *testing.B) {
	m := &storage.Message{Key: []byte("order-42"), Payload: make([]byte, 1024), Headers: map[string]string{"trace": "abc"}}
	buf := record.AppendMessage(nil, m)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	var out storage.Message
	for b.Loop() {
		if err := record.DecodeMessage(buf, &out); err != nil {
			b.Fatal(err)
		}
	}
}
