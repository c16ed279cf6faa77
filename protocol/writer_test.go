package protocol

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"
)

func newPeekedReader(r io.Reader) *bufio.Reader { return bufio.NewReaderSize(r, ReadBufferSize) }

func TestWriterRoundTrip(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	w := NewWriter(&out, 0)
	if err := w.WritePreamble(); err != nil {
		t.Fatal(err)
	}
	for _, s := range samples() {
		if err := w.WriteMessage(s.corr, s.msg); err != nil {
			t.Fatal(err)
		}
	}
	if w.Buffered() == 0 {
		t.Fatal("small frames should stay buffered until Flush")
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if w.Buffered() != 0 {
		t.Fatal("Flush left bytes buffered")
	}
	if !bytes.Equal(out.Bytes(), stream(t)) {
		t.Fatal("Writer output differs from AppendFrame")
	}
	readAll(t, &out)
}

func TestWriterFrameTooLarge(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	w := NewWriter(&out, MinMaxFrameSize)
	big := &Publish{Topic: "t", Messages: []PublishMessage{{Payload: make([]byte, MinMaxFrameSize)}}}
	err := w.WriteMessage(9, big)
	var tl *FrameTooLargeError
	if !errors.As(err, &tl) || tl.CorrelationID != 9 || tl.Max != MinMaxFrameSize {
		t.Fatalf("want *FrameTooLargeError, got %v", err)
	}
	if w.Buffered() != 0 {
		t.Fatal("a rejected frame must not stay buffered")
	}
	// Not sticky: the writer goes on.
	if err := w.WriteMessage(10, &Credit{Handle: 1}); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteMessage(11, &Nack{Delay: -1}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("want ErrInvalidArgument, got %v", err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	corr, m, err := NewReader(&out, 0).ReadClientMessage()
	if err != nil || corr != 10 || m.Opcode() != OpCredit {
		t.Fatalf("got %d %v %v", corr, m, err)
	}
}

// Large frames are written out without waiting for Flush, and the big buffer is not kept.
func TestWriterFlushesLargeFrames(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	w := NewWriter(&out, 0)
	big := &Deliver{Deliveries: []Delivery{{Topic: "t", Payload: make([]byte, 2<<20)}}}
	if err := w.WriteMessage(0, big); err != nil {
		t.Fatal(err)
	}
	if w.Buffered() != 0 || out.Len() == 0 {
		t.Fatalf("buffered %d, written %d", w.Buffered(), out.Len())
	}
	if cap(w.buf) > writeKeepCap {
		t.Fatalf("kept a %d-byte buffer", cap(w.buf))
	}
}

type failingWriter struct{ n int }

func (f *failingWriter) Write(p []byte) (int, error) {
	f.n++
	return 0, errors.New("broken pipe")
}

func TestWriterErrorIsSticky(t *testing.T) {
	t.Parallel()
	fw := &failingWriter{}
	w := NewWriter(fw, 0)
	_ = w.WriteMessage(1, &Credit{})
	err := w.Flush()
	if err == nil {
		t.Fatal("want an error")
	}
	if err2 := w.WriteMessage(2, &Credit{}); err2 != err {
		t.Fatalf("not sticky: %v", err2)
	}
	if err2 := w.Flush(); err2 != err || fw.n != 1 {
		t.Fatalf("not sticky: %v after %d writes", err2, fw.n)
	}
}

type shortWriter struct{}

func (shortWriter) Write(p []byte) (int, error) { return len(p) / 2, nil }

func TestWriterShortWrite(t *testing.T) {
	t.Parallel()
	w := NewWriter(shortWriter{}, 0)
	_ = w.WriteMessage(1, &Credit{})
	if err := w.Flush(); !errors.Is(err, io.ErrShortWrite) {
		t.Fatalf("want io.ErrShortWrite, got %v", err)
	}
}
