package protocol

import (
	"bytes"
	"fmt"
	"testing"
	"time"
)

func benchDeliver(size, batch int) *Deliver {
	d := &Deliver{Deliveries: make([]Delivery, batch)}
	for i := range d.Deliveries {
		d.Deliveries[i] = Delivery{Handle: 1, SubscriptionID: 7, Topic: "orders.eu.created", Partition: 3,
			Offset: int64(1000 + i), Attempt: 1, LeaseDeadline: t2, PublishTime: t1, Key: []byte("customer-42"),
			Headers: map[string]string{"content-type": "application/json"}, Payload: bytes.Repeat([]byte("x"), size)}
	}
	return d
}

func benchPublish(size, batch int) *Publish {
	p := &Publish{Topic: "orders.eu.created", Messages: make([]PublishMessage, batch)}
	for i := range p.Messages {
		p.Messages[i] = PublishMessage{Partition: PartitionAuto, Key: []byte("customer-42"),
			Headers: map[string]string{"content-type": "application/json"}, Payload: bytes.Repeat([]byte("x"), size), TTL: time.Hour}
	}
	return p
}

func BenchmarkEncode(b *testing.B) {
	for _, size := range []int{100, 1024} {
		for _, batch := range []int{1, 64} {
			for _, m := range []Message{benchPublish(size, batch), benchDeliver(size, batch)} {
				b.Run(fmt.Sprintf("%s_%dB_Batch%d", m.Opcode(), size, batch), func(b *testing.B) {
					buf, _ := AppendFrame(nil, 1, m)
					b.SetBytes(int64(len(buf)))
					b.ReportAllocs()
					for b.Loop() {
						buf, _ = AppendFrame(buf[:0], 1, m)
					}
				})
			}
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, size := range []int{100, 1024} {
		for _, batch := range []int{1, 64} {
			for _, m := range []Message{benchPublish(size, batch), benchDeliver(size, batch)} {
				b.Run(fmt.Sprintf("%s_%dB_Batch%d", m.Opcode(), size, batch), func(b *testing.B) {
					body, _ := m.Encode(nil)
					out, _ := newMessage(m.Opcode())
					b.SetBytes(int64(len(body)))
					b.ReportAllocs()
					for b.Loop() {
						if err := out.Decode(body); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}

// BenchmarkReadFrame measures the reader over a stream of Ack frames (the most frequent request).
func BenchmarkReadFrame(b *testing.B) {
	var stream []byte
	for range 1024 {
		stream, _ = AppendFrame(stream, 1, &Ack{Refs: []Ref{{SubscriptionID: 7, Offset: 1}}})
	}
	b.SetBytes(int64(len(stream) / 1024))
	b.ReportAllocs()
	r := bytes.NewReader(stream)
	rd := NewReader(r, 0)
	for b.Loop() {
		if _, err := rd.ReadFrame(); err != nil {
			r.Reset(stream)
			rd = NewReader(r, 0)
		}
	}
}
