package server

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolmq/spool/internal/auth"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/errmap"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// binarySession serves the binary protocol (docs/protocol.md sections 2 to 10).
type binarySession struct {
	c *conn
	// r is the reader goroutine's.
	r *protocol.Reader
	// timeout is the session timeout after the handshake (reader goroutine).
	timeout time.Duration

	// wmu guards the write side of the socket: the fields below up to dbuf, and conn.nw's
	// unwritten rest. The writer goroutine
	// holds it for a whole flush, from taking the response queue to its last byte; the goroutines
	// with answers (the reader, the publish worker) only try it, to write them themselves when
	// the writer is idle and nothing is queued for it (answer).
	wmu          sync.Mutex
	w            *protocol.Writer
	preambleSent bool
	batch        []protocol.Delivery
	batchBytes   int
	// taken is the writer's buffer for the deliveries it takes from a member (Member.Take).
	taken []*storage.Delivery
	// wTimeout is the write timeout last set, at wDeadlineSet (see flush).
	wTimeout     time.Duration
	wDeadlineSet time.Time
	// dbuf is answer's encoding buffer (what answer could not write waits in conn.nw).
	dbuf []byte

	// group holds the Ack or Nack requests read but not yet run, all of one kind
	// (reader goroutine; see run and runGroup).
	group []groupReq

	// serverCorr numbers the server's own requests (Heartbeat, Goodbye); never 0.
	serverCorr atomic.Uint32

	// version is the negotiated protocol version, the layout requests are decoded in. Reader
	// goroutine only (write sets the Writer's from HelloOK).
	version uint16

	// Guarded by c.mu: ready is set when HelloOK is queued; interval is the heartbeat interval.
	ready    bool
	interval time.Duration
}

func newBinarySession(c *conn) *binarySession {
	return &binarySession{
		c: c,
		// Until HelloOK the peer is unauthenticated and sends only Hello: frames are held to the
		// smallest max frame size a server may announce; handshake raises it.
		r: protocol.NewReader(c.br, min(c.srv.cfg.MaxFrameSize, protocol.MinMaxFrameSize)),
		w: protocol.NewWriter(stallWriter{c}, c.srv.cfg.MaxFrameSize),
	}
}

// nextCorr returns the next correlation id of a server request.
func (b *binarySession) nextCorr() uint32 {
	for {
		if id := b.serverCorr.Add(1); id != 0 {
			return id
		}
	}
}

// run is the reader loop: the handshake within the handshake timeout, then the requests in the
// order received. Publishes go to the connection's publish stage (publish.go), which appends each
// topic's publishes in order; every other request is run to completion here, in order, except
// that consecutive Acks, or consecutive Nacks, that arrived together (read one after the other
// without waiting for the socket, at most maxGather) run at once (runGroup).
// A frame of any other kind, an Ack after Nacks and so on, or a read that could wait ends the
// group: the group runs first, then that frame, so no request runs before an earlier request of
// another kind or after a later one.
func (b *binarySession) run() {
	c := b.c
	if !b.handshake() {
		return
	}
	for {
		buffered := b.nextFrameBuffered()
		if len(b.group) > 0 && (!buffered || len(b.group) >= maxGather) {
			b.runGroup()
		}
		if !buffered {
			c.kickPublishes() // the next read may block
		}
		if !c.waitRoom() || !c.setReadDeadline(time.Now().Add(b.timeout)) {
			return
		}
		f, err := b.r.ReadFrame()
		if err != nil {
			b.runGroup()
			b.readFailed(err, false)
			return
		}
		m, err := protocol.DecodeClientVersion(f, b.version)
		if err != nil {
			// A bad body leaves the stream in sync: answer and go on.
			b.runGroup()
			b.reply(f.CorrelationID, protocol.AsError(err))
			continue
		}
		if gathered(m) && f.CorrelationID != 0 {
			if len(b.group) > 0 && b.group[0].msg.Opcode() != m.Opcode() {
				b.runGroup()
			}
			b.group = append(b.group, groupReq{corr: f.CorrelationID, msg: m})
			continue
		}
		b.runGroup()
		if b.handle(f.CorrelationID, m, len(f.Body)) {
			return
		}
	}
}

