package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

func wantMalformed(t *testing.T, m Message, body []byte, reason string) {
	t.Helper()
	err := m.Decode(body)
	var de *DecodeError
	if !errors.Is(err, ErrMalformedFrame) || !errors.As(err, &de) {
		t.Fatalf("want a *DecodeError wrapping ErrMalformedFrame, got %v", err)
	}
	if de.Opcode != m.Opcode() {
		t.Fatalf("DecodeError.Opcode = %s, want %s", de.Opcode, m.Opcode())
	}
	if reason != "" && !strings.Contains(err.Error(), reason) {
		t.Fatalf("error %q does not mention %q", err, reason)
	}
}

// M1-4: every strict prefix of every body is rejected, and so is every body with a trailing byte.
func TestDecodeTruncatedAndTrailing(t *testing.T) {
	t.Parallel()
	for _, s := range samples() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			body, err := s.msg.Encode(nil)
			if err != nil {
				t.Fatal(err)
			}
			m, _ := newMessage(s.msg.Opcode())
			for n := range len(body) {
				wantMalformed(t, m, body[:n], "")
			}
			wantMalformed(t, m, append(body, 0), "trailing")
		})
	}
}

func u32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// Hostile counts and lengths are rejected from the bytes that remain, before allocating.
func TestDecodeHostileCounts(t *testing.T) {
	// Not parallel: it measures the bytes allocated by the process.
	huge := u32(1_000_000_000)
	cases := []struct {
		name string
		msg  Message
		body []byte
	}{
		{"publish message count", new(Publish), cat(u32(1), []byte("t"), huge, make([]byte, 12))},
		{"publish header count", new(Publish), cat(u32(1), []byte("t"), u32(1), u32(0xffffffff), u32(0), huge, make([]byte, 20))},
		{"publish payload length", new(Publish), cat(u32(1), []byte("t"), u32(1), u32(0xffffffff), u32(0), u32(0), u32(0xfffffff0), make([]byte, 20))},
		{"topic length", new(Publish), cat(u32(0xffffffff), []byte("t"))},
		{"deliveries", new(Deliver), cat(huge, make([]byte, 16))},
		{"refs", new(Ack), cat(huge, make([]byte, 16))},
		{"not held", new(NackOK), cat(u32(0), u32(0), huge)},
		{"subscriptions", new(SubscribeOK), cat(u32(1), u32(0), huge)},
		{"positions", new(PublishOK), cat(huge)},
		{"properties", new(Hello), cat(make([]byte, 4), u32(0), u32(0), u32(0), huge, make([]byte, 20))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			err := c.msg.Decode(c.body)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrMalformedFrame) {
				t.Fatalf("want ErrMalformedFrame, got %v", err)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<10 {
				t.Fatalf("allocated %d bytes for a %d-byte body", alloc, len(c.body))
			}
		})
	}
}

func TestDecodeInvalidValues(t *testing.T) {
	t.Parallel()
	str := func(s string) []byte { return append(u32(uint32(len(s))), s...) }
	t.Run("invalid utf8", func(t *testing.T) {
		t.Parallel()
		wantMalformed(t, new(Publish), cat(str("a\xffb"), u32(0)), "UTF-8")
	})
	t.Run("bool", func(t *testing.T) {
		t.Parallel()
		wantMalformed(t, new(Nack), cat(u32(0), []byte{2}, str(""), u32(0)), "bool")
	})
	t.Run("duplicate header", func(t *testing.T) {
		t.Parallel()
		wantMalformed(t, new(Hello), cat(make([]byte, 4), str(""), str(""), u32(0), u32(2), str("k"), str("1"), str("k"), str("2")), "duplicate")
	})
	t.Run("start kind", func(t *testing.T) {
		t.Parallel()
		wantMalformed(t, new(Subscribe), cat(str("t"), str(""), str(""), []byte{0}, u32(0), u32(0), []byte{4}, make([]byte, 8), str("")), "start kind")
	})
	t.Run("group mode", func(t *testing.T) {
		t.Parallel()
		wantMalformed(t, new(Subscribe), cat(str("t"), str(""), str(""), []byte{2}, u32(0), u32(0), []byte{0}, make([]byte, 8), str("")), "group mode")
	})
	t.Run("goodbye ok body", func(t *testing.T) {
		t.Parallel()
		wantMalformed(t, new(GoodbyeOK), []byte{0}, "trailing")
	})
}

// Headers in any order decode (encoders sort them, decoders do not insist).
func TestDecodeUnsortedHeaders(t *testing.T) {
	t.Parallel()
	str := func(s string) []byte { return append(u32(uint32(len(s))), s...) }
	body := cat(make([]byte, 4), str(""), str(""), u32(0), u32(2), str("z"), str("1"), str("a"), str("2"))
	var m Hello
	if err := m.Decode(body); err != nil {
		t.Fatal(err)
	}
	if m.Properties["z"] != "1" || m.Properties["a"] != "2" {
		t.Fatalf("got %v", m.Properties)
	}
}

