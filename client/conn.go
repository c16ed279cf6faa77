package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolmq/spool/internal/netwrite"
	"github.com/spoolmq/spool/protocol"
)

// Tuning of a connection.
const (
	// ackBatchMax is the most refs one Ack frame carries (24 bytes each: 24 KiB, well inside the
	// smallest max frame size of 64 KiB).
	ackBatchMax = 1024
	// ackFlushCount pending refs are sent at once, without waiting for ackDelay.
	ackFlushCount = 256
	// ackDelay is how long an ack waits for others to share its frame.
	ackDelay = time.Millisecond
	// writeQueueMax is how many encoded bytes may wait for the writer before senders block.
	writeQueueMax = 4 << 20
	// writeKeepCap: a write buffer grown past this is dropped after use.
	writeKeepCap = 1 << 20
)

// States of a call.
const (
	callPending uint32 = iota
	callDone
	callAbandoned
)

// call is one request waiting for its answer. Exactly one of the reader (the answer), the
// teardown (connection lost) and the waiter (ctx ended: abandoned) decides its fate, through
// state.
type call struct {
	state atomic.Uint32
	// batch is the write batch the frame was encoded into; guarded by conn.wmu.
	batch uint64
	// done is closed when the call completed and the waiter won (nil for callback-only calls).
	done chan struct{}
	// resp, err and unsent are written once by complete, before done is closed.
	resp protocol.ServerMessage
	err  error
	// unsent reports that the frame never left the client (the connection broke first), so the
	// request certainly had no effect.
	unsent bool
	// hook runs at completion, on the reader goroutine or the teardown; won is false when the
	// waiter abandoned the call first. It must not block or take conn.wmu.
	hook func(cl *call, won bool)
}

func (cl *call) complete(resp protocol.ServerMessage, err error, unsent bool) {
	cl.resp, cl.err, cl.unsent = resp, err, unsent
	won := cl.state.CompareAndSwap(callPending, callDone)
	if cl.hook != nil {
		cl.hook(cl, won)
	}
	if won && cl.done != nil {
		close(cl.done)
	}
}

// pendingAck is a ref waiting to be sent in an Ack frame; waiter (may be nil) gets the outcome.
// Waiters must not block.
type pendingAck struct {
	ref    protocol.Ref
	waiter func(error)
}

// conn is one session with the broker. It runs exactly two goroutines, both owned by it and
// counted in wg: readLoop (frames in, answers matched to calls, deliveries routed to
// subscriptions, heartbeats answered, silence detected) and writeLoop (frames out, batched into
// few system calls; acks coalesced; heartbeats when idle). Any error of either closes the
// net.Conn; the reader then waits for the writer and tears down: every pending call fails with
// ErrConnectionLost, every subscription forgets its handle on this connection.
//
// One shortcut: a caller that waits for its answer (Publish, PublishBatch, Subscribe...) writes
// the write buffer to the socket itself when the writer is idle, with a write that never waits
// (see writeDirect): one goroutine hand-off less per request. Whoever writes holds smu from
// taking the buffer to its last byte, so frames leave in the order they were encoded.
//
// Lock order: smu -> wmu -> mu (a caller holding wmu only tries smu). None is held while calling
// into a Subscription or a hook.
type conn struct {
	c              *Client
	nc             net.Conn
	r              *protocol.Reader
	addr           string
	hello          *protocol.HelloOK
	sendMax        int
	hb             time.Duration
	sessionTimeout time.Duration
	// maxCredit is the broker's cap on a handle's credit (HelloOK.properties["server.max_credit"]),
	// 0 if it did not say.
	maxCredit uint32
	logger    *slog.Logger
	// nw is the socket's write side: direct writes (none on TLS or net.Pipe: every frame then goes
	// through the writer), what they left unwritten, and the time of the last write, from which
	// heartbeats count silence.
	nw *netwrite.Writer

	// smu is held by whoever writes to the socket: the writer for a whole round (taking the
	// buffer, writing what a direct write left, then the buffer), or a caller writing its request
	// itself (writeDirect). It guards spare and nw's unwritten rest.
	smu sync.Mutex
	// spare is the buffer that replaces wbuf when a batch is taken.
	spare []byte

	// wmu guards the write side: the buffer of encoded frames waiting for the writer, the acks
	// waiting to be coalesced, and whether the connection still accepts frames.
	wmu     sync.Mutex
	wbuf    []byte
	wbatch  uint64        // id of the batch wbuf accumulates; the writer takes batches in order
	wtaken  chan struct{} // closed when the writer takes a batch (senders waiting for room)
	acks    []pendingAck
	ackDue  time.Time
	ackNow  bool
	wclosed bool
	// taken is the id of the last batch the writer took (and handed to the OS, or failed to).
	taken atomic.Uint64
	wwake chan struct{}

	// mu guards the call table, the handle table and the close state.
	mu              sync.Mutex
	nextCorr        uint32
	calls           map[uint32]*call
	handles         map[uint32]*Subscription
	dead            bool
	cause           error
	goodbyeCorr     uint32 // the broker's Goodbye correlation id, 0 if none
	goodbyeAnswered bool

	// busy counts this connection's deliveries inside handlers; a broker Goodbye is answered
	// when it drops to 0.
	busy      atomic.Int64
	draining  atomic.Bool
	goingAway chan struct{} // closed when the broker said Goodbye
	goingOnce sync.Once

	failOnce   sync.Once
	closing    chan struct{} // closed by fail: stops the writer
	writerDone chan struct{}
	done       chan struct{} // closed at the end of the teardown
	wg         sync.WaitGroup
}