// handshake reads the preamble and Hello (the read deadline set at accept still runs) and queues
// HelloOK. It reports false when the connection must close.
func (b *binarySession) handshake() bool {
	c := b.c
	if err := b.r.ReadPreamble(); err != nil {
		var pe *protocol.PreambleError
		if errors.As(err, &pe) {
			// Not a Spool client: close without answering (docs/protocol.md section 2.1).
			c.srv.stats.closedByError.Add(1)
			c.logger.Debug("bad preamble, closing", slog.Any("error", err))
			return false
		}
		b.readFailed(err, true)
		return false
	}
	f, err := b.r.ReadFrame()
	if err != nil {
		b.readFailed(err, true)
		return false
	}
	// Anything but Hello first is UNEXPECTED_FRAME (docs/protocol.md section 5), an opcode no
	// version defines included: checked before decoding, which would call it UNKNOWN_OPCODE.
	if f.Opcode != protocol.OpHello || f.CorrelationID == 0 {
		b.fail(f.CorrelationID, protocol.ErrUnexpectedFrame.Errorf("the first frame must be Hello with a non-zero correlation id, got %s with correlation id %d", f.Opcode, f.CorrelationID))
		return false
	}
	m, err := protocol.DecodeClient(f)
	if err != nil {
		b.fail(f.CorrelationID, protocol.AsError(err))
		return false
	}
	hello := m.(*protocol.Hello)
	version, err := protocol.NegotiateVersion(hello.MinVersion, hello.MaxVersion)
	if err != nil {
		b.fail(f.CorrelationID, protocol.AsError(err))
		return false
	}
	b.version = version
	if c.authOn() {
		if e := c.authenticate(hello.Token); e != nil {
			b.fail(f.CorrelationID, e)
			return false
		}
	}
	cfg := c.srv.cfg
	interval, timeout := cfg.negotiateHeartbeat(hello.HeartbeatInterval)
	b.timeout = timeout
	ok2 := &protocol.HelloOK{
		Version:           version,
		ServerName:        cfg.Name,
		SessionID:         c.id,
		HeartbeatInterval: interval,
		SessionTimeout:    timeout,
		MaxFrameSize:      uint32(cfg.MaxFrameSize),
		MaxMessageSize:    uint32(cfg.MaxMessageSize),
		// server.max_credit lets a client refuse a Credit past the cap itself: Credit has no
		// success answer, so it cannot tell an accepted raise from one whose Error is coming.
		Properties: map[string]string{"server.version": cfg.Version, "server.max_credit": strconv.Itoa(cfg.MaxCredit)},
	}
	b.r.SetMaxFrameSize(cfg.MaxFrameSize)
	c.mu.Lock()
	b.ready, b.interval = true, interval
	c.client, c.version = hello.ClientName, version
	c.out = append(c.out, outItem{corr: f.CorrelationID, msg: ok2})
	c.mu.Unlock()
	c.signal()
	c.logger.Debug("binary session opened", slog.String("client", hello.ClientName),
		slog.Duration("heartbeat", interval), slog.Duration("session_timeout", timeout))
	return true
}

// readFailed reports a read error that ends the connection: a timeout (SESSION_TIMEOUT), an
// oversize frame (FRAME_TOO_LARGE) or a bad header (MALFORMED_FRAME) get an Error frame first; the
// client closing or the connection breaking just end it.
func (b *binarySession) readFailed(err error, handshake bool) {
	c := b.c
	var tooLarge *protocol.FrameTooLargeError
	var decode *protocol.DecodeError
	switch {
	case c.interrupted.Load():
	case errors.Is(err, io.EOF):
		c.peerClosed.Store(true)
		c.logger.Debug("client closed the connection")
	case errors.Is(err, os.ErrDeadlineExceeded):
		c.srv.stats.sessionTimeouts.Add(1)
		if handshake {
			b.fail(0, protocol.ErrSessionTimeout.Errorf("handshake not completed within %s", c.srv.cfg.HandshakeTimeout))
		} else {
			b.fail(0, protocol.ErrSessionTimeout.Errorf("no frame received for %s", b.timeout))
		}
		c.logger.Debug("session timeout", slog.Bool("handshake", handshake))
	case errors.As(err, &tooLarge):
		b.fail(tooLarge.CorrelationID, protocol.ErrFrameTooLarge.Errorf("%s frame of %d bytes exceeds the max frame size %d", tooLarge.Opcode, tooLarge.Size, tooLarge.Max))
	case errors.As(err, &decode):
		b.fail(0, protocol.AsError(err))
	default:
		c.peerClosed.Store(true)
		c.logger.Debug("read failed", slog.Any("error", err))
	}
}

