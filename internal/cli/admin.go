package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/spoolmq/spool/client/admin"
)

// Defaults of the admin client (package client/admin's).
const (
	// DefaultAdminTimeout bounds one admin API request when NewAdminClient is given no
	// *http.Client.
	DefaultAdminTimeout = admin.DefaultTimeout
	// MaxResponseBytes bounds the body of an admin API answer that the client reads.
	MaxResponseBytes = admin.MaxResponseBytes
	// QueueGroup is the API's name of the one subscription of a QUEUE topic (storage.QueueGroup).
	QueueGroup = admin.QueueGroup
)

// APIError is an error answer of the admin API: {"error":{"code","message","retryable"}}. An
// answer that is not in that shape (a proxy's error page) gets the code "HTTP_<status>".
type APIError = admin.APIError

// AdminClient is the CLI's client of the admin API: package client/admin's Client, whose
// methods the CLI calls here return a transport failure with a hint at --http and SPOOL_HTTP.
// Safe for concurrent use.
type AdminClient struct {
	*admin.Client
}

// NewAdminClient returns a client of the admin API at addr, which is a URL ("http://host:8080",
// "https://spool.example.com/") or a host:port ("localhost:8080"; ":8080" means localhost:8080),
// so that the listen address given to spool serve works too. hc nil means an http.Client with
// DefaultAdminTimeout. Bad addresses return an error naming the accepted forms.
func NewAdminClient(addr string, hc *http.Client) (*AdminClient, error) {
	c, err := admin.NewClient(addr, hc)
	if err != nil {
		return nil, err
	}
	return &AdminClient{Client: c}, nil
}

// BaseURL normalizes an admin API address (see NewAdminClient) to a URL without a trailing slash.
func BaseURL(addr string) (string, error) {
	c, err := admin.NewClient(addr, nil)
	if err != nil {
		return "", err
	}
	return c.Base(), nil
}

// hint adds to a transport failure where the address came from.
func (c *AdminClient) hint(err error) error {
	var ue *admin.UnreachableError
	if errors.As(err, &ue) {
		return fmt.Errorf("cannot reach the admin API at %s (set --http or SPOOL_HTTP): %w", ue.Base, ue.Err)
	}
	return err
}

// Call is admin.Client.Call: the body of a 2xx answer (decoded into out too), an *APIError, or a
// transport failure naming the address.
func (c *AdminClient) Call(ctx context.Context, method, path string, query url.Values, in, out any) ([]byte, error) {
	raw, err := c.Client.Call(ctx, method, path, query, in, out)
	return raw, c.hint(err)
}

// TopicPath returns the API path of a topic, followed by the given path segments (each escaped):
// TopicPath("orders", "config") is /api/v1/topics/orders/config.
func TopicPath(topic string, rest ...string) string { return admin.TopicPath(topic, rest...) }

// GroupPath returns the API path of a subscription (topic, group), followed by the given path
// segments. An empty group means the subscription of a QUEUE topic (QueueGroup).
func GroupPath(topic, group string, rest ...string) string {
	return admin.GroupPath(topic, group, rest...)
}

// Group returns the API's name of a group given on the command line: "" means QueueGroup.
func Group(group string) string {
	if group == "" {
		return QueueGroup
	}
	return group
}
