package server

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/protocol"
	"github.com/spoolmq/spool/protocol/text"
)

// ErrNotRunning is returned by Start after Stop (or a second Start).
var ErrNotRunning = errors.New("server: not running")

// maxRejecters bounds the goroutines that answer connections over the limit (OVERLOADED); beyond
// it such connections are closed without an answer.
const maxRejecters = 64

// rejectTimeout bounds the life of a connection over the limit.
const rejectTimeout = time.Second

// memberCloseTimeout bounds the release of a closing connection's leases.
const memberCloseTimeout = 10 * time.Second

// runState is the lifecycle of a Server.
type runState uint8

const (
	stateNew runState = iota
	stateRunning
	stateStopping
	stateStopped
)

// Server is Spool's TCP server: it accepts connections on one listener, tells the binary protocol
// from the text mode by the first byte, and serves each connection with two goroutines (a reader
// that runs requests against the broker in order, and a writer that sends responses and pushes
// deliveries), plus a publish worker for a binary connection that publishes (it appends the
// connection's queued publishes per topic in order, sharing fsyncs). It owns every goroutine it starts (accept loop, connections) and counts them in one
// WaitGroup. Every method is safe for concurrent use. See the package documentation.
type Server struct {
	cfg    Config
	broker *broker.Broker
	logger *slog.Logger
	// sessionPrefix makes session ids unique across restarts.
	sessionPrefix string

	// wg counts the accept loop, every connection goroutine (reader, writer, publish worker and
	// lanes) and the goroutines answering connections over the limit.
	wg sync.WaitGroup
	// rootCtx is the parent of every connection's context; cancelled when Stop gives up waiting.
	rootCtx    context.Context
	cancelRoot context.CancelFunc
	// acceptDone is closed when the accept loop returned.
	acceptDone chan struct{}
	// acceptStop is closed by Stop: it ends a back-off pause of the accept loop at once.
	acceptStop chan struct{}
	// pause waits d after a failed accept, or less if acceptStop closes (tests record it).
	pause func(d time.Duration)
	// connsChanged (capacity 1) is signalled when a connection ends.
	connsChanged chan struct{}
	// rejecters is a semaphore of goroutines answering connections over the limit.
	rejecters chan struct{}

	nextSession   atomic.Uint64
	lastRejectLog atomic.Int64
	stats         counters

	// partitions caches topic partition counts for message ids (sync.Map of string to int), at
	// most partitionsMax topics, twice the broker's topic bound (partitionsN counts them; past it
	// the cache starts over: deleted topics' names would otherwise stay in it for good, and live
	// ones alone never reach it).
	partitions    sync.Map
	partitionsN   atomic.Int64
	partitionsMax int64

	// mu guards the fields below.
	mu        sync.Mutex
	state     runState
	ln        net.Listener
	acceptErr error
	conns     map[*conn]struct{}
}

// counters are the server's statistics.
type counters struct {
	accepted, rejected, closedByError, sessionTimeouts atomic.Int64
}

// Stats are the server's figures, for metrics and the admin API.
type Stats struct {
	// Accepted counts connections accepted since Start (including rejected ones).
	Accepted int64 `json:"accepted"`
	// Rejected counts connections closed because MaxConnections was reached.
	Rejected int64 `json:"rejected"`
	// Open counts the open connections, Binary and Text by mode (a connection whose first byte has
	// not arrived yet is in neither).
	Open   int `json:"open"`
	Binary int `json:"binary"`
	Text   int `json:"text"`
	// ClosedByError counts connections the server closed for a protocol error (malformed or
	// oversize frame, bad handshake), SessionTimeouts those closed for silence.
	ClosedByError   int64 `json:"closed_by_error"`
	SessionTimeouts int64 `json:"session_timeouts"`
}

