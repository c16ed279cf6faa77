package cli

import (
	"bytes"
	"context"
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

// Defaults of the admin client.
const (
	// DefaultAdminTimeout bounds one admin API request when NewAdminClient is given no
	// *http.Client.
	DefaultAdminTimeout = 60 * time.Second
	// MaxResponseBytes bounds the body of an admin API answer that the client reads.
	MaxResponseBytes = 512 << 20
	// QueueGroup is the API's name of the one subscription of a QUEUE topic (storage.QueueGroup).
	QueueGroup = "$queue"
)

// APIError is an error answer of the admin API: {"error":{"code","message","retryable"}}. An
// answer that is not in that shape (a proxy's error page) gets the code "HTTP_<status>".
type APIError struct {
	// Status is the HTTP status.
	Status int
	// Code is the API's error code (TOPIC_NOT_FOUND, INVALID_ARGUMENT, ...).
	Code string
	// Message says what went wrong.
	Message string
	// Retryable reports whether the same request may succeed later.
	Retryable bool
}

// Error returns "CODE: message" (the form the CLI prints after "spool: ").
func (e *APIError) Error() string {
	if e.Message == "" {
		return e.Code
	}
	return e.Code + ": " + e.Message
}

// AdminClient calls Spool's HTTP admin API (internal/admin). Safe for concurrent use.
type AdminClient struct {
	base string
	hc   *http.Client
}

// NewAdminClient returns a client of the admin API at addr, which is a URL ("http://host:8080",
// "https://spool.example.com/") or a host:port ("localhost:8080"; ":8080" means localhost:8080),
// so that the listen address given to spool serve works too. hc nil means an http.Client with
// DefaultAdminTimeout. Bad addresses return an error naming the accepted forms.
func NewAdminClient(addr string, hc *http.Client) (*AdminClient, error) {
	base, err := BaseURL(addr)
	if err != nil {
		return nil, err
	}
	if hc == nil {
		hc = &http.Client{Timeout: DefaultAdminTimeout}
	}
	return &AdminClient{base: base, hc: hc}, nil
}

// BaseURL normalizes an admin API address (see NewAdminClient) to a URL without a trailing slash.
func BaseURL(addr string) (string, error) {
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
		addr = "http://" + net.JoinHostPort(host, port)
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
func (c *AdminClient) Base() string { return c.base }

// Call sends method base+path?query with in encoded as the JSON body (nil: no body) and returns
// the body of a 2xx answer, decoded into out as well when out is not nil and the body is not
// empty. A non-2xx answer returns an *APIError; a transport failure an error naming the address
// (or ctx's error).
func (c *AdminClient) Call(ctx context.Context, method, path string, query url.Values, in, out any) ([]byte, error) {
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
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("cannot reach the admin API at %s (set --http or SPOOL_HTTP): %w", c.base, unwrapURLError(err))
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
		Error *struct {
			Code      string `json:"code"`
			Message   string `json:"message"`
			Retryable bool   `json:"retryable"`
		} `json:"error"`
	}
	if err := json.Unmarshal(data, &body); err == nil && body.Error != nil && body.Error.Code != "" {
		return &APIError{Status: status, Code: body.Error.Code, Message: body.Error.Message, Retryable: body.Error.Retryable}
	}
	msg := http.StatusText(status)
	if text := strings.TrimSpace(string(data)); text != "" {
		msg += ": " + Truncate(strings.Join(strings.Fields(text), " "), 200)
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

// GroupPath returns the API path of a subscription (topic, group), followed by the given path
// segments. An empty group means the subscription of a QUEUE topic (QueueGroup).
func GroupPath(topic, group string, rest ...string) string {
	return joinPath(TopicPath(topic, "groups", Group(group)), rest)
}

// Group returns the API's name of a group given on the command line: "" means QueueGroup.
func Group(group string) string {
	if group == "" {
		return QueueGroup
	}
	return group
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
