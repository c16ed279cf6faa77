package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/protocol"
	"github.com/spoolmq/spool/protocol/text"
)

// fastPublisherIdle keeps the one-shot publisher sessions of these tests short.
func fastPublisherIdle(c *Config) { c.TextPublisherIdle = 100 * time.Millisecond }

// TestTextSeedMilestone1 plays seed 002's M1-1 and M1-2 over TCP as Debian's nc does (it does not
// half-close when its input ends): the publisher session is closed by the server after
// text_publisher_idle, the subscriber prints the exact MESSAGE line.
func TestTextSeedMilestone1(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fastPublisherIdle, nil)

	pub := e.dialText()
	pub.send("PUBLISH orders.created hello-world")
	if got := pub.expectEOF(); !slices.Equal(got, []string{"OK 0"}) {
		t.Fatalf("publisher read %q, want [OK 0] then the server closing", got)
	}

	sub := e.dialText()
	sub.send("SUBSCRIBE orders.created")
	sub.expect("OK subscribed orders.created")
	sub.expectLine("MESSAGE orders.created hello-world")
	// A message published while the subscriber waits arrives too.
	pub2 := e.dialText()
	pub2.send("PUBLISH orders.created second message with  spaces ")
	pub2.expect("OK 1")
	sub.expectLine("MESSAGE orders.created second message with  spaces ")

	// Input that ends (nc -N, ncat) closes a session without subscription at once.
	half := e.dialText()
	half.send("PUBLISH orders.created third")
	_ = half.nc.(*net.TCPConn).CloseWrite()
	if got := half.expectEOF(); !slices.Equal(got, []string{"OK 2"}) {
		t.Fatalf("half-closed publisher read %q", got)
	}
}

// TestTextGroupSharesMessages plays seed 002's M2-1: two terminals in one group, ten one-shot
// publishers; every message appears in exactly one terminal.
func TestTextGroupSharesMessages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fastPublisherIdle, nil)
	consumers := make([]*tclient, 2)
	for i := range consumers {
		c := e.dialText()
		c.send(fmt.Sprintf("JOIN_GROUP order-processors consumer-%d", i+1), "SUBSCRIBE orders.created")
		c.expect(fmt.Sprintf("OK group order-processors consumer consumer-%d", i+1))
		c.expect("OK subscribed orders.created group order-processors consumer consumer-")
		consumers[i] = c
	}
	for i := 1; i <= 10; i++ {
		p := e.dialText()
		p.send(fmt.Sprintf("PUBLISH orders.created message-%d", i))
		p.expect("OK ")
		p.nc.Close()
	}
	seen := map[string]int{}
	lines := make(chan string, 10)
	for _, c := range consumers {
		go func() {
			for {
				l, err := c.tryLine()
				if err != nil {
					return
				}
				lines <- l
			}
		}()
	}
	for range 10 {
		select {
		case l := <-lines:
			seen[l]++
		case <-time.After(waitTimeout):
			t.Fatalf("got %v, want 10 messages", seen)
		}
	}
	for i := 1; i <= 10; i++ {
		if n := seen[fmt.Sprintf("MESSAGE orders.created message-%d", i)]; n != 1 {
			t.Fatalf("message-%d seen %d times: %v", i, n, seen)
		}
	}
	// Nothing more is on its way: both members hold their messages (session-long leases).
	var held int
	for _, m := range e.b.Members() {
		held += m.InFlight
	}
	if held != 10 {
		t.Fatalf("members hold %d deliveries, want 10", held)
	}
	for _, c := range consumers {
		c.nc.Close()
	}
}