// fail queues a connection-level Error frame; the connection closes after it.
func (b *binarySession) fail(corr uint32, e *protocol.Error) {
	if e.Code != protocol.CodeSessionTimeout {
		b.c.srv.stats.closedByError.Add(1)
	}
	b.c.logger.Debug("closing connection with error", slog.Int("code", int(e.Code)), slog.String("error", e.Error()))
	b.c.enqueue(outItem{corr: corr, msg: e})
}

// reply sends a response (answer).
func (b *binarySession) reply(corr uint32, m protocol.Message) {
	b.answer(outItem{corr: corr, msg: m})
}

// maxDirectBuf bounds the encoding buffer answer keeps between calls.
const maxDirectBuf = 64 << 10

// answer sends responses. When the writer is idle (wmu free), nothing is queued for it and the
// connection has no subscription, the calling goroutine (the reader, or the publish worker for
// the publishes it appended) writes them to the socket itself, with a write that never waits:
// one goroutine hand-off less per request, which on a connection with one request at a time is
// most of the server's scheduling cost. What the socket does not take at once is kept (conn.nw)
// and the writer is woken: it writes that before anything else. Otherwise the responses are
// queued for the writer. Either way they leave in the order answer and enqueue were called: a
// queued response is never overtaken (the queue must be empty), and the writer holds wmu from
// taking the queue to its last byte.
func (b *binarySession) answer(its ...outItem) {
	if len(its) == 0 {
		return
	}
	if b.wmu.TryLock() {
		done := b.answerLocked(its)
		b.wmu.Unlock()
		if done {
			return
		}
	}
	b.c.enqueueAll(its)
}

// answerLocked writes its to the socket if the writer has nothing to write before them; it
// reports false when they must be queued instead. b.wmu must be held.
func (b *binarySession) answerLocked(its []outItem) bool {
	c := b.c
	if !b.preambleSent || !c.nw.CanDirect() || b.w.Buffered() > 0 {
		return false
	}
	c.mu.Lock()
	// A connection with subscriptions leaves its answers (acks mostly) to the writer, which sends
	// them in one write with the deliveries their credit makes room for.
	idle := len(c.out) == 0 && len(c.handles) == 0
	c.mu.Unlock()
	if !idle {
		return false
	}
	buf := b.dbuf[:0]
	for _, it := range its {
		start := len(buf)
		var err error
		buf, err = protocol.AppendFrameVersion(buf, it.corr, it.msg, b.version)
		if err != nil || len(buf)-start > b.w.MaxFrameSize() {
			b.dbuf = buf[:0]
			return false // the writer replaces it with an Error frame (write)
		}
	}
	switch short, err := c.nw.Direct(buf); {
	case err != nil:
		c.logger.Debug("write failed, closing connection", slog.Any("error", err))
		c.abort()
	case short:
		c.signal()
	}
	if cap(buf) > maxDirectBuf {
		buf = nil
	}
	b.dbuf = buf[:0]
	return true
}

// replyErr queues the Error frame for err (mapped by errmap.ErrorFrom); unexpected errors are logged.
func (b *binarySession) replyErr(corr uint32, err error) {
	b.reply(corr, b.errorFrame(err))
}

// errorFrame returns the Error frame for err (mapped by errmap.ErrorFrom); unexpected errors and
// storage failures are logged with every detail (the frame's message has no paths).
func (b *binarySession) errorFrame(err error) *protocol.Error {
	e := errmap.ErrorFrom(err)
	if logged(e) {
		b.c.logger.Warn("request failed", slog.String("code", e.Name), slog.Any("error", err))
	}
	return e
}

// logged reports whether an error answered to a client is worth the server's log: an unexpected
// error or a failure of the storage, whose details (files, hosts) the client's message leaves out.
func logged(e *protocol.Error) bool {
	switch e.Code {
	case protocol.CodeInternal, protocol.CodeStorageUnavailable, protocol.CodeStorageFull:
		return true
	}
	return false
}