// dialConn opens a connection and runs the handshake, within ctx and DialTimeout.
func (c *Client) dialConn(ctx context.Context) (*conn, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.dialTimeout)
	defer cancel()
	dial := c.cfg.dial
	if dial == nil {
		d := &net.Dialer{KeepAlive: 15 * time.Second}
		dial = d.DialContext
	}
	nc, err := dial(ctx, "tcp", c.addr)
	if err != nil {
		return nil, fmt.Errorf("client: dial %s: %w", c.addr, err)
	}
	if tc := c.cfg.tlsConfig; tc != nil {
		if tc.ServerName == "" {
			tc = tc.Clone()
			if host, _, err := net.SplitHostPort(c.addr); err == nil {
				tc.ServerName = host
			}
		}
		tlsConn := tls.Client(nc, tc)
		if err := tlsConn.HandshakeContext(ctx); err != nil {
			_ = nc.Close()
			return nil, fmt.Errorf("client: tls handshake with %s: %w", c.addr, err)
		}
		nc = tlsConn
	}
	// The protocol handshake reads and writes synchronously: bound it by the deadline and abort it
	// when ctx ends.
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	r := protocol.NewReader(nc, 0)
	w := protocol.NewWriter(nc, 0)
	ok, err := protocol.ClientHandshake(r, w, &protocol.Hello{
		ClientName:        c.cfg.clientName,
		Token:             c.cfg.token,
		HeartbeatInterval: c.cfg.heartbeatInterval,
		Properties:        map[string]string{"client.library": "spool-go"},
	})
	if !stop() || ctx.Err() != nil {
		if err == nil {
			err = ctx.Err()
		}
	}
	if err != nil {
		_ = nc.Close()
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
			err = fmt.Errorf("%w (%w)", ctxErr, err)
		}
		return nil, fmt.Errorf("client: handshake with %s: %w", c.addr, err)
	}
	_ = nc.SetDeadline(time.Time{})

	cn := &conn{
		c:              c,
		nc:             nc,
		r:              r,
		addr:           c.addr,
		hello:          ok,
		sendMax:        int(ok.MaxFrameSize),
		hb:             ok.HeartbeatInterval,
		sessionTimeout: ok.SessionTimeout,
		nw:             netwrite.New(nc),
		wbatch:         1,
		wtaken:         make(chan struct{}),
		wwake:          make(chan struct{}, 1),
		calls:          make(map[uint32]*call),
		handles:        make(map[uint32]*Subscription),
		nextCorr:       1, // the handshake used 1
		goingAway:      make(chan struct{}),
		closing:        make(chan struct{}),
		writerDone:     make(chan struct{}),
		done:           make(chan struct{}),
	}
	if c.cfg.maxFrameSize > 0 && c.cfg.maxFrameSize < cn.sendMax {
		cn.sendMax = c.cfg.maxFrameSize
	}
	if v, err := strconv.ParseUint(ok.Properties["server.max_credit"], 10, 32); err == nil {
		cn.maxCredit = uint32(v)
	}
	if cn.hb <= 0 {
		cn.hb = 10 * time.Second
	}
	if cn.sessionTimeout <= 0 {
		cn.sessionTimeout = 3 * cn.hb
	}
	cn.logger = c.logger.With(slog.String("session_id", ok.SessionID))
	cn.wg.Add(2)
	go cn.readLoop()
	go cn.writeLoop()
	return cn, nil
}

