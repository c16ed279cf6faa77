package server

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
	"github.com/spoolmq/spool/protocol"
)

// consumerHandle returns the one handle open on the server's connections, or nil.
func (e *env) consumerHandle() *handle {
	_, h := e.consumerConn()
	return h
}

// A consumer over real TCP that never reads, with 1 MB messages and the largest credit: the
// deliveries queued for its connection and not written stay within max_conn_buffer_bytes (4 of
// them) for its whole life, where the whole backlog (40 MB) used to wait in its member's channel
// until the write stall ended the session; also when its leases expire while its writer is
// blocked (their credit comes back, but not to a stalled connection). Nothing is lost: another
// consumer gets all of it.
func TestConnBufferBoundsConsumerThatDoesNotRead(t *testing.T) {
	for _, tc := range []struct {
		name    string
		lease   time.Duration
		timeout time.Duration
		// read is how many deliveries the consumer reads (and holds) before it stops reading.
		read int
	}{
		{"default lease", 0, time.Second, 0},
		{"leases expiring while stalled", 2 * time.Second, 6 * time.Second, 12},
	} {
		t.Run(tc.name, func(t *testing.T) { testConnBuffer(t, tc.lease, tc.timeout, tc.read) })
	}
}

func testConnBuffer(t *testing.T, lease, timeout time.Duration, read int) {
	const n, size = 40, 1_000_000
	e := newEnv(t, func(c *Config) {
		c.MaxConnBufferBytes = 4 << 20
		c.MinHeartbeatInterval = time.Millisecond
		c.HeartbeatInterval = 100 * time.Millisecond
		c.SessionTimeout = timeout // ends the session of the consumer that never reads
	}, nil)
	defer e.close()
	pub := e.dial(&protocol.Hello{ClientName: "test", HeartbeatInterval: 5 * time.Second})
	payload := strings.Repeat("x", size)
	for range n {
		pub.publish("big", payload)
	}

	stuck := e.dial(nil)
	stuck.send(&protocol.Subscribe{Topic: "big", MaxInFlight: uint32(e.srv.cfg.MaxCredit), LeaseDuration: lease})
	if read > 0 {
		stuck.deliveriesN(read) // then it stops reading; their leases expire while it is stalled
	}
	window := (4 << 20) / (size + 64) // deliveries of this size that fit in the bound
	seen, most := false, 0
	for deadline := time.Now().Add(waitTimeout); ; {
		h := e.consumerHandle()
		if h == nil {
			if seen {
				break // the session ended
			}
		} else {
			seen = true
			most = max(most, len(h.member.Deliveries()))
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session of a consumer that does not read did not end")
		}
		time.Sleep(time.Millisecond)
	}
	if most > window {
		t.Fatalf("up to %d deliveries of %d bytes waited for the connection, want at most %d (max_conn_buffer_bytes 4 MiB)", most, size, window)
	}
	t.Logf("at most %d deliveries queued (window %d)", most, window)

	// A consumer with a long heartbeat (session timeout 10 intervals): reading 40 MB must not
	// end its session.
	c := e.dial(&protocol.Hello{ClientName: "test", HeartbeatInterval: 5 * time.Second})
	c.subscribe(&protocol.Subscribe{Topic: "big", MaxInFlight: 100})
	ds := c.deliveriesN(n)
	seenOffsets := map[int64]bool{}
	for _, d := range ds {
		seenOffsets[d.Offset] = true
	}
	if len(seenOffsets) != n {
		t.Fatalf("another consumer got %d distinct messages, want %d", len(seenOffsets), n)
	}
}

