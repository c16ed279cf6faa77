package admin

import (
	"net"
	"net/http"
	"os"
	"strings"
)

// A web page can reach a broker on its visitor's machine by DNS rebinding: its own name resolves
// to the attacker first, then to 127.0.0.1, and the browser then treats the broker's answers as
// the page's own origin (same-origin: the cross-origin check passes and responses are readable).
// Such a request still carries the page's name as Host. So a request that arrived on a loopback
// address must name a host that can only mean this machine: an IP address, localhost (or a name
// under .localhost) or the machine's host name. Requests on other addresses are not checked: a
// broker reachable there without authentication is open to that network anyway.

// LocalHost reports whether r, if it arrived on a loopback address, names this machine in its
// Host (see above) or one of allowed; true for requests on any other address.
func LocalHost(r *http.Request, allowed []string) bool {
	la, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	ta, ok := la.(*net.TCPAddr)
	if !ok || !ta.IP.IsLoopback() {
		return true
	}
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
		if strings.EqualFold(host, a) {
			return true
		}
	}
	name, err := os.Hostname()
	return err == nil && strings.EqualFold(host, strings.TrimSuffix(name, "."))
}

// misdirected is the answer to a request that fails LocalHost.
func misdirected(r *http.Request) error {
	return httpErr(http.StatusMisdirectedRequest, "MISDIRECTED_REQUEST",
		"host %q does not name this machine: on a loopback address, name localhost or an IP address (a page using DNS rebinding names its own host)", r.Host)
}

// HostGuard wraps next (a listener without authentication, such as the pprof debug listener) with
// the LocalHost check, answering 421 Misdirected Request in plain text.
func HostGuard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !LocalHost(r, nil) {
			http.Error(w, misdirected(r).Error(), http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}