// TestTextAckNackVerbose covers delivery tags: VERBOSE shows them, ACK completes, NACK hands the
// message to the other member, QUIT releases what the session holds.
func TestTextAckNackVerbose(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fastPublisherIdle, nil)
	a := e.dialText()
	a.send("VERBOSE ON", "JOIN_GROUP g a", "SUBSCRIBE jobs FROM_BEGINNING")
	a.expect("OK verbose on")
	a.expect("OK group g consumer a")
	a.expect("OK subscribed jobs")
	p := e.dialText()
	p.send("PUBLISH jobs p0", "PUBLISH jobs p1")
	p.expect("OK 0")
	p.expect("OK 1")
	a.expectLine("DELIVERY 1 0 1 jobs p0")
	a.expectLine("DELIVERY 2 1 1 jobs p1")
	a.send("ACK 1")
	a.expect("OK 1 acked")
	a.send("ACK 1")
	a.expect("OK 0 acked, 1 already done")
	a.send("ACK 7")
	a.expect("ERR INVALID_ARGUMENT unknown delivery tag 7")

	b := e.dialText()
	b.send("JOIN_GROUP g b", "SUBSCRIBE jobs")
	b.expect("OK group g consumer b")
	b.expect("OK subscribed jobs")
	a.send("NACK 2")
	a.expect("OK 1 nacked")
	b.expectLine("MESSAGE jobs p1")
	b.send("QUIT")
	b.expect("OK BYE (1 deliveries released)")
	b.expectEOF()
	// Released at once, back to a, third attempt.
	a.expectLine("DELIVERY 3 1 3 jobs p1")
	a.send("UNSUBSCRIBE jobs")
	a.expect("OK unsubscribed 1, 1 deliveries released")
	if st := e.groupStats("jobs", ""); st.Pending != 1 || st.InFlight != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestTextCloseReleasesAtOnce plays seed 002's M2-8: killing an nc consumer (its socket closes)
// hands its messages to the other member at once, although text leases last 24 h. The server
// reads the end of input and notices the gone peer by the end-of-input probe (docs/protocol.md
// 11.5), over TCP and over TLS, where an empty write on the TLS connection would send nothing.
func TestTextCloseReleasesAtOnce(t *testing.T) {
	t.Parallel()
	t.Run("TCP", func(t *testing.T) {
		t.Parallel()
		testTextCloseReleasesAtOnce(t, newEnv(t, fastPublisherIdle, nil))
	})
	t.Run("TLS", func(t *testing.T) {
		t.Parallel()
		testTextCloseReleasesAtOnce(t, newTLSEnv(t, fastPublisherIdle, nil))
	})
}

func testTextCloseReleasesAtOnce(t *testing.T, e *env) {
	a := e.dialText()
	a.send("JOIN_GROUP g consumer-1", "SUBSCRIBE work")
	a.expect("OK group")
	a.expect("OK subscribed")
	p := e.dialText()
	p.send("PUBLISH work w1")
	p.expect("OK 0")
	a.expect("MESSAGE work w1")
	b := e.dialText()
	b.send("JOIN_GROUP g consumer-2", "SUBSCRIBE work")
	b.expect("OK group")
	b.expect("OK subscribed")
	a.nc.Close() // Ctrl+C on nc
	b.expectLine("MESSAGE work w1")
}

// TestTextHalfCloseKeepsDelivering: ncat and nc -N half-close when their input ends; a session
// with a subscription keeps delivering. When such a client goes away later, nothing reaches the
// server until it writes again: the next delivery (answered with a reset) ends the session.
func TestTextHalfCloseKeepsDelivering(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fastPublisherIdle, nil)
	c := e.dialText()
	c.send("SUBSCRIBE halfclose")
	if err := c.nc.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	c.expect("OK subscribed halfclose")
	c.expect("# end of input")
	p := e.dialText()
	p.send("PUBLISH halfclose still-listening")
	p.expect("OK 0")
	c.expect("MESSAGE halfclose still-listening")
	c.nc.Close()
	p.send("PUBLISH halfclose wake-up")
	p.expect("OK 1")
	eventually(t, "member gone", func() error {
		if n := len(e.b.Members()); n != 0 {
			return fmt.Errorf("%d members", n)
		}
		return nil
	})
}