// A text session that never acks holds its deliveries only for text_ack_timeout: then it is
// closed with SESSION_TIMEOUT and the other consumer of the queue gets them (it used to wait for
// text_ack_wait, 24 h).
func TestTextSessionThatNeverAcksReleasesAfterTimeout(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.TextAckTimeout = 200 * time.Millisecond }, nil)
	defer e.close()
	pub := e.dial(nil)
	pub.publish("jobs", "a", "b", "c")

	tc := e.dialText()
	tc.send("SUBSCRIBE jobs")
	tc.expect("OK subscribed jobs")
	for range 3 {
		tc.expect("MESSAGE jobs ")
	}
	other := e.dial(nil)
	other.subscribe(&protocol.Subscribe{Topic: "jobs", MaxInFlight: 10})
	// Heartbeats keep the connection's reads from timing out: bound the wait here.
	for deadline := time.Now().Add(waitTimeout); len(other.deliveries) < 3; {
		if time.Now().After(deadline) {
			t.Fatalf("the other consumer got %d of the 3 messages the idle text session holds", len(other.deliveries))
		}
		other.keep(other.read())
	}
	got := payloadsOf(other.deliveriesN(3))
	if strings.Join(got, ",") != "a,b,c" {
		t.Fatalf("the other consumer got %v, want a,b,c", got)
	}
	lines := tc.expectEOF()
	if len(lines) == 0 || !strings.HasPrefix(lines[len(lines)-1], "ERR SESSION_TIMEOUT") {
		t.Fatalf("the idle session's last lines: %q, want ERR SESSION_TIMEOUT", lines)
	}
}

func TestConfigConnBufferAndTextAckTimeout(t *testing.T) {
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.MaxConnBufferBytes = 1000 }, "max_conn_buffer_bytes"},
		{func(c *Config) { c.MaxConnBufferBytes = 2 << 30 }, "max_conn_buffer_bytes"},
		{func(c *Config) { c.TextAckTimeout = -time.Second }, "text_ack_timeout"},
		{func(c *Config) { c.TextAckWait = time.Minute; c.TextAckTimeout = time.Hour }, "text_ack_timeout"},
	} {
		c := Config{}
		tc.mod(&c)
		err := c.WithDefaults().Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error naming %s", err, tc.want)
		}
	}
	c := Config{TextAckWait: time.Minute}.WithDefaults()
	if err := c.Validate(); err != nil || c.TextAckTimeout != time.Minute {
		t.Fatalf("text_ack_wait 1m: text_ack_timeout %s, %v; want 1m (the default is at most text_ack_wait)", c.TextAckTimeout, err)
	}
}

// A Subscribe with max_in_flight 0 gets the broker's default credit, windowed from the first
// claim: the member used to start with the default unbounded (initialCredit(0) was 0, which the
// broker reads as its default, up to 65536) until the handle was registered.
func TestSubscribeDefaultCreditIsWindowed(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.MaxConnBufferBytes = 64 << 10
		c.MaxMessageSize = 64 << 10
	}, func(b *broker.Config) { b.DefaultMaxInFlight = 1000 })
	defer e.close()
	e.dial(nil)
	conns := e.srv.snapshot()
	if len(conns) != 1 {
		t.Fatalf("%d connections, want 1", len(conns))
	}
	credit, initial := conns[0].subscribeCredit(0)
	if credit != 1000 {
		t.Fatalf("credit = %d, want the broker's default 1000", credit)
	}
	if initial != 1 {
		t.Fatalf("initial member credit = %d, want the window 1 (64 KiB bound, 64 KiB messages)", initial)
	}
	if credit, initial := conns[0].subscribeCredit(5000); credit != 5000 || initial != 1 {
		t.Fatalf("subscribeCredit(5000) = %d, %d; want 5000, 1", credit, initial)
	}
}

// text_ack_timeout also ends a session that keeps writing (here PING after PING) while it holds
// deliveries: the check ran only when the writer had been silent for a while, so such a session
// kept its deliveries for text_ack_wait (24 h). The timeout is on the server's clock, a fake one
// here: the writer's check timer (every text_ack_timeout/8, 7.5 min) never fires during the
// test, only the flushes the PINGs cause can end the session.
func TestTextAckTimeoutWhileSessionKeepsWriting(t *testing.T) {
	clock := storagetest.NewFakeClock(time.Now())
	e := newEnv(t, func(c *Config) {
		c.TextAckTimeout = time.Hour
		c.Clock = clock
	}, nil)
	defer e.close()
	pub := e.dial(nil)
	pub.publish("jobs", "a")

	tc := e.dialText()
	tc.send("SUBSCRIBE jobs")
	tc.expect("OK subscribed jobs")
	tc.expect("MESSAGE jobs ")
	tc.send("PING")
	tc.expectLine("OK PONG") // within the timeout: the session goes on
	clock.Advance(time.Hour)
	for deadline := time.Now().Add(waitTimeout); ; {
		if time.Now().After(deadline) {
			t.Fatal("a session that keeps writing while holding a delivery was not closed by text_ack_timeout")
		}
		_, _ = io.WriteString(tc.nc, "PING\n")
		l, err := tc.tryLine()
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if strings.HasPrefix(l, "ERR SESSION_TIMEOUT") {
			break
		}
		if l != "OK PONG" {
			t.Fatalf("got %q, want OK PONG", l)
		}
	}
}

