package text

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/spoolmq/spool/protocol"
)

func readLines(t *testing.T, lr *LineReader) ([]string, []error) {
	t.Helper()
	var lines []string
	var errs []error
	for range 1000 {
		l, err := lr.ReadLine()
		if err == io.EOF {
			return lines, errs
		}
		if err != nil {
			errs = append(errs, err)
			lines = append(lines, "<err>")
			continue
		}
		lines = append(lines, string(l))
	}
	t.Fatal("no EOF")
	return nil, nil
}

func TestLineReader(t *testing.T) {
	t.Parallel()
	in := "PUBLISH a b\r\nSUBSCRIBE a\n\nlast line without newline"
	for _, r := range []io.Reader{strings.NewReader(in), iotest.OneByteReader(strings.NewReader(in)), iotest.DataErrReader(strings.NewReader(in))} {
		lines, errs := readLines(t, NewLineReader(r, 0))
		want := []string{"PUBLISH a b", "SUBSCRIBE a", "", "last line without newline"}
		if len(errs) != 0 || strings.Join(lines, "|") != strings.Join(want, "|") {
			t.Fatalf("got %q, %v", lines, errs)
		}
	}
}

// An oversize line is discarded, reported with LINE_TOO_LONG, and the next line is read normally,
// without buffering the oversize line (the limit holds for memory too).
func TestLineReaderTooLong(t *testing.T) {
	const max = 100
	in := strings.Repeat("x", max) + "\n" + // exactly the limit: fine
		strings.Repeat("y", max) + "\r\n" + // the limit plus CRLF: fine
		strings.Repeat("z", max+1) + "\n" + // one over: error
		"PING\n" +
		strings.Repeat("w", 10*protocol.ReadBufferSize) + "\n" + // far over, across buffer refills
		"QUIT\n" +
		strings.Repeat("v", max+5) // over, at EOF
	lines, errs := readLines(t, NewLineReader(iotest.HalfReader(strings.NewReader(in)), max))
	want := []string{strings.Repeat("x", max), strings.Repeat("y", max), "<err>", "PING", "<err>", "QUIT", "<err>"}
	if strings.Join(lines, "|") != strings.Join(want, "|") {
		t.Fatalf("got %q", lines)
	}
	for _, err := range errs {
		if !errors.Is(err, protocol.ErrLineTooLong) {
			t.Fatalf("want LINE_TOO_LONG, got %v", err)
		}
	}

	// Memory: a 50 MiB line costs no more than the limit.
	big := io.MultiReader(io.LimitReader(infiniteX{}, 50<<20), strings.NewReader("\nPING\n"))
	lr := NewLineReader(big, DefaultMaxLineLength)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := lr.ReadLine()
	runtime.ReadMemStats(&after)
	if !errors.Is(err, protocol.ErrLineTooLong) {
		t.Fatalf("want LINE_TOO_LONG, got %v", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 4*DefaultMaxLineLength {
		t.Fatalf("discarding a 50 MiB line allocated %d bytes", alloc)
	}
	if l, err := lr.ReadLine(); err != nil || string(l) != "PING" {
		t.Fatalf("after the long line: %q, %v", l, err)
	}
}

type infiniteX struct{}

func (infiniteX) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

func TestLineReaderErrorsAreSticky(t *testing.T) {
	t.Parallel()
	boom := errors.New("reset")
	lr := NewLineReader(iotest.ErrReader(boom), 0)
	if _, err := lr.ReadLine(); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if _, err := lr.ReadLine(); !errors.Is(err, boom) {
		t.Fatal("not sticky")
	}
	lr = NewLineReader(strings.NewReader(""), 0)
	if _, err := lr.ReadLine(); err != io.EOF {
		t.Fatal(err)
	}
	if lr.MaxLineLength() != DefaultMaxLineLength {
		t.Fatal("default")
	}
}

// A server peeks the first byte with a bufio.Reader and hands it on: nothing is lost.
func TestLineReaderReusesPeekedReader(t *testing.T) {
	t.Parallel()
	br := bufio.NewReaderSize(bytes.NewReader([]byte("PING\n")), protocol.ReadBufferSize)
	b, _ := br.Peek(1)
	if protocol.IsBinary(b[0]) {
		t.Fatal("text detected as binary")
	}
	l, err := NewLineReader(br, 0).ReadLine()
	if err != nil || string(l) != "PING" {
		t.Fatalf("%q %v", l, err)
	}
}
