package record

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Part of the on-disk format; never change.
const (
	// TypeMessageV1 is the first byte of a version-1 message record body.
	TypeMessageV1 byte = 0x01

	flagNotBefore byte = 1 << 0
	flagExpiresAt byte = 1 << 1
	flagLinked    byte = 1 << 2 // storage.Message.Linked; no field
	knownFlags         = flagNotBefore | flagExpiresAt | flagLinked
)

// Size returns the number of bytes AppendMessage appends for m.
func Size(m *storage.Message) int {
	n := 2 + lenBytes(len(m.Key)) + lenBytes(len(m.ProducerID)) + uvarintLen(uint64(len(m.Headers))) + lenBytes(len(m.Payload))
	if !m.NotBefore.IsZero() {
		n += timeLen(m.NotBefore)
	}
	if !m.ExpiresAt.IsZero() {
		n += timeLen(m.ExpiresAt)
	}
	for k, v := range m.Headers {
		n += lenBytes(len(k)) + lenBytes(len(v))
	}
	return n
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func lenBytes(n int) int { return uvarintLen(uint64(n)) + n }

func timeLen(t time.Time) int {
	s := t.Unix()
	return uvarintLen(uint64(s<<1)^uint64(s>>63)) + uvarintLen(uint64(t.Nanosecond()))
}

// AppendMessage appends the record body of m to dst and returns the extended slice. It uses the
// key, headers, payload, producer id, not-before and expiry of m; the topic, partition, offset and
// PublishedAt are stored by the log, not in the body. Header names are written sorted.
func AppendMessage(dst []byte, m *storage.Message) []byte {
	dst = slices.Grow(dst, Size(m))
	var flags byte
	if !m.NotBefore.IsZero() {
		flags |= flagNotBefore
	}
	if !m.ExpiresAt.IsZero() {
		flags |= flagExpiresAt
	}
	if m.Linked {
		flags |= flagLinked
	}
	dst = append(dst, TypeMessageV1, flags)
	dst = appendBytes(dst, m.Key)
	dst = appendString(dst, m.ProducerID)
	if flags&flagNotBefore != 0 {
		dst = appendTime(dst, m.NotBefore)
	}
	if flags&flagExpiresAt != 0 {
		dst = appendTime(dst, m.ExpiresAt)
	}
	dst = binary.AppendUvarint(dst, uint64(len(m.Headers)))
	if len(m.Headers) > 0 {
		var arr [16]string
		names := arr[:0]
		for k := range m.Headers {
			names = append(names, k)
		}
		slices.Sort(names)
		for _, k := range names {
			dst = appendString(dst, k)
			dst = appendString(dst, m.Headers[k])
		}
	}
	return appendBytes(dst, m.Payload)
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendTime(dst []byte, t time.Time) []byte {
	dst = binary.AppendVarint(dst, t.Unix())
	return binary.AppendUvarint(dst, uint64(t.Nanosecond()))
}

// decoder reads a body front to back; the first error sticks.
type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: message record at byte %d: %s", storage.ErrCorrupt, d.off, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.off:])
	if n <= 0 || n != uvarintLen(v) {
		d.fail("bad %s varint", what)
		return 0
	}
	d.off += n
	return v
}

// bytes returns the next length-prefixed field, aliasing the input.
func (d *decoder) bytes(what string) []byte {
	n := d.uvarint(what + " length")
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)-d.off) {
		d.fail("%s length %d exceeds the %d bytes left", what, n, len(d.b)-d.off)
		return nil
	}
	end := d.off + int(n)
	b := d.b[d.off:end:end]
	d.off = end
	if n == 0 {
		return nil
	}
	return b
}

func (d *decoder) time(what string) time.Time {
	if d.err != nil {
		return time.Time{}
	}
	sec, n := binary.Varint(d.b[d.off:])
	if n <= 0 || n != uvarintLen(uint64(sec<<1)^uint64(sec>>63)) {
		d.fail("bad %s seconds varint", what)
		return time.Time{}
	}
	d.off += n
	ns := d.uvarint(what + " nanoseconds")
	if d.err != nil {
		return time.Time{}
	}
	if ns >= uint64(time.Second) {
		d.fail("%s nanoseconds %d out of range", what, ns)
		return time.Time{}
	}
	t := time.Unix(sec, int64(ns)).UTC()
	if t.Unix() != sec || t.IsZero() {
		d.fail("%s seconds %d out of range", what, sec)
		return time.Time{}
	}
	return t
}

// DecodeMessage decodes a record body made by AppendMessage into m. It accepts only the one
// encoding AppendMessage makes of a message (minimal varints, sorted headers). It sets Key, Headers,
// Payload, ProducerID, NotBefore, ExpiresAt and Linked and leaves the other fields alone. Key and Payload
// alias body. Malformed input returns an error wrapping storage.ErrCorrupt; m is then partly
// set.
func DecodeMessage(body []byte, m *storage.Message) error {
	d := decoder{b: body}
	if len(body) < 2 {
		d.fail("short record body (%d bytes)", len(body))
		return d.err
	}
	if body[0] != TypeMessageV1 {
		d.fail("unknown record type %#x", body[0])
		return d.err
	}
	flags := body[1]
	d.off = 2
	if flags&^knownFlags != 0 {
		d.fail("unknown flags %#x", flags)
		return d.err
	}
	m.Linked = flags&flagLinked != 0
	m.Key = d.bytes("key")
	m.ProducerID = string(d.bytes("producer id"))
	m.NotBefore, m.ExpiresAt = time.Time{}, time.Time{}
	if flags&flagNotBefore != 0 {
		m.NotBefore = d.time("not_before")
	}
	if flags&flagExpiresAt != 0 {
		m.ExpiresAt = d.time("expires_at")
	}
	count := d.uvarint("header count")
	m.Headers = nil
	if d.err == nil && count > 0 {
		// Each header takes at least 2 bytes: this bounds the map by the input.
		if count > uint64(len(d.b)-d.off)/2 {
			d.fail("header count %d exceeds what %d bytes can hold", count, len(d.b)-d.off)
			return d.err
		}
		m.Headers = make(map[string]string, min(count, 64))
		var prev []byte
		for i := uint64(0); i < count && d.err == nil; i++ {
			name := d.bytes("header name")
			value := d.bytes("header value")
			if d.err == nil && i > 0 && bytes.Compare(prev, name) >= 0 {
				d.fail("header names not sorted and unique at %q", name)
			}
			prev = name
			m.Headers[string(name)] = string(value)
		}
	}
	m.Payload = d.bytes("payload")
	if d.err == nil && d.off != len(d.b) {
		d.fail("%d trailing bytes", len(d.b)-d.off)
	}
	return d.err
}

// ProducerID returns the producer id of a record body (empty if it has none), reading only the
// fields before it: what the embedded engine's de-duplication table is rebuilt from at Open. The
// result aliases body. It checks only what it reads; DecodeMessage checks the whole record.
func ProducerID(body []byte) ([]byte, error) {
	d := decoder{b: body}
	if len(body) < 2 {
		d.fail("short record body (%d bytes)", len(body))
		return nil, d.err
	}
	if body[0] != TypeMessageV1 {
		d.fail("unknown record type %#x", body[0])
		return nil, d.err
	}
	d.off = 2
	d.bytes("key")
	id := d.bytes("producer id")
	return id, d.err
}