// SessionInfo describes one open connection for the admin API.
type SessionInfo struct {
	// ID is the session id (HelloOK.session_id, and the "session" attribute of log lines).
	ID string `json:"id"`
	// Mode is "binary", "text", or "" before the first byte arrived.
	Mode string `json:"mode"`
	// Remote is the client's address.
	Remote string `json:"remote"`
	// Client is Hello.client_name (binary).
	Client string `json:"client,omitempty"`
	// ProtocolVersion is the binary protocol version the handshake negotiated (0 for the text
	// mode and before the handshake).
	ProtocolVersion int `json:"protocol_version"`
	// Opened is when the connection was accepted.
	Opened time.Time `json:"opened"`
	// Members are the IDs of the connection's members (one per open subscription handle).
	Members []string `json:"members"`
}

// New validates cfg (completed with defaults) and returns a server for b, not started yet. The
// broker must be started before the first connection arrives and stopped after Stop.
func New(cfg Config, b *broker.Broker) (*Server, error) {
	if b == nil {
		return nil, errors.New("server: broker is required")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("server config: %w", err)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Server{
		cfg:           cfg,
		broker:        b,
		logger:        logger.With("component", "server"),
		sessionPrefix: strings.ToLower(rand.Text()[:6]),
		partitionsMax: int64(2 * max(b.MaxTopics(), broker.DefaultMaxTopics)),
		acceptDone:    make(chan struct{}),
		acceptStop:    make(chan struct{}),
		connsChanged:  make(chan struct{}, 1),
		rejecters:     make(chan struct{}, maxRejecters),
		conns:         make(map[*conn]struct{}),
	}
	s.pause = func(d time.Duration) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-s.acceptStop:
		}
	}
	return s, nil
}

// Start serves ln (which the server then owns and closes) until Stop. It returns at once; the
// accept loop runs on its own goroutine. ctx provides values only.
func (s *Server) Start(ctx context.Context, ln net.Listener) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != stateNew {
		return ErrNotRunning
	}
	s.state = stateRunning
	s.ln = ln
	s.rootCtx, s.cancelRoot = context.WithCancel(context.WithoutCancel(ctx))
	s.wg.Add(1)
	go s.acceptLoop(ln)
	s.logger.InfoContext(ctx, "tcp server listening", slog.String("addr", ln.Addr().String()),
		slog.Int("max_connections", s.cfg.MaxConnections), slog.Int("max_frame_size", s.cfg.MaxFrameSize),
		slog.Bool("tls", s.cfg.TLSConfig != nil))
	return nil
}

// Addr returns the listener's address (nil before Start).
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Done is closed when the accept loop has ended: after Stop, or when the listener failed (then
// Err says why).
func (s *Server) Done() <-chan struct{} { return s.acceptDone }

// Err returns the error that ended the accept loop, nil after a clean Stop.
func (s *Server) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acceptErr
}

// Stop shuts the server down gracefully:
//
//  1. stop accepting (close the listener);
//  2. say goodbye to every connection: binary sessions get Goodbye (CLOSED) and no more
//     deliveries but may still ack, nack and extend for Config.GoodbyeGrace; text sessions get
//     "ERR CLOSED" and end;
//  3. when the grace ends (or every client answered GoodbyeOK), end the remaining sessions: their
//     members leave (leases released at once), their writers flush, their sockets close;
//  4. if ctx ends first, close the remaining sockets and cancel the requests in flight.
//
// Stop waits for every goroutine of the server. It does not stop the broker (its owner does that
// afterwards). Stop is idempotent and safe before Start.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	switch s.state {
	case stateNew:
		s.state = stateStopped
		close(s.acceptDone)
		s.mu.Unlock()
		return nil
	case stateStopping, stateStopped:
		s.mu.Unlock()
		return s.waitAll(ctx)
	}
	s.state = stateStopping
	ln := s.ln
	s.mu.Unlock()
	close(s.acceptStop)

	start := time.Now()
	if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		s.logger.WarnContext(ctx, "closing listener", slog.Any("error", err))
	}
	<-s.acceptDone

	conns := s.snapshot()
	for _, c := range conns {
		c.goodbye()
	}
	grace := time.NewTimer(s.cfg.GoodbyeGrace)
	defer grace.Stop()
	if !s.waitConns(ctx, grace.C) {
		for _, c := range s.snapshot() {
			c.interrupt()
		}
		s.waitConns(ctx, nil)
	}
	var err error
	if ctx.Err() != nil {
		left := s.snapshot()
		for _, c := range left {
			c.abort()
		}
		s.cancelRoot()
		err = fmt.Errorf("server: stop: %d connections still open: %w", len(left), context.Cause(ctx))
	}
	s.cancelRoot()
	s.wg.Wait()
	s.mu.Lock()
	s.state = stateStopped
	s.mu.Unlock()
	s.logger.InfoContext(ctx, "tcp server stopped", slog.Int("connections_closed", len(conns)), slog.Duration("took", time.Since(start)))
	return err
}

