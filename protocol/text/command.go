package text

import (
	"bytes"
	"strconv"
	"strings"
	"time"

	"github.com/spoolmq/spool/protocol"
)

// Verb is a text command.
type Verb uint8

// The commands of the text mode (docs/protocol.md section 11).
const (
	// VerbNone is the zero Command: a blank line, which the server ignores.
	VerbNone Verb = iota
	// VerbPublish: PUBLISH <topic> <payload...>
	VerbPublish
	// VerbSubscribe: SUBSCRIBE <topic-or-pattern> [FROM_NOW | FROM_BEGINNING |
	// FROM_TIMESTAMP <rfc3339> | FROM_MESSAGE_ID <id>] [FILTER <expression...>]
	VerbSubscribe
	// VerbJoinGroup: JOIN_GROUP <group> <consumer-id>
	VerbJoinGroup
	// VerbAck: ACK <tag> [<tag>...]
	VerbAck
	// VerbNack: NACK <tag> [<tag>...]
	VerbNack
	// VerbUnsubscribe: UNSUBSCRIBE [<topic-or-pattern>]
	VerbUnsubscribe
	// VerbVerbose: VERBOSE [ON | OFF]
	VerbVerbose
	// VerbAuth: AUTH <token>
	VerbAuth
	// VerbPing: PING
	VerbPing
	// VerbHelp: HELP
	VerbHelp
	// VerbQuit: QUIT
	VerbQuit
)

var verbNames = [...]string{
	VerbNone: "", VerbPublish: "PUBLISH", VerbSubscribe: "SUBSCRIBE", VerbJoinGroup: "JOIN_GROUP",
	VerbAck: "ACK", VerbNack: "NACK", VerbUnsubscribe: "UNSUBSCRIBE", VerbVerbose: "VERBOSE",
	VerbAuth: "AUTH", VerbPing: "PING", VerbHelp: "HELP", VerbQuit: "QUIT",
}

// String returns the command's keyword.
func (v Verb) String() string {
	if int(v) < len(verbNames) {
		return verbNames[v]
	}
	return "Verb(" + strconv.Itoa(int(v)) + ")"
}

// Command is one parsed command line. Which fields are set depends on Verb.
type Command struct {
	Verb Verb
	// Topic is the topic of PUBLISH, the topic or pattern of SUBSCRIBE, and the optional pattern
	// of UNSUBSCRIBE ("" means every subscription of the session).
	Topic string
	// Payload is the rest of a PUBLISH line after the topic and one space, verbatim (spaces
	// included); nil when empty.
	Payload []byte
	// Start is the optional start position of SUBSCRIBE (zero: FROM_NOW).
	Start protocol.StartPosition
	// Filter is the optional member filter of SUBSCRIBE: the rest of the line after the FILTER
	// keyword, trimmed (it may contain blanks; the server checks its syntax).
	Filter string
	// Group and Member are the arguments of JOIN_GROUP; Ordered is its optional ORDERED (the
	// group's members own partitions and get them in offset order).
	Group   string
	Member  string
	Ordered bool
	// Tags are the delivery tags of ACK and NACK.
	Tags []uint64
	// On is the argument of VERBOSE (no argument means ON).
	On bool
	// Token is the argument of AUTH.
	Token string
}

func invalid(format string, args ...any) error {
	return protocol.ErrInvalidArgument.Errorf(format, args...)
}

