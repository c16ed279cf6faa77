package protocol

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"time"
	"unicode/utf8"
)

// Primitive encodings of the wire format (docs/protocol.md section 3). All integers are
// big-endian. Part of the wire contract: never change.
//
//	u8 u16 u32 i32 i64   fixed size, big-endian, two's complement for signed
//	bool                 u8: 0 or 1; any other value is malformed
//	string               u32 byte length, then that many bytes of UTF-8
//	bytes                u32 byte length, then that many bytes
//	time                 i64 nanoseconds since the Unix epoch, UTC; 0 means "not set"
//	duration             u32 milliseconds
//	headers              u32 count, then count pairs of (string key, string value); keys unique
//	array of T           u32 count, then count T

// Minimum encoded sizes, used to bound a count by the bytes that remain before allocating.
const (
	sizeString = 4
	sizeHeader = 2 * sizeString
)

// maxDurationMillis is the largest duration the wire can carry (about 49.7 days).
const maxDurationMillis = math.MaxUint32

// MaxDuration is the largest duration the wire format can carry: 2^32-1 milliseconds, about 49.7
// days.
const MaxDuration = time.Duration(maxDurationMillis) * time.Millisecond

var (
	minWireTime = time.Unix(0, math.MinInt64)
	maxWireTime = time.Unix(0, math.MaxInt64)
)

// enc appends one message body and remembers the first error. Encode methods create it with
// newEnc and return e.done().
type enc struct {
	b   []byte
	n0  int // len(b) at start, to roll back on error
	op  Opcode
	err error
}

func newEnc(dst []byte, op Opcode) enc { return enc{b: dst, n0: len(dst), op: op} }

// done returns the appended buffer, or the original one and the error.
func (e *enc) done() ([]byte, error) {
	if e.err != nil {
		return e.b[:e.n0], e.err
	}
	return e.b, nil
}

func (e *enc) fail(field, format string, args ...any) {
	if e.err == nil {
		e.err = fmt.Errorf("%w: protocol: encode %s: %s: %s", ErrInvalidArgument, e.op, field, fmt.Sprintf(format, args...))
	}
}

func (e *enc) u8(v uint8)   { e.b = append(e.b, v) }
func (e *enc) u16(v uint16) { e.b = binary.BigEndian.AppendUint16(e.b, v) }
func (e *enc) u32(v uint32) { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *enc) i32(v int32)  { e.b = binary.BigEndian.AppendUint32(e.b, uint32(v)) }
func (e *enc) i64(v int64)  { e.b = binary.BigEndian.AppendUint64(e.b, uint64(v)) }

func (e *enc) boolean(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}

func (e *enc) length(field string, n int) {
	if uint64(n) > math.MaxUint32 {
		e.fail(field, "length %d does not fit in u32", n)
		return
	}
	e.u32(uint32(n))
}

func (e *enc) str(field, s string) {
	if !utf8.ValidString(s) {
		e.fail(field, "string is not valid UTF-8")
		return
	}
	e.length(field, len(s))
	e.b = append(e.b, s...)
}

func (e *enc) bytes(field string, p []byte) {
	e.length(field, len(p))
	e.b = append(e.b, p...)
}

func (e *enc) time(field string, t time.Time) {
	if t.IsZero() {
		e.i64(0)
		return
	}
	if t.Before(minWireTime) || t.After(maxWireTime) {
		e.fail(field, "time %s is outside the range of int64 nanoseconds (years 1678-2262)", t)
		return
	}
	n := t.UnixNano()
	if n == 0 {
		e.fail(field, "the Unix epoch itself cannot be sent: 0 means \"not set\"")
		return
	}
	e.i64(n)
}

// duration encodes d in milliseconds, rounded up so that a positive duration stays positive.
func (e *enc) duration(field string, d time.Duration) {
	if d < 0 {
		e.fail(field, "duration %s is negative", d)
		return
	}
	ms := (int64(d) + int64(time.Millisecond) - 1) / int64(time.Millisecond)
	if ms > maxDurationMillis {
		e.fail(field, "duration %s exceeds the wire maximum %s", d, MaxDuration)
		return
	}
	e.u32(uint32(ms))
}

// headers encodes a string map with its keys in ascending byte order, so that equal maps always
// encode to equal bytes.
func (e *enc) headers(field string, h map[string]string) {
	e.length(field, len(h))
	if len(h) == 0 {
		return
	}
	var arr [16]string
	keys := arr[:0]
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		e.str(field, k)
		e.str(field, h[k])
	}
}

// dec decodes one message body. Every read checks the bytes that remain; the first failure is kept
// and later reads return zero values, so decoders read straight through and check d.finish().
type dec struct {
	b   []byte
	off int
	op  Opcode
	err *DecodeError
}

func newDec(src []byte, op Opcode) dec { return dec{b: src, op: op} }

func (d *dec) fail(field, format string, args ...any) {
	if d.err == nil {
		d.err = &DecodeError{Opcode: d.op, Field: field, Offset: d.off, Reason: fmt.Sprintf(format, args...), Err: ErrMalformedFrame}
	}
}