// isDead reports whether the connection failed or is being torn down.
func (cn *conn) isDead() bool {
	select {
	case <-cn.closing:
		return true
	default:
		return false
	}
}

// lostErr returns the error for operations on this connection after it broke.
func (cn *conn) lostErr() error {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return lostError(cn.cause)
}

// fail closes the connection with cause (the first cause wins). Idempotent; does not wait.
func (cn *conn) fail(cause error) {
	cn.mu.Lock()
	if cn.cause == nil {
		cn.cause = cause
	}
	cn.mu.Unlock()
	cn.failOnce.Do(func() {
		cn.wmu.Lock()
		cn.wclosed = true
		cn.wmu.Unlock()
		close(cn.closing)
		_ = cn.nc.Close()
	})
}

// nextCorrLocked returns a correlation id that is not 0 and not in use. cn.mu must be held.
func (cn *conn) nextCorrLocked() uint32 {
	for {
		cn.nextCorr++
		if cn.nextCorr == 0 {
			continue
		}
		if _, busy := cn.calls[cn.nextCorr]; !busy {
			return cn.nextCorr
		}
	}
}

// wakeWriter signals the writer without blocking.
func (cn *conn) wakeWriter() {
	select {
	case cn.wwake <- struct{}{}:
	default:
	}
}

// put encodes m with corr into the write buffer; cl (may be nil) records the batch. With
// flushAcks the pending acks are encoded first, so that they precede m on the wire. With block it
// waits while the buffer is over writeQueueMax (until ctx ends or the connection breaks); without,
// it never waits: the reader goroutine's own frames (HeartbeatOK, GoodbyeOK, giving back a handle)
// must not, because the writer may be blocked on a broker that waits for this reader. Errors: the
// connection is closed (ErrConnectionLost), m cannot be encoded (wrapping
// protocol.ErrInvalidArgument) or its frame is too large (*protocol.FrameTooLargeError).
func (cn *conn) put(ctx context.Context, block bool, corr uint32, m protocol.Message, cl *call, flushAcks bool) error {
	cn.wmu.Lock()
	for block && len(cn.wbuf) >= writeQueueMax && !cn.wclosed {
		ch := cn.wtaken
		cn.wmu.Unlock()
		select {
		case <-ch:
		case <-cn.closing:
		case <-ctx.Done():
			return ctx.Err()
		}
		cn.wmu.Lock()
	}
	if cn.wclosed {
		cn.wmu.Unlock()
		return cn.lostErr()
	}
	if flushAcks && len(cn.acks) > 0 {
		cn.encodeAcksLocked()
	}
	start := len(cn.wbuf)
	var err error
	if p, ok := m.(*protocol.Publish); ok {
		m, err = delayAsNotBefore(p, cn.hello.Version, time.Now()) // an older broker has no Delay
	}
	buf := cn.wbuf
	if err == nil {
		buf, err = protocol.AppendFrameVersion(cn.wbuf, corr, m, cn.hello.Version)
	}
	if err != nil {
		cn.wmu.Unlock()
		return fmt.Errorf("client: encode %s: %w", m.Opcode(), err)
	}
	if size := len(buf) - start; size > cn.sendMax {
		cn.wbuf = buf[:start]
		cn.wmu.Unlock()
		return &protocol.FrameTooLargeError{Opcode: m.Opcode(), CorrelationID: corr, Size: int64(size), Max: cn.sendMax}
	}
	cn.wbuf = buf
	if cl != nil {
		cl.batch = cn.wbatch
	}
	// A caller that waits for its answer writes the buffer itself when the writer is idle;
	// PublishAsync, acks and the reader's own frames leave it to the writer, which coalesces them.
	if cl != nil && cl.done != nil && cn.nw.HasRaw() && cn.smu.TryLock() {
		cn.writeDirect()
		return nil
	}
	cn.wmu.Unlock()
	cn.wakeWriter()
	return nil
}

