package protocol

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// ReadBufferSize is the size of the bufio.Reader a Reader wraps around its source. Frames larger
// than the buffer are read straight into their body.
const ReadBufferSize = 32 << 10

// Reader reads frames from a byte stream, reassembling frames split across reads. It checks
// every frame's length against the max frame size before allocating its body, and allocates a
// large body as its bytes arrive, so a hostile length costs at most 64 KiB.
//
// A Reader is not safe for concurrent use; a connection has one reading goroutine.
type Reader struct {
	br  *bufio.Reader
	max int
	// version is the layout ReadClientMessage and ReadServerMessage decode (SetVersion).
	version uint16
	hdr     [HeaderSize]byte
	// err is sticky: after a framing error (bad length, oversize frame, I/O error) the stream is
	// out of sync and every later read returns it.
	err error
}

// NewReader returns a Reader of r with the given max frame size (header included); maxFrameSize
// <= 0 means DefaultMaxFrameSize. If r is a *bufio.Reader of at least ReadBufferSize bytes it is
// used as is, so that bytes a server peeked to detect the mode are not lost.
func NewReader(r io.Reader, maxFrameSize int) *Reader {
	rd := &Reader{br: bufio.NewReaderSize(r, ReadBufferSize), version: MaxVersion}
	rd.SetMaxFrameSize(maxFrameSize)
	return rd
}

// SetMaxFrameSize changes the max frame size (header included); n <= 0 means DefaultMaxFrameSize.
// A client sets it to HelloOK.MaxFrameSize after the handshake.
func (r *Reader) SetMaxFrameSize(n int) {
	if n <= 0 {
		n = DefaultMaxFrameSize
	}
	r.max = n
}

// MaxFrameSize returns the max frame size.
func (r *Reader) MaxFrameSize() int { return r.max }

// SetVersion makes the Reader decode bodies in the layout of protocol version v (MaxVersion until
// then): both sides set the negotiated version after the handshake.
func (r *Reader) SetVersion(v uint16) { r.version = v }

// ReadPreamble reads the 4-byte preamble and checks it: a *PreambleError (wrapping
// ErrMalformedFrame) if it is not Preamble, io.ErrUnexpectedEOF or another read error otherwise.
func (r *Reader) ReadPreamble() error {
	if r.err != nil {
		return r.err
	}
	var got [len(Preamble)]byte
	if _, err := io.ReadFull(r.br, got[:]); err != nil {
		r.err = readErr("preamble", err)
		return r.err
	}
	if got != Preamble {
		r.err = &PreambleError{Got: got}
		return r.err
	}
	return nil
}

// ReadFrame reads the next frame. The returned Body is newly allocated and owned by the caller
// (decoded messages keep pointing into it). Errors:
//   - io.EOF: the stream ended cleanly between frames;
//   - an error wrapping io.ErrUnexpectedEOF: it ended inside a frame;
//   - *FrameTooLargeError: the frame is larger than the max frame size (its body is not read);
//   - *DecodeError wrapping ErrMalformedFrame: a length smaller than the header;
//   - any other read error of the source.
//
// All of them leave the stream out of sync and are returned again by every later call.
func (r *Reader) ReadFrame() (Frame, error) {
	if r.err != nil {
		return Frame{}, r.err
	}
	if _, err := io.ReadFull(r.br, r.hdr[:]); err != nil {
		if err == io.EOF {
			r.err = io.EOF
		} else {
			r.err = readErr("frame header", err)
		}
		return Frame{}, r.err
	}
	f := Frame{
		Opcode:        Opcode(binary.BigEndian.Uint16(r.hdr[4:])),
		Flags:         binary.BigEndian.Uint16(r.hdr[6:]),
		CorrelationID: binary.BigEndian.Uint32(r.hdr[8:]),
	}
	length := int64(binary.BigEndian.Uint32(r.hdr[0:]))
	if length < HeaderSize-4 {
		r.err = &DecodeError{Opcode: f.Opcode, Field: "length", Reason: fmt.Sprintf("frame length %d is smaller than the rest of the header (8)", length), Err: ErrMalformedFrame}
		return Frame{}, r.err
	}
	if size := 4 + length; size > int64(r.max) {
		r.err = &FrameTooLargeError{Opcode: f.Opcode, CorrelationID: f.CorrelationID, Size: size, Max: r.max}
		return Frame{}, r.err
	}
	body, err := readBody(r.br, int(length-(HeaderSize-4)))
	if err != nil {
		r.err = readErr("frame body", err)
		return Frame{}, r.err
	}
	f.Body = body
	return f, nil
}

// eagerBody is the largest body allocated whole before its bytes arrive. A larger one grows as
// they do, so that a length the peer never sends costs at most this much.
const eagerBody = 64 << 10

// readBody reads an n-byte body: at once up to eagerBody, else in doubling steps (at most one
// extra copy of what arrived).
func readBody(r io.Reader, n int) ([]byte, error) {
	if n <= eagerBody {
		b := make([]byte, n)
		_, err := io.ReadFull(r, b)
		return b, err
	}
	b := make([]byte, eagerBody)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	for len(b) < n {
		next := make([]byte, min(n, 2*len(b)))
		copy(next, b)
		if _, err := io.ReadFull(r, next[len(b):]); err != nil {
			return nil, err
		}
		b = next
	}
	return b, nil
}

// ReadClientMessage reads a frame and decodes it like DecodeClientVersion with the Reader's
// version (SetVersion). It returns the frame's correlation id whenever a frame was read, also with
// a decode error, so that a server can answer with an Error frame; decode errors (*DecodeError)
// are not sticky: the next frame can be read.
func (r *Reader) ReadClientMessage() (uint32, ClientMessage, error) {
	f, err := r.ReadFrame()
	if err != nil {
		return 0, nil, err
	}
	m, err := decodeFrame(f, NewClientMessage, r.version)
	return f.CorrelationID, m, err
}

// ReadServerMessage reads a frame and decodes it like DecodeServerVersion with the Reader's
// version; see ReadClientMessage.
func (r *Reader) ReadServerMessage() (uint32, ServerMessage, error) {
	f, err := r.ReadFrame()
	if err != nil {
		return 0, nil, err
	}
	m, err := decodeFrame(f, NewServerMessage, r.version)
	return f.CorrelationID, m, err
}

func readErr(what string, err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("protocol: read %s: %w", what, err)
}
