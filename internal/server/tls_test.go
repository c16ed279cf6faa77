package server

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/testutil"
	"github.com/spoolmq/spool/protocol"
)

// TestTLSBothModesAndLimit: with TLSConfig the text mode and the binary protocol run inside TLS on
// one port, and a connection over MaxConnections gets its OVERLOADED answer inside TLS too.
func TestTLSBothModesAndLimit(t *testing.T) {
	t.Parallel()
	cert, pool := testutil.SelfSignedCert(t, "127.0.0.1")
	e := newEnv(t, func(c *Config) {
		c.MaxConnections = 1
		c.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}, nil)
	dial := func() *tls.Conn {
		tc, err := tls.DialWithDialer(&net.Dialer{Timeout: waitTimeout}, "tcp", e.addr, &tls.Config{RootCAs: pool})
		if err != nil {
			t.Fatalf("TLS dial: %v", err)
		}
		t.Cleanup(func() { _ = tc.Close() })
		_ = tc.SetDeadline(time.Now().Add(waitTimeout))
		return tc
	}
	textLine := func(tc *tls.Conn, line string) string {
		if _, err := io.WriteString(tc, line+"\n"); err != nil {
			t.Fatal(err)
		}
		l, err := bufio.NewReader(tc).ReadString('\n')
		if err != nil {
			t.Fatalf("text reply to %q: %v", line, err)
		}
		return l
	}

	// Text mode; then the connection closes and frees the only place.
	tc := dial()
	if l := textLine(tc, "PUBLISH tls text"); !strings.HasPrefix(l, "OK ") {
		t.Fatalf("text publish over TLS: %q", l)
	}
	_ = tc.Close()
	eventually(t, "the text connection gone", func() error {
		if n := e.srv.Stats().Open; n != 0 {
			return fmt.Errorf("%d open", n)
		}
		return nil
	})
	// Binary on the same port: a raw client's handshake and a publish.
	bc := dial()
	b := &bclient{t: t, nc: bc, r: protocol.NewReader(bc, 0), w: protocol.NewWriter(bc, 0), corr: 1}
	if _, err := protocol.ClientHandshake(b.r, b.w, &protocol.Hello{ClientName: "tls"}); err != nil {
		t.Fatalf("binary handshake over TLS: %v", err)
	}
	b.publish("tls", "binary")
	// Over the limit: ERR OVERLOADED inside TLS.
	if l := textLine(dial(), "PING"); !strings.HasPrefix(l, "ERR OVERLOADED") {
		t.Fatalf("over the limit: %q", l)
	}
}