// writeDirect takes the write buffer (the caller's frame and whatever was queued before it) and
// writes it without waiting (nw.Direct); what the socket does not take at once is kept, and the
// writer is woken to write it first. While bytes of an earlier direct write still wait, the
// buffer is left to the writer. A write error fails the connection, as the writer's would.
// cn.smu and cn.wmu must be held; it releases both.
func (cn *conn) writeDirect() {
	if !cn.nw.CanDirect() {
		cn.wmu.Unlock()
		cn.smu.Unlock()
		cn.wakeWriter()
		return
	}
	buf := cn.takeLocked()
	cn.wmu.Unlock()
	switch short, err := cn.nw.Direct(buf); {
	case err != nil:
		cn.fail(fmt.Errorf("write: %w", err))
	case short:
		cn.wakeWriter()
	}
	cn.keepSpare(buf)
	cn.smu.Unlock()
}

// takeLocked takes the write buffer as the next batch. cn.smu and cn.wmu must be held.
func (cn *conn) takeLocked() []byte {
	buf := cn.wbuf
	cn.wbuf = cn.spare[:0]
	cn.spare = nil
	cn.taken.Store(cn.wbatch)
	cn.wbatch++
	if len(buf) >= writeQueueMax {
		close(cn.wtaken)
		cn.wtaken = make(chan struct{})
	}
	return buf
}

// keepSpare keeps a written buffer for reuse. cn.smu must be held.
func (cn *conn) keepSpare(buf []byte) {
	if cap(buf) <= writeKeepCap {
		cn.spare = buf[:0]
	}
}

// send writes a frame that expects no answer (HeartbeatOK, GoodbyeOK, Credit), without waiting
// for room in the write buffer.
func (cn *conn) send(corr uint32, m protocol.Message) error {
	return cn.put(context.Background(), false, corr, m, nil, false)
}

// sendCredit sends a Credit raising handle h's credit by n. It has no success answer; a failure
// comes back as an Error with its correlation id, which matches no call and is logged (complete).
func (cn *conn) sendCredit(h, n uint32) error {
	cn.mu.Lock()
	corr := cn.nextCorrLocked()
	cn.mu.Unlock()
	return cn.send(corr, &protocol.Credit{Handle: h, Additional: n})
}

// start sends a request. hook (may be nil) runs when it completes; with wait, the call has a done
// channel for conn.wait. An error means the request was not sent and nothing will complete it.
func (cn *conn) start(ctx context.Context, m protocol.ClientMessage, hook func(*call, bool), wait, flushAcks bool) (*call, error) {
	return cn.startWith(ctx, true, m, hook, wait, flushAcks)
}

// startNoWait is start for a frame that must not wait for room in the write buffer and whose
// answer nobody waits for (see put).
func (cn *conn) startNoWait(m protocol.ClientMessage, flushAcks bool) {
	_, _ = cn.startWith(context.Background(), false, m, nil, false, flushAcks)
}

func (cn *conn) startWith(ctx context.Context, block bool, m protocol.ClientMessage, hook func(*call, bool), wait, flushAcks bool) (*call, error) {
	cl := &call{hook: hook}
	if wait {
		cl.done = make(chan struct{})
	}
	cn.mu.Lock()
	if cn.dead {
		err := lostError(cn.cause)
		cn.mu.Unlock()
		return nil, err
	}
	corr := cn.nextCorrLocked()
	cn.calls[corr] = cl
	cn.mu.Unlock()
	if err := cn.put(ctx, block, corr, m, cl, flushAcks); err != nil {
		cn.mu.Lock()
		if cn.calls[corr] == cl {
			delete(cn.calls, corr)
		}
		cn.mu.Unlock()
		if cl.state.CompareAndSwap(callPending, callAbandoned) {
			return nil, err
		}
		// The teardown completed the call first: it reports through hook and done as usual.
	}
	return cl, nil
}

