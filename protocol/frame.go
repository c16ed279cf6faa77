package protocol

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Preamble is the first 4 bytes each side sends on a binary connection, before any frame: a zero
// byte and "SPL". No text command starts with a zero byte, so a server reads one byte to tell the
// binary protocol from the text mode on the same port. Part of the wire contract: never change.
var Preamble = [4]byte{0x00, 'S', 'P', 'L'}

// IsBinary reports whether a connection whose first byte is first speaks the binary protocol (the
// preamble's zero byte) rather than the text mode. A server peeks one byte with a bufio.Reader of
// at least ReadBufferSize bytes and hands that same reader to NewReader or to the text mode's line
// reader.
func IsBinary(first byte) bool { return first == Preamble[0] }

// Sizes and limits of the framing (docs/protocol.md sections 2 and 10).
const (
	// HeaderSize is the size of a frame header: length u32, opcode u16, flags u16, correlation id
	// u32.
	HeaderSize = 12
	// DefaultMaxFrameSize is the default largest frame, header included: 10 MiB (BRIEF.md section
	// 5). The server announces its own value in HelloOK; both directions use it.
	DefaultMaxFrameSize = 10 << 20
	// MinMaxFrameSize is the smallest max frame size a server may announce: 64 KiB.
	MinMaxFrameSize = 64 << 10
	// MaxMaxFrameSize is the largest max frame size a server may announce: 1 GiB.
	MaxMaxFrameSize = 1 << 30
	// MaxBatch is the most messages a Publish, positions a PublishOK and deliveries a Deliver may
	// hold. Decoding allocates at most about 6 times a frame's size, plus up to about 512 bytes
	// per batch entry (a tiny message with a header costs a struct and a map far larger than its
	// encoding); MaxBatch caps that second part at about 5 MiB per frame.
	MaxBatch = 10_000
	// DefaultMaxMessageSize is the default largest message (key, header names and values, and
	// payload), 1 MiB; a topic may configure its own.
	DefaultMaxMessageSize = 1 << 20
)

// Protocol versions this package speaks. A version names the layout of every frame body except
// Hello, HelloOK and Error, which never change.
const (
	// Version1 is the first, pre-release layout: PublishOK and deliveries without the topic's
	// partition count. No longer spoken: a version-1 peer gets UNSUPPORTED_VERSION.
	Version1 uint16 = 1
	// Version2 adds the topic's partition count to PublishOK and to every delivery, so that clients
	// show the message ids users see everywhere else (BRIEF 2b).
	Version2 uint16 = 2
	// Version3 adds the member filter at the end of Subscribe. A version-2 peer still works:
	// Reader and Writer use the layout of the version set with SetVersion, and a Subscribe with
	// a filter cannot be encoded for version 2 (an encoding error, nothing sent).
	Version3 uint16 = 3
	// Version4 adds per-key batches: batch_size at the end of Subscribe, and batch_len (plus
	// batch_offset when not 0) at the end of every delivery. Version-2 and version-3 peers still
	// work: they cannot ask for batches, so they are never given one.
	Version4 uint16 = 4
	// Version5 adds rejoin at the end of Subscribe: a resubscription after a reconnect names the
	// subscription it had, and the server joins only that one instead of creating a new group
	// or binding. Older peers keep the old behaviour: their Subscribe may create, and a Subscribe
	// with rejoin cannot be encoded for them.
	Version5 uint16 = 5
	// Version6 adds delay at the end of every PublishMessage: a delay relative to the broker's
	// receipt of the Publish, on the broker's clock, where not_before is an absolute time that a
	// client can only compute on its own clock (BRIEF 2b: the broker's clock, never a
	// client's). Older peers keep not_before only; a Publish with a delay cannot be encoded for
	// them.
	Version6 uint16 = 6
	// MinVersion and MaxVersion are the range this package implements.
	MinVersion = Version2
	MaxVersion = Version6
	// MaxBatchLen bounds a delivery's BatchLen (the engines' batch bound).
	MaxBatchLen = 10_000
)

// versioned is implemented by the message types whose layout changed after MinVersion: they
// encode and decode the layout of a given version (Encode and Decode use MaxVersion's).
type versioned interface {
	encodeVersion(dst []byte, v uint16) ([]byte, error)
	decodeVersion(src []byte, v uint16) error
}

// Opcode identifies the type of a frame's body. Bit 0x80 is set on responses: the response to a
// request with opcode X has opcode X|0x80 (Error, 0x80, answers any request). Opcodes 0x40-0x7f are
// unsolicited server pushes. Part of the wire contract: never change a value.
type Opcode uint16