// handle runs one request (a Publish is queued for the publish stage; size is its frame body
// size). It reports true when the session ends. Ack and Nack with a correlation id do not come
// here: run gathers them (runGroup).
func (b *binarySession) handle(corr uint32, m protocol.ClientMessage, size int) bool {
	switch m := m.(type) {
	case *protocol.HeartbeatOK:
		return false // the answer to our Heartbeat: any frame is a sign of life
	case *protocol.GoodbyeOK:
		return true // the answer to our Goodbye
	case *protocol.Credit:
		b.credit(corr, m)
		return false
	}
	if corr == 0 {
		b.reply(0, protocol.ErrUnexpectedFrame.Errorf("%s with correlation id 0: requests need a non-zero correlation id", m.Opcode()))
		return false
	}
	switch m := m.(type) {
	case *protocol.Hello:
		b.reply(corr, protocol.ErrUnexpectedFrame.Errorf("the session is already open"))
	case *protocol.Publish:
		if e := b.c.authorize(auth.Publish, m.Topic, ""); e != nil {
			b.c.observePublish(m.Topic, len(m.Messages), time.Now(), e)
			b.reply(corr, e)
		} else if err := checkDelays(m.Messages); err != nil {
			b.c.observePublish(m.Topic, len(m.Messages), time.Now(), err)
			b.replyErr(corr, err)
		} else if !b.inlinePublish() {
			b.queuePublish(corr, m, size)
		} else {
			now := time.Now()
			prompt := b.c.nw.Since(now) < promptWithin
			if it, ok := b.appendOne(pubReq{corr: corr, msg: m, start: now, size: size, prompt: prompt}); ok {
				b.reply(corr, it.msg)
			} else {
				b.queuePublish(corr, m, size) // throttled: a lane waits for it (publish.go)
			}
		}
	case *protocol.Subscribe:
		b.subscribe(corr, m)
	case *protocol.Unsubscribe:
		b.unsubscribe(corr, m)
	case *protocol.Extend:
		b.reply(corr, b.extendResult(m))
	case *protocol.Heartbeat:
		b.reply(corr, &protocol.HeartbeatOK{Echo: m.Time, Time: b.c.srv.cfg.Clock.Now()})
	case *protocol.Goodbye:
		b.clientGoodbye(corr)
		return true
	default:
		b.reply(corr, protocol.ErrUnexpectedFrame.Errorf("%s is not a client request", m.Opcode()))
	}
	return false
}

func (b *binarySession) subscribe(corr uint32, m *protocol.Subscribe) {
	c := b.c
	cfg := c.srv.cfg
	mode := storage.ModeShared
	if m.Mode == protocol.GroupOrdered {
		mode = storage.ModeOrdered
	}
	switch {
	case int64(m.MaxInFlight) > int64(cfg.MaxCredit):
		b.reply(corr, protocol.ErrInvalidArgument.Errorf("max_in_flight %d exceeds the server's cap %d", m.MaxInFlight, cfg.MaxCredit))
		return
	}
	start, err := startPosition(m.Start)
	if err != nil {
		b.replyErr(corr, err)
		return
	}
	if e := c.authorize(auth.Consume, m.Topic, m.Group); e != nil {
		b.reply(corr, e)
		return
	}
	if e := c.handleRoom(); e != nil {
		b.reply(corr, e)
		return
	}
	credit, initial := c.subscribeCredit(m.MaxInFlight)
	member, err := c.srv.broker.Subscribe(c.ctx, broker.SubscribeParams{
		Allow:         c.consumeFilter(m.Group),
		Pattern:       m.Topic,
		Group:         m.Group,
		MemberID:      m.MemberID,
		Principal:     c.principalName(),
		MaxInFlight:   initial,
		LeaseDuration: m.LeaseDuration,
		Start:         start,
		Notify:        c.wake,
		Mode:          mode,
		Filter:        m.Filter,
		BatchSize:     int(m.BatchSize), // checked by the broker (ordered members, at most 1000)
		Rejoin:        m.Rejoin,         // checked by the broker (a topic name)
	})
	if err != nil {
		b.replyErr(corr, err)
		return
	}
	subs := member.Subscriptions()
	ok := &protocol.SubscribeOK{MemberID: member.ClientID(), Subscriptions: make([]protocol.SubscriptionInfo, len(subs))}
	for i, a := range subs {
		ok.Subscriptions[i] = protocol.SubscriptionInfo{SubscriptionID: a.SubscriptionID, Topic: a.Topic}
	}
	c.addHandle(m.Topic, member, credit, func(id uint32) outItem {
		ok.Handle = id
		return outItem{corr: corr, msg: ok}
	})
}

