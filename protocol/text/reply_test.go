package text

import (
	"errors"
	"reflect"
	"testing"

	"github.com/spoolmq/spool/protocol"
)

func TestAppendReplies(t *testing.T) {
	t.Parallel()
	cases := []struct {
		got, want string
	}{
		// The seed's M1-2 expectation, byte for byte.
		{string(AppendMessage(nil, "orders.created", []byte("hello-world"))), "MESSAGE orders.created hello-world\n"},
		{string(AppendMessage(nil, "t", nil)), "MESSAGE t \n"},
		{string(AppendMessage(nil, "t", []byte("caf\xc3\xa9\tok"))), "MESSAGE t caf\xc3\xa9\tok\n"},
		{string(AppendMessage(nil, "t", []byte("a\nb"))), "MESSAGE_BASE64 t YQpi\n"},
		{string(AppendMessage(nil, "t", []byte{0xff, 0x00})), "MESSAGE_BASE64 t /wA=\n"},
		{string(AppendDelivery(nil, Delivery{Tag: 3, MessageID: "1:7", Attempt: 2, Topic: "t", Payload: []byte("p q")})), "DELIVERY 3 1:7 2 t p q\n"},
		{string(AppendDelivery(nil, Delivery{Tag: 4, MessageID: "8", Attempt: 1, Topic: "t", Payload: []byte("\x1b[2J")})), "DELIVERY_BASE64 4 8 1 t G1sySg==\n"},
		{string(AppendOK(nil, "")), "OK\n"},
		{string(AppendOK(nil, "0")), "OK 0\n"},
		{string(AppendOK(nil, "two\nlines")), "OK two lines\n"},
		{string(AppendErr(nil, protocol.ErrTopicNotFound.WithMessage("topic \"x\"\r\ndoes not exist"))), "ERR TOPIC_NOT_FOUND topic \"x\"  does not exist\n"},
		{string(AppendErr(nil, errors.New("boom"))), "ERR INTERNAL boom\n"},
		{string(AppendErr(nil, protocol.ErrClosed)), "ERR CLOSED\n"},
		{string(AppendErr(nil, &protocol.Error{Code: 299, Message: "new"})), "ERR CODE_299 new\n"},
		{string(AppendInfo(nil, "hello")), "# hello\n"},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestParseReply(t *testing.T) {
	t.Parallel()
	cases := []struct {
		line string
		want Reply
	}{
		{"OK", Reply{Kind: ReplyOK}},
		{"OK 3:17", Reply{Kind: ReplyOK, Text: "3:17"}},
		{"ERR LEASE_NOT_HELD tag 4", Reply{Kind: ReplyErr, Err: protocol.ErrLeaseNotHeld.WithMessage("tag 4")}},
		{"ERR CODE_201 x", Reply{Kind: ReplyErr, Err: protocol.ErrInternal.WithMessage("x")}},
		{"ERR CODE_299", Reply{Kind: ReplyErr, Err: &protocol.Error{Code: 299}}},
		{"ERR SOMETHING_NEW", Reply{Kind: ReplyErr, Err: &protocol.Error{Name: "SOMETHING_NEW"}}},
		{"MESSAGE orders.created hello-world", Reply{Kind: ReplyMessage, Delivery: Delivery{Topic: "orders.created", Payload: []byte("hello-world")}}},
		{"MESSAGE t", Reply{Kind: ReplyMessage, Delivery: Delivery{Topic: "t"}}},
		{"MESSAGE_BASE64 t YQpi", Reply{Kind: ReplyMessage, Delivery: Delivery{Topic: "t", Payload: []byte("a\nb")}}},
		{"DELIVERY 3 1:7 2 t p q", Reply{Kind: ReplyDelivery, Delivery: Delivery{Tag: 3, MessageID: "1:7", Attempt: 2, Topic: "t", Payload: []byte("p q")}}},
		{"DELIVERY_BASE64 4 8 1 t G1sySg==", Reply{Kind: ReplyDelivery, Delivery: Delivery{Tag: 4, MessageID: "8", Attempt: 1, Topic: "t", Payload: []byte("\x1b[2J")}}},
		{"# help text", Reply{Kind: ReplyInfo, Text: "help text"}},
	}
	for _, c := range cases {
		got, err := ParseReply([]byte(c.line))
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("ParseReply(%q) = %+v, %v; want %+v", c.line, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "NOPE", "ERR", "MESSAGE", "MESSAGE_BASE64 t !!", "DELIVERY 0 1 1 t x", "DELIVERY 1 1 x t p", "DELIVERY 1 1 1", "OK\tx", "OK x\r"} {
		if _, err := ParseReply([]byte(bad)); !errors.Is(err, protocol.ErrMalformedFrame) {
			t.Errorf("ParseReply(%q): want MALFORMED_FRAME, got %v", bad, err)
		}
	}
}

func TestReplyRoundTrip(t *testing.T) {
	t.Parallel()
	for _, r := range []Reply{
		{Kind: ReplyOK}, {Kind: ReplyOK, Text: "PONG"},
		{Kind: ReplyErr, Err: protocol.ErrUnknownCommand.WithMessage("unknown command \"X\"")},
		{Kind: ReplyInfo, Text: "x"},
		{Kind: ReplyMessage, Delivery: Delivery{Topic: "a.b", Payload: []byte{0, 1, 2}}},
		{Kind: ReplyDelivery, Delivery: Delivery{Tag: 1, MessageID: "0", Attempt: 1, Topic: "a", Payload: []byte("x")}},
	} {
		line, err := AppendReply(nil, r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseReply(line[:len(line)-1])
		if err != nil || !reflect.DeepEqual(got, r) {
			t.Errorf("round trip of %+v: %+v, %v", r, got, err)
		}
	}
	for _, r := range []Reply{{}, {Kind: ReplyErr}, {Kind: ReplyOK, Text: "a\nb"}, {Kind: ReplyMessage}, {Kind: ReplyMessage, Delivery: Delivery{Topic: "t", Tag: 1}}, {Kind: ReplyDelivery, Delivery: Delivery{Topic: "t"}}} {
		if _, err := AppendReply(nil, r); err == nil {
			t.Errorf("AppendReply(%+v): want an error", r)
		}
	}
}

func TestPrintable(t *testing.T) {
	t.Parallel()
	for p, want := range map[string]bool{"": true, "hello world": true, "tab\there": true, "é€😀": true,
		"\x00": false, "a\nb": false, "a\rb": false, "\x7f": false, "\u0085": false, "\xff": false, "\xc3": false} {
		if got := Printable([]byte(p)); got != want {
			t.Errorf("Printable(%q) = %v", p, got)
		}
	}
}

func TestHelpLinesArePrintable(t *testing.T) {
	t.Parallel()
	for _, l := range HelpLines {
		if !Printable([]byte(l)) || len(l) > 110 {
			t.Errorf("help line %q", l)
		}
	}
}
