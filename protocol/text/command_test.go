package text

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/protocol"
)

// The seed-002 milestone lines parse as written (seed-002-requirements.md sections 4.1-4.3).
func TestParseSeedCommands(t *testing.T) {
	t.Parallel()
	cases := []struct {
		line string
		want Command
	}{
		{"PUBLISH orders.created hello-world", Command{Verb: VerbPublish, Topic: "orders.created", Payload: []byte("hello-world")}},
		{"SUBSCRIBE orders.created", Command{Verb: VerbSubscribe, Topic: "orders.created"}},
		{"JOIN_GROUP order-processors consumer-1", Command{Verb: VerbJoinGroup, Group: "order-processors", Member: "consumer-1"}},
		{"JOIN_GROUP g c ordered", Command{Verb: VerbJoinGroup, Group: "g", Member: "c", Ordered: true}},
		{"PUBLISH orders.created message-10", Command{Verb: VerbPublish, Topic: "orders.created", Payload: []byte("message-10")}},
		{"PUBLISH orders.created test-persistence", Command{Verb: VerbPublish, Topic: "orders.created", Payload: []byte("test-persistence")}},
		{"SUBSCRIBE sensors.*.temperature", Command{Verb: VerbSubscribe, Topic: "sensors.*.temperature"}},
		{"SUBSCRIBE test.#", Command{Verb: VerbSubscribe, Topic: "test.#"}},
	}
	for _, c := range cases {
		got, err := Parse([]byte(c.line))
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", c.line, got, err, c.want)
		}
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	ts := time.Date(2025, 1, 31, 7, 0, 0, 500, time.UTC)
	cases := []struct {
		line string
		want Command
	}{
		{"", Command{}},
		{"   \t ", Command{}},
		{"publish t a  b ", Command{Verb: VerbPublish, Topic: "t", Payload: []byte("a  b ")}},
		{"PUBLISH t  leading", Command{Verb: VerbPublish, Topic: "t", Payload: []byte(" leading")}},
		{"PUBLISH\tt\tx\ty", Command{Verb: VerbPublish, Topic: "t", Payload: []byte("x\ty")}},
		{"PUBLISH t", Command{Verb: VerbPublish, Topic: "t"}},
		{"PUBLISH t ", Command{Verb: VerbPublish, Topic: "t"}},
		{"PUBLISH t {\"id\": 1, \"ok\": true}", Command{Verb: VerbPublish, Topic: "t", Payload: []byte(`{"id": 1, "ok": true}`)}},
		{"PUBLISH t caf\xc3\xa9 \x01", Command{Verb: VerbPublish, Topic: "t", Payload: []byte("caf\xc3\xa9 \x01")}},
		{"  Subscribe   a.b   from_beginning ", Command{Verb: VerbSubscribe, Topic: "a.b", Start: protocol.StartPosition{Kind: protocol.StartFromBeginning}}},
		{"SUBSCRIBE a FROM_NOW", Command{Verb: VerbSubscribe, Topic: "a"}},
		{"SUBSCRIBE a FROM_TIMESTAMP 2025-01-31T08:00:00.0000005+01:00", Command{Verb: VerbSubscribe, Topic: "a", Start: protocol.StartPosition{Kind: protocol.StartFromTimestamp, Time: ts}}},
		{"SUBSCRIBE a FROM_MESSAGE_ID 3:17", Command{Verb: VerbSubscribe, Topic: "a", Start: protocol.StartPosition{Kind: protocol.StartFromMessageID, MessageID: "3:17"}}},
		{"SUBSCRIBE a FILTER region=eu", Command{Verb: VerbSubscribe, Topic: "a", Filter: "region=eu"}},
		{"subscribe a from_beginning filter  region in (eu, us) AND !test \t", Command{Verb: VerbSubscribe, Topic: "a",
			Start: protocol.StartPosition{Kind: protocol.StartFromBeginning}, Filter: "region in (eu, us) AND !test"}},
		{"SUBSCRIBE FILTER FILTER x exists", Command{Verb: VerbSubscribe, Topic: "FILTER", Filter: "x exists"}},
		{"ACK 1", Command{Verb: VerbAck, Tags: []uint64{1}}},
		{"nack 3 4\t5", Command{Verb: VerbNack, Tags: []uint64{3, 4, 5}}},
		{"UNSUBSCRIBE", Command{Verb: VerbUnsubscribe}},
		{"UNSUBSCRIBE orders.#", Command{Verb: VerbUnsubscribe, Topic: "orders.#"}},
		{"VERBOSE", Command{Verb: VerbVerbose, On: true}},
		{"verbose off", Command{Verb: VerbVerbose}},
		{"AUTH abc.def", Command{Verb: VerbAuth, Token: "abc.def"}},
		{"PING", Command{Verb: VerbPing}},
		{"help", Command{Verb: VerbHelp}},
		{"QUIT", Command{Verb: VerbQuit}},
	}
	for _, c := range cases {
		got, err := Parse([]byte(c.line))
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", c.line, got, err, c.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		line string
		want *protocol.Error
		msg  string
	}{
		{"FETCH x", protocol.ErrUnknownCommand, "HELP"},
		{"GET / HTTP/1.1", protocol.ErrUnknownCommand, "GET"},
		{"PUBLISH", protocol.ErrInvalidArgument, "usage: PUBLISH"},
		{"PUBLISH   ", protocol.ErrInvalidArgument, "usage"},
		{"PUBLISH t\x00x y", protocol.ErrInvalidArgument, "control"},
		{"SUBSCRIBE", protocol.ErrInvalidArgument, "usage: SUBSCRIBE"},
		{"SUBSCRIBE a b", protocol.ErrInvalidArgument, "start position"},
		{"SUBSCRIBE a FROM_TIMESTAMP", protocol.ErrInvalidArgument, "needs a value"},
		{"SUBSCRIBE a FROM_TIMESTAMP yesterday", protocol.ErrInvalidArgument, "RFC 3339"},
		{"SUBSCRIBE 0 FROM_TIMESTAMP 0000-01-01T0:00:00+01:00", protocol.ErrInvalidArgument, "years 0001 to 9999"},
		{"SUBSCRIBE 0 FROM_TIMESTAMP 9999-12-31T23:30:00-01:00", protocol.ErrInvalidArgument, "years 0001 to 9999"},
		{"SUBSCRIBE a FROM_BEGINNING 5", protocol.ErrInvalidArgument, "takes no value"},
		{"SUBSCRIBE a FROM_MESSAGE_ID x:1", protocol.ErrInvalidArgument, "PARTITION:OFFSET"},
		{"JOIN_GROUP g", protocol.ErrInvalidArgument, "usage: JOIN_GROUP"},
		{"JOIN_GROUP g m x", protocol.ErrInvalidArgument, "can only be ORDERED"},
		{"JOIN_GROUP g m ORDERED x", protocol.ErrInvalidArgument, "usage: JOIN_GROUP"},
		{"JOIN_GROUP g m ORDERED BATCH 10", protocol.ErrInvalidArgument, "not available in the text mode"},
		{"ACK", protocol.ErrInvalidArgument, "usage: ACK"},
		{"ACK 0", protocol.ErrInvalidArgument, "positive"},
		{"NACK 1 x", protocol.ErrInvalidArgument, "positive"},
		{"ACK 18446744073709551616", protocol.ErrInvalidArgument, "positive"},
		{"VERBOSE maybe", protocol.ErrInvalidArgument, "VERBOSE"},
		{"AUTH", protocol.ErrInvalidArgument, "AUTH"},
		{"PING now", protocol.ErrInvalidArgument, "PING"},
		{"UNSUBSCRIBE a b", protocol.ErrInvalidArgument, "UNSUBSCRIBE"},
		{"PUBLISH t x\r", protocol.ErrInvalidArgument, "carriage return"},
		{"PUBLISH t x\ny", protocol.ErrInvalidArgument, "newline"},
		{"SUBSCRIBE a\rb", protocol.ErrInvalidArgument, "control"},
		{"SUBSCRIBE a FILTER", protocol.ErrInvalidArgument, "FILTER needs an expression"},
		{"SUBSCRIBE a FILTER  \t", protocol.ErrInvalidArgument, "FILTER needs an expression"},
		{"SUBSCRIBE a FILTER x=\x01", protocol.ErrInvalidArgument, "control character at byte 2"},
		{"SUBSCRIBE a FROM_NOW x FILTER y=z", protocol.ErrInvalidArgument, "takes no value"},
	}
	for _, c := range cases {
		got, err := Parse([]byte(c.line))
		var pe *protocol.Error
		if !errors.As(err, &pe) || !errors.Is(err, c.want) || !strings.Contains(pe.Message, c.msg) {
			t.Errorf("Parse(%q) = %+v, %v; want %s mentioning %q", c.line, got, err, c.want.Name, c.msg)
		}
		if !reflect.DeepEqual(got, Command{}) {
			t.Errorf("Parse(%q) returned %+v with an error", c.line, got)
		}
	}
}

