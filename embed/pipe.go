package embed

import (
	"context"
	"errors"
	"net"
	"sync"
)

// pipeListener is the server's listener of in-memory connections: dial hands the server one
// end of a net.Pipe. with merges a TCP listener's connections into it, so that one server serves
// both.
type pipeListener struct {
	conns chan accepted
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup // the TCP forwarder of with
}

// accepted is what Accept returns: an in-memory connection, or what the TCP listener accepted
// (a connection or an error such as running out of descriptors, which the server backs off
// from as it does with its own listener).
type accepted struct {
	c   net.Conn
	err error
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan accepted), done: make(chan struct{})}
}

// errClosed is what dial returns once the broker is closed.
var errClosed = errors.New("embed: broker closed")

// dial returns the client end of a new in-memory connection once the server took the other.
func (l *pipeListener) dial(ctx context.Context) (net.Conn, error) {
	cc, sc := net.Pipe()
	select {
	case l.conns <- accepted{c: sc}:
		return cc, nil
	case <-l.done:
		err := errClosed
		_, _ = cc.Close(), sc.Close()
		return nil, err
	case <-ctx.Done():
		_, _ = cc.Close(), sc.Close()
		return nil, ctx.Err()
	}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case a := <-l.conns:
		return a.c, a.err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

// with returns a listener that accepts l's connections and tcp's; closing it closes both. Its
// forwarder goroutine ends once tcp is closed (wait).
func (l *pipeListener) with(tcp net.Listener) net.Listener {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for {
			c, err := tcp.Accept()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			select {
			case l.conns <- accepted{c: c, err: err}:
			case <-l.done:
				if c != nil {
					_ = c.Close()
				}
				return
			}
		}
	}()
	return &bothListener{pipeListener: l, tcp: tcp}
}

// wait waits for the forwarder of with, once the TCP listener is closed.
func (l *pipeListener) wait() { l.wg.Wait() }

// bothListener is pipeListener.with's listener: its address is the TCP one.
type bothListener struct {
	*pipeListener
	tcp net.Listener
}

func (b *bothListener) Close() error {
	_ = b.pipeListener.Close()
	return b.tcp.Close()
}

func (b *bothListener) Addr() net.Addr { return b.tcp.Addr() }

// pipeAddr is the address of in-memory connections.
type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "embedded" }
