package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"runtime"
	"testing"
	"testing/iotest"
)

// stream returns the preamble followed by the frames of every sample.
func stream(t *testing.T) []byte {
	t.Helper()
	b := append([]byte(nil), Preamble[:]...)
	for _, s := range samples() {
		var err error
		if b, err = AppendFrame(b, s.corr, s.msg); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// readAll reads the preamble and every sample frame from r and checks them.
func readAll(t *testing.T, r io.Reader) {
	t.Helper()
	rd := NewReader(r, 0)
	if err := rd.ReadPreamble(); err != nil {
		t.Fatal(err)
	}
	for _, s := range samples() {
		f, err := rd.ReadFrame()
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if f.Opcode != s.msg.Opcode() || f.CorrelationID != s.corr || f.Flags != 0 {
			t.Fatalf("%s: header %+v", s.name, f)
		}
		m, err := newMessage(f.Opcode)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Decode(f.Body); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if !reflect.DeepEqual(m, s.msg) {
			t.Fatalf("%s: got %#v", s.name, m)
		}
	}
	if _, err := rd.ReadFrame(); err != io.EOF {
		t.Fatalf("after the last frame: want io.EOF, got %v", err)
	}
}

func TestReaderWholeStream(t *testing.T) {
	t.Parallel()
	readAll(t, bytes.NewReader(stream(t)))
}

// M1-5: a frame split over many TCP segments, down to one byte per read, is reassembled.
func TestReaderOneByteDrip(t *testing.T) {
	t.Parallel()
	readAll(t, iotest.OneByteReader(bytes.NewReader(stream(t))))
	readAll(t, iotest.HalfReader(bytes.NewReader(stream(t))))
	readAll(t, iotest.DataErrReader(bytes.NewReader(stream(t))))
}

// blockingAfter serves its data, then fails the test if the reader asks for more: an oversize
// frame must be rejected from its header alone, without reading (or waiting for) its body.
type blockingAfter struct {
	t    *testing.T
	data []byte
}

func (b *blockingAfter) Read(p []byte) (int, error) {
	if len(b.data) == 0 {
		b.t.Error("the reader tried to read the body of an oversize frame")
		return 0, io.ErrNoProgress
	}
	n := copy(p, b.data)
	b.data = b.data[n:]
	return n, nil
}

func header(length uint32, op Opcode, flags uint16, corr uint32) []byte {
	h := make([]byte, HeaderSize)
	binary.BigEndian.PutUint32(h[0:], length)
	binary.BigEndian.PutUint16(h[4:], uint16(op))
	binary.BigEndian.PutUint16(h[6:], flags)
	binary.BigEndian.PutUint32(h[8:], corr)
	return h
}

// M1-6: a frame larger than the max is rejected with a typed error, without allocating or reading
// its body; the error is sticky (the stream is out of sync).
func TestReaderOversizeFrame(t *testing.T) {
	// Not parallel: it measures the bytes allocated by the process.
	rd := NewReader(&blockingAfter{t: t, data: header(0xffff_fff0, OpPublish, 0, 77)}, 0)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := rd.ReadFrame()
	runtime.ReadMemStats(&after)
	var tooLarge *FrameTooLargeError
	if !errors.As(err, &tooLarge) || !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("want *FrameTooLargeError, got %v", err)
	}
	if tooLarge.CorrelationID != 77 || tooLarge.Opcode != OpPublish || tooLarge.Size != 4+0xffff_fff0 || tooLarge.Max != DefaultMaxFrameSize {
		t.Fatalf("error fields %+v", tooLarge)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<10 {
		t.Fatalf("rejecting an oversize frame allocated %d bytes", alloc)
	}
	if _, err2 := rd.ReadFrame(); err2 != err {
		t.Fatalf("error not sticky: %v", err2)
	}
}

func TestReaderFrameSizeBoundary(t *testing.T) {
	t.Parallel()
	const max = 1024
	body := make([]byte, max-HeaderSize)
	ok := append(header(uint32(max-4), OpCredit, 0, 1), body...)
	f, err := NewReader(bytes.NewReader(ok), max).ReadFrame()
	if err != nil || f.Size() != max {
		t.Fatalf("a frame of exactly the max must pass: %v", err)
	}
	tooBig := append(header(uint32(max-3), OpCredit, 0, 1), body...)
	tooBig = append(tooBig, 0)
	if _, err := NewReader(bytes.NewReader(tooBig), max).ReadFrame(); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("max+1: want ErrFrameTooLarge, got %v", err)
	}
	// SetMaxFrameSize applies to the next frame.
	rd := NewReader(bytes.NewReader(tooBig), max)
	rd.SetMaxFrameSize(max + 1)
	if _, err := rd.ReadFrame(); err != nil || rd.MaxFrameSize() != max+1 {
		t.Fatalf("after SetMaxFrameSize: %v", err)
	}
}

// M1-7: a connection that does not start with the preamble is rejected.
func TestReaderBadPreamble(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"PUBLISH x y\n", "\x00SPX", "\x16\x03\x01\x02"} {
		rd := NewReader(bytes.NewReader([]byte(in)), 0)
		err := rd.ReadPreamble()
		var pe *PreambleError
		if !errors.As(err, &pe) || !errors.Is(err, ErrMalformedFrame) {
			t.Fatalf("%q: want *PreambleError, got %v", in, err)
		}
		if _, err := rd.ReadFrame(); !errors.As(err, &pe) {
			t.Fatalf("%q: error not sticky: %v", in, err)
		}
	}
	if err := NewReader(bytes.NewReader([]byte{0, 'S'}), 0).ReadPreamble(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short preamble: want io.ErrUnexpectedEOF, got %v", err)
	}
	if !IsBinary(Preamble[0]) || IsBinary('P') {
		t.Fatal("IsBinary")
	}
}