func TestAppendCommandRoundTrip(t *testing.T) {
	t.Parallel()
	cmds := []Command{
		{Verb: VerbPublish, Topic: "orders.created", Payload: []byte("hello-world")},
		{Verb: VerbPublish, Topic: "t", Payload: []byte("  spaced\tpayload ")},
		{Verb: VerbPublish, Topic: "t"},
		{Verb: VerbSubscribe, Topic: "a.*", Start: protocol.StartPosition{Kind: protocol.StartFromTimestamp, Time: time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)}},
		{Verb: VerbSubscribe, Topic: "a.#", Start: protocol.StartPosition{Kind: protocol.StartFromBeginning}},
		{Verb: VerbSubscribe, Topic: "a", Start: protocol.StartPosition{Kind: protocol.StartFromMessageID, MessageID: "17"}},
		{Verb: VerbSubscribe, Topic: "a", Filter: "region in (eu, us), !test"},
		{Verb: VerbJoinGroup, Group: "g", Member: "m-1"},
		{Verb: VerbAck, Tags: []uint64{1, 2, 18446744073709551615}},
		{Verb: VerbNack, Tags: []uint64{9}},
		{Verb: VerbUnsubscribe}, {Verb: VerbUnsubscribe, Topic: "x"},
		{Verb: VerbVerbose, On: true}, {Verb: VerbVerbose},
		{Verb: VerbAuth, Token: "tok"}, {Verb: VerbPing}, {Verb: VerbHelp}, {Verb: VerbQuit},
	}
	for _, c := range cmds {
		line, err := AppendCommand(nil, c)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if line[len(line)-1] != '\n' {
			t.Fatalf("%q: no newline", line)
		}
		got, err := Parse(line[:len(line)-1])
		if err != nil || !reflect.DeepEqual(got, c) {
			t.Errorf("Parse(AppendCommand(%+v)) = %+v, %v (line %q)", c, got, err, line)
		}
	}
	line, _ := AppendCommand(nil, Command{Verb: VerbPublish, Topic: "orders.created", Payload: []byte("hello-world")})
	if string(line) != "PUBLISH orders.created hello-world\n" {
		t.Fatalf("got %q", line)
	}
}

func TestAppendCommandErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []Command{
		{},
		{Verb: VerbPublish},
		{Verb: VerbPublish, Topic: "a b"},
		{Verb: VerbPublish, Topic: "t", Payload: []byte("x\ny")},
		{Verb: VerbPublish, Topic: "t", Payload: []byte("x\r")},
		{Verb: VerbJoinGroup, Group: "g"},
		{Verb: VerbAck},
		{Verb: VerbAck, Tags: []uint64{0}},
		{Verb: VerbSubscribe, Topic: "t", Start: protocol.StartPosition{Kind: protocol.StartFromNow, MessageID: "1"}},
		{Verb: VerbSubscribe, Topic: "t", Start: protocol.StartPosition{Kind: protocol.StartFromMessageID, MessageID: "x"}},
		{Verb: VerbSubscribe, Topic: "t", Start: protocol.StartPosition{Kind: 9}},
		{Verb: VerbSubscribe, Topic: "t", Start: protocol.StartPosition{Kind: protocol.StartFromTimestamp, Time: time.Date(0, 12, 31, 23, 0, 0, 0, time.UTC)}},
		{Verb: VerbAuth, Token: "a\tb"},
	} {
		dst := []byte("keep")
		out, err := AppendCommand(dst, c)
		if !errors.Is(err, protocol.ErrInvalidArgument) || string(out) != "keep" {
			t.Errorf("AppendCommand(%+v) = %q, %v; want INVALID_ARGUMENT and dst unchanged", c, out, err)
		}
	}
}

func TestVerbString(t *testing.T) {
	t.Parallel()
	if VerbJoinGroup.String() != "JOIN_GROUP" || Verb(200).String() != "Verb(200)" {
		t.Fatal("Verb.String")
	}
}

func TestIsHTTP(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		line string
		want bool
	}{
		{"POST / HTTP/1.1", true},
		{"GET /index.html HTTP/1.0\r", true},
		{"OPTIONS * HTTP/1.1", true},
		{"Host: 127.0.0.1:9092", true},
		{"host:localhost", true},
		{"PUBLISH orders HTTP/1.1", false}, // a payload, not a method
		{"PUBLISH orders.created {\"a\":1}", false},
		{"post / HTTP/1.1", false}, // methods are case-sensitive
		{"GET / HTTP", false},
		{"SUBSCRIBE orders", false},
		{"", false},
	} {
		if got := IsHTTP([]byte(c.line)); got != c.want {
			t.Errorf("IsHTTP(%q) = %v, want %v", c.line, got, c.want)
		}
	}
}