func (b *binarySession) unsubscribe(corr uint32, m *protocol.Unsubscribe) {
	c := b.c
	hs := c.removeHandles(func(h *handle) bool { return h.id == m.Handle })
	if len(hs) == 0 {
		b.reply(corr, protocol.ErrUnknownHandle.Errorf("handle %d is not open on this connection", m.Handle))
		return
	}
	released, err := hs[0].member.Leave(c.ctx)
	if err != nil {
		b.replyErr(corr, err)
		return
	}
	b.reply(corr, &protocol.UnsubscribeOK{Released: uint32(max(released, 0))})
}

// maxGather bounds the requests of a connection that run at once (runGroup).
const maxGather = 64

// groupReq is an Ack or Nack request waiting for runGroup.
type groupReq struct {
	corr uint32
	msg  protocol.ClientMessage
}

// gathered reports whether run gathers requests like m: Ack and Nack. Not Extend: the embedded
// engine does not persist leases (an Extend waits for no fsync), and on PostgreSQL, when each
// Extend was a transaction of its own, running several at once gained nothing (32-34 ms one at a
// time against 37-48 ms together for 40 Extends; they share the lanes' transactions since, not
// measured again).
func gathered(m protocol.ClientMessage) bool {
	switch m.(type) {
	case *protocol.Ack, *protocol.Nack:
		return true
	}
	return false
}

// runGroup runs the requests gathered since the last call (all Acks or all Nacks) at the same
// time, and answers them in order. One at a time, a consumer would be held to one request per
// engine commit: one that acks many small batches (a member whose credit comes back in pieces)
// or nacks every message (a downstream outage). Run together, they share the commits, and each
// still gets its own answer: on the embedded engine the acks and nacks of a group share fsyncs
// (group commit; 40 Nacks in one burst: 0.6 ms against 6.1 ms one at a time); on PostgreSQL they
// share the combined delivery transactions of the lanes (pgstore/combine.go).
//
// The group holds one kind and runs before the next request is read, so the order between
// requests of different kinds holds. Inside a group the order is open, which shows only when two
// requests name the same delivery (docs/protocol.md section 6): of two Acks, either answer may
// count it Acked and the other AlreadyDone; of two Nacks, the one that runs first gives it back
// (Nacked or DeadLettered) and the other lists it in NotHeld.
func (b *binarySession) runGroup() {
	reqs := b.group
	switch len(reqs) {
	case 0:
		return
	case 1:
		b.reply(reqs[0].corr, b.groupResult(reqs[0].msg))
	default:
		out := make([]protocol.Message, len(reqs))
		var wg sync.WaitGroup
		for i := range reqs {
			wg.Go(func() { out[i] = b.groupResult(reqs[i].msg) })
		}
		wg.Wait()
		for i := range reqs {
			b.reply(reqs[i].corr, out[i])
		}
	}
	clear(reqs)
	b.group = reqs[:0]
}

// groupResult runs a gathered request and returns its answer. It is safe to call concurrently:
// each call builds its own answer, and what the calls share is guarded (the connection's handles
// and labels by c.mu; broker members, the broker and the metrics are safe for concurrent use).
func (b *binarySession) groupResult(m protocol.ClientMessage) protocol.Message {
	switch m := m.(type) {
	case *protocol.Ack:
		return b.ackResult(m)
	case *protocol.Nack:
		return b.nackResult(m)
	}
	return protocol.ErrInternal.Errorf("%s is not gathered", m.Opcode())
}