// The tags of a subscription that ended under a text session (its topic deleted) are dropped
// when the session is told: they used to stay, and kept text_ack_timeout counting for deliveries
// the session no longer held.
func TestTextTagsOfEndedSubscriptionDropped(t *testing.T) {
	e := newEnv(t, nil, nil)
	defer e.close()
	pub := e.dial(nil)
	pub.publish("gone", "a", "b")

	tc := e.dialText()
	tc.send("SUBSCRIBE gone")
	tc.expect("OK subscribed gone")
	tc.expect("MESSAGE gone ")
	tc.expect("MESSAGE gone ")
	if err := e.b.DeleteTopic(context.Background(), "gone", true); err != nil {
		t.Fatal(err)
	}
	tc.expect("# subscription ")
	var ts *textSession
	for _, c := range e.srv.snapshot() {
		c.mu.Lock()
		if s, ok := c.sess.(*textSession); ok {
			ts = s
		}
		c.mu.Unlock()
	}
	if ts == nil {
		t.Fatal("no text session")
	}
	ts.c.mu.Lock()
	held := len(ts.tags)
	ts.c.mu.Unlock()
	if held != 0 {
		t.Fatalf("%d tags held after the subscription ended, want 0", held)
	}
}

// The size estimate rises at once to a larger delivery and decays towards smaller ones: it used
// to keep the largest size ever seen, so one burst of large messages shrank the window for the
// connection's whole life.
func TestSizeEstimateDecays(t *testing.T) {
	var e sizeEstimate
	e.observe(1_000_000)
	if got := e.v.Load(); got != 1_000_000 {
		t.Fatalf("estimate %d after a 1 MB delivery, want 1000000", got)
	}
	for range maxWindow {
		e.observe(1_000)
	}
	if got := e.v.Load(); got < 300_000 {
		t.Fatalf("estimate %d after one window of small deliveries, want most of the large size kept", got)
	}
	for range 8 * maxWindow {
		e.observe(1_000)
	}
	if got := e.v.Load(); got > 10_000 {
		t.Fatalf("estimate %d after many small deliveries, want it decayed towards 1000", got)
	}
	e.observe(500_000)
	if got := e.v.Load(); got != 500_000 {
		t.Fatalf("estimate %d after a 500 kB delivery, want 500000 at once", got)
	}
}

// A delivery too large for the connection's frames is dead-lettered, not written: it does not
// count in the size estimate (it used to, shrinking the window to 1 for a long time).
func TestTooLargeDeliveryNotInSizeEstimate(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxFrameSize = protocol.MinMaxFrameSize }, nil)
	defer e.close()
	if _, err := e.b.CreateTopic(context.Background(), "sizes", storage.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 2*protocol.MinMaxFrameSize)
	for _, p := range []string{big, "small"} {
		if _, err := e.b.Publish(context.Background(), "sizes", []storage.AppendMessage{{Partition: 0, Payload: []byte(p)}}); err != nil {
			t.Fatal(err)
		}
	}
	c := e.dial(nil)
	c.subscribe(&protocol.Subscribe{Topic: "sizes", MaxInFlight: 10})
	if got := payloadsOf(c.deliveriesN(1)); got[0] != "small" {
		t.Fatalf("got %q, want the small message (the large one is dead-lettered)", got)
	}
	for _, sc := range e.srv.snapshot() {
		if est := sc.est.v.Load(); est >= int64(protocol.MinMaxFrameSize) {
			t.Fatalf("size estimate %d after a dead-lettered %d-byte delivery, want the small one's", est, len(big))
		}
	}
}

// queuedFor returns what the server holds for h now: the deliveries waiting in its member's
// channel plus those its writer took and has not handed to the socket, and h's queue limit.
func queuedFor(c *conn, h *handle) (queued, limit int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return h.member.Waiting() + h.held, h.limit
}

