package text

import (
	"bufio"
	"errors"
	"fmt"
	"io"

	"github.com/spoolmq/spool/protocol"
)

// DefaultMaxLineLength is the default limit of a line's length, without its terminator: 1 MiB +
// 1 KiB, so that "PUBLISH <topic> " and a payload of the default max message size (1 MiB) fit.
const DefaultMaxLineLength = 1<<20 + 1<<10

// keepBuf: a line buffer grown past this is dropped before the next line, so a connection that
// once sent a long line does not pin it.
const keepBuf = 64 << 10

// LineReader reads lines terminated by "\n" (an optional "\r" before it is removed too), with a
// length limit that holds without buffering the rest of an oversize line.
//
// A LineReader is not safe for concurrent use.
type LineReader struct {
	br  *bufio.Reader
	max int
	buf []byte
	// err is sticky: io.EOF after the last line, or a read error.
	err error
}

// NewLineReader returns a LineReader of r; maxLineLength <= 0 means DefaultMaxLineLength. If r is
// a *bufio.Reader of at least protocol.ReadBufferSize bytes (the one a server peeked the first byte
// with) it is used as is.
func NewLineReader(r io.Reader, maxLineLength int) *LineReader {
	if maxLineLength <= 0 {
		maxLineLength = DefaultMaxLineLength
	}
	return &LineReader{br: bufio.NewReaderSize(r, protocol.ReadBufferSize), max: maxLineLength}
}

// MaxLineLength returns the line length limit.
func (l *LineReader) MaxLineLength() int { return l.max }

// ReadLine returns the next line without its terminator. The slice is valid until the next call.
// A last line without "\n" before the end of the stream is returned as a line; then io.EOF.
//
// A line longer than the limit is read to its end and discarded, and ReadLine returns an error
// wrapping protocol.ErrLineTooLong (reply "ERR LINE_TOO_LONG ..."); the next call reads the next
// line. Read errors of the source are sticky.
func (l *LineReader) ReadLine() ([]byte, error) {
	if l.err != nil {
		return nil, l.err
	}
	if cap(l.buf) > keepBuf {
		l.buf = nil
	}
	l.buf = l.buf[:0]
	total, tooLong := 0, false
	for {
		chunk, err := l.br.ReadSlice('\n')
		total += len(chunk)
		// The terminator "\r\n" does not count: a line is too long once its bytes exceed max+2.
		if !tooLong && total > l.max+2 {
			tooLong, l.buf = true, l.buf[:0]
		}
		if !tooLong {
			l.buf = l.grow(l.buf, len(chunk))
			l.buf = append(l.buf, chunk...)
		}
		switch {
		case err == nil:
			return l.finish(tooLong)
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			l.err = io.EOF
			if total == 0 {
				return nil, io.EOF
			}
			return l.finish(tooLong)
		default:
			l.err = fmt.Errorf("text: read line: %w", err)
			return nil, l.err
		}
	}
}

// grow makes room for n more bytes, doubling (append grows large slices by 1.25x, which would
// allocate about 5 times the limit in total for a long line) and never past the limit.
func (l *LineReader) grow(b []byte, n int) []byte {
	if len(b)+n <= cap(b) {
		return b
	}
	c := min(max(2*cap(b), len(b)+n, 4096), l.max+2)
	nb := make([]byte, len(b), max(c, len(b)+n))
	copy(nb, b)
	return nb
}

func (l *LineReader) finish(tooLong bool) ([]byte, error) {
	line := l.buf
	if n := len(line); n > 0 && line[n-1] == '\n' {
		line = line[:n-1]
		if n := len(line); n > 0 && line[n-1] == '\r' {
			line = line[:n-1]
		}
	}
	if tooLong || len(line) > l.max {
		return nil, protocol.ErrLineTooLong.Errorf("line exceeds the limit of %d bytes; it was discarded", l.max)
	}
	return line, nil
}
