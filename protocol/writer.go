package protocol

import (
	"fmt"
	"io"
)

// Writer buffering thresholds.
const (
	// writeFlushAt: WriteMessage writes the buffer out once it holds this much.
	writeFlushAt = 64 << 10
	// writeKeepCap: a buffer grown past this by a large frame is dropped after it was written, so
	// an idle connection does not pin a 10 MiB buffer.
	writeKeepCap = 1 << 20
)

// Writer encodes frames into a buffer and writes them to a byte stream. Frames are written whole
// and in order; WriteMessage writes the buffer out once it holds 64 KiB, and Flush writes the
// rest, so a writer goroutine can batch many frames into one system call.
//
// A Writer is not safe for concurrent use: a connection has one writing goroutine (responses and
// pushes must never interleave inside a frame).
type Writer struct {
	w   io.Writer
	max int
	// version is the layout WriteMessage encodes (SetVersion).
	version uint16
	buf     []byte
	// err is sticky: after a failed write the stream may hold a partial frame.
	err error
}

// NewWriter returns a Writer to w with the given max frame size (header included); maxFrameSize
// <= 0 means DefaultMaxFrameSize.
func NewWriter(w io.Writer, maxFrameSize int) *Writer {
	wr := &Writer{w: w, version: MaxVersion}
	wr.SetMaxFrameSize(maxFrameSize)
	return wr
}

// SetMaxFrameSize changes the max frame size (header included); n <= 0 means DefaultMaxFrameSize.
// A client sets it to HelloOK.MaxFrameSize after the handshake.
func (w *Writer) SetMaxFrameSize(n int) {
	if n <= 0 {
		n = DefaultMaxFrameSize
	}
	w.max = n
}

// MaxFrameSize returns the max frame size.
func (w *Writer) MaxFrameSize() int { return w.max }

// SetVersion makes the Writer encode bodies in the layout of protocol version v (MaxVersion until
// then): both sides set the negotiated version after the handshake.
func (w *Writer) SetVersion(v uint16) { w.version = v }

// WritePreamble buffers the preamble. Call it once, before the first frame.
func (w *Writer) WritePreamble() error {
	if w.err != nil {
		return w.err
	}
	w.buf = append(w.buf, Preamble[:]...)
	return nil
}

// WriteMessage encodes m as a frame with the given correlation id and buffers it. An encoding error
// (wrapping ErrInvalidArgument) or a frame larger than the max frame size (*FrameTooLargeError)
// buffers nothing and leaves the Writer usable; a write error is sticky.
func (w *Writer) WriteMessage(correlationID uint32, m Message) error {
	if w.err != nil {
		return w.err
	}
	start := len(w.buf)
	buf, err := appendFrame(w.buf, correlationID, m, w.version)
	if err != nil {
		return err
	}
	if size := len(buf) - start; size > w.max {
		w.buf = buf[:start]
		return &FrameTooLargeError{Opcode: m.Opcode(), CorrelationID: correlationID, Size: int64(size), Max: w.max}
	}
	w.buf = buf
	if len(w.buf) >= writeFlushAt {
		return w.Flush()
	}
	return nil
}

// Buffered returns the number of bytes buffered and not yet written.
func (w *Writer) Buffered() int { return len(w.buf) }

// Flush writes the buffered frames.
func (w *Writer) Flush() error {
	if w.err != nil {
		return w.err
	}
	if len(w.buf) == 0 {
		return nil
	}
	n, err := w.w.Write(w.buf)
	if err == nil && n < len(w.buf) {
		err = io.ErrShortWrite
	}
	if err != nil {
		w.err = fmt.Errorf("protocol: write: %w", err)
		return w.err
	}
	if cap(w.buf) > writeKeepCap {
		w.buf = nil
	} else {
		w.buf = w.buf[:0]
	}
	return nil
}