// wait waits for cl's answer: the response, or the *protocol.Error, or ErrConnectionLost, or
// ctx's error (the call is then abandoned: its answer is dropped when it comes).
func (cn *conn) wait(ctx context.Context, cl *call) (protocol.ServerMessage, error) {
	select {
	case <-cl.done:
	case <-ctx.Done():
		if cl.state.CompareAndSwap(callPending, callAbandoned) {
			return nil, ctx.Err()
		}
		<-cl.done
	}
	return cl.resp, cl.err
}

// roundTrip sends m and waits for its answer.
func (cn *conn) roundTrip(ctx context.Context, m protocol.ClientMessage, flushAcks bool) (protocol.ServerMessage, error) {
	cl, err := cn.start(ctx, m, nil, true, flushAcks)
	if err != nil {
		return nil, err
	}
	return cn.wait(ctx, cl)
}

// ack queues ref for the next Ack frame; now asks for it to be sent without waiting for others.
// waiter (may be nil, must not block) gets the outcome.
func (cn *conn) ack(ref protocol.Ref, waiter func(error), now bool) {
	cn.wmu.Lock()
	if cn.wclosed {
		cn.wmu.Unlock()
		if waiter != nil {
			waiter(cn.lostErr())
		}
		return
	}
	if len(cn.acks) == 0 {
		cn.ackDue = time.Now().Add(ackDelay)
	}
	cn.acks = append(cn.acks, pendingAck{ref: ref, waiter: waiter})
	if now {
		cn.ackNow = true
	}
	wake := len(cn.acks) == 1 || now || len(cn.acks) >= ackFlushCount
	cn.wmu.Unlock()
	if wake {
		cn.wakeWriter()
	}
}

// encodeAcksLocked encodes every pending ack into Ack frames of at most ackBatchMax refs.
// cn.wmu must be held.
func (cn *conn) encodeAcksLocked() {
	for len(cn.acks) > 0 {
		n := min(len(cn.acks), ackBatchMax)
		batch := make([]pendingAck, n)
		copy(batch, cn.acks)
		if n == len(cn.acks) {
			cn.acks = cn.acks[:0]
		} else {
			cn.acks = cn.acks[n:]
		}
		refs := make([]protocol.Ref, n)
		for i := range batch {
			refs[i] = batch[i].ref
		}
		cl := &call{hook: func(cl *call, _ bool) { cn.ackDone(batch, cl) }}
		cn.mu.Lock()
		corr := cn.nextCorrLocked()
		cn.calls[corr] = cl
		cn.mu.Unlock()
		buf, err := protocol.AppendFrameVersion(cn.wbuf, corr, &protocol.Ack{Refs: refs}, cn.hello.Version)
		if err != nil { // cannot happen: refs always encode
			cn.mu.Lock()
			delete(cn.calls, corr)
			cn.mu.Unlock()
			cl.complete(nil, fmt.Errorf("client: encode ack: %w", err), true)
			continue
		}
		cn.wbuf = buf
		cl.batch = cn.wbatch
	}
	cn.ackNow = false
}

// ackDone resolves the waiters of one Ack frame.
func (cn *conn) ackDone(batch []pendingAck, cl *call) {
	var unknown map[protocol.Ref]bool
	if ok, isOK := cl.resp.(*protocol.AckOK); isOK && len(ok.Unknown) > 0 {
		unknown = make(map[protocol.Ref]bool, len(ok.Unknown))
		for _, r := range ok.Unknown {
			unknown[r] = true
		}
	}
	if cl.err != nil {
		cn.logger.Debug("ack failed", slog.Int("refs", len(batch)), slog.Any("error", cl.err))
	}
	if len(batch) > 1 && errors.Is(cl.err, protocol.ErrStaleGeneration) {
		// Ordered groups: some refs are of partitions this member lost in a rebalance; the broker
		// acked the others. Ack each ref alone to tell every waiter its own answer (an ack the
		// broker applied answers AlreadyDone). Non-blocking sends: this runs on the reader.
		for _, a := range batch {
			one := []pendingAck{a}
			_, err := cn.startWith(context.Background(), false, &protocol.Ack{Refs: []protocol.Ref{a.ref}},
				func(cl *call, _ bool) { cn.ackDone(one, cl) }, false, false)
			if err != nil && a.waiter != nil {
				a.waiter(err)
			}
		}
		return
	}
	for _, a := range batch {
		if a.waiter == nil {
			continue
		}
		switch {
		case cl.err != nil:
			a.waiter(cl.err)
		case unknown[a.ref]:
			a.waiter(fmt.Errorf("%w: subscription %d partition %d offset %d", ErrUnknownMessage, a.ref.SubscriptionID, a.ref.Partition, a.ref.Offset))
		default:
			a.waiter(nil)
		}
	}
}