// ackResult runs an Ack request and returns its answer (AckOK or Error). Each subscription's refs
// are acked on their own (docs/protocol.md section 8.4): the Go client coalesces the acks of all
// its subscriptions into one Ack, and one subscription that fails must not leave the others'
// messages to come back after their lease. Refs of a subscription that is gone (subscriptionGone)
// are unknown; any other failure answers an Error (settleFailure) once every group was tried,
// except a storage failure (storageFailed): the groups after it are not tried, as theirs would
// fail alike after as long a wait.
func (b *binarySession) ackResult(m *protocol.Ack) protocol.Message {
	c := b.c
	if e := checkRefs(m.Refs); e != nil {
		return e
	}
	res := &protocol.AckOK{}
	var failed error
	for _, g := range groupRefs(m.Refs) {
		member, ok := c.memberFor(g.sub)
		if !ok {
			res.Unknown = wireRefs(res.Unknown, g.sub, g.refs)
			continue
		}
		r, err := c.ackGroup(g, member)
		if r != nil {
			c.observeAck(g.sub, r.Acked)
			res.Acked += uint32(r.Acked)
			res.AlreadyDone += uint32(r.AlreadyDone)
			res.Unknown = wireRefs(res.Unknown, g.sub, r.Unknown)
		}
		failed = settleFailure(failed, err)
		if storageFailed(err) {
			break
		}
	}
	if failed != nil {
		return b.errorFrame(failed)
	}
	return res
}

// nackResult runs a Nack request and returns its answer (NackOK or Error). As for an Ack, each
// subscription's refs are nacked on their own: a gone subscription's refs are not held, and any
// other failure answers an Error once every group was tried (a storage failure at once).
func (b *binarySession) nackResult(m *protocol.Nack) protocol.Message {
	c := b.c
	if e := checkRefs(m.Refs); e != nil {
		return e
	}
	opts := broker.NackOptions{Delay: m.Delay, ToDLQ: m.ToDLQ, Reason: m.Reason}
	res := &protocol.NackOK{}
	var failed error
	for _, g := range groupRefs(m.Refs) {
		nacked, dead, notHeld, err := c.nackGroup(c.holders(g.sub), g, opts)
		res.Nacked += uint32(nacked)
		res.DeadLettered += uint32(dead)
		if err != nil {
			failed = settleFailure(failed, err)
			if storageFailed(err) {
				break
			}
			continue
		}
		res.NotHeld = wireRefs(res.NotHeld, g.sub, notHeld)
	}
	if failed != nil {
		return b.errorFrame(failed)
	}
	return res
}

// extendResult runs an Extend request and returns its answer (ExtendOK or Error), each
// subscription's refs on their own as for a Nack.
func (b *binarySession) extendResult(m *protocol.Extend) protocol.Message {
	c := b.c
	// Checked before any ref: refs this connection holds no lease for never reach the broker.
	if err := broker.CheckLeaseDuration("extend duration", m.Duration); err != nil {
		return b.errorFrame(err)
	}
	if e := checkRefs(m.Refs); e != nil {
		return e
	}
	res := &protocol.ExtendOK{}
	var failed error
	for _, g := range groupRefs(m.Refs) {
		notHeld, err := c.eachHolder(c.holders(g.sub), g.refs, func(h *handle, refs []storage.DeliveryRef) ([]storage.DeliveryRef, error) {
			r, err := h.member.ExtendBatchGen(c.ctx, g.sub, g.gen, refs, m.Duration)
			if err != nil {
				return nil, err
			}
			if r.Extended > 0 && (res.Deadline.IsZero() || r.Deadline.Before(res.Deadline)) {
				res.Deadline = r.Deadline
			}
			res.Extended += uint32(r.Extended)
			return r.NotHeld, nil
		})
		if err != nil {
			failed = settleFailure(failed, err)
			if storageFailed(err) {
				break
			}
			continue
		}
		res.NotHeld = wireRefs(res.NotHeld, g.sub, notHeld)
	}
	if failed != nil {
		return b.errorFrame(failed)
	}
	return res
}

// credit raises a handle's credit. Credit has no success response; errors carry its correlation
// id.
func (b *binarySession) credit(corr uint32, m *protocol.Credit) {
	c := b.c
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.handles[m.Handle]
	var e *protocol.Error
	switch {
	case h == nil:
		e = protocol.ErrUnknownHandle.Errorf("handle %d is not open on this connection", m.Handle)
	case c.draining:
		return // the server is closing: no more deliveries whatever the credit
	default:
		n := int64(h.credit) + int64(m.Additional)
		if n > int64(c.srv.cfg.MaxCredit) {
			e = protocol.ErrInvalidArgument.Errorf("credit %d + %d exceeds the server's cap %d", h.credit, m.Additional, c.srv.cfg.MaxCredit)
			break
		}
		h.credit = int(n)
		c.applyCreditLocked(h, c.windowLocked(len(c.handles)))
	}
	if e != nil {
		c.out = append(c.out, outItem{corr: corr, msg: e})
		defer c.signal()
	}
}

