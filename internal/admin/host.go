package admin

import (
	"net"
	"net/http"
	"os"
	"strings"
)

// A web page can reach a broker its visitor's browser can reach by DNS rebinding: its own name
// resolves to the attacker first, then to 127.0.0.1 (or the broker's address on the visitor's
// network), and the browser then treats the broker's answers as the page's own origin
// (same-origin: the cross-origin check passes and responses are readable). Such a request still
// carries the page's name as Host. So without authentication a request must name a host that the
// page cannot own: an IP address, localhost (or a name under .localhost), the machine's host name
// or a name the operator configured. This holds whatever address the request arrived on: a broker
// in a container or behind a port forward sees the browser's loopback request on another address.

// LocalHost reports whether r names, in its Host, an IP address, localhost or a name under
// .localhost, the machine's host name or one of allowed (case-insensitive, port and trailing dot
// ignored). An empty Host (HTTP/1.0) passes: browsers always send one.
func LocalHost(r *http.Request, allowed []string) bool {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	switch {
	case host == "", net.ParseIP(host) != nil, host == "localhost", strings.HasSuffix(host, ".localhost"):
		return true
	}
	for _, a := range allowed {
		if strings.EqualFold(host, strings.TrimSuffix(a, ".")) {
			return true
		}
	}
	name, err := os.Hostname()
	return err == nil && strings.EqualFold(host, strings.TrimSuffix(name, "."))
}

// misdirected is the answer to a request that fails LocalHost.
func misdirected(r *http.Request) error {
	return httpErr(http.StatusMisdirectedRequest, "MISDIRECTED_REQUEST",
		"host %q is not a name of this broker: without authentication, name it by IP address or localhost, or add the name to http_allowed_hosts (a page using DNS rebinding names its own host)", r.Host)
}

// HostGuard wraps next (a listener without authentication, such as the pprof debug listener) with
// the LocalHost check of allowed, answering 421 Misdirected Request in plain text.
func HostGuard(next http.Handler, allowed []string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !LocalHost(r, allowed) {
			http.Error(w, misdirected(r).Error(), http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}
