package admin

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spoolmq/spool/protocol"
)

// Limits of the HTTP listener (NewServer, LimitListener, Config.BodyReadTimeout). A client that
// trickles its headers or body, or keeps idle connections open, holds a goroutine and a socket
// each; these bound what it can hold.
const (
	// ReadHeaderTimeout bounds the reading of a request's line and headers.
	ReadHeaderTimeout = 10 * time.Second
	// DefaultBodyReadTimeout bounds the reading of a request body, from the start of the handler:
	// a body not received by then is answered 408 SESSION_TIMEOUT.
	DefaultBodyReadTimeout = 30 * time.Second
	// IdleTimeout closes a keep-alive connection that sends no request for that long.
	IdleTimeout = 2 * time.Minute
	// WriteTimeout bounds a response, from the end of the request headers: longer than the
	// longest pull wait (DefaultMaxPullWait).
	WriteTimeout = DefaultMaxPullWait + 30*time.Second
	// DefaultMaxConnections bounds the open HTTP connections (LimitListener).
	DefaultMaxConnections = 1024
	// refuseTimeout bounds the life of a connection refused by LimitListener.
	refuseTimeout = time.Second
)

// NewServer returns the HTTP server of h with the timeouts above. Serve it on a LimitListener.
// The body timeout is the handler's (Config.BodyReadTimeout), per request, so that a slow body
// gets a clear 408 SESSION_TIMEOUT rather than the bare read error of a server-wide ReadTimeout.
func NewServer(h *Handler, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// LimitListener returns ln accepting at most maxConns open connections at a time. A connection
// over the limit is answered at once with 503 and the JSON error OVERLOADED (retryable,
// Retry-After: 1) and closed, so that the client knows why, instead of waiting in the backlog.
// With tlsCfg, every connection, the refused ones too, speaks TLS; http.Server gets the *tls.Conn
// (it runs the handshake within ReadHeaderTimeout and fills Request.TLS). An accept that fails
// for lack of file descriptors or memory is retried after a pause (see acceptBackoff), logged to
// logger (nil discards) once per streak.
func LimitListener(ln net.Listener, maxConns int, tlsCfg *tls.Config, logger *slog.Logger) net.Listener {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	l := &limitListener{Listener: ln, max: int64(maxConns), refusal: refusal(maxConns), tls: tlsCfg,
		logger: logger, closed: make(chan struct{})}
	l.pause = func(d time.Duration) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-l.closed:
		}
	}
	return l
}

type limitListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	refusal []byte
	tls     *tls.Config
	// refusing bounds the goroutines answering connections over the limit (each may run a TLS
	// handshake); past it a connection is closed at once, as the TCP server does.
	refusing atomic.Int64
	logger   *slog.Logger
	// closed is closed by Close: it ends an accept back-off pause at once.
	closed    chan struct{}
	closeOnce sync.Once
	// pause waits d after a failed accept, or less if the listener closes (tests record it).
	pause func(d time.Duration)
}

// Accept back-off: an accept that fails for lack of resources (EMFILE, ENFILE, ENOBUFS, ENOMEM)
// is retried after acceptBackoffMin, doubling with each failure in a row up to
// acceptBackoffMax, so that running out of file descriptors slows accepts instead of spinning
// (connections wait in the listen backlog). net/http's Serve would back off too, but logs a line
// per failure: the listener logs the first failure of a streak and every acceptLogEvery-th at
// WARN, and the streak's end at INFO. Other errors go to Serve as they are.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
	acceptLogEvery   = 100
)

// outOfResources reports whether err, a failed accept, is a lack of descriptors or memory.
func outOfResources(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOBUFS) ||
		errors.Is(err, syscall.ENOMEM)
}

// Close closes the listener and ends an accept back-off in progress.
func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// acceptRetrying is Listener.Accept with the back-off above.
func (l *limitListener) acceptRetrying() (net.Conn, error) {
	var backoff time.Duration
	failures, since := 0, time.Time{}
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			if failures > 0 {
				l.logger.Info("http accept recovered", slog.Int("failures", failures), slog.Duration("after", time.Since(since)))
			}
			return c, nil
		}
		select {
		case <-l.closed:
			return nil, err
		default:
		}
		if !outOfResources(err) {
			return nil, err
		}
		backoff = min(max(2*backoff, acceptBackoffMin), acceptBackoffMax)
		if failures++; failures == 1 {
			since = time.Now()
		}
		if failures == 1 || failures%acceptLogEvery == 0 {
			l.logger.Warn("http accept failed, backing off; new connections wait", slog.Any("error", err),
				slog.Int("failures", failures), slog.Duration("backoff", backoff))
		}
		l.pause(backoff)
	}
}

// maxRefusing is how many refusals may be answered at once.
const maxRefusing = 64

// wrap returns c in TLS when the listener has a configuration.
func (l *limitListener) wrap(c net.Conn) net.Conn {
	if l.tls == nil {
		return c
	}
	return tls.Server(c, l.tls)
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.acceptRetrying()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			if l.refusing.Add(1) > maxRefusing {
				l.refusing.Add(-1)
				_ = c.Close()
				continue
			}
			go func() {
				defer l.refusing.Add(-1)
				refuse(l.wrap(c), l.refusal)
			}()
			continue
		}
		return l.wrap(&limitConn{Conn: c, release: func() { l.open.Add(-1) }}), nil
	}
}

// limitConn gives its place back once, on the first Close.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// refusal is the response to a connection over the limit.
func refusal(maxConns int) []byte {
	body, _ := json.Marshal(errorBody{Error: errorDetail{Code: protocol.ErrOverloaded.Name, Retryable: true,
		Message: fmt.Sprintf("too many HTTP connections (limit %d); retry later", maxConns)}})
	body = append(body, '\n')
	return fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nCache-Control: no-store\r\n"+
		"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// refuse writes the refusal, half-closes, and reads what the client sent (a bounded amount, for
// at most refuseTimeout) before closing: closing with unread input would make the kernel send a
// reset, which can destroy the response before the client reads it.
func refuse(c net.Conn, resp []byte) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(refuseTimeout))
	if _, err := c.Write(resp); err != nil {
		return
	}
	if tc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}

// deadlineBody turns the timeout of a request body read into SESSION_TIMEOUT (408). The
// connection's read deadline is set when the handler starts (Handler.wrap); net/http clears it
// once the body was read, before it watches the connection for the client going away, so a long
// pull is not cut off.
type deadlineBody struct {
	io.ReadCloser
	timeout time.Duration
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		// The deadline stays: the server's attempt to read the rest of the body before answering
		// fails at once, and the connection closes after the answer.
		err = protocol.ErrSessionTimeout.Errorf("request body not received within %s", b.timeout)
	}
	return n, err
}