// Opcodes, the same in every protocol version.
const (
	OpHello             Opcode = 0x01 // client: open the session
	OpPublish           Opcode = 0x02 // client: append messages
	OpSubscribe         Opcode = 0x03 // client: join subscriptions, open a handle
	OpUnsubscribe       Opcode = 0x04 // client: close a handle
	OpAck               Opcode = 0x05 // client: complete deliveries
	OpNack              Opcode = 0x06 // client: give deliveries back
	OpExtend            Opcode = 0x07 // client: extend leases
	OpCredit            Opcode = 0x08 // client: grant more in-flight deliveries (no response)
	OpHeartbeat         Opcode = 0x09 // either side: liveness probe
	OpGoodbye           Opcode = 0x0a // either side: announce a clean close
	OpDeliver           Opcode = 0x40 // server push: a batch of deliveries
	OpSubscriptionEnded Opcode = 0x41 // server push: a subscription or handle ended
	OpError             Opcode = 0x80 // server: a request failed, or a connection error
	OpHelloOK           Opcode = 0x81
	OpPublishOK         Opcode = 0x82
	OpSubscribeOK       Opcode = 0x83
	OpUnsubscribeOK     Opcode = 0x84
	OpAckOK             Opcode = 0x85
	OpNackOK            Opcode = 0x86
	OpExtendOK          Opcode = 0x87
	OpHeartbeatOK       Opcode = 0x89 // either side
	OpGoodbyeOK         Opcode = 0x8a // either side
)

var opcodeNames = map[Opcode]string{
	OpHello: "Hello", OpPublish: "Publish", OpSubscribe: "Subscribe", OpUnsubscribe: "Unsubscribe",
	OpAck: "Ack", OpNack: "Nack", OpExtend: "Extend", OpCredit: "Credit", OpHeartbeat: "Heartbeat",
	OpGoodbye: "Goodbye", OpDeliver: "Deliver", OpSubscriptionEnded: "SubscriptionEnded",
	OpError: "Error", OpHelloOK: "HelloOK", OpPublishOK: "PublishOK", OpSubscribeOK: "SubscribeOK",
	OpUnsubscribeOK: "UnsubscribeOK", OpAckOK: "AckOK", OpNackOK: "NackOK", OpExtendOK: "ExtendOK",
	OpHeartbeatOK: "HeartbeatOK", OpGoodbyeOK: "GoodbyeOK",
}

// String returns the message type's name, or "Opcode(0x1234)" for an unknown opcode.
func (o Opcode) String() string {
	if n, ok := opcodeNames[o]; ok {
		return n
	}
	return fmt.Sprintf("Opcode(%#04x)", uint16(o))
}

// IsResponse reports whether o is a response opcode (bit 0x80 set): its correlation id is that of
// the request it answers.
func (o Opcode) IsResponse() bool { return o&0x80 != 0 }

// Message is the body of one frame. Every message type of this package implements it with a
// pointer receiver.
type Message interface {
	// Opcode returns the frame opcode of the message type.
	Opcode() Opcode
	// Encode appends the body's encoding to dst and returns the extended slice. On error (a field
	// the wire cannot carry: invalid UTF-8, a negative duration, a time outside int64
	// nanoseconds) it returns dst unchanged and an error wrapping ErrInvalidArgument.
	Encode(dst []byte) ([]byte, error)
	// Decode replaces the receiver's contents with the body in src. The byte slices of the
	// decoded message (keys, payloads) point into src, which must not be modified while the
	// message is in use; strings and maps are copied. Empty byte slices, maps and arrays decode
	// to nil. Decode never panics, allocates only after checking each count and length against
	// the bytes that remain, rejects trailing bytes, and returns a *DecodeError wrapping
	// ErrMalformedFrame.
	Decode(src []byte) error
}

// ClientMessage is a message a client sends to a server (pgproto3's FrontendMessage).
type ClientMessage interface {
	Message
	// FromClient marks client-to-server message types.
	FromClient()
}

// ServerMessage is a message a server sends to a client (pgproto3's BackendMessage). Heartbeat,
// HeartbeatOK, Goodbye and GoodbyeOK travel both ways and are both.
type ServerMessage interface {
	Message
	// FromServer marks server-to-client message types.
	FromServer()
}