// Parse parses one line (without its terminator; see LineReader). Keywords are case-insensitive
// and fields are separated by spaces or tabs. A blank line parses to the zero Command and no
// error. Errors are *protocol.Error: UNKNOWN_COMMAND for an unknown keyword, INVALID_ARGUMENT for
// wrong arguments; the server replies "ERR <NAME> <message>".
//
// Parse checks the syntax only: names, patterns and groups are validated by the server.
func Parse(line []byte) (Command, error) {
	if i := bytes.IndexByte(line, '\n'); i >= 0 {
		return Command{}, invalid("the line contains a newline at byte %d", i)
	}
	if n := len(line); n > 0 && line[n-1] == '\r' {
		return Command{}, invalid("the line ends with a carriage return")
	}
	rest := trimLeft(line)
	if len(rest) == 0 {
		return Command{}, nil
	}
	kw, rest := cutField(rest)
	verb := lookupVerb(kw)
	if verb == VerbPublish {
		return parsePublish(rest)
	}
	var filter []byte
	if verb == VerbSubscribe {
		rest, filter = cutFilter(rest)
	}
	if verb == VerbNone {
		return Command{}, protocol.ErrUnknownCommand.Errorf("unknown command %q; send HELP for the list", truncate(kw, 32))
	}
	args, err := fields(rest)
	if err != nil {
		return Command{}, err
	}
	c := Command{Verb: verb}
	nargs := func(min, max int, usage string) error {
		if len(args) < min || len(args) > max {
			return invalid("usage: %s", usage)
		}
		return nil
	}
	switch verb {
	case VerbSubscribe:
		if err := nargs(1, 3, "SUBSCRIBE <topic-or-pattern> [FROM_NOW | FROM_BEGINNING | FROM_TIMESTAMP <rfc3339> | FROM_MESSAGE_ID <id>] [FILTER <expression>]"); err != nil {
			return Command{}, err
		}
		c.Topic = args[0]
		if c.Start, err = parseStart(args[1:]); err != nil {
			return Command{}, err
		}
		if filter != nil {
			if len(filter) == 0 {
				return Command{}, invalid("SUBSCRIBE: FILTER needs an expression (for example FILTER region=eu)")
			}
			for i, ch := range filter {
				if ch < 0x20 && ch != '\t' || ch == 0x7f {
					return Command{}, invalid("SUBSCRIBE: FILTER: control character at byte %d", i)
				}
			}
			c.Filter = string(filter)
		}
	case VerbJoinGroup:
		if len(args) > 3 && strings.EqualFold(args[3], "BATCH") {
			// Said plainly: a batch is settled as a unit, which ACK <tag> lines do not express.
			return Command{}, invalid("JOIN_GROUP: BATCH: per-key batches are not available in the text mode (a batch is acked or nacked as a unit); use the binary protocol's Subscribe batch_size")
		}
		if err := nargs(2, 3, "JOIN_GROUP <group> <consumer-id> [ORDERED]"); err != nil {
			return Command{}, err
		}
		c.Group, c.Member = args[0], args[1]
		if len(args) == 3 {
			if !strings.EqualFold(args[2], "ORDERED") {
				return Command{}, invalid("JOIN_GROUP: %q: the third argument can only be ORDERED", args[2])
			}
			c.Ordered = true
		}
	case VerbAck, VerbNack:
		if len(args) == 0 {
			return Command{}, invalid("usage: %s <tag> [<tag>...]", verb)
		}
		c.Tags = make([]uint64, len(args))
		for i, a := range args {
			t, err := strconv.ParseUint(a, 10, 64)
			if err != nil || t == 0 {
				return Command{}, invalid("%s: delivery tag %q is not a positive integer", verb, truncate([]byte(a), 32))
			}
			c.Tags[i] = t
		}
	case VerbUnsubscribe:
		if err := nargs(0, 1, "UNSUBSCRIBE [<topic-or-pattern>]"); err != nil {
			return Command{}, err
		}
		if len(args) == 1 {
			c.Topic = args[0]
		}
	case VerbVerbose:
		if err := nargs(0, 1, "VERBOSE [ON | OFF]"); err != nil {
			return Command{}, err
		}
		c.On = true
		if len(args) == 1 {
			switch {
			case strings.EqualFold(args[0], "ON"):
			case strings.EqualFold(args[0], "OFF"):
				c.On = false
			default:
				return Command{}, invalid("usage: VERBOSE [ON | OFF]")
			}
		}
	case VerbAuth:
		if err := nargs(1, 1, "AUTH <token>"); err != nil {
			return Command{}, err
		}
		c.Token = args[0]
	case VerbPing, VerbHelp, VerbQuit:
		if err := nargs(0, 0, verb.String()); err != nil {
			return Command{}, err
		}
	}
	return c, nil
}

func parsePublish(rest []byte) (Command, error) {
	topic, after := cutField(trimLeft(rest))
	if len(topic) == 0 {
		return Command{}, invalid("usage: PUBLISH <topic> <payload...>")
	}
	if err := checkToken(topic); err != nil {
		return Command{}, err
	}
	c := Command{Verb: VerbPublish, Topic: string(topic)}
	// after starts with the separator that ended the topic; the payload is everything after it.
	if len(after) > 1 {
		c.Payload = bytes.Clone(after[1:])
	}
	return c, nil
}