// consumerConn returns the one handle open on the server's connections and its connection, or
// nils.
func (e *env) consumerConn() (*conn, *handle) {
	for _, c := range e.srv.snapshot() {
		c.mu.Lock()
		for _, h := range c.handles {
			c.mu.Unlock()
			return c, h
		}
		c.mu.Unlock()
	}
	return nil, nil
}

// A consumer over real TCP stops reading while a producer publishes 1 MB messages: what the
// server holds for its connection (queued in its member plus taken by its writer) stays within
// max_conn_buffer_bytes all along, also once the writer is stalled on the full socket, and most
// of the backlog stays in the log. When the consumer reads and acks again, delivery resumes on
// the same connection and it gets every message (its credit, 20, needs the acks). Binary and
// text sessions alike.
func TestConnBufferWindowWhileConsumerStalls(t *testing.T) {
	t.Run("binary", func(t *testing.T) { testConnBufferWindow(t, false) })
	t.Run("text", func(t *testing.T) { testConnBufferWindow(t, true) })
}

func testConnBufferWindow(t *testing.T, textMode bool) {
	const n, size, credit = 40, 1_000_000, 20
	e := newEnv(t, func(c *Config) {
		c.MaxConnBufferBytes = 4 << 20
		c.TextMaxInFlight = credit
	}, nil)
	defer e.close()
	window := (4 << 20) / (size + 64)
	hello := &protocol.Hello{ClientName: "test", HeartbeatInterval: 5 * time.Second}
	var (
		bc  *bclient
		tc  *tclient
		sub *protocol.SubscribeOK
	)
	if textMode {
		tc = e.dialText()
		tc.send("SUBSCRIBE big")
		tc.expect("OK subscribed big")
	} else {
		bc = e.dial(hello)
		sub = bc.subscribe(&protocol.Subscribe{Topic: "big", MaxInFlight: credit})
	}
	c, h := e.consumerConn()
	if h == nil {
		t.Fatal("no consumer handle")
	}
	sample := func() (queued, limit int) {
		t.Helper()
		queued, limit = queuedFor(c, h)
		if queued > window {
			t.Fatalf("%d deliveries of %d bytes held for the consumer, want at most the window %d (4 MiB)", queued, size, window)
		}
		return queued, limit
	}
	pub := e.dial(hello)
	payload := strings.Repeat("x", size)
	for range n {
		pub.publish("big", payload)
		sample()
	}
	// The kernel's socket buffers fill up, then the writer waits in a write: its window is shut.
	eventually(t, "the consumer's writer stalls", func() error {
		if queued, limit := sample(); limit != 0 || queued == 0 {
			return fmt.Errorf("queued %d, queue limit %d", queued, limit)
		}
		return nil
	})
	if d := h.member.Info().Delivered; d >= n {
		t.Fatalf("the stalled consumer's member took %d of %d messages from the log", d, n)
	}

	if !textMode {
		// More credit while the writer waits for the socket gives no room beyond what it
		// holds: the new queue limit plus what the writer holds stays within the window (the
		// limit used to be the whole window again).
		bc.send(&protocol.Credit{Handle: sub.Handle, Additional: 1})
		eventually(t, "the server takes the credit", func() error {
			c.mu.Lock()
			defer c.mu.Unlock()
			if h.credit != credit+1 {
				return fmt.Errorf("credit %d", h.credit)
			}
			if h.limit+h.held > window {
				t.Fatalf("after a Credit while stalled: queue limit %d + %d held by the writer, want at most the window %d", h.limit, h.held, window)
			}
			return nil
		})
	}

	// Reading and acking resumes delivery.
	for got := 0; got < n; got++ {
		if textMode {
			for l := tc.line(); !strings.HasPrefix(l, "MESSAGE big "); l = tc.line() {
				if !strings.HasPrefix(l, "OK ") && !strings.HasPrefix(l, "# ") {
					t.Fatalf("got line %.80q, want a delivery or an ACK's answer", l)
				}
			}
			tc.send(fmt.Sprint("ACK ", got+1)) // the n-th delivery line has tag n
		} else {
			ds := bc.deliveriesN(1)
			if ds[0].Attempt != 1 {
				t.Fatalf("offset %d delivered again (attempt %d)", ds[0].Offset, ds[0].Attempt)
			}
			bc.send(&protocol.Ack{Refs: refs(ds...)})
		}
		sample()
	}
}
