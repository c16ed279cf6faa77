package admin

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Defaults of the client.
const (
	// DefaultTimeout bounds one request when NewClient is given no *http.Client.
	DefaultTimeout = 60 * time.Second
	// MaxResponseBytes bounds the body of an answer that the client reads.
	MaxResponseBytes = 512 << 20
	// QueueGroup is the API's name of the one subscription of a QUEUE topic; the group
	// arguments of Client take "" for it too.
	QueueGroup = "$queue"
)

// APIError is an error answer of the admin API: {"error":{"code","message","retryable"}}. An
// answer that is not in that shape (a proxy's error page) gets the code "HTTP_<status>". Get it
// with errors.As.
type APIError struct {
	// Status is the HTTP status.
	Status int
	// Code is the API's error code (TOPIC_NOT_FOUND, INVALID_ARGUMENT, ...; docs/protocol.md
	// section 9.2), or NOT_FOUND, METHOD_NOT_ALLOWED for what the HTTP layer refuses.
	Code string
	// Message says what went wrong.
	Message string
	// Retryable reports whether the same request may succeed later.
	Retryable bool
}

// Error returns "CODE: message".
func (e *APIError) Error() string {
	if e.Message == "" {
		return e.Code
	}
	return e.Code + ": " + e.Message
}

// UnreachableError is a request that got no HTTP answer (connection refused, DNS, TLS handshake,
// the http.Client's timeout). The request may or may not have reached the broker.
type UnreachableError struct {
	// Base is the client's base URL.
	Base string
	// Err is the transport's error.
	Err error
}

// Error returns "cannot reach the admin API at <base>: <cause>".
func (e *UnreachableError) Error() string {
	return "cannot reach the admin API at " + e.Base + ": " + e.Err.Error()
}

// Unwrap returns the transport's error.
func (e *UnreachableError) Unwrap() error { return e.Err }

// Option configures a Client (NewClient).
type Option func(*options)

type options struct {
	token string
	tls   *tls.Config
}

// WithToken sends "Authorization: Bearer <token>" with every request: the token of a principal
// of the broker's auth configuration (admin permission for the group and topic operations).
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// WithTLSConfig uses cfg for https: the CA that signed the server's certificate (RootCAs) and,
// for mutual TLS, the client certificate (Certificates), whose common name names the principal
// when no token is given. It needs an https:// address; a host:port address becomes https.
func WithTLSConfig(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// Client calls Spool's HTTP admin API. Safe for concurrent use.
type Client struct {
	base  string
	hc    *http.Client
	token string
}

// NewClient returns a client of the admin API at addr: a URL ("http://host:8080",
// "https://spool.example.com/prefix") or a host:port ("localhost:8080"; ":8080" means
// localhost:8080). hc nil means an http.Client with DefaultTimeout; hc is not modified
// (WithTLSConfig uses a copy with its own transport). Bad addresses and options return an error.
func NewClient(addr string, hc *http.Client, opts ...Option) (*Client, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	base, err := baseURL(addr, o.tls != nil)
	if err != nil {
		return nil, err
	}
	if hc == nil {
		hc = &http.Client{Timeout: DefaultTimeout}
	}
	if o.tls != nil {
		if !strings.HasPrefix(base, "https://") {
			return nil, fmt.Errorf("admin API address %q: WithTLSConfig needs an https:// address", addr)
		}
		var tr *http.Transport
		switch t := hc.Transport.(type) {
		case nil:
			tr = http.DefaultTransport.(*http.Transport).Clone()
		case *http.Transport:
			tr = t.Clone()
		default:
			return nil, fmt.Errorf("WithTLSConfig: the http.Client's Transport is a %T, not an *http.Transport; set its TLS configuration there instead", t)
		}
		tr.TLSClientConfig = o.tls
		withTLS := *hc
		withTLS.Transport = tr
		hc = &withTLS
	}
	return &Client{base: base, hc: hc, token: o.token}, nil
}

// baseURL normalizes an address (see NewClient) to a URL without a trailing slash; a host:port
// gets https when secure.
func baseURL(addr string, secure bool) (string, error) {
	bad := func(why string) error {
		return fmt.Errorf("admin API address %q: %s (want http://host:port, https://host, host:port or :port)", addr, why)
	}
	addr = strings.TrimSpace(addr)
	if addr == "" {
		return "", bad("empty")
	}
	if !strings.Contains(addr, "://") {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return "", bad(err.Error())
		}
		if host == "" {
			host = "localhost"
		}
		scheme := "http://"
		if secure {
			scheme = "https://"
		}
		addr = scheme + net.JoinHostPort(host, port)
	}
	u, err := url.Parse(addr)
	if err != nil {
		return "", bad(err.Error())
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", bad("scheme must be http or https")
	}
	if u.Host == "" {
		return "", bad("no host")
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return "", bad("no query or fragment allowed")
	}
	return strings.TrimSuffix(u.String(), "/"), nil
}

