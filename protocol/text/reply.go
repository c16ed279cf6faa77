package text

import (
	"bytes"
	"encoding/base64"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/spoolmq/spool/protocol"
)

// ReplyKind is the kind of a line the server sends in text mode.
type ReplyKind uint8

// Reply kinds (docs/protocol.md section 11).
const (
	// ReplyOK: "OK" or "OK <text>", the success reply of one command.
	ReplyOK ReplyKind = iota + 1
	// ReplyErr: "ERR <CODE_NAME> <message>", the failure reply of one command (or a notice
	// before the server closes the connection).
	ReplyErr
	// ReplyMessage: "MESSAGE <topic> <payload>" or "MESSAGE_BASE64 <topic> <base64>", a
	// delivery in the default format.
	ReplyMessage
	// ReplyDelivery: "DELIVERY <tag> <message-id> <attempt> <topic> <payload>" or
	// "DELIVERY_BASE64 ...", a delivery after VERBOSE ON.
	ReplyDelivery
	// ReplyInfo: "# <text>", an informational line (HELP output); clients may ignore it.
	ReplyInfo
)

// Reply is one parsed server line.
type Reply struct {
	Kind ReplyKind
	// Text is the text of OK and INFO lines.
	Text string
	// Err is the error of an ERR line: its table entry (Code, Name, Retryable) and Message. A name
	// this package does not know keeps Code 0.
	Err *protocol.Error
	// Delivery is set for MESSAGE and DELIVERY lines; only Topic and Payload for MESSAGE.
	Delivery Delivery
}

// Delivery is one message delivered to a text session.
type Delivery struct {
	// Tag is the session's delivery tag: the n-th delivery line of the session has tag n,
	// whatever its format. ACK and NACK name it.
	Tag uint64
	// MessageID is the user-facing message id ("offset" or "partition:offset").
	MessageID string
	// Attempt is 1 for the first delivery, 2 for the first redelivery, ...
	Attempt uint32
	Topic   string
	// Payload is nil when empty.
	Payload []byte
}

// Printable reports whether a payload is printed raw in a MESSAGE or DELIVERY line: valid UTF-8
// without control characters other than tab. Other payloads are printed base64-encoded
// (MESSAGE_BASE64, DELIVERY_BASE64) so that a binary payload can neither break the line framing
// nor garble a terminal.
func Printable(payload []byte) bool {
	for len(payload) > 0 {
		r, n := utf8.DecodeRune(payload)
		if r == utf8.RuneError && n <= 1 {
			return false
		}
		if r != '\t' && unicode.IsControl(r) {
			return false
		}
		payload = payload[n:]
	}
	return true
}

// AppendOK appends "OK" or "OK <text>" and "\n". Newlines and carriage returns in text become
// spaces.
func AppendOK(dst []byte, text string) []byte {
	dst = append(dst, "OK"...)
	if text != "" {
		dst = append(dst, ' ')
		dst = appendOneLine(dst, text)
	}
	return append(dst, '\n')
}

// AppendErr appends "ERR <CODE_NAME> <message>" and "\n" for err, mapped with protocol.AsError
// (an error outside the table is INTERNAL). Newlines in the message become spaces.
func AppendErr(dst []byte, err error) []byte {
	e := protocol.AsError(err)
	if e == nil {
		e = protocol.ErrInternal
	}
	dst = append(dst, "ERR "...)
	dst = append(dst, errName(e)...)
	if e.Message != "" {
		dst = append(dst, ' ')
		dst = appendOneLine(dst, e.Message)
	}
	return append(dst, '\n')
}

func errName(e *protocol.Error) string {
	if e.Name != "" {
		return e.Name
	}
	return "CODE_" + strconv.Itoa(int(e.Code))
}

// AppendInfo appends "# <text>" and "\n".
func AppendInfo(dst []byte, text string) []byte {
	dst = append(dst, "# "...)
	dst = appendOneLine(dst, text)
	return append(dst, '\n')
}

// AppendMessage appends a delivery in the default format: "MESSAGE <topic> <payload>\n" for a
// Printable payload, "MESSAGE_BASE64 <topic> <base64>\n" otherwise. The topic must be a valid topic
// name (no blanks or control characters), which the server guarantees.
func AppendMessage(dst []byte, topic string, payload []byte) []byte {
	if Printable(payload) {
		dst = append(dst, "MESSAGE "...)
		dst = append(dst, topic...)
		dst = append(dst, ' ')
		dst = append(dst, payload...)
	} else {
		dst = append(dst, "MESSAGE_BASE64 "...)
		dst = append(dst, topic...)
		dst = append(dst, ' ')
		dst = base64.StdEncoding.AppendEncode(dst, payload)
	}
	return append(dst, '\n')
}

// AppendDelivery appends a delivery in the verbose format: "DELIVERY <tag> <message-id> <attempt>
// <topic> <payload>\n", or DELIVERY_BASE64 with the payload base64-encoded when it is not
// Printable.
func AppendDelivery(dst []byte, d Delivery) []byte {
	kw := "DELIVERY "
	if !Printable(d.Payload) {
		kw = "DELIVERY_BASE64 "
	}
	dst = append(dst, kw...)
	dst = strconv.AppendUint(dst, d.Tag, 10)
	dst = append(dst, ' ')
	dst = append(dst, d.MessageID...)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, uint64(d.Attempt), 10)
	dst = append(dst, ' ')
	dst = append(dst, d.Topic...)
	dst = append(dst, ' ')
	if kw == "DELIVERY " {
		dst = append(dst, d.Payload...)
	} else {
		dst = base64.StdEncoding.AppendEncode(dst, d.Payload)
	}
	return append(dst, '\n')
}