// waitAll waits for a Stop in progress.
func (s *Server) waitAll(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("server: stop: %w", context.Cause(ctx))
	}
}

// waitConns waits until no connection is left (true), or until timeout fires or ctx ends (false).
func (s *Server) waitConns(ctx context.Context, timeout <-chan time.Time) bool {
	for {
		s.mu.Lock()
		n := len(s.conns)
		s.mu.Unlock()
		if n == 0 {
			return true
		}
		select {
		case <-s.connsChanged:
		case <-timeout:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// snapshot lists the open connections.
func (s *Server) snapshot() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		out = append(out, c)
	}
	return out
}

// Accept back-off: after a failed accept (out of file descriptors, EMFILE or ENFILE, and the
// like) the loop waits acceptBackoffMin, doubling with each failure in a row up to
// acceptBackoffMax, like net/http: it slows down instead of spinning, and connections wait in the
// listen backlog until descriptors are free. It logs the first failure of a streak and every
// acceptLogEvery-th at WARN, and the streak's end at INFO, not a line per failure.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
	acceptLogEvery   = 100
)

// nextAcceptBackoff is the pause after a failed accept that followed a pause of prev (0: none).
func nextAcceptBackoff(prev time.Duration) time.Duration {
	return min(max(2*prev, acceptBackoffMin), acceptBackoffMax)
}

// acceptLoop accepts connections until the listener is closed.
func (s *Server) acceptLoop(ln net.Listener) {
	defer s.wg.Done()
	defer close(s.acceptDone)
	var backoff time.Duration
	failures, since := 0, time.Time{}
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			stopping := s.state != stateRunning
			s.mu.Unlock()
			if stopping || errors.Is(err, net.ErrClosed) {
				if !stopping {
					s.mu.Lock()
					s.acceptErr = err
					s.mu.Unlock()
					s.logger.Error("listener closed unexpectedly", slog.Any("error", err))
				}
				return
			}
			// Out of file descriptors and similar: back off and retry (see nextAcceptBackoff).
			backoff = nextAcceptBackoff(backoff)
			if failures++; failures == 1 {
				since = time.Now()
			}
			if failures == 1 || failures%acceptLogEvery == 0 {
				s.logger.Warn("accept failed, backing off; new connections wait", slog.Any("error", err),
					slog.Int("failures", failures), slog.Duration("backoff", backoff))
			}
			s.pause(backoff)
			continue
		}
		if failures > 0 {
			s.logger.Info("accept recovered", slog.Int("failures", failures), slog.Duration("after", time.Since(since)))
			failures = 0
		}
		backoff = 0
		s.stats.accepted.Add(1)
		if s.cfg.TLSConfig != nil {
			// The handshake runs on the connection's first read (mode detection, or the
			// OVERLOADED answer), under its deadline, not in this loop.
			nc = tls.Server(nc, s.cfg.TLSConfig)
		}
		s.mu.Lock()
		switch {
		case s.state != stateRunning:
			s.mu.Unlock()
			_ = nc.Close()
			continue
		case len(s.conns) >= s.cfg.MaxConnections:
			s.mu.Unlock()
			s.reject(nc)
			continue
		}
		c := newConn(s, nc)
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