// writeLoop writes the queued frames, coalescing everything queued since its last write into one
// system call; it encodes coalesced acks when they are due and sends a Heartbeat when nothing was
// written for one heartbeat interval.
func (cn *conn) writeLoop() {
	defer cn.wg.Done()
	defer close(cn.writerDone)
	hb := time.NewTimer(cn.hb)
	defer hb.Stop()
	ackTimer := time.NewTimer(time.Hour)
	ackTimer.Stop()
	defer ackTimer.Stop()
	// The write deadline and the heartbeat timer are not moved on every write: a timer update
	// costs more than the rest of a small write's work. The deadline moves every 1/16 of the
	// session timeout (a write blocked for 15/16 of it to all of it fails), also when the
	// heartbeat timer fires without anything to write (direct writes keep it ahead too); the
	// heartbeat timer is re-armed when it fires, for the rest of the interval since the last
	// write (the writer's or a direct one).
	refresh := cn.sessionTimeout / 16
	var lastDeadline time.Time
	for {
		fired := false
		select {
		case <-cn.wwake:
		case <-hb.C:
			fired = true
		case <-ackTimer.C:
		case <-cn.closing:
			return
		}
		now := time.Now()
		cn.smu.Lock()
		cn.wmu.Lock()
		if len(cn.acks) > 0 {
			if cn.ackNow || len(cn.acks) >= ackFlushCount || !now.Before(cn.ackDue) {
				cn.encodeAcksLocked()
			} else {
				ackTimer.Reset(cn.ackDue.Sub(now))
			}
		}
		if len(cn.wbuf) == 0 && !cn.nw.Pending() && cn.nw.Since(now) >= cn.hb {
			cn.mu.Lock()
			corr := cn.nextCorrLocked() // answered by HeartbeatOK, which matches no call
			cn.mu.Unlock()
			if buf, err := protocol.AppendFrameVersion(cn.wbuf, corr, &protocol.Heartbeat{Time: now}, cn.hello.Version); err == nil {
				cn.wbuf = buf
			}
		}
		buf := cn.takeLocked()
		cn.wmu.Unlock()
		write := cn.nw.Pending() || len(buf) > 0
		if (write || fired) && now.Sub(lastDeadline) >= refresh {
			_ = cn.nc.SetWriteDeadline(now.Add(cn.sessionTimeout))
			lastDeadline = now
		}
		if write {
			_, err := cn.nw.FlushRest() // what a direct write left goes first
			if err == nil && len(buf) > 0 {
				_, err = cn.nc.Write(buf)
			}
			if err != nil {
				cn.smu.Unlock()
				cn.fail(fmt.Errorf("write: %w", err))
				return
			}
			cn.nw.Wrote(now)
		}
		cn.keepSpare(buf)
		cn.smu.Unlock()
		if fired {
			hb.Reset(max(cn.hb-cn.nw.Since(time.Now()), time.Millisecond))
		}
	}
}

