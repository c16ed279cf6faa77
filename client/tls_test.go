package client

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"testing"
	"time"

	"github.com/spoolmq/spool/protocol"
)

// TestTLS: with TLSConfig the preamble and frames run inside TLS, and the server name defaults to
// the host of the address.
func TestTLS(t *testing.T) {
	t.Parallel()
	cert, pool := selfSigned(t, "pipe")
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

// selfSigned returns a certificate for host and a pool that trusts it.
func selfSigned(t *testing.T, host string) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: host},
		DNSNames:              []string{host},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:                  true,
		BasicConstraintsValid: true,
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
