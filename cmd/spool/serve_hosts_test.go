package main

import (
	"slices"
	"testing"

	"github.com/spoolmq/spool/internal/config"
)

// TestHTTPAllowedHosts: the names requests may give without authentication are
// http_allowed_hosts and the host name of http, not its IP address or an empty host.
func TestHTTPAllowedHosts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		http    string
		allowed []string
		want    []string
	}{
		{"127.0.0.1:8080", nil, nil},
		{":8080", []string{"proxy.example"}, []string{"proxy.example"}},
		{"[::1]:8080", nil, nil},
		{"broker.lan:8080", []string{"proxy.example"}, []string{"proxy.example", "broker.lan"}},
	} {
		cfg := config.Config{HTTP: c.http, HTTPAllowedHosts: c.allowed}
		if got := httpAllowedHosts(cfg); !slices.Equal(got, c.want) {
			t.Errorf("http %q, allowed %q: %q, want %q", c.http, c.allowed, got, c.want)
		}
	}
}
