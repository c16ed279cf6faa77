package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal"
	"github.com/spoolmq/spool/internal/testutil"
	"github.com/spoolmq/spool/protocol"
	"github.com/spoolmq/spool/protocol/text"
)

// waitTimeout bounds every wait of these tests: nothing is timed, a test only fails when an
// expected event never happens.
const waitTimeout = 20 * time.Second

// env is a server on 127.0.0.1:0 over a broker on a real wal engine in a temporary directory.
type env struct {
	t      testing.TB
	engine storage.Engine
	b      *broker.Broker
	srv    *Server
	addr   string
	// clientTLS is set by newTLSEnv: dialRaw dials over TLS.
	clientTLS *tls.Config
}

// newEnv starts an engine, a broker and a server; mod may change the server config, bmod the
// broker's.
func newEnv(t testing.TB, mod func(*Config), bmod func(*broker.Config)) *env {
	t.Helper()
	return newEnvWAL(t, wal.Config{}, mod, bmod)
}

// newEnvWAL is newEnv with the engine configuration wcfg.
func newEnvWAL(t testing.TB, wcfg wal.Config, mod func(*Config), bmod func(*broker.Config)) *env {
	t.Helper()
	eng, err := wal.Open(t.TempDir(), wcfg)
	if err != nil {
		t.Fatalf("wal.Open: %v", err)
	}
	return newEnvEngine(t, eng, mod, bmod)
}

// newEnvEngine is newEnv over the engine eng, which the env closes.
func newEnvEngine(t testing.TB, eng storage.Engine, mod func(*Config), bmod func(*broker.Config)) *env {
	t.Helper()
	e := &env{t: t, engine: eng}
	bcfg := broker.Config{Engine: eng, Logger: testLogger(t), RetentionInterval: -1, PollInterval: 50 * time.Millisecond}
	if bmod != nil {
		bmod(&bcfg)
	}
	b, err := broker.New(bcfg)
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatalf("broker.Start: %v", err)
	}
	e.b = b
	cfg := Config{Logger: testLogger(t), Name: "test", GoodbyeGrace: 2 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := New(cfg, b)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	if err := srv.Start(context.Background(), ln); err != nil {
		t.Fatalf("server.Start: %v", err)
	}
	e.srv = srv
	e.addr = ln.Addr().String()
	t.Cleanup(e.close)
	return e
}

// newTLSEnv is newEnv with a server that speaks TLS (a self-signed certificate for 127.0.0.1);
// its dialRaw, and so every client of the env, dials over TLS.
func newTLSEnv(t testing.TB, mod func(*Config), bmod func(*broker.Config)) *env {
	t.Helper()
	cert, pool := testutil.SelfSignedCert(t, "127.0.0.1")
	e := newEnv(t, func(c *Config) {
		c.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if mod != nil {
			mod(c)
		}
	}, bmod)
	e.clientTLS = &tls.Config{RootCAs: pool}
	return e
}

// close stops the server, then the broker, then closes the engine: the shutdown order of spool
// serve.
func (e *env) close() {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := e.srv.Stop(ctx); err != nil {
		e.t.Errorf("server.Stop: %v", err)
	}
	if err := e.b.Stop(ctx); err != nil {
		e.t.Errorf("broker.Stop: %v", err)
	}
	if err := e.engine.Close(); err != nil {
		e.t.Errorf("engine.Close: %v", err)
	}
}

func testLogger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("SPOOL_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: level}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// eventually polls f until it returns nil or waitTimeout passes.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	testutil.Eventually(t, waitTimeout, what, f)
}

// bclient is a raw binary client: it sends frames and expects frames, keeping the deliveries it
// reads while waiting for a response.
type bclient struct {
	t     testing.TB
	nc    net.Conn
	r     *protocol.Reader
	w     *protocol.Writer
	wmu   sync.Mutex
	corr  uint32
	hello *protocol.HelloOK
	// deliveries read and not taken yet; ended are SubscriptionEnded pushes; other are frames that
	// answer nothing the client waits for (server Heartbeat, Goodbye).
	deliveries []protocol.Delivery
	ended      []*protocol.SubscriptionEnded
	other      []protocol.ServerMessage
}

// dialRaw connects without any handshake of Spool's (over TLS, after the TLS handshake, for an
// env of newTLSEnv).
func (e *env) dialRaw() net.Conn {
	e.t.Helper()
	var nc net.Conn
	var err error
	if e.clientTLS != nil {
		nc, err = tls.DialWithDialer(&net.Dialer{Timeout: waitTimeout}, "tcp", e.addr, e.clientTLS)
	} else {
		nc, err = net.DialTimeout("tcp", e.addr, waitTimeout)
	}
	if err != nil {
		e.t.Fatalf("dial: %v", err)
	}
	e.t.Cleanup(func() { nc.Close() })
	return nc
}

