// Package protocol is Spool's wire protocol codec, shared by the server and the Go client. The
// specification, from which a client in any language can be written, is docs/protocol.md; this
// package is its reference implementation.
//
// # Framing
//
// Each side of a binary connection first sends the 4-byte Preamble (0x00 'S' 'P' 'L'); no text
// command starts with a zero byte, so the server tells the binary protocol from the line-based text
// mode (package protocol/text) by the first byte (IsBinary). Then frames follow, big-endian:
//
//	+----------------+-----------+----------+-------------------+----------------+
//	| length u32     | opcode u16| flags u16| correlation id u32| body           |
//	+----------------+-----------+----------+-------------------+----------------+
//	  bytes after the length field (8 + body); 4 + length <= max frame size (10 MiB default)
//
// Reader reassembles frames split across reads and checks the length against the max frame size
// before it allocates the body (FrameTooLargeError). Writer buffers whole frames and writes them
// in order.
//
// # Messages
//
// Every frame body is a Message, one type per opcode, one file per type named after its opcode
// (01_hello.go, 81_hello_ok.go, ...). Messages encode append-style (Encode(dst) ([]byte, error),
// no hidden allocations) and decode with bounds: every count and length is checked against the
// bytes that remain before anything is allocated, trailing bytes are rejected, and errors are
// *DecodeError wrapping ErrMalformedFrame. Decoders never panic (fuzzed by FuzzFrameDecode).
// ClientMessage (FromClient) and ServerMessage (FromServer) separate the two directions like
// pgproto3's Frontend and Backend; DecodeClient and DecodeServer dispatch on the opcode.
//
// Decoded byte slices (keys, payloads) alias the decoded buffer: Reader.ReadFrame returns a
// freshly allocated body per frame, which the caller then owns.
//
// # Errors
//
// errors.go holds the one table of error codes (Error, ErrorForCode, IsRetryable): protocol
// errors, the broker's errors and availability errors, each with a stable code, name and retry
// flag. The server maps its internal errors to these codes; codes never change.
//
// # Concurrency
//
// Messages are plain values. Reader and Writer are not safe for concurrent use: a connection has
// one reading and one writing goroutine. The package has no global mutable state; the error
// sentinels must not be modified.
package protocol