// readLoop reads frames until the connection breaks, then tears it down.
func (cn *conn) readLoop() {
	defer cn.wg.Done()
	var lastDeadline time.Time
	refresh := cn.sessionTimeout / 16
	var err error
	for {
		// Any frame is a sign of life: the broker sends one at least every heartbeat interval, so
		// silence for the session timeout means it is gone. Moving the deadline costs a timer
		// update, so it moves only every 1/16 of the timeout.
		if now := time.Now(); now.Sub(lastDeadline) >= refresh {
			_ = cn.nc.SetReadDeadline(now.Add(cn.sessionTimeout))
			lastDeadline = now
		}
		var f protocol.Frame
		f, err = cn.r.ReadFrame()
		if err != nil {
			break
		}
		cn.handleFrame(f)
	}
	var ne net.Error
	closing := false
	select {
	case <-cn.c.closing:
		closing = true
	default:
	}
	switch {
	case closing:
		// Close said Goodbye: the broker's answer and close are the end Close asked for, not a
		// loss (the disconnect hook gets ErrClientClosed, as when Close closes the socket itself).
		err = ErrClientClosed
	case errors.Is(err, io.EOF):
		err = errors.New("closed by the broker")
	case errors.As(err, &ne) && ne.Timeout() && !cn.isDead():
		err = fmt.Errorf("%w: no frame from the broker for %v", protocol.ErrSessionTimeout, cn.sessionTimeout)
	default:
		err = fmt.Errorf("read: %w", err)
	}
	cn.fail(err)
	<-cn.writerDone
	cn.teardown()
}

// handleFrame dispatches one frame from the broker.
func (cn *conn) handleFrame(f protocol.Frame) {
	// Every frame after HelloOK is in the negotiated version's layout: an older broker's Deliver
	// has no batch fields.
	m, err := protocol.DecodeServerVersion(f, cn.hello.Version)
	if err != nil {
		if f.CorrelationID != 0 && f.Opcode.IsResponse() {
			cn.complete(f.CorrelationID, nil, fmt.Errorf("client: undecodable %s from the broker: %w", f.Opcode, err))
			return
		}
		cn.logger.Error("undecodable frame from the broker", slog.String("opcode", f.Opcode.String()), slog.Any("error", err))
		return
	}
	switch m := m.(type) {
	case *protocol.Deliver:
		cn.deliver(m)
	case *protocol.SubscriptionEnded:
		cn.subscriptionEnded(m)
	case *protocol.Heartbeat:
		_ = cn.send(f.CorrelationID, &protocol.HeartbeatOK{Echo: m.Time, Time: time.Now()})
	case *protocol.Goodbye:
		cn.serverGoodbye(f.CorrelationID, m)
	case *protocol.Error:
		if f.CorrelationID == 0 {
			// A connection-level error: the broker closes right after it.
			cn.logger.Warn("connection error from the broker", slog.Any("error", m))
			cn.mu.Lock()
			if cn.cause == nil {
				cn.cause = m
			}
			cn.mu.Unlock()
			return
		}
		cn.complete(f.CorrelationID, nil, m)
	default:
		cn.complete(f.CorrelationID, m, nil)
	}
}

// complete hands an answer to its call; answers matching no call (HeartbeatOK, abandoned calls
// already removed) are dropped.
func (cn *conn) complete(corr uint32, resp protocol.ServerMessage, err error) {
	cn.mu.Lock()
	cl := cn.calls[corr]
	delete(cn.calls, corr)
	cn.mu.Unlock()
	switch {
	case cl != nil:
		cl.complete(resp, err, false)
	case err != nil:
		// The answer to a request nobody waits for (an abandoned call, a failed Credit).
		cn.logger.Warn("error from the broker for no pending request", slog.Uint64("correlation_id", uint64(corr)), slog.Any("error", err))
	}
}

// deliver routes a Deliver frame to the subscriptions of its handles. Deliveries for handles this
// client no longer has (closed, abandoned) are dropped: the broker released or will release their
// leases.
func (cn *conn) deliver(m *protocol.Deliver) {
	subs := make([]*Subscription, len(m.Deliveries))
	cn.mu.Lock()
	for i := range m.Deliveries {
		subs[i] = cn.handles[m.Deliveries[i].Handle]
	}
	cn.mu.Unlock()
	for i := range m.Deliveries {
		if subs[i] == nil {
			cn.logger.Debug("delivery for an unknown handle dropped", slog.Uint64("handle", uint64(m.Deliveries[i].Handle)))
			continue
		}
		subs[i].push(cn, &m.Deliveries[i])
	}
}