// cutFilter splits the arguments of SUBSCRIBE at the first field FILTER (case-insensitive) after
// the topic: it returns what comes before it and the rest of the line after it, trimmed (not nil,
// possibly empty); filter is nil without FILTER.
func cutFilter(b []byte) (args, filter []byte) {
	_, rest := cutField(trimLeft(b)) // the topic, whatever its name
	for {
		rest = trimLeft(rest)
		if len(rest) == 0 {
			return b, nil
		}
		start := len(b) - len(rest)
		var f []byte
		f, rest = cutField(rest)
		if strings.EqualFold(string(f), "FILTER") {
			return b[:start], append([]byte{}, bytes.TrimRight(trimLeft(rest), " \t")...)
		}
	}
}

func parseStart(args []string) (protocol.StartPosition, error) {
	var s protocol.StartPosition
	if len(args) == 0 {
		return s, nil
	}
	kind, ok := protocol.ParseStartKind(args[0])
	if !ok {
		return s, invalid("unknown start position %q: want FROM_NOW, FROM_BEGINNING, FROM_TIMESTAMP <rfc3339> or FROM_MESSAGE_ID <id>", truncate([]byte(args[0]), 32))
	}
	s.Kind = kind
	needValue := kind == protocol.StartFromTimestamp || kind == protocol.StartFromMessageID
	if needValue != (len(args) == 2) {
		if needValue {
			return s, invalid("%s needs a value", kind)
		}
		return s, invalid("%s takes no value", kind)
	}
	switch kind {
	case protocol.StartFromTimestamp:
		t, err := time.Parse(time.RFC3339Nano, args[1])
		if err != nil {
			return s, invalid("FROM_TIMESTAMP %q: want an RFC 3339 time such as 2025-01-31T08:00:00Z", truncate([]byte(args[1]), 40))
		}
		t = t.UTC()
		if y := t.Year(); y < 1 || y > 9999 {
			// An offset can move a year-0000 or year-9999 time out of the range RFC 3339 can write.
			return s, invalid("FROM_TIMESTAMP %q: the time in UTC must fall in years 0001 to 9999", truncate([]byte(args[1]), 40))
		}
		s.Time = t
	case protocol.StartFromMessageID:
		if _, _, err := protocol.ParseMessageID(args[1]); err != nil {
			return s, invalid("FROM_MESSAGE_ID %q: want OFFSET or PARTITION:OFFSET", truncate([]byte(args[1]), 40))
		}
		s.MessageID = args[1]
	}
	return s, nil
}

// AppendCommand appends c as a line, "\n" included. It fails with INVALID_ARGUMENT for a value the
// line syntax cannot carry: an empty or blank-containing argument, a control character, a payload
// with a newline or ending in a carriage return.
func AppendCommand(dst []byte, c Command) ([]byte, error) {
	n0 := len(dst)
	fail := func(err error) ([]byte, error) { return dst[:n0], err }
	dst = append(dst, c.Verb.String()...)
	args := func(vals ...string) error {
		for _, v := range vals {
			if err := checkToken([]byte(v)); err != nil {
				return err
			}
			if v == "" {
				return invalid("%s: empty argument", c.Verb)
			}
			dst = append(dst, ' ')
			dst = append(dst, v...)
		}
		return nil
	}
	var err error
	switch c.Verb {
	case VerbPublish:
		if err = args(c.Topic); err == nil && len(c.Payload) > 0 {
			if bytes.IndexByte(c.Payload, '\n') >= 0 || c.Payload[len(c.Payload)-1] == '\r' {
				return fail(invalid("PUBLISH: the payload contains a newline or ends with a carriage return"))
			}
			dst = append(dst, ' ')
			dst = append(dst, c.Payload...)
		}
	case VerbSubscribe:
		err = args(c.Topic)
		if err == nil {
			err = appendStart(&dst, c.Start)
		}
		if err == nil && c.Filter != "" {
			if strings.ContainsAny(c.Filter, "\r\n") {
				return fail(invalid("SUBSCRIBE: the filter contains a line break"))
			}
			dst = append(dst, " FILTER "...)
			dst = append(dst, c.Filter...)
		}
	case VerbJoinGroup:
		err = args(c.Group, c.Member)
		if err == nil && c.Ordered {
			dst = append(dst, " ORDERED"...)
		}
	case VerbAck, VerbNack:
		if len(c.Tags) == 0 {
			return fail(invalid("%s: no tags", c.Verb))
		}
		for _, t := range c.Tags {
			if t == 0 {
				return fail(invalid("%s: tag 0", c.Verb))
			}
			dst = append(dst, ' ')
			dst = strconv.AppendUint(dst, t, 10)
		}
	case VerbUnsubscribe:
		if c.Topic != "" {
			err = args(c.Topic)
		}
	case VerbVerbose:
		if c.On {
			dst = append(dst, " ON"...)
		} else {
			dst = append(dst, " OFF"...)
		}
	case VerbAuth:
		err = args(c.Token)
	case VerbPing, VerbHelp, VerbQuit:
	default:
		return fail(invalid("no command"))
	}
	if err != nil {
		return fail(err)
	}
	return append(dst, '\n'), nil
}