// dial connects and completes the handshake with hello (nil: defaults).
func (e *env) dial(hello *protocol.Hello) *bclient {
	e.t.Helper()
	c, err := e.tryDial(hello)
	if err != nil {
		e.t.Fatalf("handshake: %v", err)
	}
	return c
}

func (e *env) tryDial(hello *protocol.Hello) (*bclient, error) {
	nc, err := net.DialTimeout("tcp", e.addr, waitTimeout)
	if err != nil {
		return nil, err
	}
	c := &bclient{t: e.t, nc: nc, r: protocol.NewReader(nc, 0), w: protocol.NewWriter(nc, 0), corr: 1}
	e.t.Cleanup(func() { nc.Close() })
	if hello == nil {
		hello = &protocol.Hello{ClientName: "test"}
	}
	_ = nc.SetDeadline(time.Now().Add(waitTimeout))
	ok, err := protocol.ClientHandshake(c.r, c.w, hello)
	_ = nc.SetDeadline(time.Time{})
	if err != nil {
		return nil, err
	}
	c.hello = ok
	return c, nil
}

// send writes one frame; corr 0 means the next correlation id, which it returns.
func (c *bclient) send(m protocol.Message) uint32 {
	c.t.Helper()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.corr++
	if err := c.w.WriteMessage(c.corr, m); err != nil {
		c.t.Fatalf("write %s: %v", m.Opcode(), err)
	}
	if err := c.w.Flush(); err != nil {
		c.t.Fatalf("flush %s: %v", m.Opcode(), err)
	}
	return c.corr
}

// sendCorr writes one frame with a given correlation id.
func (c *bclient) sendCorr(corr uint32, m protocol.Message) {
	c.t.Helper()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.w.WriteMessage(corr, m); err != nil {
		c.t.Fatalf("write %s: %v", m.Opcode(), err)
	}
	if err := c.w.Flush(); err != nil {
		c.t.Fatalf("flush %s: %v", m.Opcode(), err)
	}
}

// read reads the next frame (failing the test on error or timeout).
func (c *bclient) read() (uint32, protocol.ServerMessage) {
	c.t.Helper()
	corr, m, err := c.tryRead()
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return corr, m
}

func (c *bclient) tryRead() (uint32, protocol.ServerMessage, error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(waitTimeout))
	return c.r.ReadServerMessage()
}

// keep files frames that are not the response being waited for, and answers the server's
// heartbeats like a real client.
func (c *bclient) keep(corr uint32, m protocol.ServerMessage) {
	switch m := m.(type) {
	case *protocol.Deliver:
		c.deliveries = append(c.deliveries, m.Deliveries...)
	case *protocol.SubscriptionEnded:
		c.ended = append(c.ended, m)
	case *protocol.Heartbeat:
		c.sendCorr(corr, &protocol.HeartbeatOK{Echo: m.Time, Time: time.Now()})
	default:
		c.other = append(c.other, m)
	}
}

// response reads until the response to corr arrives.
func (c *bclient) response(corr uint32) protocol.ServerMessage {
	c.t.Helper()
	for {
		got, m := c.read()
		if got == corr && m.Opcode().IsResponse() {
			return m
		}
		c.keep(got, m)
	}
}

// request sends m and returns its response.
func (c *bclient) request(m protocol.Message) protocol.ServerMessage {
	c.t.Helper()
	return c.response(c.send(m))
}

// expectOK sends m and fails unless the response is not an Error.
func expectOK[T protocol.ServerMessage](c *bclient, m protocol.Message) T {
	c.t.Helper()
	resp := c.request(m)
	ok, isT := resp.(T)
	if !isT {
		c.t.Fatalf("%s: got %T %v", m.Opcode(), resp, resp)
	}
	return ok
}

// expectErr sends m and fails unless the response is an Error with code.
func (c *bclient) expectErr(m protocol.Message, code uint16) *protocol.Error {
	c.t.Helper()
	resp := c.request(m)
	e, ok := resp.(*protocol.Error)
	if !ok || e.Code != code {
		c.t.Fatalf("%s: got %T %v, want Error code %d", m.Opcode(), resp, resp, code)
	}
	return e
}

// deliveriesN reads until n deliveries are buffered and takes them.
func (c *bclient) deliveriesN(n int) []protocol.Delivery {
	c.t.Helper()
	for len(c.deliveries) < n {
		corr, m := c.read()
		c.keep(corr, m)
	}
	out := c.deliveries[:n:n]
	c.deliveries = c.deliveries[n:]
	return out
}

// expectClosed reads until the server closes the connection and returns the frames it read.
func (c *bclient) expectClosed() []protocol.ServerMessage {
	c.t.Helper()
	var got []protocol.ServerMessage
	for {
		_, m, err := c.tryRead()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err) {
				c.nc.Close() // like a real client
				return got
			}
			c.t.Fatalf("waiting for the server to close: %v (after %v)", err, got)
		}
		got = append(got, m)
	}
}

func isReset(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "broken pipe"))
}

