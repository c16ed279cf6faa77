// Package tlsconf loads the TLS material of spool serve's listeners (the server.tls section of
// the configuration: certificate, key, optional client CA for mutual TLS) and keeps the current
// certificate, so that a reload (SIGHUP) changes it for new connections without touching the open
// ones. It also builds the TLS configuration of the client commands (--tls-ca, --tls-cert,
// --tls-key).
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
)

// MinVersion is the oldest TLS version Spool speaks, on both sides.
const MinVersion = tls.VersionTLS12

// Files are the PEM files of the listeners' TLS. The yaml tags are the keys of the server.tls
// section of the configuration file.
type Files struct {
	// CertFile is the server certificate, followed by its intermediates. Setting it (with KeyFile)
	// turns TLS on for the TCP listener (binary protocol and text mode) and the HTTP listener.
	CertFile string `yaml:"cert_file"`
	// KeyFile is the private key of CertFile.
	KeyFile string `yaml:"key_file"`
	// ClientCAFile, when set, turns on mutual TLS: every client must present a certificate signed
	// by one of these CAs, or the handshake fails.
	ClientCAFile string `yaml:"client_ca_file"`
}

// Enabled reports whether any file is set (TLS is on; Check then requires CertFile and KeyFile).
func (f Files) Enabled() bool { return f.CertFile != "" || f.KeyFile != "" || f.ClientCAFile != "" }

// FileError is the error of a TLS setting whose file is missing or unusable. Key is the setting's
// key in the server.tls section ("cert_file", "key_file", "client_ca_file").
type FileError struct {
	Key  string
	Path string
	Err  error
}

func (e *FileError) Error() string { return e.Key + " " + e.Detail() }

// Detail is the message without the key: the file and what is wrong with it.
func (e *FileError) Detail() string {
	if e.Path == "" {
		return e.Err.Error()
	}
	return fmt.Sprintf("%q: %v", e.Path, e.Err)
}

func (e *FileError) Unwrap() error { return e.Err }

// Check loads every file once and reports the first problem as a *FileError; nil when TLS is off.
func (f Files) Check() error {
	if !f.Enabled() {
		return nil
	}
	if _, err := f.loadCert(); err != nil {
		return err
	}
	if f.ClientCAFile != "" {
		if _, err := LoadPool(f.ClientCAFile); err != nil {
			return &FileError{Key: "client_ca_file", Path: f.ClientCAFile, Err: err}
		}
	}
	return nil
}

// loadCert reads the certificate and its key.
func (f Files) loadCert() (*tls.Certificate, error) {
	switch {
	case f.CertFile == "":
		return nil, &FileError{Key: "cert_file", Err: errors.New("must be set when key_file or client_ca_file is (TLS needs a certificate and its key)")}
	case f.KeyFile == "":
		return nil, &FileError{Key: "key_file", Err: errors.New("must be set with cert_file (the certificate's private key)")}
	}
	certPEM, err := os.ReadFile(f.CertFile)
	if err != nil {
		return nil, &FileError{Key: "cert_file", Path: f.CertFile, Err: err}
	}
	keyPEM, err := os.ReadFile(f.KeyFile)
	if err != nil {
		return nil, &FileError{Key: "key_file", Path: f.KeyFile, Err: err}
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, &FileError{Key: "cert_file", Path: f.CertFile, Err: fmt.Errorf("with key_file %q: %w", f.KeyFile, err)}
	}
	return &cert, nil
}

// LoadPool reads a PEM file of CA certificates.
func LoadPool(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, errors.New("no PEM certificate found")
	}
	return pool, nil
}

// Server holds the listeners' TLS: the current certificate, swapped by Reload, and the client
// CAs of mutual TLS. Safe for concurrent use.
type Server struct {
	files Files
	cert  atomic.Pointer[tls.Certificate]
	// clientCAs is nil without mutual TLS; read at start only (a reload changes the certificate).
	clientCAs *x509.CertPool
}

// NewServer loads files (Check's errors).
func NewServer(files Files) (*Server, error) {
	if err := files.Check(); err != nil {
		return nil, err
	}
	s := &Server{files: files}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	if files.ClientCAFile != "" {
		pool, err := LoadPool(files.ClientCAFile)
		if err != nil {
			return nil, &FileError{Key: "client_ca_file", Path: files.ClientCAFile, Err: err}
		}
		s.clientCAs = pool
	}
	return s, nil
}

// Reload reads the certificate and key files again and makes them the certificate of every new
// handshake; open connections keep theirs. On error the current certificate stays.
func (s *Server) Reload() error {
	cert, err := s.files.loadCert()
	if err != nil {
		return err
	}
	s.cert.Store(cert)
	return nil
}

// Mutual reports whether clients must present a certificate.
func (s *Server) Mutual() bool { return s.clientCAs != nil }

// NotAfter is the expiry of the current certificate (zero when it cannot be parsed), for logs.
func (s *Server) NotAfter() time.Time {
	c := s.cert.Load()
	if c == nil || len(c.Certificate) == 0 {
		return time.Time{}
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return time.Time{}
	}
	return leaf.NotAfter
}

// Config returns a server configuration that uses the current certificate at each handshake
// (TLS 1.2 or later; client certificates required and verified with mutual TLS). nextProtos are
// the ALPN protocols offered (the HTTP listener: "http/1.1").
func (s *Server) Config(nextProtos ...string) *tls.Config {
	c := &tls.Config{
		MinVersion:     MinVersion,
		NextProtos:     nextProtos,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.cert.Load(), nil },
	}
	if s.clientCAs != nil {
		c.ClientAuth = tls.RequireAndVerifyClientCert
		c.ClientCAs = s.clientCAs
	}
	return c
}

// ClientConfig is the TLS configuration of a client: caFile (empty: the system's roots) verifies
// the server; certFile and keyFile, both or neither, are the client certificate of mutual TLS.
// Errors are *FileError keyed by the flag names ("--tls-ca", "--tls-cert", "--tls-key").
func ClientConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: MinVersion}
	if caFile != "" {
		pool, err := LoadPool(caFile)
		if err != nil {
			return nil, &FileError{Key: "--tls-ca", Path: caFile, Err: err}
		}
		c.RootCAs = pool
	}
	switch {
	case certFile == "" && keyFile == "":
	case certFile == "":
		return nil, &FileError{Key: "--tls-cert", Err: errors.New("must be given with --tls-key")}
	case keyFile == "":
		return nil, &FileError{Key: "--tls-key", Err: errors.New("must be given with --tls-cert")}
	default:
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, &FileError{Key: "--tls-cert", Path: certFile, Err: fmt.Errorf("with --tls-key %q: %w", keyFile, err)}
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