// AppendReply appends any reply; it fails for values the line syntax cannot carry.
func AppendReply(dst []byte, r Reply) ([]byte, error) {
	switch r.Kind {
	case ReplyOK:
		if strings.ContainsAny(r.Text, "\r\n") {
			return dst, invalid("OK text contains a line break")
		}
		return AppendOK(dst, r.Text), nil
	case ReplyErr:
		if r.Err == nil || strings.ContainsAny(r.Err.Message, "\r\n") {
			return dst, invalid("ERR without error, or its message contains a line break")
		}
		return AppendErr(dst, r.Err), nil
	case ReplyInfo:
		if strings.ContainsAny(r.Text, "\r\n") {
			return dst, invalid("info text contains a line break")
		}
		return AppendInfo(dst, r.Text), nil
	case ReplyMessage, ReplyDelivery:
		d := r.Delivery
		if d.Topic == "" || checkToken([]byte(d.Topic)) != nil {
			return dst, invalid("delivery topic %q", d.Topic)
		}
		if r.Kind == ReplyMessage {
			if d.Tag != 0 || d.MessageID != "" || d.Attempt != 0 {
				return dst, invalid("MESSAGE carries only topic and payload")
			}
			return AppendMessage(dst, d.Topic, d.Payload), nil
		}
		if d.MessageID == "" || checkToken([]byte(d.MessageID)) != nil {
			return dst, invalid("delivery message id %q", d.MessageID)
		}
		return AppendDelivery(dst, d), nil
	}
	return dst, invalid("undefined reply kind %d", r.Kind)
}

// ParseReply parses one server line (without its terminator). Errors wrap
// protocol.ErrMalformedFrame.
func ParseReply(line []byte) (Reply, error) {
	bad := func(format string, args ...any) (Reply, error) {
		return Reply{}, protocol.ErrMalformedFrame.Errorf("text reply: "+format, args...)
	}
	// A server never writes CR or LF inside a line (texts are sanitized, payloads with them are
	// base64-encoded).
	if bytes.ContainsAny(line, "\r\n") {
		return bad("line break inside the line")
	}
	if line, ok := bytes.CutPrefix(line, []byte("#")); ok {
		line, _ = bytes.CutPrefix(line, []byte(" "))
		return Reply{Kind: ReplyInfo, Text: string(line)}, nil
	}
	kw, rest := cutField(line)
	if len(rest) > 0 && rest[0] != ' ' {
		return bad("fields must be separated by single spaces")
	}
	if len(rest) > 0 {
		rest = rest[1:]
	}
	switch string(kw) {
	case "OK":
		return Reply{Kind: ReplyOK, Text: string(rest)}, nil
	case "ERR":
		name, msg := cutSpace(rest)
		if len(name) == 0 {
			return bad("ERR without a code name")
		}
		e, ok := protocol.ErrorForName(string(name))
		if !ok {
			e = &protocol.Error{Name: string(name)}
			if n, isCode := strings.CutPrefix(string(name), "CODE_"); isCode {
				if code, err := strconv.ParseUint(n, 10, 16); err == nil && strconv.FormatUint(code, 10) == n {
					e, _ = protocol.ErrorForCode(uint16(code))
				}
			}
		}
		e.Message = string(msg)
		return Reply{Kind: ReplyErr, Err: e}, nil
	case "MESSAGE", "MESSAGE_BASE64":
		topic, payload := cutSpace(rest)
		if len(topic) == 0 || checkToken(topic) != nil {
			return bad("MESSAGE without a valid topic")
		}
		p, err := payloadOf(string(kw) == "MESSAGE_BASE64", payload)
		if err != nil {
			return bad("%v", err)
		}
		return Reply{Kind: ReplyMessage, Delivery: Delivery{Topic: string(topic), Payload: p}}, nil
	case "DELIVERY", "DELIVERY_BASE64":
		var f [4][]byte
		for i := range f {
			f[i], rest = cutSpace(rest)
			if len(f[i]) == 0 || checkToken(f[i]) != nil {
				return bad("DELIVERY needs <tag> <message-id> <attempt> <topic> <payload>")
			}
		}
		tag, err1 := strconv.ParseUint(string(f[0]), 10, 64)
		attempt, err2 := strconv.ParseUint(string(f[2]), 10, 32)
		if err1 != nil || err2 != nil || tag == 0 || strconv.FormatUint(tag, 10) != string(f[0]) || strconv.FormatUint(attempt, 10) != string(f[2]) {
			return bad("DELIVERY: bad tag or attempt")
		}
		p, err := payloadOf(string(kw) == "DELIVERY_BASE64", rest)
		if err != nil {
			return bad("%v", err)
		}
		return Reply{Kind: ReplyDelivery, Delivery: Delivery{
			Tag: tag, MessageID: string(f[1]), Attempt: uint32(attempt), Topic: string(f[3]), Payload: p,
		}}, nil
	}
	return bad("unknown reply %q", truncate(kw, 32))
}

// cutSpace returns the bytes before the first space and the bytes after it.
func cutSpace(b []byte) (before, after []byte) {
	before, after, _ = bytes.Cut(b, []byte(" "))
	return before, after
}

func payloadOf(b64 bool, p []byte) ([]byte, error) {
	if b64 {
		out, err := base64.StdEncoding.AppendDecode(nil, p)
		if err != nil {
			return nil, err
		}
		p = out
	}
	if len(p) == 0 {
		return nil, nil
	}
	return bytes.Clone(p), nil
}

func appendOneLine(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\n' || c == '\r' {
			c = ' '
		}
		dst = append(dst, c)
	}
	return dst
}