// clientGoodbye stops the deliveries, releases the leases of the connection's members (they are
// redelivered at once) and answers GoodbyeOK; the connection then closes.
func (b *binarySession) clientGoodbye(corr uint32) {
	c := b.c
	// Every publish read before the Goodbye is answered before GoodbyeOK (nothing follows it).
	c.waitPublishes()
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	for _, h := range c.removeHandles(func(*handle) bool { return true }) {
		if _, err := h.member.Leave(c.ctx); err != nil {
			c.logger.Warn("member leave failed", slog.String("member", h.member.ID()), slog.Any("error", err))
		}
	}
	b.reply(corr, &protocol.GoodbyeOK{})
}

// goodbye is the server's Goodbye (Server.Stop): no more deliveries (the members keep their leases
// but get no credit), acks, nacks and extends still work until the client answers GoodbyeOK or the
// grace period ends. Before the handshake completed, the connection just ends.
func (b *binarySession) goodbye() {
	c := b.c
	c.mu.Lock()
	if !b.ready || c.closing {
		c.mu.Unlock()
		c.interrupt()
		return
	}
	c.draining = true
	for _, h := range c.handles {
		_ = h.member.SetMaxInFlight(0)
	}
	c.out = append(c.out, outItem{corr: b.nextCorr(), msg: &protocol.Goodbye{Code: protocol.CodeClosed, Reason: "server shutting down"}})
	c.mu.Unlock()
	c.signal()
}

func (b *binarySession) heartbeatInterval() time.Duration {
	b.c.mu.Lock()
	defer b.c.mu.Unlock()
	return b.interval
}

// flush is the writer's work: what answer left unwritten, responses in order, then for each open
// handle the subscriptions that ended and the deliveries in its member's channel, packed into
// Deliver frames within the max frame size; a Heartbeat when the timer fired and nothing was
// written for the heartbeat interval (by the writer or answer). It holds wmu throughout.
func (b *binarySession) flush(final, heartbeat bool) (bool, error) {
	c := b.c
	b.wmu.Lock()
	defer b.wmu.Unlock()
	out, hs := c.take(final)
	c.mu.Lock()
	timeout, ready, interval := b.timeout, b.ready, b.interval
	c.mu.Unlock()
	if !ready || timeout == 0 {
		timeout = c.srv.cfg.HandshakeTimeout
	}
	// Moving the deadline costs a timer update: it moves every 1/16 of the timeout (a write
	// blocked for 15/16 of the timeout to all of it breaks the connection).
	if now := time.Now(); timeout != b.wTimeout || now.Sub(b.wDeadlineSet) >= timeout/16 {
		_ = c.nc.SetWriteDeadline(now.Add(timeout))
		b.wTimeout, b.wDeadlineSet = timeout, now
	}
	// What answer could not write precedes everything queued since.
	wrote, err := c.nw.FlushRest()
	if err != nil {
		return wrote, err
	}
	for _, it := range out {
		if err := b.write(it.corr, it.msg); err != nil {
			return wrote, err
		}
		wrote = true
	}
	for _, h := range hs {
		n, err := b.flushHandle(h)
		if err != nil {
			return wrote, err
		}
		wrote = wrote || n
	}
	if err := b.writeBatch(); err != nil {
		return wrote, err
	}
	if heartbeat && !wrote && ready && c.nw.Since(time.Now()) >= interval {
		if err := b.write(b.nextCorr(), &protocol.Heartbeat{Time: c.srv.cfg.Clock.Now()}); err != nil {
			return wrote, err
		}
		wrote = true
	}
	if err := b.w.Flush(); err != nil {
		return wrote, err
	}
	c.moveWindows(hs)
	return wrote, nil
}