func TestReaderTruncated(t *testing.T) {
	t.Parallel()
	frame, _ := AppendFrame(nil, 3, &Unsubscribe{Handle: 1})
	for n := 1; n < len(frame); n++ {
		_, err := NewReader(bytes.NewReader(frame[:n]), 0).ReadFrame()
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("frame cut at %d bytes: want io.ErrUnexpectedEOF, got %v", n, err)
		}
	}
	if _, err := NewReader(bytes.NewReader(nil), 0).ReadFrame(); err != io.EOF {
		t.Fatalf("empty stream: want io.EOF, got %v", err)
	}
	readErr := errors.New("connection reset")
	_, err := NewReader(iotest.ErrReader(readErr), 0).ReadFrame()
	if !errors.Is(err, readErr) {
		t.Fatalf("want the source's error, got %v", err)
	}
}

func TestReaderLengthSmallerThanHeader(t *testing.T) {
	t.Parallel()
	_, err := NewReader(bytes.NewReader(header(7, OpAck, 0, 1)), 0).ReadFrame()
	if !errors.Is(err, ErrMalformedFrame) {
		t.Fatalf("want ErrMalformedFrame, got %v", err)
	}
}

// Unknown opcodes, wrong directions and undefined flags are decode errors that keep the stream in
// sync: the next frame is read normally.
func TestReaderDecodeErrorsAreNotSticky(t *testing.T) {
	t.Parallel()
	var b []byte
	b = append(b, header(8+3, 0x7777, 0, 11)...)
	b = append(b, 1, 2, 3)
	b, _ = AppendFrame(b, 12, &Deliver{})
	flagged, _ := AppendFrame(nil, 13, &Unsubscribe{Handle: 1})
	binary.BigEndian.PutUint16(flagged[6:], 0x0001)
	b = append(b, flagged...)
	b = append(b, header(8+1, OpUnsubscribe, 0, 14)...)
	b = append(b, 9)
	b, _ = AppendFrame(b, 15, &Credit{Handle: 2, Additional: 5})

	rd := NewReader(bytes.NewReader(b), 0)
	want := []struct {
		corr uint32
		err  error
	}{{11, ErrUnknownOpcode}, {12, ErrUnexpectedFrame}, {13, ErrMalformedFrame}, {14, ErrMalformedFrame}}
	for _, w := range want {
		corr, m, err := rd.ReadClientMessage()
		var de *DecodeError
		if corr != w.corr || m != nil || !errors.Is(err, w.err) || !errors.As(err, &de) {
			t.Fatalf("corr %d: got corr %d, %v, %v; want %v", w.corr, corr, m, err, w.err)
		}
	}
	corr, m, err := rd.ReadClientMessage()
	if err != nil || corr != 15 || !reflect.DeepEqual(m, &Credit{Handle: 2, Additional: 5}) {
		t.Fatalf("the stream lost sync: %d %v %v", corr, m, err)
	}
}

func TestReadServerMessage(t *testing.T) {
	t.Parallel()
	b, _ := AppendFrame(nil, 4, ErrTopicNotFound.WithMessage("x"))
	b, _ = AppendFrame(b, 5, &Hello{})
	rd := NewReader(bytes.NewReader(b), 0)
	corr, m, err := rd.ReadServerMessage()
	if err != nil || corr != 4 {
		t.Fatal(err)
	}
	if e, ok := m.(*Error); !ok || !errors.Is(e, ErrTopicNotFound) || e.Name != "TOPIC_NOT_FOUND" || e.Message != "x" {
		t.Fatalf("got %#v", m)
	}
	if _, _, err := rd.ReadServerMessage(); !errors.Is(err, ErrUnexpectedFrame) {
		t.Fatalf("a client must not accept Hello: %v", err)
	}
}

// A bufio.Reader the server used to peek the first byte is reused, so no byte is lost.
func TestReaderReusesPeekedBufio(t *testing.T) {
	t.Parallel()
	b := stream(t)
	br := newPeekedReader(bytes.NewReader(b))
	first, err := br.Peek(1)
	if err != nil || !IsBinary(first[0]) {
		t.Fatal("peek")
	}
	readAll(t, br)
}

// A body past 64 KiB is allocated as its bytes arrive: a header announcing 10 MiB followed by a
// few bytes costs at most the first 64 KiB; bodies of every size around the steps read whole.
func TestReaderLargeBodyGrowsWithItsBytes(t *testing.T) {
	// Not parallel: TotalAlloc counts the whole process.
	src := append(header(DefaultMaxFrameSize-4, OpPublish, 0, 1), make([]byte, 100)...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := NewReader(bytes.NewReader(src), DefaultMaxFrameSize).ReadFrame()
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("want io.ErrUnexpectedEOF, got %v", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
		t.Fatalf("a 10 MiB header with 100 bytes behind it allocated %d bytes", got)
	}
	for _, size := range []int{eagerBody - 1, eagerBody, eagerBody + 1, 2*eagerBody + 7, 1<<20 + 3} {
		body := make([]byte, size)
		for i := range body {
			body[i] = byte(i * 7)
		}
		frame := append(header(uint32(8+size), OpPublish, 0, 2), body...)
		f, err := NewReader(iotest.HalfReader(bytes.NewReader(frame)), DefaultMaxFrameSize).ReadFrame()
		if err != nil || !bytes.Equal(f.Body, body) || cap(f.Body) != size {
			t.Fatalf("body of %d bytes: err %v, got %d bytes (cap %d), equal %v", size, err, len(f.Body), cap(f.Body), bytes.Equal(f.Body, body))
		}
	}
}