func appendStart(dst *[]byte, s protocol.StartPosition) error {
	switch s.Kind {
	case protocol.StartFromNow, protocol.StartFromBeginning:
		if !s.Time.IsZero() || s.MessageID != "" {
			return invalid("SUBSCRIBE: %s takes no value", s.Kind)
		}
		if s.Kind == protocol.StartFromBeginning {
			*dst = append(*dst, " FROM_BEGINNING"...)
		}
	case protocol.StartFromTimestamp:
		if s.MessageID != "" {
			return invalid("SUBSCRIBE: FROM_TIMESTAMP takes no message id")
		}
		if y := s.Time.UTC().Year(); y < 1 || y > 9999 {
			return invalid("SUBSCRIBE: FROM_TIMESTAMP year %d is outside 0001 to 9999", y)
		}
		*dst = append(*dst, " FROM_TIMESTAMP "...)
		*dst = s.Time.UTC().AppendFormat(*dst, time.RFC3339Nano)
	case protocol.StartFromMessageID:
		if !s.Time.IsZero() {
			return invalid("SUBSCRIBE: FROM_MESSAGE_ID takes no time")
		}
		if _, _, err := protocol.ParseMessageID(s.MessageID); err != nil {
			return invalid("SUBSCRIBE: FROM_MESSAGE_ID %q: want OFFSET or PARTITION:OFFSET", s.MessageID)
		}
		*dst = append(*dst, " FROM_MESSAGE_ID "...)
		*dst = append(*dst, s.MessageID...)
	default:
		return invalid("SUBSCRIBE: undefined start kind %d", s.Kind)
	}
	return nil
}

func lookupVerb(kw []byte) Verb {
	for v := VerbPublish; int(v) < len(verbNames); v++ {
		if len(kw) == len(verbNames[v]) && strings.EqualFold(string(kw), verbNames[v]) {
			return v
		}
	}
	return VerbNone
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' }

func trimLeft(b []byte) []byte {
	for len(b) > 0 && isBlank(b[0]) {
		b = b[1:]
	}
	return b
}

// cutField returns the bytes up to the first blank, and the rest starting at that blank.
func cutField(b []byte) (field, rest []byte) {
	for i, c := range b {
		if isBlank(c) {
			return b[:i], b[i:]
		}
	}
	return b, nil
}

// fields splits b on runs of blanks; every field must be free of control characters.
func fields(b []byte) ([]string, error) {
	var out []string
	for {
		b = trimLeft(b)
		if len(b) == 0 {
			return out, nil
		}
		var f []byte
		f, b = cutField(b)
		if err := checkToken(f); err != nil {
			return nil, err
		}
		out = append(out, string(f))
	}
}

// checkToken rejects control characters (and blanks) inside an argument.
func checkToken(f []byte) error {
	for i, c := range f {
		if c < 0x20 || c == 0x7f || c == ' ' {
			return invalid("argument %q: control character or blank at byte %d", truncate(f, 32), i)
		}
	}
	return nil
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

// httpMethods are the request methods a browser (or any HTTP client) may send.
var httpMethods = []string{"GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "CONNECT", "TRACE"}

// IsHTTP reports whether line is an HTTP/1 request line ("POST / HTTP/1.1") or a Host header.
// A server closes such a session without running any of its lines: a web page can make a
// browser send a request whose body holds text-mode commands to the text port (a cross-protocol
// request), and the request's own lines would otherwise only be answered ERR.
func IsHTTP(line []byte) bool {
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(line) >= 5 && bytes.EqualFold(line[:5], []byte("host:")) {
		return true
	}
	f := bytes.Fields(line)
	if len(f) != 3 || !bytes.HasPrefix(f[2], []byte("HTTP/")) {
		return false
	}
	for _, m := range httpMethods {
		if string(f[0]) == m {
			return true
		}
	}
	return false
}
