package server

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"github.com/spoolmq/spool/internal/netwrite"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolmq/spool/internal/auth"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/errmap"
	"github.com/spoolmq/spool/internal/metrics"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// Connection modes, told apart by the first byte (protocol.IsBinary).
const (
	modeBinary = "binary"
	modeText   = "text"
)

// lingerTimeout and lingerMaxBytes bound the wait for a client to close after the server ended
// its connection (lingerClose).
const (
	lingerTimeout  = time.Second
	lingerMaxBytes = 1 << 20
)

// maxLeftSubscriptions bounds the subscriptions of closed handles a connection remembers (acks
// for their deliveries are still accepted).
const maxLeftSubscriptions = 10_000

// session is the mode-specific half of a connection.
type session interface {
	// run is the reader goroutine's loop: it reads requests and runs them in order until the
	// session ends (the client leaves, a connection-level error, interrupt).
	run()
	// flush runs on the writer goroutine: it writes the queued responses and, unless final or
	// the connection is draining or closing, the subscriptions that ended and the deliveries
	// waiting in the members' channels; heartbeat says the heartbeat timer fired. It reports
	// whether it wrote anything. An error means the connection is broken.
	flush(final, heartbeat bool) (wrote bool, err error)
	// heartbeatInterval is the longest the writer may stay silent (0: no heartbeats).
	heartbeatInterval() time.Duration
	// goodbye starts a server-initiated close (Server.Stop).
	goodbye()
}

// outItem is one queued response: a frame (binary) or a line (text).
type outItem struct {
	corr uint32
	msg  protocol.Message
	line []byte
}

// handle is one Subscribe of a connection: a broker member.
type handle struct {
	id      uint32
	pattern string
	member  *broker.Member
	// credit is the client's credit; applied is the member's MaxInFlight and limit its queue
	// limit, -1 for none (window.go); held counts the deliveries the writer took from the member
	// and has not handed to the socket yet. All guarded by conn.mu.
	credit, applied, limit, held int
}

// conn is one accepted connection. It runs two goroutines, both counted in the server's
// WaitGroup: the reader (serve: mode detection, then session.run, then finish) and the writer
// (writeLoop). The reader owns the members (it subscribes, unsubscribes and closes them); the
// writer only reads from their channels.
type conn struct {
	srv    *Server
	nc     net.Conn
	br     *bufio.Reader
	id     string
	remote string
	opened time.Time
	logger *slog.Logger
	// ctx is the context of the connection's broker calls; cancelled when the connection ended or
	// Stop gave up waiting.
	ctx    context.Context
	cancel context.CancelFunc
	// quitCtx is ctx, also cancelled when quit closes: the throttle wait of a publish lane
	// (publish.go) ends with an interrupted or ended session instead of holding its end for up
	// to the topic's delay.
	quitCtx    context.Context
	quitCancel context.CancelFunc

	// wake (capacity 1) wakes the writer: a response was queued, deliveries arrived in a member's
	// channel (the members' Notify), a subscription ended, the server said goodbye.
	wake chan struct{}
	// flushed (capacity 1) tells a reader waiting for queue room that the writer took the queue.
	flushed chan struct{}
	// stopWriter is closed when the session ended: the writer writes what is queued and exits.
	stopWriter chan struct{}
	writerDone chan struct{}
	// quit is closed by interrupt and abort (waits of the reader end), and by finish: the
	// publishes still waiting are refused.
	quit        chan struct{}
	quitOnce    sync.Once
	closeOnce   sync.Once
	interrupted atomic.Bool
	// peerClosed is set by the reader when the client closed its side or the connection broke:
	// the socket is closed without lingering.
	peerClosed atomic.Bool
	// pub is the publish stage of a binary session (publish.go): its queue and worker.
	pub pubStage
	// nw is the socket's write side shared with the goroutines that answer without the writer
	// (binarySession.answer): what they left unwritten, and the time of the last write, from
	// which the heartbeat counts silence.
	nw *netwrite.Writer
	// principal is the authenticated client when Config.Auth is on (reader goroutine only).
	principal *auth.Principal
	// est is the largest delivery the connection was given (window.go).
	est sizeEstimate

	// mu guards the fields below. Lock order: conn.mu before the broker's locks (SetMaxInFlight is
	// called under it); the broker never calls back into the connection.
	mu   sync.Mutex
	mode string
	sess session
	// client is Hello.client_name; version the protocol version its handshake negotiated.
	client  string
	version uint16
	// out is the queue of responses for the writer.
	out []outItem
	// handles are the open subscription handles by id.
	handles    map[uint32]*handle
	nextHandle uint32
	// left are the subscriptions of closed handles: acks for their deliveries are still accepted.
	left map[int64]bool
	// labels are the metric labels (topic, group) of the subscriptions the writer delivered from.
	labels map[int64]subLabels
	// draining: the server said goodbye; no more deliveries, acks still accepted.
	draining bool
	// byeBeforeMode: the server said goodbye before the mode was known.
	byeBeforeMode bool
	// closing: the session ended; no more deliveries.
	closing bool
}

