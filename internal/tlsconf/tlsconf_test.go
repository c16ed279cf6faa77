package tlsconf

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// writePair writes a self-signed certificate with serial and its key to dir/cert.pem and
// dir/key.pem.
func writePair(t *testing.T, dir string, serial int64) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "spool"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Duration(serial) * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func serialOf(t *testing.T, s *Server) int64 {
	t.Helper()
	c, err := s.Config().GetCertificate(&tls.ClientHelloInfo{})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf.SerialNumber.Int64()
}

// TestReload: Reload swaps the certificate of new handshakes; a file that does not load returns a
// *FileError and keeps the current one.
func TestReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile := writePair(t, dir, 1)
	s, err := NewServer(Files{CertFile: certFile, KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	if c := s.Config("http/1.1"); c.MinVersion != tls.VersionTLS12 || c.ClientAuth != tls.NoClientCert || s.Mutual() {
		t.Fatalf("config: min %x, client auth %v", c.MinVersion, c.ClientAuth)
	}
	writePair(t, dir, 2)
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := serialOf(t, s); got != 2 {
		t.Fatalf("after reload: serial %d, want 2", got)
	}
	if err := os.WriteFile(certFile, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	var fe *FileError
	if err := s.Reload(); !errors.As(err, &fe) || fe.Key != "cert_file" {
		t.Fatalf("reload of a broken file: %v", err)
	}
	if got := serialOf(t, s); got != 2 {
		t.Fatalf("after a failed reload: serial %d, want 2 still", got)
	}
}

// TestMutualAndClientConfig: client_ca_file requires verified client certificates; the client
// flags' errors name the flag.
func TestMutualAndClientConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile := writePair(t, dir, 1)
	s, err := NewServer(Files{CertFile: certFile, KeyFile: keyFile, ClientCAFile: certFile})
	if err != nil {
		t.Fatal(err)
	}
	if c := s.Config(); c.ClientAuth != tls.RequireAndVerifyClientCert || c.ClientCAs == nil {
		t.Fatalf("mutual: client auth %v", c.ClientAuth)
	}
	if _, err := NewServer(Files{CertFile: certFile, KeyFile: keyFile, ClientCAFile: keyFile}); err == nil {
		t.Fatal("a key as client CA file: accepted")
	}
	c, err := ClientConfig(certFile, certFile, keyFile)
	if err != nil || c.RootCAs == nil || len(c.Certificates) != 1 || c.MinVersion != tls.VersionTLS12 {
		t.Fatalf("ClientConfig: %v", err)
	}
	var fe *FileError
	for _, tc := range []struct{ ca, cert, key, flag string }{
		{filepath.Join(dir, "missing"), "", "", "--tls-ca"},
		{"", certFile, "", "--tls-key"},
		{"", "", keyFile, "--tls-cert"},
		{"", keyFile, keyFile, "--tls-cert"},
	} {
		if _, err := ClientConfig(tc.ca, tc.cert, tc.key); !errors.As(err, &fe) || fe.Key != tc.flag {
			t.Errorf("ClientConfig(%q, %q, %q): %v, want an error for %s", tc.ca, tc.cert, tc.key, err, tc.flag)
		}
	}
}
