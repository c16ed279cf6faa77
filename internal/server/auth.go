package server

import (
	"crypto/tls"
	"log/slog"

	"github.com/spoolmq/spool/internal/auth"
	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/protocol"
)

// authOn reports whether the server authenticates its clients (Config.Auth).
func (c *conn) authOn() bool { return c.srv.cfg.Auth.Enabled() }

// priority reports whether the session's principal holds the priority permission on topic: its
// publishes there are exempt from backpressure. Without authentication nobody does. The principal
// is set before the first publish (Hello, text AUTH on the reader goroutine).
func (c *conn) priority(topic string) bool {
	return c.authOn() && c.principal.Can(auth.Priority, topic)
}

// authenticate finds the principal of a session: the token of Hello or AUTH when one is given,
// else the verified client certificate's common name (mutual TLS). It sets c.principal, or
// returns NOT_AUTHENTICATED (logged and counted). Reader goroutine only.
func (c *conn) authenticate(token string) *protocol.Error {
	a := c.srv.cfg.Auth
	var p *auth.Principal
	var ok bool
	via := "token"
	if token != "" {
		p, ok = a.ByToken(token)
	} else {
		via = "certificate"
		p, ok = a.ByCertCN(c.certCN())
	}
	if !ok {
		msg := "a valid token is required"
		if token != "" {
			msg = "the token names no principal"
		}
		return c.denied(auth.ReasonUnauthenticated, "", "connect", "", protocol.ErrNotAuthenticated.WithMessage(msg))
	}
	c.principal = p
	c.logger.Debug("authenticated", slog.String("principal", p.Name), slog.String("via", via))
	return nil
}

// certCN returns the subject common name of the connection's verified client certificate, or "".
func (c *conn) certCN() string {
	tc, ok := c.nc.(*tls.Conn)
	if !ok {
		return ""
	}
	st := tc.ConnectionState()
	if len(st.VerifiedChains) == 0 || len(st.PeerCertificates) == 0 {
		return ""
	}
	return st.PeerCertificates[0].Subject.CommonName
}

// authorize returns nil when authentication is off or the session's principal may do action on
// topic (with group for consume); otherwise NOT_AUTHENTICATED or PERMISSION_DENIED, logged and
// counted. A wildcard pattern to consume in a group must be covered by one consume permission
// (auth.Covers); without a group it needs a consume permission admitting no group, and binds
// only the topics the principal may consume (consumeFilter).
func (c *conn) authorize(action, topic, group string) *protocol.Error {
	if !c.authOn() {
		return nil
	}
	p := c.principal
	if p == nil {
		return c.denied(auth.ReasonUnauthenticated, "", action, topic, protocol.ErrNotAuthenticated.WithMessage("authenticate first"))
	}
	var ok bool
	switch {
	case action == auth.Consume && names.IsPattern(topic) && group != "":
		// A durable group's binding subscribes the group to every matching topic created
		// later: the principal must be allowed them all.
		ok = p.CanConsumePattern(topic, group)
	case action == auth.Consume && names.IsPattern(topic):
		ok = p.MayConsumeGroup(group)
	case action == auth.Consume:
		ok = p.CanConsume(topic, group)
	default:
		ok = p.Can(action, topic)
	}
	if ok {
		return nil
	}
	what := topic
	if group != "" {
		what += " in group " + group
	}
	return c.denied(auth.ReasonForbidden, p.Name, action, topic,
		protocol.ErrPermissionDenied.Errorf("principal %s may not %s %s", p.Name, action, what))
}

// consumeFilter is the broker's SubscribeParams.Allow of a subscription in group: nil when
// authentication is off, else the topics the session's principal may consume.
func (c *conn) consumeFilter(group string) func(string) bool {
	if !c.authOn() {
		return nil
	}
	p := c.principal
	return func(topic string) bool { return p.CanConsume(topic, group) }
}

// principalName is the name of the session's principal, "" without authentication: the broker
// scopes the member ids the session chooses by it (broker.SubscribeParams.Principal), so that
// another principal's session can never take, replace or fence its members.
func (c *conn) principalName() string {
	if !c.authOn() || c.principal == nil {
		return ""
	}
	return c.principal.Name
}

// denied counts a refused request, logs it (at most one line per reason and principal every
// auth.DenialLogInterval, with the number left out since) and returns e. The token is never
// logged.
func (c *conn) denied(reason, principal, action, topic string, e *protocol.Error) *protocol.Error {
	c.srv.cfg.Metrics.ObserveAuthDenied(reason)
	if log, suppressed := c.srv.cfg.Auth.LogDenial(reason, principal, c.srv.cfg.Clock.Now()); log {
		c.logger.Warn("request denied", slog.String("reason", reason), slog.String("principal", principal),
			slog.String("action", action), slog.String("topic", topic), slog.Uint64("suppressed", suppressed))
	}
	return e
}