// reject answers a connection over MaxConnections with OVERLOADED (an Error frame after the
// preamble for a binary client, an ERR line for a text one) and closes it.
func (s *Server) reject(nc net.Conn) {
	s.stats.rejected.Add(1)
	if now := time.Now().UnixNano(); now-s.lastRejectLog.Load() > int64(10*time.Second) {
		s.lastRejectLog.Store(now)
		s.logger.Warn("connection limit reached, rejecting connections", slog.Int("max_connections", s.cfg.MaxConnections),
			slog.Int64("rejected_total", s.stats.rejected.Load()))
	}
	select {
	case s.rejecters <- struct{}{}:
	default:
		_ = nc.Close()
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() { <-s.rejecters }()
		defer nc.Close()
		defer lingerClose(nc, rejectTimeout)
		_ = nc.SetDeadline(time.Now().Add(rejectTimeout))
		e := protocol.ErrOverloaded.Errorf("too many connections (max %d); retry later", s.cfg.MaxConnections)
		e.RetryAfter = time.Second
		br := bufio.NewReaderSize(nc, 16)
		first, err := br.Peek(1)
		if err != nil {
			return
		}
		if protocol.IsBinary(first[0]) {
			w := protocol.NewWriter(nc, s.cfg.MaxFrameSize)
			if w.WritePreamble() == nil && w.WriteMessage(0, e) == nil {
				_ = w.Flush()
			}
			return
		}
		_, _ = nc.Write(text.AppendErr(nil, e))
	}()
}

// removeConn forgets a connection that ended.
func (s *Server) removeConn(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	select {
	case s.connsChanged <- struct{}{}:
	default:
	}
}

// newSessionID returns a session id unique in this process and unlikely to repeat across restarts.
func (s *Server) newSessionID() string {
	return fmt.Sprintf("%s-%d", s.sessionPrefix, s.nextSession.Add(1))
}

// Stats returns the server's figures now.
func (s *Server) Stats() Stats {
	st := Stats{
		Accepted:        s.stats.accepted.Load(),
		Rejected:        s.stats.rejected.Load(),
		ClosedByError:   s.stats.closedByError.Load(),
		SessionTimeouts: s.stats.sessionTimeouts.Load(),
	}
	for _, c := range s.snapshot() {
		st.Open++
		switch c.modeName() {
		case modeBinary:
			st.Binary++
		case modeText:
			st.Text++
		}
	}
	return st
}

// Sessions describes the open connections, ordered by session id.
func (s *Server) Sessions() []SessionInfo {
	conns := s.snapshot()
	out := make([]SessionInfo, 0, len(conns))
	for _, c := range conns {
		out = append(out, c.info())
	}
	slices.SortFunc(out, func(a, b SessionInfo) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// partitionCount returns how many partitions topic has, for message ids. Partition counts only
// grow, and a message id of partition 0 means the same with or without the "0:" prefix, so a
// cached count is refreshed only when a partition at or above it shows up.
func (s *Server) partitionCount(ctx context.Context, topic string, partition int32) int {
	if v, ok := s.partitions.Load(topic); ok && int(partition) < v.(int) {
		return v.(int)
	}
	n, err := s.broker.TopicPartitions(ctx, topic)
	if err != nil {
		return int(partition) + 2 // unknown: format "partition:offset", which is always accepted
	}
	if _, loaded := s.partitions.Swap(topic, n); !loaded && s.partitionsN.Add(1) > s.partitionsMax {
		s.partitions.Clear()
		s.partitionsN.Store(0)
	}
	return n
}
