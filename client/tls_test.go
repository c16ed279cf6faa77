package client

import (
	"context"
	"crypto/tls"
	"testing"

	"github.com/spoolmq/spool/internal/testutil"
	"github.com/spoolmq/spool/protocol"
)

// TestTLS: with TLSConfig the preamble and frames run inside TLS, and the server name defaults to
// the host of the address.
func TestTLS(t *testing.T) {
	t.Parallel()
	cert, pool := testutil.SelfSignedCert(t, "pipe")
	n := newPipeNet(t)
	ch := make(chan error, 1)
	var c *Client
	go func() {
		var err error
		c, err = Dial(context.Background(), "pipe:1", Dialer(n.dial), Logger(testLogger(t)), TLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}))
		ch <- err
	}()
	raw := recv(t, n.accept, "connection")
	t.Cleanup(func() { _ = raw.Close() })
	sc := tls.Server(raw, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
	p := &peer{t: t, nc: sc, r: protocol.NewReader(sc, 0), w: protocol.NewWriter(sc, 0)}
	p.handshake(nil)
	if err := recv(t, ch, "Dial"); err != nil {
		t.Fatalf("Dial over TLS: %v", err)
	}
	closePipeClient(t, c, &p)
	if got := sc.ConnectionState().ServerName; got != "pipe" {
		t.Fatalf("SNI %q, want the host of the address", got)
	}
	res := make(chan error, 1)
	go func() {
		_, err := c.Publish(context.Background(), "t", Message{Payload: []byte("secret")})
		res <- err
	}()
	corr, pub := expect[*protocol.Publish](p)
	if string(pub.Messages[0].Payload) != "secret" {
		t.Fatalf("payload %q", pub.Messages[0].Payload)
	}
	p.write(corr, &protocol.PublishOK{Positions: []protocol.Position{{}}})
	if err := recv(t, res, "publish"); err != nil {
		t.Fatal(err)
	}
}