// subscribe opens a handle and returns its SubscribeOK.
func (c *bclient) subscribe(s *protocol.Subscribe) *protocol.SubscribeOK {
	c.t.Helper()
	return expectOK[*protocol.SubscribeOK](c, s)
}

// publish publishes payloads to topic in one batch.
// holdN publishes n messages to topic, subscribes with room for all of them and returns their
// deliveries, which the connection then holds.
func (c *bclient) holdN(topic string, n int) []protocol.Delivery {
	c.t.Helper()
	payloads := make([]string, n)
	for i := range payloads {
		payloads[i] = fmt.Sprint("m", i)
	}
	c.publish(topic, payloads...)
	c.subscribe(&protocol.Subscribe{Topic: topic, MaxInFlight: uint32(n)})
	return c.deliveriesN(n)
}

func (c *bclient) publish(topic string, payloads ...string) *protocol.PublishOK {
	c.t.Helper()
	msgs := make([]protocol.PublishMessage, len(payloads))
	for i, p := range payloads {
		msgs[i] = protocol.PublishMessage{Partition: protocol.PartitionAuto, Payload: []byte(p)}
	}
	return expectOK[*protocol.PublishOK](c, &protocol.Publish{Topic: topic, Messages: msgs})
}

func refs(ds ...protocol.Delivery) []protocol.Ref {
	out := make([]protocol.Ref, len(ds))
	for i := range ds {
		out[i] = ds[i].Ref()
	}
	return out
}

func payloadsOf(ds []protocol.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = string(d.Payload)
	}
	return out
}

// tclient is a raw text-mode client, driving the connection as nc does.
type tclient struct {
	t  testing.TB
	nc net.Conn
	br *bufio.Reader
}

func (e *env) dialText() *tclient {
	e.t.Helper()
	nc := e.dialRaw()
	return &tclient{t: e.t, nc: nc, br: bufio.NewReader(nc)}
}

// send writes lines, each terminated by "\n".
func (c *tclient) send(lines ...string) {
	c.t.Helper()
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	if _, err := io.WriteString(c.nc, b.String()); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// line reads the next line without its terminator.
func (c *tclient) line() string {
	c.t.Helper()
	l, err := c.tryLine()
	if err != nil {
		c.t.Fatalf("read line: %v", err)
	}
	return l
}

func (c *tclient) tryLine() (string, error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(waitTimeout))
	l, err := c.br.ReadString('\n')
	if err != nil {
		return l, err
	}
	return strings.TrimSuffix(l, "\n"), nil
}

// expect reads the next line that is not information ("# ...") and checks its prefix.
func (c *tclient) expect(prefix string) string {
	c.t.Helper()
	for {
		l := c.line()
		if strings.HasPrefix(l, "# ") && !strings.HasPrefix(prefix, "# ") {
			continue
		}
		if !strings.HasPrefix(l, prefix) {
			c.t.Fatalf("got line %q, want prefix %q", l, prefix)
		}
		return l
	}
}

// expectLine reads the next line, which must be want exactly (comment lines included).
func (c *tclient) expectLine(want string) {
	c.t.Helper()
	if l := c.line(); l != want {
		c.t.Fatalf("got line %q, want %q", l, want)
	}
}

// expectEOF reads until the server closes the connection and returns the lines it read.
func (c *tclient) expectEOF() []string {
	c.t.Helper()
	var got []string
	for {
		l, err := c.tryLine()
		if err != nil {
			if errors.Is(err, io.EOF) || isReset(err) {
				c.nc.Close() // like nc
				return got
			}
			c.t.Fatalf("waiting for the server to close: %v (after %q)", err, got)
		}
		got = append(got, l)
	}
}

// reply parses a line with text.ParseReply.
func parseReply(t *testing.T, line string) text.Reply {
	t.Helper()
	r, err := text.ParseReply([]byte(line))
	if err != nil {
		t.Fatalf("parse %q: %v", line, err)
	}
	return r
}

// members returns the broker's live members.
func (e *env) memberInfo(id string) (broker.MemberInfo, error) {
	for _, m := range e.b.Members() {
		if m.ID == id {
			return m, nil
		}
	}
	return broker.MemberInfo{}, fmt.Errorf("member %q not found", id)
}

// groupStats returns the stats of group on topic ("" for the queue subscription).
func (e *env) groupStats(topic, group string) *storage.SubscriptionStats {
	e.t.Helper()
	info, err := e.b.Group(context.Background(), topic, group)
	if err != nil {
		e.t.Fatalf("group %q on %q: %v", group, topic, err)
	}
	return info.Stats
}

// raiseFileLimit makes sure the process may open n files, or skips the test.
func raiseFileLimit(t *testing.T, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skipf("getrlimit: %v", err)
	}
	if lim.Cur >= n {
		return
	}
	if lim.Max < n {
		t.Skipf("RLIMIT_NOFILE hard limit %d < %d", lim.Max, n)
	}
	lim.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skipf("setrlimit: %v", err)
	}
}