// flushHandle adds what one handle has to send to the output.
func (b *binarySession) flushHandle(h *handle) (wrote bool, err error) {
	c := b.c
	for _, e := range h.member.TakeEnded() {
		pe := errmap.ErrorFrom(e.Err)
		if err := b.write(0, &protocol.SubscriptionEnded{Handle: h.id, SubscriptionID: e.SubscriptionID, Topic: e.Topic, Code: pe.Code, Message: pe.Message}); err != nil {
			return wrote, err
		}
		wrote = true
	}
	maxBody := b.w.MaxFrameSize() - protocol.DeliverOverhead
	ds, open := c.takeFrom(h, b.taken[:0])
	defer func() { clear(ds); b.taken = ds[:0] }()
	if !open {
		if c.handleClosedByBroker(h) {
			if err := b.write(0, &protocol.SubscriptionEnded{Handle: h.id, Code: protocol.CodeClosed, Message: "the broker closed the subscription"}); err != nil {
				return wrote, err
			}
			wrote = true
		}
		return wrote, nil
	}
	batch := deliveredBatch{obs: c.srv.cfg.Metrics.Deliveries()}
	for _, d := range ds {
		pd := delivery(h.id, d)
		pd.Partitions = uint32(c.srv.partitionCount(c.ctx, d.Topic, d.Partition))
		n := pd.EncodedLen()
		if n > maxBody {
			b.tooLarge(h, d, n) // never written: it does not count in the size estimate
			continue
		}
		c.est.observe(n)
		c.delivered(&batch, h, d)
		if b.batchBytes+n > maxBody || len(b.batch) == protocol.MaxBatch {
			if err := b.writeBatch(); err != nil {
				return wrote, err
			}
		}
		b.batch = append(b.batch, pd)
		b.batchBytes += n
		wrote = true
	}
	return wrote, nil
}

// writeBatch writes the pending deliveries as one Deliver frame.
func (b *binarySession) writeBatch() error {
	if len(b.batch) == 0 {
		return nil
	}
	err := b.write(0, &protocol.Deliver{Deliveries: b.batch})
	clear(b.batch)
	b.batch = b.batch[:0]
	b.batchBytes = 0
	return err
}

// tooLarge dead-letters a delivery that cannot fit in a frame of this connection (a topic's
// max_message_bytes above the server's max frame size): it could never be delivered here.
func (b *binarySession) tooLarge(h *handle, d *storage.Delivery, size int) {
	c := b.c
	reason := "delivery larger than the connection's max frame size"
	c.logger.Warn("delivery does not fit in a frame, dead-lettering it", slog.String("topic", d.Topic),
		slog.Int("partition", int(d.Partition)), slog.Int64("offset", d.Offset), slog.Int("size", size))
	if _, err := h.member.NackBatch(c.ctx, d.SubscriptionID, []storage.DeliveryRef{d.Ref()}, broker.NackOptions{ToDLQ: true, Reason: reason}); err != nil {
		c.logger.Warn("dead-lettering an oversize delivery failed", slog.Any("error", err))
	}
}

// write encodes one frame, after the preamble for the first one.
func (b *binarySession) write(corr uint32, m protocol.Message) error {
	if !b.preambleSent {
		if err := b.w.WritePreamble(); err != nil {
			return err
		}
		b.preambleSent = true
	}
	if ok, isHello := m.(*protocol.HelloOK); isHello {
		// Every frame after HelloOK is in the negotiated version's layout (Deliver changed in
		// version 4); set here, on the writer's goroutine, before any of them.
		b.w.SetVersion(ok.Version)
	}
	err := b.w.WriteMessage(corr, m)
	var tooLarge *protocol.FrameTooLargeError
	if errors.As(err, &tooLarge) {
		// A response cannot outgrow its request in practice; never send a frame the client must
		// reject.
		b.c.logger.Error("response frame too large", slog.String("opcode", m.Opcode().String()), slog.Int64("size", tooLarge.Size))
		return b.w.WriteMessage(corr, protocol.ErrInternal.Errorf("the %s response is larger than the max frame size", m.Opcode()))
	}
	if err != nil && errors.Is(err, protocol.ErrInvalidArgument) {
		b.c.logger.Error("response cannot be encoded", slog.String("opcode", m.Opcode().String()), slog.Any("error", err))
		return b.w.WriteMessage(corr, protocol.ErrInternal.Errorf("the %s response cannot be encoded: %v", m.Opcode(), err))
	}
	return err
}
