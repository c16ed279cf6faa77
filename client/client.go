package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/spoolmq/spool/protocol"
)

// Client is a connection to a Spool broker that reconnects by itself. It publishes (sync, batch,
// async) and runs subscriptions. Every method is safe for concurrent use. Create it with Dial and
// release it with Close.
type Client struct {
	cfg    config
	addr   string
	logger *slog.Logger
	hooks  hookSet

	// rootCtx is the client's service context (STYLE C16): cancelled when Close stops the
	// background goroutines, it bounds their waits.
	rootCtx    context.Context
	rootCancel context.CancelFunc

	// mu guards the connection state and the subscription set. Lock order: Client.mu ->
	// Subscription.mu; neither is held across network waits.
	mu        sync.Mutex
	cur       *conn
	connCh    chan struct{} // closed when cur is set; replaced right after
	conns     map[*conn]struct{}
	subs      map[*Subscription]struct{}
	closed    bool // Close was called: no new work
	stopping  bool // Close is tearing down: no new connection
	connected bool // the first connection was made

	closing   chan struct{} // closed when Close stops the background goroutines
	stopped   chan struct{} // closed when Close has finished
	resubWake chan struct{}
	wg        sync.WaitGroup // supervisor, publisher loop
	cbWG      sync.WaitGroup // callback loop (stopped last)

	pub asyncState
}

// Dial connects to the broker at addr ("host:port") and returns a Client, or the error of the
// first connection attempt (the client only reconnects by itself once it has been connected). ctx
// bounds the attempt together with DialTimeout; it is not kept.
//
// A broker refusal is returned as its *protocol.Error (errors.Is(err,
// protocol.ErrNotAuthenticated), protocol.ErrUnsupportedVersion); bad options return an error
// wrapping protocol.ErrInvalidArgument.
func Dial(ctx context.Context, addr string, opts ...Opt) (*Client, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	c := &Client{
		cfg:       cfg,
		addr:      addr,
		logger:    cfg.logger.With(slog.String("component", "client"), slog.String("addr", addr)),
		hooks:     newHookSet(cfg.hooks),
		connCh:    make(chan struct{}),
		conns:     make(map[*conn]struct{}),
		subs:      make(map[*Subscription]struct{}),
		closing:   make(chan struct{}),
		stopped:   make(chan struct{}),
		resubWake: make(chan struct{}, 1),
	}
	c.rootCtx, c.rootCancel = contextWithCancel(context.Background())
	c.pub.init(cfg.maxAsyncInFlight)
	cn, err := c.dialConn(ctx)
	if err != nil {
		c.rootCancel()
		return nil, err
	}
	c.setCurrent(cn)
	c.wg.Add(2)
	go c.supervise(cn)
	go c.publishLoop()
	c.cbWG.Add(1)
	go c.callbackLoop()
	return c, nil
}

// contextWithCancel wraps context.WithCancelCause so that the cancel function records
// ErrClientClosed as the cause.
func contextWithCancel(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	return ctx, func() { cancel(ErrClientClosed) }
}

// Addr returns the address the client dials.
func (c *Client) Addr() string { return c.addr }

// setCurrent makes cn the connection for new work and wakes the waiters. It returns false (and
// the caller must close cn) when Close is tearing the client down.
func (c *Client) setCurrent(cn *conn) bool {
	c.mu.Lock()
	if c.stopping {
		c.mu.Unlock()
		return false
	}
	reconnect := c.connected
	c.connected = true
	c.cur = cn
	c.conns[cn] = struct{}{}
	close(c.connCh)
	c.connCh = make(chan struct{})
	c.mu.Unlock()
	c.logger.Info("connected", slog.String("session_id", cn.hello.SessionID), slog.String("server", cn.hello.ServerName),
		slog.Bool("reconnect", reconnect), slog.Duration("heartbeat", cn.hb), slog.Duration("session_timeout", cn.sessionTimeout))
	ev := ConnectEvent{Addr: c.addr, ServerName: cn.hello.ServerName, SessionID: cn.hello.SessionID, Version: cn.hello.Version, Reconnect: reconnect}
	for _, h := range c.hooks.connect {
		h.OnConnect(ev)
	}
	return true
}

// current returns the connection for new work, or nil while reconnecting.
func (c *Client) current() *conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.liveLocked()
}

