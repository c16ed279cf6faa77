package admin

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
)

// TestLoopbackRequestMustNameThisMachine: a request on a loopback address that names another host
// (a page using DNS rebinding) is refused with 421 before any route runs, reads included; the
// names of this machine are served.
func TestLoopbackRequestMustNameThisMachine(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "rebind"}).ok(http.StatusCreated, nil)
	for _, host := range []string{"evil.example", "evil.example:8080", "attacker.localhost.evil.example"} {
		e.do("GET", "/api/v1/topics", nil, "Host", host).fails(http.StatusMisdirectedRequest, "MISDIRECTED_REQUEST")
		e.do("DELETE", "/api/v1/topics/rebind", nil, "Host", host).fails(http.StatusMisdirectedRequest, "MISDIRECTED_REQUEST")
	}
	// A name the operator allows (a reverse proxy's), and any name with authentication on.
	allowed := newEnv(t, func(c *Config) { c.AllowedHosts = []string{"proxy.example"} })
	allowed.do("GET", "/api/v1/topics", nil, "Host", "Proxy.Example:443").ok(http.StatusOK, nil)
	allowed.do("GET", "/api/v1/topics", nil, "Host", "evil.example").fails(http.StatusMisdirectedRequest, "MISDIRECTED_REQUEST")
	withAuth := authEnv(t, true)
	withAuth.do("GET", "/healthz", nil, "Host", "evil.example").ok(http.StatusOK, nil)

	name, _ := os.Hostname()
	for _, host := range []string{"localhost", "localhost:9", "LOCALHOST.", "ui.localhost", "127.0.0.1:1", "[::1]:80", "10.1.2.3", name} {
		e.do("GET", "/api/v1/topics/rebind", nil, "Host", host).ok(http.StatusOK, nil)
	}
}

// TestOtherAddressRequestMustNameThisMachine: the Host check does not depend on the address a
// request arrived on: a broker in a container (or behind a port forward) gets the browser's
// loopback request on its own address, so a rebinding page's name is refused there too, while
// scrapes and probes by IP address are served.
func TestOtherAddressRequestMustNameThisMachine(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	withAuth := authEnv(t, true)
	on := func(h http.Handler, method, path, host string) int {
		req := httptest.NewRequest(method, path, nil)
		req.Host = host
		local := &net.TCPAddr{IP: net.ParseIP("172.17.0.2"), Port: 8080}
		req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, local))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	for _, c := range []struct {
		h            http.Handler
		method, path string
		host         string
		want         int
	}{
		{e.h, "GET", "/api/v1/topics", "evil.example:8080", http.StatusMisdirectedRequest},
		{e.h, "DELETE", "/api/v1/topics/x", "evil.example", http.StatusMisdirectedRequest},
		{e.h, "GET", "/metrics", "evil.example", http.StatusMisdirectedRequest},
		{e.h, "GET", "/metrics", "172.17.0.2:8080", http.StatusOK},
		{e.h, "GET", "/readyz", "10.0.0.7:8080", http.StatusOK},
		{e.h, "GET", "/api/v1/topics", "localhost:8080", http.StatusOK},
		{withAuth.h, "GET", "/healthz", "evil.example", http.StatusOK},
		{HostGuard(http.NotFoundHandler(), nil), "GET", "/debug/pprof/cmdline", "evil.example", http.StatusMisdirectedRequest},
		{HostGuard(http.NotFoundHandler(), []string{"pprof.example"}), "GET", "/debug/pprof/cmdline", "pprof.example:6060", http.StatusNotFound},
	} {
		if got := on(c.h, c.method, c.path, c.host); got != c.want {
			t.Errorf("%s %s Host %s: status %d, want %d", c.method, c.path, c.host, got, c.want)
		}
	}
}

// TestHostGuard: the debug listener's wrapper answers 421 for another host.
func TestHostGuard(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(HostGuard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), nil))
	defer srv.Close()
	for host, want := range map[string]int{"evil.example": http.StatusMisdirectedRequest, "127.0.0.1": http.StatusOK, "localhost:6060": http.StatusOK} {
		req, _ := http.NewRequest("GET", srv.URL+"/debug/pprof/cmdline", nil)
		req.Host = host
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("Host %s: status %d, want %d", host, res.StatusCode, want)
		}
	}
}
