package server

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/protocol"
)

// TestTLSBothModesAndLimit: with TLSConfig the text mode and the binary protocol run inside TLS on
// one port, and a connection over MaxConnections gets its OVERLOADED answer inside TLS too.
func TestTLSBothModesAndLimit(t *testing.T) {
	t.Parallel()
	cert, pool := serverCert(t)
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

// serverCert returns a self-signed certificate for 127.0.0.1 and a pool that trusts it.
func serverCert(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}