func (d *dec) remaining() int { return len(d.b) - d.off }

// need reports whether n more bytes are available, failing otherwise.
func (d *dec) need(field string, n int) bool {
	if d.err != nil {
		return false
	}
	if n > d.remaining() {
		d.fail(field, "needs %d bytes, %d left", n, d.remaining())
		return false
	}
	return true
}

func (d *dec) u8(field string) uint8 {
	if !d.need(field, 1) {
		return 0
	}
	v := d.b[d.off]
	d.off++
	return v
}

func (d *dec) u16(field string) uint16 {
	if !d.need(field, 2) {
		return 0
	}
	v := binary.BigEndian.Uint16(d.b[d.off:])
	d.off += 2
	return v
}

func (d *dec) u32(field string) uint32 {
	if !d.need(field, 4) {
		return 0
	}
	v := binary.BigEndian.Uint32(d.b[d.off:])
	d.off += 4
	return v
}

func (d *dec) i32(field string) int32 { return int32(d.u32(field)) }

func (d *dec) i64(field string) int64 {
	if !d.need(field, 8) {
		return 0
	}
	v := binary.BigEndian.Uint64(d.b[d.off:])
	d.off += 8
	return int64(v)
}

func (d *dec) boolean(field string) bool {
	at := d.off
	switch v := d.u8(field); v {
	case 0:
		return false
	case 1:
		return true
	default:
		d.off = at
		d.fail(field, "bool must be 0 or 1, got %d", v)
		return false
	}
}

// length reads a u32 byte length and checks that many bytes follow.
func (d *dec) length(field string) int {
	at := d.off
	n := d.u32(field)
	if d.err != nil {
		return 0
	}
	if uint64(n) > uint64(d.remaining()) {
		d.off = at
		d.fail(field, "length %d exceeds the %d bytes left", n, d.remaining()-4)
		return 0
	}
	return int(n)
}

func (d *dec) str(field string) string {
	at := d.off
	n := d.length(field)
	if d.err != nil || n == 0 {
		return ""
	}
	p := d.b[d.off : d.off+n]
	if !utf8.Valid(p) {
		d.off = at
		d.fail(field, "string is not valid UTF-8")
		return ""
	}
	d.off += n
	return string(p)
}

// bytes returns a slice of the source (no copy), capped so that appending to it cannot overwrite
// the bytes that follow. An empty value decodes to nil.
func (d *dec) bytes(field string) []byte {
	n := d.length(field)
	if d.err != nil || n == 0 {
		return nil
	}
	p := d.b[d.off : d.off+n : d.off+n]
	d.off += n
	return p
}

// batch reads the count of a Publish, PublishOK or Deliver: like count, and at most MaxBatch.
func (d *dec) batch(field string, minSize int) int {
	at := d.off
	n := d.count(field, minSize)
	if n > MaxBatch {
		d.off = at
		d.fail(field, "count %d exceeds the protocol limit of %d per frame", n, MaxBatch)
		return 0
	}
	return n
}

// batch writes the count of a Publish, PublishOK or Deliver, at most MaxBatch.
func (e *enc) batch(field string, n int) {
	if n > MaxBatch {
		e.fail(field, "%d entries exceed the protocol limit of %d per frame", n, MaxBatch)
		return
	}
	e.length(field, n)
}

// count reads an array or map count and checks that count elements of at least minSize bytes
// each fit in the bytes that remain, before anything is allocated for them.
func (d *dec) count(field string, minSize int) int {
	at := d.off
	n := d.u32(field)
	if d.err != nil {
		return 0
	}
	if uint64(n)*uint64(minSize) > uint64(d.remaining()) {
		d.off = at
		d.fail(field, "count %d needs at least %d bytes, %d left", n, uint64(n)*uint64(minSize), d.remaining()-4)
		return 0
	}
	return int(n)
}

func (d *dec) time(field string) time.Time {
	n := d.i64(field)
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func (d *dec) duration(field string) time.Duration {
	return time.Duration(d.u32(field)) * time.Millisecond
}

// headers decodes a string map; duplicate keys are malformed. An empty map decodes to nil.
func (d *dec) headers(field string) map[string]string {
	n := d.count(field, sizeHeader)
	if n == 0 {
		return nil
	}
	h := make(map[string]string, n)
	for range n {
		at := d.off
		k := d.str(field)
		v := d.str(field)
		if d.err != nil {
			return nil
		}
		if _, dup := h[k]; dup {
			d.off = at
			d.fail(field, "duplicate key %q", k)
			return nil
		}
		h[k] = v
	}
	return h
}

// finish returns the first error, or a malformed error if bytes are left over.
func (d *dec) finish() error {
	if d.err == nil && d.off != len(d.b) {
		d.fail("body", "%d trailing bytes", len(d.b)-d.off)
	}
	if d.err != nil {
		return d.err
	}
	return nil
}