// subscriptionEnded routes a SubscriptionEnded push.
func (cn *conn) subscriptionEnded(m *protocol.SubscriptionEnded) {
	cn.mu.Lock()
	s := cn.handles[m.Handle]
	if m.SubscriptionID == 0 {
		delete(cn.handles, m.Handle)
	}
	cn.mu.Unlock()
	if s != nil {
		s.ended(cn, m)
	}
}

// registerHandle maps a handle to its subscription (on the reader goroutine, before the next
// frame is read, so that no delivery of the handle can miss it).
func (cn *conn) registerHandle(h uint32, s *Subscription) {
	cn.mu.Lock()
	if !cn.dead {
		cn.handles[h] = s
	}
	cn.mu.Unlock()
}

func (cn *conn) unregisterHandle(h uint32) {
	cn.mu.Lock()
	delete(cn.handles, h)
	cn.mu.Unlock()
}

// serverGoodbye handles the broker's Goodbye (shutdown, drain): the client stops using the
// connection for new work and reconnects, lets the handlers running on its deliveries settle them
// during the broker's grace period, and answers GoodbyeOK when the last one is done.
func (cn *conn) serverGoodbye(corr uint32, m *protocol.Goodbye) {
	reason := protocol.ErrClosed.WithMessage(m.Reason)
	if m.Code != 0 {
		if e, _ := protocol.ErrorForCode(m.Code); e != nil {
			reason = e.WithMessage(m.Reason)
		}
	}
	cn.logger.Info("goodbye from the broker", slog.Any("reason", reason))
	cn.mu.Lock()
	cn.goodbyeCorr = corr
	if cn.cause == nil {
		cn.cause = reason
	}
	cn.mu.Unlock()
	cn.draining.Store(true)
	cn.goingOnce.Do(func() { close(cn.goingAway) })
	cn.maybeGoodbyeOK()
}

// maybeGoodbyeOK answers the broker's Goodbye once no handler holds a delivery of this
// connection.
func (cn *conn) maybeGoodbyeOK() {
	if cn.busy.Load() != 0 {
		return
	}
	cn.mu.Lock()
	corr := cn.goodbyeCorr
	if corr == 0 || cn.goodbyeAnswered {
		cn.mu.Unlock()
		return
	}
	cn.goodbyeAnswered = true
	cn.mu.Unlock()
	_ = cn.put(context.Background(), false, corr, &protocol.GoodbyeOK{}, nil, true)
}

// enterHandler counts a delivery of this connection entering a handler; false when the
// connection is going away (the delivery is then dropped: the broker releases it).
func (cn *conn) enterHandler() bool {
	cn.busy.Add(1)
	if cn.draining.Load() || cn.isDead() {
		cn.leaveHandler()
		return false
	}
	return true
}

func (cn *conn) leaveHandler() {
	if cn.busy.Add(-1) == 0 && cn.draining.Load() {
		cn.maybeGoodbyeOK()
	}
}

// teardown runs once, on the reader goroutine after both loops stopped: it fails every pending
// call and ack, detaches the subscriptions and reports the disconnect.
func (cn *conn) teardown() {
	cn.mu.Lock()
	cn.dead = true
	calls := cn.calls
	cn.calls = nil
	handles := cn.handles
	cn.handles = nil
	err := lostError(cn.cause)
	cn.mu.Unlock()

	cn.wmu.Lock()
	taken := cn.taken.Load()
	acks := cn.acks
	cn.acks = nil
	unsent := make(map[*call]bool, len(calls))
	for _, cl := range calls {
		unsent[cl] = cl.batch > taken
	}
	cn.wmu.Unlock()

	for _, a := range acks {
		if a.waiter != nil {
			a.waiter(err)
		}
	}
	for _, cl := range calls {
		cl.complete(nil, err, unsent[cl])
	}
	seen := make(map[*Subscription]bool, len(handles))
	for _, s := range handles {
		if !seen[s] {
			seen[s] = true
			s.connLost(cn)
		}
	}
	close(cn.done)
	cn.c.connClosed(cn, err)
}