func newConn(s *Server, nc net.Conn) *conn {
	id := s.newSessionID()
	ctx, cancel := context.WithCancel(s.rootCtx)
	quitCtx, quitCancel := context.WithCancel(ctx)
	remote := nc.RemoteAddr().String()
	return &conn{
		srv:        s,
		nc:         nc,
		br:         bufio.NewReaderSize(nc, protocol.ReadBufferSize),
		id:         id,
		remote:     remote,
		opened:     time.Now(),
		nw:         netwrite.New(nc),
		logger:     s.logger.With(slog.String("session", id), slog.String("remote", remote)),
		ctx:        ctx,
		cancel:     cancel,
		quitCtx:    quitCtx,
		quitCancel: quitCancel,
		wake:       make(chan struct{}, 1),
		flushed:    make(chan struct{}, 1),
		stopWriter: make(chan struct{}),
		writerDone: make(chan struct{}),
		quit:       make(chan struct{}),
		pub:        newPubStage(),
		handles:    make(map[uint32]*handle),
		left:       make(map[int64]bool),
		labels:     make(map[int64]subLabels),
	}
}

// serve is the reader goroutine: it detects the mode, starts the writer, runs the session and
// cleans up.
func (c *conn) serve() {
	defer c.srv.wg.Done()
	defer c.srv.removeConn(c)
	defer c.cancel()

	_ = c.nc.SetReadDeadline(c.opened.Add(c.srv.cfg.HandshakeTimeout))
	first, err := c.br.Peek(1)
	if err != nil {
		c.logger.Debug("connection closed before its first byte", slog.Any("error", err))
		c.closeSocket()
		return
	}
	var sess session
	mode := modeText
	if protocol.IsBinary(first[0]) {
		mode = modeBinary
		sess = newBinarySession(c)
	} else {
		sess = newTextSession(c)
	}
	c.mu.Lock()
	c.mode, c.sess = mode, sess
	bye := c.byeBeforeMode
	c.mu.Unlock()
	c.logger.Debug("connection opened", slog.String("mode", mode))
	c.srv.cfg.Metrics.ConnectionOpened(mode)
	defer c.srv.cfg.Metrics.ConnectionClosed(mode)
	if bye {
		c.interrupt()
	}

	c.srv.wg.Add(1)
	go c.writeLoop(sess)
	sess.run()
	c.finish()
}

// finish ends the session after the reader returned: no more deliveries, the members leave (their
// leases are released at once, before anything else can block), the publishes still waiting are
// refused, the writer writes what is queued (a last Error, GoodbyeOK, ERR CLOSED), and the socket
// closes.
func (c *conn) finish() {
	// Closing quit refuses the publishes still queued or waiting for their topic's throttle:
	// CLOSED, nothing stored (docs/protocol.md 8.3), whatever ended the session (a session
	// timeout, a connection-level error, the client closing its connection, Stop). After the
	// client's Goodbye none is left: every publish read before it was answered.
	c.quitOnce.Do(c.closeQuit)
	c.mu.Lock()
	c.closing = true
	hs := c.sortedHandlesLocked()
	clear(c.handles)
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), memberCloseTimeout)
	released := 0
	for _, h := range hs {
		n, err := h.member.Leave(ctx)
		released += n
		if err != nil {
			c.logger.Warn("member leave failed", slog.String("member", h.member.ID()), slog.Any("error", err))
		}
	}
	cancel()
	// The publishes read before the session ended are answered (those appended or being
	// appended) or refused CLOSED before the writer's final flush.
	c.stopPublishes()
	close(c.stopWriter)
	<-c.writerDone
	if c.peerClosed.Load() {
		c.closeSocket()
	} else {
		c.lingerClose()
	}
	c.logger.Debug("connection closed", slog.Int("members", len(hs)), slog.Int("released", released),
		slog.Duration("age", time.Since(c.opened)))
}