// liveLocked returns c.cur unless it broke or the broker said Goodbye on it (the supervisor then
// clears it shortly; new work waits for the next connection instead of spinning on this one).
// c.mu must be held.
func (c *Client) liveLocked() *conn {
	if c.cur == nil || c.cur.isDead() || c.cur.draining.Load() {
		return nil
	}
	return c.cur
}

// waitConn returns the connection for new work, waiting for a reconnect until ctx ends. It fails
// with ErrClientClosed once Close was called, unless internal (Close's own work).
func (c *Client) waitConn(ctx context.Context) (*conn, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClientClosed
		}
		if cn := c.liveLocked(); cn != nil {
			c.mu.Unlock()
			return cn, nil
		}
		ch := c.connCh
		c.mu.Unlock()
		select {
		case <-ch:
		case <-c.closing:
			return nil, ErrClientClosed
		case <-ctx.Done():
			return nil, fmt.Errorf("client: waiting for a connection to %s: %w", c.addr, ctx.Err())
		}
	}
}

// connClosed is called by a connection's teardown.
func (c *Client) connClosed(cn *conn, err error) {
	c.mu.Lock()
	delete(c.conns, cn)
	if c.cur == cn {
		c.cur = nil
	}
	stopping := c.stopping
	c.mu.Unlock()
	if stopping {
		c.logger.Debug("disconnected", slog.String("session_id", cn.hello.SessionID))
	} else {
		c.logger.Warn("disconnected", slog.String("session_id", cn.hello.SessionID), slog.Any("error", err))
	}
	ev := DisconnectEvent{Addr: c.addr, SessionID: cn.hello.SessionID, Err: err}
	for _, h := range c.hooks.disconnect {
		h.OnDisconnect(ev)
	}
}

// backoff returns the wait before reconnect attempt n (0-based): min * 2^n capped at max, with
// jitter.
func (c *Client) backoff(n int) time.Duration {
	d := c.cfg.backoffMin
	for i := 0; i < n && d < c.cfg.backoffMax; i++ {
		d *= 2
	}
	d = min(d, c.cfg.backoffMax)
	if j := c.cfg.jitter; j > 0 {
		d = time.Duration(float64(d) * (1 + j*(2*rand.Float64()-1)))
	}
	return max(d, time.Millisecond)
}

// supervise owns the connection life cycle: while a connection is current it resubscribes the
// subscriptions that are not on it (retrying retryable failures); when it breaks or the broker
// says Goodbye, it reconnects with backoff until Close.
func (c *Client) supervise(cn *conn) {
	defer c.wg.Done()
	for {
		c.superviseConn(cn)
		select {
		case <-c.closing:
			return
		default:
		}
		c.mu.Lock()
		if c.cur == cn {
			c.cur = nil
		}
		c.mu.Unlock()
		if cn = c.reconnect(); cn == nil {
			return
		}
	}
}

// superviseConn returns when cn breaks, the broker says Goodbye on it, or the client closes.
func (c *Client) superviseConn(cn *conn) {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	failures := 0
	for {
		if c.resubscribeAll(cn) {
			retry.Reset(c.backoff(failures))
			failures++
		} else {
			failures = 0
		}
		select {
		case <-cn.done:
			return
		case <-cn.goingAway:
			return
		case <-c.closing:
			return
		case <-c.resubWake:
		case <-retry.C:
		}
	}
}

// requestResubscribe wakes the supervisor to resubscribe what is not subscribed.
func (c *Client) requestResubscribe() {
	select {
	case c.resubWake <- struct{}{}:
	default:
	}
}