// Base returns the API's base URL.
func (c *Client) Base() string { return c.base }

// Call sends method base+path?query with in encoded as the JSON body (nil: no body) and returns
// the body of a 2xx answer, decoded into out as well when out is not nil and the body is not
// empty. It is the way to routes without a method of their own (TopicPath and GroupPath build
// the paths). A non-2xx answer returns an *APIError; a transport failure an *UnreachableError
// (or ctx's error).
func (c *Client) Call(ctx context.Context, method, path string, query url.Values, in, out any) ([]byte, error) {
	target := c.base + path
	if len(query) > 0 {
		target += "?" + query.Encode()
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("encode request to %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		return nil, fmt.Errorf("request %s %s: %w", method, target, err)
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &UnreachableError{Base: c.base, Err: unwrapURLError(err)}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read answer of %s %s: %w", method, target, err)
	}
	if len(data) > MaxResponseBytes {
		return nil, fmt.Errorf("answer of %s %s exceeds %d bytes", method, target, MaxResponseBytes)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, decodeError(resp.StatusCode, data)
	}
	if out != nil && len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return nil, fmt.Errorf("decode answer of %s %s: %w", method, target, err)
		}
	}
	return data, nil
}

// decodeError turns an error answer into an *APIError.
func decodeError(status int, data []byte) *APIError {
	var body struct {
		Error *ErrorDetail `json:"error"`
	}
	if err := json.Unmarshal(data, &body); err == nil && body.Error != nil && body.Error.Code != "" {
		return &APIError{Status: status, Code: body.Error.Code, Message: body.Error.Message, Retryable: body.Error.Retryable}
	}
	msg := http.StatusText(status)
	if text := strings.Join(strings.Fields(string(data)), " "); text != "" {
		if r := []rune(text); len(r) > 200 {
			text = string(r[:199]) + "…"
		}
		msg += ": " + text
	}
	return &APIError{Status: status, Code: fmt.Sprintf("HTTP_%d", status), Message: msg}
}

// unwrapURLError drops the *url.Error wrapper, whose text repeats the method and the URL.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// TopicPath returns the API path of a topic, followed by the given path segments (each escaped):
// TopicPath("orders", "config") is /api/v1/topics/orders/config.
func TopicPath(topic string, rest ...string) string {
	return joinPath("/api/v1/topics/"+url.PathEscape(topic), rest)
}

// GroupPath returns the API path of a group on a topic, followed by the given path segments. An
// empty group means the subscription of a QUEUE topic (QueueGroup).
func GroupPath(topic, group string, rest ...string) string {
	if group == "" {
		group = QueueGroup
	}
	return joinPath(TopicPath(topic, "groups", group), rest)
}

func joinPath(p string, rest []string) string {
	var b strings.Builder
	b.WriteString(p)
	for _, r := range rest {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(r))
	}
	return b.String()
}