// writeLoop is the writer goroutine: it flushes whenever woken, sends heartbeats when silent, and
// ends after a final flush when the session ended. A write error breaks the connection (abort),
// which ends the reader too.
func (c *conn) writeLoop(s session) {
	defer c.srv.wg.Done()
	defer close(c.writerDone)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	armed := false
	// The heartbeat timer is not reset on every write (a timer update costs about as much as the
	// rest of a small answer's work): when it fires after a write (the writer's or one made
	// without it, see nw), it is re-armed for the rest of the interval since that write.
	for {
		final, heartbeat := false, false
		select {
		case <-c.wake:
		case <-c.stopWriter:
			final = true
		case <-timer.C:
			heartbeat, armed = true, false
			if rest := s.heartbeatInterval() - c.nw.Since(time.Now()); rest > 0 {
				heartbeat, armed = false, true
				timer.Reset(rest)
			}
		}
		wrote, err := s.flush(final, heartbeat)
		if err != nil {
			c.logger.Debug("write failed, closing connection", slog.Any("error", err))
			c.abort()
			return
		}
		if final {
			return
		}
		if wrote {
			c.nw.Wrote(time.Now())
		}
		if iv := s.heartbeatInterval(); iv > 0 && !armed {
			timer.Reset(iv)
			armed = true
		}
	}
}

// signal wakes the writer.
func (c *conn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// enqueue queues a response for the writer.
func (c *conn) enqueue(it outItem) {
	c.mu.Lock()
	c.out = append(c.out, it)
	c.mu.Unlock()
	c.signal()
}

// enqueueAll queues responses for the writer.
func (c *conn) enqueueAll(its []outItem) {
	if len(its) == 0 {
		return
	}
	c.mu.Lock()
	c.out = append(c.out, its...)
	c.mu.Unlock()
	c.signal()
}

// waitRoom blocks the reader while the requests of the connection in progress (responses queued
// for the writer plus publishes queued or being appended) reach MaxQueuedResponses, or the queued
// publishes reach MaxPipelinedBytes (a client that sends requests without reading the answers, or
// faster than they are appended): the reader stops reading and TCP pushes back. It reports false
// when the connection is ending.
func (c *conn) waitRoom() bool {
	for {
		c.mu.Lock()
		n := len(c.out)
		c.mu.Unlock()
		pending, bytes := c.pub.load()
		if n+pending < c.srv.cfg.MaxQueuedResponses && (pending == 0 || bytes < c.srv.cfg.MaxPipelinedBytes) {
			return true
		}
		c.kickPublishes() // the worker must run for room to come
		select {
		case <-c.flushed:
		case <-c.pub.progress:
		case <-c.quit:
			return false
		}
	}
}

// take hands the queued responses to the writer, with the handles whose deliveries it should send
// (none when final, draining or closing).
func (c *conn) take(final bool) ([]outItem, []*handle) {
	c.mu.Lock()
	out := c.out
	c.out = nil
	var hs []*handle
	if !final && !c.draining && !c.closing {
		hs = c.sortedHandlesLocked()
	}
	c.mu.Unlock()
	select {
	case c.flushed <- struct{}{}:
	default:
	}
	return out, hs
}

// sortedHandlesLocked lists the open handles by id. c.mu must be held.
func (c *conn) sortedHandlesLocked() []*handle {
	hs := make([]*handle, 0, len(c.handles))
	for _, h := range c.handles {
		hs = append(hs, h)
	}
	slices.SortFunc(hs, func(a, b *handle) int { return cmp.Compare(a.id, b.id) })
	return hs
}

// addHandle registers a new handle after queuing its response (SubscribeOK, OK), so that the
// writer sends the response before any delivery of the handle. credit is the client's credit:
// the member, given what initialCredit allowed, gets it with its queue limit (window.go). A
// handle added while the server drains gets no credit.
func (c *conn) addHandle(pattern string, m *broker.Member, credit int, reply func(id uint32) outItem) *handle {
	c.mu.Lock()
	c.nextHandle++
	h := &handle{id: c.nextHandle, pattern: pattern, member: m, credit: credit, applied: m.MaxInFlight(), limit: -1}
	c.out = append(c.out, reply(h.id))
	c.handles[h.id] = h
	if c.draining {
		_ = m.SetMaxInFlight(0)
	} else {
		c.applyCreditLocked(h, c.windowLocked(len(c.handles)))
	}
	c.mu.Unlock()
	c.signal()
	return h
}

// handleRoom returns LIMIT_EXCEEDED when the connection has max_subscriptions_per_connection
// handles open, else nil. Subscribes of a connection run one at a time on its reader.
func (c *conn) handleRoom() *protocol.Error {
	c.mu.Lock()
	n := len(c.handles)
	c.mu.Unlock()
	if limit := c.srv.cfg.MaxSubscriptionsPerConn; n >= limit {
		return protocol.ErrLimitExceeded.Errorf("this connection has %d subscriptions open, the server's max_subscriptions_per_connection: unsubscribe one or open another connection", n)
	}
	return nil
}

// removeHandles unregisters the handles for which keep returns false and remembers their
// subscriptions (acks of their deliveries stay valid). The caller closes their members.
func (c *conn) removeHandles(drop func(*handle) bool) []*handle {
	var subs [][]broker.Attachment
	c.mu.Lock()
	hs := c.sortedHandlesLocked()
	c.mu.Unlock()
	var out []*handle
	for _, h := range hs {
		if drop(h) {
			out = append(out, h)
			subs = append(subs, h.member.Subscriptions())
		}
	}
	c.mu.Lock()
	for i, h := range out {
		delete(c.handles, h.id)
		for _, a := range subs[i] {
			if len(c.left) < maxLeftSubscriptions {
				c.left[a.SubscriptionID] = true
			}
		}
	}
	c.mu.Unlock()
	return out
}

// handleClosedByBroker is called by the writer when a member's channel was closed: if the handle is
// still registered (the reader did not close it), the broker closed the member (it stopped), and
// the handle is dropped. It reports whether the handle was still registered.
func (c *conn) handleClosedByBroker(h *handle) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.handles[h.id] != h {
		return false
	}
	delete(c.handles, h.id)
	return true
}