// resubscribeAll subscribes every live subscription that has no handle on cn. It reports whether
// a retryable failure asks for another round later. Non-retryable failures end the subscription,
// of a topic name and of a pattern alike: a refused resubscription leaves no handle to go on
// with. SUBSCRIPTION_NOT_ACTIVE is one of them: the group's subscription is no longer active
// (cancelled meanwhile), and a retry would loop, or make a new group of the name should it pass.
func (c *Client) resubscribeAll(cn *conn) (retryLater bool) {
	c.mu.Lock()
	subs := slices.Collect(maps.Keys(c.subs))
	c.mu.Unlock()
	for _, s := range subs {
		if !s.needsSubscribe(cn) {
			continue
		}
		err := s.subscribeOn(c.rootCtx, cn, true)
		switch {
		case err == nil:
		case cn.isDead() || errors.Is(err, ErrClientClosed) || errors.Is(err, ErrSubscriptionClosed) || c.rootCtx.Err() != nil:
			return false
		case IsRetryable(err),
			// The same parameters succeeded before: with a fixed MemberID, INVALID_ARGUMENT means
			// the broker still holds the member of the broken connection (until its session
			// timeout).
			s.cfg.memberID != "" && errors.Is(err, protocol.ErrInvalidArgument):
			s.logger.Warn("resubscribe failed, will retry", slog.Any("error", err))
			retryLater = true
		default:
			s.logger.Error("resubscribe failed, subscription ended", slog.Any("error", err))
			s.end(err)
		}
	}
	return retryLater
}

// reconnect dials with backoff until it succeeds (returning the new current connection) or the
// client closes (nil).
func (c *Client) reconnect() *conn {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for attempt := 0; ; attempt++ {
		timer.Reset(c.backoff(attempt))
		select {
		case <-timer.C:
		case <-c.closing:
			return nil
		}
		cn, err := c.dialConn(c.rootCtx)
		if err != nil {
			c.logger.Warn("reconnect failed", slog.Int("attempt", attempt+1), slog.Any("error", err))
			continue
		}
		if !c.setCurrent(cn) {
			cn.fail(ErrClientClosed)
			<-cn.done
			return nil
		}
		return cn
	}
}

// Close shuts the client down, in this order: it stops accepting work (later calls fail with
// ErrClientClosed), waits for the outstanding async publishes (Flush), closes every subscription
// (each waits for its running handlers, flushes their acks and unsubscribes), says Goodbye to the
// broker and waits for its answer, closes the connections and stops every goroutine of the
// client.
//
// When ctx ends first, Close stops waiting: async publishes still outstanding get ErrClientClosed,
// handler contexts are cancelled, connections are closed abruptly (the broker then releases their
// leases and redelivers the messages), and Close returns ctx's error after the client's own
// goroutines stopped; handler goroutines that ignore their ctx finish on their own. Close is
// idempotent; later calls wait for the first one.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		select {
		case <-c.stopped:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c.closed = true
	subs := slices.Collect(maps.Keys(c.subs))
	c.mu.Unlock()
	defer close(c.stopped)

	var errs []error
	// 1. Outstanding async publishes.
	if err := c.flush(ctx); err != nil {
		errs = append(errs, fmt.Errorf("client: close: flush: %w", err))
	}
	// 2. Subscriptions, concurrently: each waits for its handlers.
	var wg sync.WaitGroup
	subErrs := make([]error, len(subs))
	for i, s := range subs {
		wg.Go(func() { subErrs[i] = s.Close(ctx) })
	}
	wg.Wait()
	for _, err := range subErrs {
		if err != nil && !errors.Is(err, ErrSubscriptionClosed) {
			errs = append(errs, err)
		}
	}
	// 3. Background goroutines: no reconnect from now on.
	c.mu.Lock()
	c.stopping = true
	cn := c.liveLocked()
	c.cur = nil
	c.mu.Unlock()
	close(c.closing)
	// 4. Goodbye: the broker processes everything sent before it, answers and closes.
	if cn != nil && ctx.Err() == nil {
		if _, err := cn.roundTrip(ctx, &protocol.Goodbye{}, true); err != nil && !errors.Is(err, ErrConnectionLost) {
			errs = append(errs, fmt.Errorf("client: close: goodbye: %w", err))
		}
	}
	c.mu.Lock()
	conns := slices.Collect(maps.Keys(c.conns))
	c.mu.Unlock()
	for _, x := range conns {
		x.fail(ErrClientClosed)
	}
	c.rootCancel()
	// 5. Wait for every goroutine of the client: the connections' reader and writer, the
	// supervisor and the publisher loop, then the callback loop (last, so that it runs the
	// callbacks of the publishes the teardown failed).
	for _, x := range conns {
		x.wg.Wait()
	}
	c.wg.Wait()
	c.pub.stopCallbacks()
	c.cbWG.Wait()
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return nil
}