// NewClientMessage returns a new zero message of a client-to-server opcode. It fails with
// ErrUnknownOpcode for an opcode no protocol version defines, and ErrUnexpectedFrame for one only
// a server may send.
func NewClientMessage(op Opcode) (ClientMessage, error) {
	switch op {
	case OpHello:
		return new(Hello), nil
	case OpPublish:
		return new(Publish), nil
	case OpSubscribe:
		return new(Subscribe), nil
	case OpUnsubscribe:
		return new(Unsubscribe), nil
	case OpAck:
		return new(Ack), nil
	case OpNack:
		return new(Nack), nil
	case OpExtend:
		return new(Extend), nil
	case OpCredit:
		return new(Credit), nil
	case OpHeartbeat:
		return new(Heartbeat), nil
	case OpHeartbeatOK:
		return new(HeartbeatOK), nil
	case OpGoodbye:
		return new(Goodbye), nil
	case OpGoodbyeOK:
		return new(GoodbyeOK), nil
	}
	return nil, opcodeError(op, true)
}

// NewServerMessage returns a new zero message of a server-to-client opcode. It fails with
// ErrUnknownOpcode for an opcode no protocol version defines, and ErrUnexpectedFrame for one only
// a client may send.
func NewServerMessage(op Opcode) (ServerMessage, error) {
	switch op {
	case OpError:
		return new(Error), nil
	case OpHelloOK:
		return new(HelloOK), nil
	case OpPublishOK:
		return new(PublishOK), nil
	case OpSubscribeOK:
		return new(SubscribeOK), nil
	case OpUnsubscribeOK:
		return new(UnsubscribeOK), nil
	case OpAckOK:
		return new(AckOK), nil
	case OpNackOK:
		return new(NackOK), nil
	case OpExtendOK:
		return new(ExtendOK), nil
	case OpDeliver:
		return new(Deliver), nil
	case OpSubscriptionEnded:
		return new(SubscriptionEnded), nil
	case OpHeartbeat:
		return new(Heartbeat), nil
	case OpHeartbeatOK:
		return new(HeartbeatOK), nil
	case OpGoodbye:
		return new(Goodbye), nil
	case OpGoodbyeOK:
		return new(GoodbyeOK), nil
	}
	return nil, opcodeError(op, false)
}

func opcodeError(op Opcode, client bool) error {
	sentinel, reason := ErrUnknownOpcode, "opcode not defined in any protocol version"
	if _, known := opcodeNames[op]; known {
		sentinel, reason = ErrUnexpectedFrame, "a server may not receive this message type"
		if !client {
			reason = "a client may not receive this message type"
		}
	}
	return &DecodeError{Opcode: op, Field: "opcode", Reason: reason, Err: sentinel}
}

// Frame is one frame as read from the wire: the header fields and the undecoded body.
type Frame struct {
	Opcode Opcode
	// Flags must be 0: no protocol version defines one.
	Flags uint16
	// CorrelationID pairs a response with its request: a request carries a non-zero id chosen by
	// its sender, the response (or Error) repeats it. Pushes carry 0.
	CorrelationID uint32
	Body          []byte
}

// Size returns the frame's encoded size, header included.
func (f *Frame) Size() int { return HeaderSize + len(f.Body) }

// AppendFrame appends a whole frame (header and body of m, in MaxVersion's layout) to dst. It
// does not check a max frame size: Writer does. On error dst is returned unchanged.
func AppendFrame(dst []byte, correlationID uint32, m Message) ([]byte, error) {
	return appendFrame(dst, correlationID, m, MaxVersion)
}

// AppendFrameVersion is AppendFrame in the layout of protocol version v (the negotiated one).
func AppendFrameVersion(dst []byte, correlationID uint32, m Message, v uint16) ([]byte, error) {
	return appendFrame(dst, correlationID, m, v)
}

func appendFrame(dst []byte, correlationID uint32, m Message, v uint16) ([]byte, error) {
	start := len(dst)
	var zero [HeaderSize]byte
	dst = append(dst, zero[:]...)
	var out []byte
	var err error
	if vm, ok := m.(versioned); ok {
		out, err = vm.encodeVersion(dst, v)
	} else {
		out, err = m.Encode(dst)
	}
	if err != nil {
		return dst[:start], err
	}
	n := len(out) - start - 4
	if uint64(n) > math.MaxUint32 {
		return out[:start], fmt.Errorf("%w: protocol: encode %s: frame of %d bytes", ErrFrameTooLarge, m.Opcode(), n+4)
	}
	h := out[start:]
	binary.BigEndian.PutUint32(h[0:], uint32(n))
	binary.BigEndian.PutUint16(h[4:], uint16(m.Opcode()))
	binary.BigEndian.PutUint16(h[6:], 0)
	binary.BigEndian.PutUint32(h[8:], correlationID)
	return out, nil
}

