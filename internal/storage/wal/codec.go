package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// enc appends the primitive values of the state log and snapshot formats: unsigned and signed
// varints, length-prefixed bytes and strings, times as a presence byte plus signed varint unix
// nanoseconds.
type enc struct{ b []byte }

func (e *enc) u8(v byte)        { e.b = append(e.b, v) }
func (e *enc) uvarint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *enc) varint(v int64)   { e.b = binary.AppendVarint(e.b, v) }
func (e *enc) bytes(v []byte) {
	e.uvarint(uint64(len(v)))
	e.b = append(e.b, v...)
}
func (e *enc) str(v string) {
	e.uvarint(uint64(len(v)))
	e.b = append(e.b, v...)
}
func (e *enc) time(t time.Time) {
	if t.IsZero() {
		e.u8(0)
		return
	}
	e.u8(1)
	e.varint(t.UnixNano())
}

// message encodes a full message (DLQ copies): identity, publish time and content. Header names
// are written in sorted order so equal messages encode to equal bytes.
func (e *enc) message(m *storage.Message) {
	e.str(m.Topic)
	e.varint(int64(m.Partition))
	e.varint(m.Offset)
	e.time(m.PublishedAt)
	e.bytes(m.Key)
	e.uvarint(uint64(len(m.Headers)))
	for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
		e.str(k)
		e.str(m.Headers[k])
	}
	e.bytes(m.Payload)
	e.str(m.ProducerID)
	e.time(m.NotBefore)
	e.time(m.ExpiresAt)
}

// errShort is reported for truncated or malformed encoded data.
var errShort = errors.New("truncated or malformed data")

// dec reads what enc wrote. The first error sticks; every later read returns a zero value.
// Lengths are checked against the remaining input, so corrupt data cannot cause a large
// allocation.
type dec struct {
	b   []byte
	err error
}

func (d *dec) fail() {
	if d.err == nil {
		d.err = errShort
	}
	d.b = nil
}

func (d *dec) u8() byte {
	if len(d.b) < 1 {
		d.fail()
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *dec) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a length that must not exceed the remaining input divided by minSize (the smallest
// encoding of one element).
func (d *dec) count(minSize int) int {
	n := d.uvarint()
	if n > uint64(len(d.b)/max(minSize, 1)) {
		d.fail()
		return 0
	}
	return int(n)
}

func (d *dec) bytes() []byte {
	n := d.count(1)
	if d.err != nil {
		return nil
	}
	if n == 0 {
		return nil
	}
	v := make([]byte, n)
	copy(v, d.b[:n])
	d.b = d.b[n:]
	return v
}

func (d *dec) str() string {
	n := d.count(1)
	if d.err != nil || n == 0 {
		return ""
	}
	v := string(d.b[:n])
	d.b = d.b[n:]
	return v
}

func (d *dec) time() time.Time {
	switch d.u8() {
	case 0:
		return time.Time{}
	case 1:
		return time.Unix(0, d.varint()).UTC()
	}
	d.fail()
	return time.Time{}
}

func (d *dec) message(m *storage.Message) {
	m.Topic = d.str()
	m.Partition = int32(d.varint())
	m.Offset = d.varint()
	m.PublishedAt = d.time()
	m.Key = d.bytes()
	if n := d.count(2); n > 0 {
		m.Headers = make(map[string]string, n)
		for range n {
			k := d.str()
			m.Headers[k] = d.str()
		}
	}
	m.Payload = d.bytes()
	m.ProducerID = d.str()
	m.NotBefore = d.time()
	m.ExpiresAt = d.time()
}

// done reports the sticky error, or trailing bytes.
func (d *dec) done(what string) error {
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return fmt.Errorf("decode %s: %w", what, d.err)
	}
	return nil
}