// TestTextErrors checks the error replies; the session survives each of them.
func TestTextErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.MaxLineLength = 1024 }, nil)
	c := e.dialText()
	c.send("PING")
	c.expect("OK PONG")
	for _, tc := range []struct{ line, want string }{
		{"FROB x", "ERR UNKNOWN_COMMAND"},
		{"PUBLISH bad..topic x", "ERR INVALID_ARGUMENT"},
		{"SUBSCRIBE a.#.b", "ERR INVALID_ARGUMENT"},
		{"SUBSCRIBE a FROM_MESSAGE_ID x", "ERR INVALID_ARGUMENT"},
		{"JOIN_GROUP bad/group c", "ERR INVALID_ARGUMENT"},
		{"UNSUBSCRIBE nothing", "ERR UNKNOWN_HANDLE"},
		{"ACK 1", "ERR INVALID_ARGUMENT"},
		{"PUBLISH ok " + strings.Repeat("x", 2000), "ERR LINE_TOO_LONG"},
		{"AUTH secret", "OK authentication is not required"},
		{"UNSUBSCRIBE", "OK unsubscribed 0"},
	} {
		c.send(tc.line)
		c.expect(tc.want)
	}
	c.send("HELP")
	for _, want := range text.HelpLines {
		c.expectLine("# " + want)
	}
	c.expect("OK")
	c.send("PUBLISH ok after-errors")
	c.expect("OK 0")
}

// TestTextBinaryPayloadAndShutdown: a payload that is not printable arrives base64-encoded; at
// shutdown a text session reads ERR CLOSED, then the server closes it.
func TestTextBinaryPayloadAndShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.GoodbyeGrace = 200 * time.Millisecond }, nil)
	c := e.dialText()
	c.send("SUBSCRIBE bin")
	c.expect("OK subscribed bin")
	bc := e.dial(nil)
	expectOK[*protocol.PublishOK](bc, &protocol.Publish{Topic: "bin", Messages: []protocol.PublishMessage{{Partition: protocol.PartitionAuto, Payload: []byte{0, 1, '\n', 0xff}}}})
	r := parseReply(t, c.expect("MESSAGE_BASE64 bin "))
	if r.Kind != text.ReplyMessage || string(r.Delivery.Payload) != "\x00\x01\n\xff" {
		t.Fatalf("reply %+v", r)
	}

	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- e.srv.Stop(ctx) }()
	if got := c.expectEOF(); len(got) != 1 || !strings.HasPrefix(got[0], "ERR CLOSED") {
		t.Fatalf("text session read %q at shutdown", got)
	}
	bc.expectClosed() // answers nothing to the server's Goodbye: closed after the grace period
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

// TestTextFirstLineHandshakeTimeout: the first line of a text session has the handshake timeout
// (docs/protocol.md 11.5), not text_publisher_idle, and running out of it is answered with ERR
// SESSION_TIMEOUT instead of a silent close. text_publisher_idle is an hour here, so only the
// handshake timeout can end the session.
func TestTextFirstLineHandshakeTimeout(t *testing.T) {
	t.Parallel()
	// Not shorter: see TestHandshakeTimeout.
	e := newEnv(t, func(c *Config) {
		c.HandshakeTimeout = 500 * time.Millisecond
		c.TextPublisherIdle = time.Hour
	}, nil)
	c := e.dialText()
	if _, err := io.WriteString(c.nc, "PUBL"); err != nil {
		t.Fatal(err)
	}
	got := c.expectEOF()
	if len(got) != 1 || got[0] != "ERR SESSION_TIMEOUT no complete line within 500ms of connecting" {
		t.Fatalf("got %q, want one ERR SESSION_TIMEOUT line", got)
	}
	if st := e.srv.Stats(); st.SessionTimeouts != 1 {
		t.Fatalf("stats %+v, want 1 session timeout", st)
	}
}

// TestTextRefusesHTTP: a browser's request to the text port (a web page's fetch with text-mode
// commands in its body) is closed at its request line; nothing of it runs.
func TestTextRefusesHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, nil)
	pub := e.dialText()
	pub.send("PUBLISH xproto.orders first")
	pub.expect("OK 0")

	for _, first := range []string{"POST / HTTP/1.1", "Host: 127.0.0.1:9092"} {
		c := e.dialText()
		body := "PUBLISH xproto.orders injected\n"
		req := first + "\r\nContent-Type: text/plain\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
		if _, err := io.WriteString(c.nc, req); err != nil {
			t.Fatal(err)
		}
		if got := c.expectEOF(); len(got) != 0 {
			t.Fatalf("%q: read %q, want the connection closed without an answer", first, got)
		}
	}
	pub.send("PUBLISH xproto.orders second")
	pub.expect("OK 1") // offset 1: no injected message took it
}