// DecodeClient decodes a frame a server received from a client, in MaxVersion's layout (after
// the handshake a server decodes with DecodeClientVersion). Besides the body's own errors
// (see Message.Decode) it rejects flags, which no version defines (ErrMalformedFrame),
// unknown opcodes (ErrUnknownOpcode) and server-only opcodes (ErrUnexpectedFrame). All errors are
// *DecodeError; the stream stays in sync, so a server may answer with an Error frame and go on.
func DecodeClient(f Frame) (ClientMessage, error) {
	return decodeFrame(f, NewClientMessage, MaxVersion)
}

// DecodeServer decodes a frame a client received from a server; see DecodeClient. It uses
// MaxVersion's layout: after the handshake a client decodes with DecodeServerVersion.
func DecodeServer(f Frame) (ServerMessage, error) {
	return decodeFrame(f, NewServerMessage, MaxVersion)
}

// DecodeClientVersion is DecodeClient in the layout of protocol version v (the negotiated one).
func DecodeClientVersion(f Frame, v uint16) (ClientMessage, error) {
	return decodeFrame(f, NewClientMessage, v)
}

// DecodeServerVersion is DecodeServer in the layout of protocol version v (the negotiated one):
// an older broker's Deliver has no batch fields, and MaxVersion's layout would reject it.
func DecodeServerVersion(f Frame, v uint16) (ServerMessage, error) {
	return decodeFrame(f, NewServerMessage, v)
}

// decodeFrame makes the message of f's opcode for one direction, checks the flags and decodes the
// body in the layout of version v.
func decodeFrame[M Message](f Frame, newMessage func(Opcode) (M, error), v uint16) (M, error) {
	var zero M
	m, err := newMessage(f.Opcode)
	if err != nil {
		return zero, err
	}
	if err := checkFlags(f); err != nil {
		return zero, err
	}
	if vm, ok := any(m).(versioned); ok {
		err = vm.decodeVersion(f.Body, v)
	} else {
		err = m.Decode(f.Body)
	}
	if err != nil {
		return zero, err
	}
	return m, nil
}

func checkFlags(f Frame) error {
	if f.Flags != 0 {
		return &DecodeError{Opcode: f.Opcode, Field: "flags", Reason: fmt.Sprintf("flags %#04x are not defined in any protocol version", f.Flags), Err: ErrMalformedFrame}
	}
	return nil
}

// DecodeError reports a frame that cannot be decoded. It wraps ErrMalformedFrame,
// ErrUnknownOpcode or ErrUnexpectedFrame (test with errors.Is).
type DecodeError struct {
	Opcode Opcode
	// Field names the field being decoded ("messages.headers", "opcode", "flags").
	Field string
	// Offset is the byte offset in the body where the bad field starts.
	Offset int
	// Reason says what is wrong.
	Reason string
	// Err is the sentinel: ErrMalformedFrame, ErrUnknownOpcode or ErrUnexpectedFrame.
	Err error
}

// Error formats the error with the opcode, field and offset.
func (e *DecodeError) Error() string {
	return fmt.Sprintf("protocol: decode %s: %s at byte %d: %s", e.Opcode, e.Field, e.Offset, e.Reason)
}

// Unwrap returns the sentinel.
func (e *DecodeError) Unwrap() error { return e.Err }

// FrameTooLargeError reports a frame header whose length exceeds the max frame size. The body was
// not read: the stream is out of sync and the connection must be closed, after answering with an
// Error frame for CorrelationID if the reader is a server. It wraps ErrFrameTooLarge.
type FrameTooLargeError struct {
	Opcode        Opcode
	CorrelationID uint32
	// Size is the frame's size, header included, as announced by its length field.
	Size int64
	// Max is the reader's max frame size.
	Max int
}

// Error formats the error.
func (e *FrameTooLargeError) Error() string {
	return fmt.Sprintf("protocol: %s frame (correlation id %d) of %d bytes exceeds the max frame size %d", e.Opcode, e.CorrelationID, e.Size, e.Max)
}

// Unwrap returns ErrFrameTooLarge.
func (e *FrameTooLargeError) Unwrap() error { return ErrFrameTooLarge }

// PreambleError reports a connection that did not start with Preamble. It wraps
// ErrMalformedFrame.
type PreambleError struct {
	Got [4]byte
}

// Error formats the error.
func (e *PreambleError) Error() string {
	return fmt.Sprintf("protocol: bad preamble % x, want % x", e.Got[:], Preamble[:])
}

// Unwrap returns ErrMalformedFrame.
func (e *PreambleError) Unwrap() error { return ErrMalformedFrame }