// shortKey returns the i-th shortest ASCII string: all 128 one-byte strings, then two-byte ones...
func shortKey(i int) string {
	length, n := 1, 128
	for i >= n {
		i -= n
		length++
		n *= 128
	}
	b := make([]byte, length)
	for j := range b {
		b[j] = byte(i % 128)
		i /= 128
	}
	return string(b)
}

// Decoded byte slices alias the body but cannot be appended over their neighbours.
func TestDecodeBytesAreCapped(t *testing.T) {
	t.Parallel()
	body, _ := (&Publish{Topic: "t", Messages: []PublishMessage{{Key: []byte("k"), Payload: []byte("p")}}}).Encode(nil)
	var m Publish
	if err := m.Decode(body); err != nil {
		t.Fatal(err)
	}
	k := m.Messages[0].Key
	if cap(k) != len(k) {
		t.Fatalf("key cap %d, len %d", cap(k), len(k))
	}
	_ = append(k, 'X')
	if string(m.Messages[0].Payload) != "p" {
		t.Fatal("appending to the key overwrote the body")
	}
}

// Decoding never allocates more than 8 times the body plus 512 bytes per batch entry (MaxBatch
// bounds the entries), whatever the content. Worst cases are many tiny elements: each costs a Go
// struct or map entry larger than its encoding. The figures are logged; docs/protocol.md quotes
// them.
func TestDecodeAmplification(t *testing.T) {
	// Not parallel: it measures the bytes allocated by the process.
	const frame = 1 << 20
	// The shortest distinct keys: every 1-byte key, then 2-byte keys, then 3-byte keys.
	headers := map[string]string{}
	size := 0
	for i := 0; size < frame; i++ {
		k := shortKey(i)
		headers[k] = ""
		size += sizeHeader + len(k)
	}
	oneHeader := make([]PublishMessage, MaxBatch)
	for i := range oneHeader {
		oneHeader[i].Headers = map[string]string{"": ""}
	}
	oneHeaderDeliveries := make([]Delivery, MaxBatch)
	for i := range oneHeaderDeliveries {
		oneHeaderDeliveries[i].Headers = map[string]string{"": ""}
	}
	cases := []struct {
		name    string
		msg     Message
		entries int
	}{
		{"many headers", &Hello{Properties: headers}, 0},
		{"tiny messages", &Publish{Messages: make([]PublishMessage, MaxBatch)}, MaxBatch},
		{"tiny messages, one header", &Publish{Messages: oneHeader}, MaxBatch},
		{"tiny deliveries", &Deliver{Deliveries: make([]Delivery, MaxBatch)}, MaxBatch},
		{"tiny deliveries, one header", &Deliver{Deliveries: oneHeaderDeliveries}, MaxBatch},
		{"refs", &Ack{Refs: make([]Ref, frame/sizeRef)}, 0},
		{"positions", &PublishOK{Positions: make([]Position, MaxBatch)}, MaxBatch},
		{"subscriptions", &SubscribeOK{Subscriptions: make([]SubscriptionInfo, frame/sizeSubscriptionInfo)}, 0},
	}
	for _, c := range cases {
		body, err := c.msg.Encode(nil)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := newMessage(c.msg.Opcode())
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		if err := got.Decode(body); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		alloc := after.TotalAlloc - before.TotalAlloc
		perEntry := ""
		if c.entries > 0 {
			perEntry = fmt.Sprintf(", %d bytes per batch entry", int(alloc)/c.entries)
		}
		t.Logf("%-28s body %8d bytes, decoded %9d bytes (%5.2fx%s)", c.name, len(body), alloc,
			float64(alloc)/float64(len(body)), perEntry)
		if bound := 8*uint64(len(body)) + 512*uint64(c.entries); alloc > bound {
			t.Errorf("%s: decoding allocated %d bytes, above the documented bound %d", c.name, alloc, bound)
		}
	}
}

func TestBatchLimit(t *testing.T) {
	t.Parallel()
	over := &Publish{Topic: "t", Messages: make([]PublishMessage, MaxBatch+1)}
	if _, err := over.Encode(nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("encode: want ErrInvalidArgument, got %v", err)
	}
	body := cat(u32(1), []byte("t"), u32(MaxBatch+1), make([]byte, (MaxBatch+1)*sizePublishMessage))
	wantMalformed(t, new(Publish), body, "limit")
	wantMalformed(t, new(Deliver), cat(u32(MaxBatch+1), make([]byte, (MaxBatch+1)*(sizeDelivery+4))), "limit")
	wantMalformed(t, new(PublishOK), cat(u32(1), u32(MaxBatch+1), make([]byte, (MaxBatch+1)*sizePosition)), "limit")
	ok := &Publish{Topic: "t", Messages: make([]PublishMessage, MaxBatch)}
	b, err := ok.Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := new(Publish).Decode(b); err != nil {
		t.Fatal(err)
	}
}