// member returns the id of an open handle's member attached to subscription sub, or, when the
// connection only had such a handle, the session id; ok is false for a subscription the connection
// never joined.
func (c *conn) memberFor(sub int64) (id string, ok bool) {
	c.mu.Lock()
	hs := c.sortedHandlesLocked()
	left := c.left[sub]
	c.mu.Unlock()
	for _, h := range hs {
		if h.member.AttachedTo(sub) {
			return h.member.ID(), true
		}
	}
	return c.id, left
}

// holders lists the open handles whose member is attached to subscription sub.
func (c *conn) holders(sub int64) []*handle {
	c.mu.Lock()
	hs := c.sortedHandlesLocked()
	c.mu.Unlock()
	out := hs[:0]
	for _, h := range hs {
		if h.member.AttachedTo(sub) {
			out = append(out, h)
		}
	}
	return out
}

// eachHolder settles refs of one subscription through the handles hs attached to it (usually
// one: holders, or the handle a text delivery tag names): only the member holding a lease may
// nack or extend it, so op runs on each handle in turn with what the previous ones did not hold,
// and returns what it did not hold. A handle whose member closed or whose subscription is gone
// (subscriptionGone: deleted, or cancelled, perhaps by another broker instance while the member
// is still attached here) is passed over: it holds no lease of the subscription. eachHolder
// returns the refs no handle held, or op's first other error.
func (c *conn) eachHolder(hs []*handle, refs []storage.DeliveryRef, op func(h *handle, refs []storage.DeliveryRef) (notHeld []storage.DeliveryRef, err error)) ([]storage.DeliveryRef, error) {
	for _, h := range hs {
		notHeld, err := op(h, refs)
		if errors.Is(err, broker.ErrMemberClosed) || subscriptionGone(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		refs = notHeld
		if len(refs) == 0 {
			break
		}
	}
	return refs, nil
}

// subLabels are the metric labels of a subscription.
type subLabels struct{ topic, group string }

// deliveredBatch records the metrics of the deliveries a writer sends in one go (see
// metrics.DeliveryObserver).
type deliveredBatch struct {
	obs     metrics.DeliveryObserver
	lastSub int64  // the subscription of the last delivery (0: none)
	group   string // its group label
}

// delivered records metrics of a delivery the writer is about to send on h, in batch b.
func (c *conn) delivered(b *deliveredBatch, h *handle, d *storage.Delivery) {
	if d.SubscriptionID != b.lastSub {
		b.lastSub, b.group = d.SubscriptionID, c.groupOf(h, d)
	}
	b.obs.Observe(d.Topic, b.group, d.Attempt, d.PublishedAt)
}

// groupOf returns the group label of d's subscription and records its labels in c.labels for the
// acks and nacks of its deliveries: the subscription's group (broker.Member.SubscriptionGroup),
// "$queue" or "$ephemeral-<id>" for a member without a group, as the scrape-time metrics name it.
func (c *conn) groupOf(h *handle, d *storage.Delivery) string {
	if l, ok := c.labelsOf(d.SubscriptionID); ok {
		return l.group
	}
	group := h.member.SubscriptionGroup(d.SubscriptionID)
	c.mu.Lock()
	if _, ok := c.labels[d.SubscriptionID]; !ok && len(c.labels) < maxLeftSubscriptions {
		c.labels[d.SubscriptionID] = subLabels{topic: d.Topic, group: group}
	}
	c.mu.Unlock()
	return group
}

// labelsOf returns the metric labels of a subscription the connection received deliveries from.
func (c *conn) labelsOf(sub int64) (subLabels, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.labels[sub]
	return l, ok
}

// observeAck and observeNack record settled deliveries of subscription sub.
func (c *conn) observeAck(sub int64, n int) {
	if l, ok := c.labelsOf(sub); ok && n > 0 {
		c.srv.cfg.Metrics.ObserveAck(l.topic, l.group, n)
	}
}

// nacked and dead are the engine's counts (metrics.Metrics.ObserveNack).
func (c *conn) observeNack(sub int64, nacked, dead int) {
	if l, ok := c.labelsOf(sub); ok {
		c.srv.cfg.Metrics.ObserveNack(l.topic, l.group, nacked, dead)
	}
}

// observePublish records a publish call.
func (c *conn) observePublish(topic string, n int, start time.Time, err error) {
	if err != nil {
		c.srv.cfg.Metrics.ObservePublishError(errmap.ErrorFrom(err).Name)
		return
	}
	c.srv.cfg.Metrics.ObservePublish(topic, n, time.Since(start))
}

// goodbye starts a server-initiated close.
func (c *conn) goodbye() {
	c.mu.Lock()
	sess := c.sess
	if sess == nil {
		c.byeBeforeMode = true
	}
	c.mu.Unlock()
	if sess == nil {
		c.interrupt()
		return
	}
	sess.goodbye()
}

// interrupt ends the session: waits of the reader return and a blocked read fails at once. The
// reader checks the flag after every read deadline it sets, so a deadline set concurrently cannot
// undo the interrupt.
func (c *conn) interrupt() {
	c.interrupted.Store(true)
	c.quitOnce.Do(c.closeQuit)
	_ = c.nc.SetReadDeadline(time.Now())
}

// abort breaks the connection: the socket is closed, so the reader's and the writer's pending
// reads and writes fail.
func (c *conn) abort() {
	c.interrupted.Store(true)
	c.quitOnce.Do(c.closeQuit)
	c.closeSocket()
}

// setReadDeadline sets the read deadline of the next read and reports false when the session was
// interrupted meanwhile.
func (c *conn) setReadDeadline(t time.Time) bool {
	_ = c.nc.SetReadDeadline(t)
	return !c.interrupted.Load()
}

// closeQuit closes quit and cancels quitCtx (once, through quitOnce).
func (c *conn) closeQuit() {
	close(c.quit)
	c.quitCancel()
}

func (c *conn) closeSocket() {
	c.closeOnce.Do(func() { _ = c.nc.Close() })
}

// lingerClose closes a connection the server ends while the client may still be sending: it
// half-closes, then reads and discards what the client still sends until it closes too (or
// lingerTimeout passes). Closing with unread input would make the kernel send a reset, which can
// destroy the last frames (an Error, ERR CLOSED) before the client reads them.
func (c *conn) lingerClose() {
	lingerClose(c.nc, lingerTimeout)
	c.closeSocket()
}

// lingerClose half-closes nc and drains its input for at most d.
func lingerClose(nc net.Conn, d time.Duration) {
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		if cw.CloseWrite() != nil {
			return
		}
	}
	_ = nc.SetReadDeadline(time.Now().Add(d))
	_, _ = io.Copy(io.Discard, io.LimitReader(nc, lingerMaxBytes))
}

func (c *conn) modeName() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mode
}

func (c *conn) info() SessionInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	info := SessionInfo{ID: c.id, Mode: c.mode, Remote: c.remote, Client: c.client, ProtocolVersion: int(c.version),
		Opened: c.opened, Members: []string{}}
	for _, h := range c.sortedHandlesLocked() {
		info.Members = append(info.Members, h.member.ID())
	}
	return info
}
