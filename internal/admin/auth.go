package admin

import (
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/spoolmq/spool/internal/auth"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/protocol"
)

// access is what a route needs when authentication is on.
type access int

const (
	// accessAdmin: admin on the route's {topic}, or on "#" for routes without one.
	accessAdmin access = iota
	// accessOpen: nothing (probes, the OpenAPI document).
	accessOpen
	// accessMetrics: nothing when auth.open_metrics is on (the default), else admin on "#".
	accessMetrics
	// accessPublish: publish on {topic}.
	accessPublish
	// accessConsume: consume on {topic} in {group}.
	accessConsume
	// accessRead: consume (in any group) or admin on {topic}: reading messages without
	// consuming them.
	accessRead
	// accessPublishBody: a principal that may publish to some topic, checked before the body is
	// read; the handler checks the permission on the topic named in the body (seed 002's POST
	// /publish) with h.allowed.
	accessPublishBody
)

// routeAccess says what a route needs, by its operation id; a route not listed needs admin.
func routeAccess(rt *route) access {
	switch rt.doc.id {
	case "healthz", "readyz", "openapi", "ui":
		return accessOpen
	case "metrics":
		return accessMetrics
	case "publish":
		return accessPublish
	case "pull", "ack", "nack", "extend":
		return accessConsume
	case "readMessages", "messageCompletion":
		return accessRead
	case "seedPublish":
		return accessPublishBody
	}
	return accessAdmin
}

// principalOf returns the principal a request names: "Authorization: Bearer <token>", else the
// verified client certificate's common name (mutual TLS). Another scheme (Basic, which a browser
// or a proxy may add) is no token: the certificate still names the principal (docs/protocol.md
// 5.1.1), and without one the request is unauthenticated.
func (h *Handler) principalOf(r *http.Request) (*auth.Principal, bool) {
	if scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " "); strings.EqualFold(scheme, "Bearer") {
		return h.auth.ByToken(strings.TrimSpace(token))
	}
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.PeerCertificates) > 0 {
		return h.auth.ByCertCN(r.TLS.PeerCertificates[0].Subject.CommonName)
	}
	return nil, false
}

// priority reports whether a publish to topic is exempt from its backpressure: the topic holds
// publishers back now and the request's principal has the priority permission on it. The
// principal is looked up again only then (ByToken hashes).
func (h *Handler) priority(r *http.Request, topic string) bool {
	if !h.auth.Enabled() {
		return false
	}
	if bp, ok := h.b.TopicBackpressure(topic); !ok || bp.State == broker.BackpressureNormal {
		return false
	}
	p, ok := h.principalOf(r)
	return ok && p.Can(auth.Priority, topic)
}

// authorize returns nil when authentication is off or the request's principal may use the route;
// otherwise NOT_AUTHENTICATED (401) or PERMISSION_DENIED (403), logged at WARN and counted. The
// principal is named by "Authorization: Bearer <token>", else by the verified client
// certificate's common name (mutual TLS).
func (h *Handler) authorize(rt *route, r *http.Request) error {
	a := h.auth
	acc := routeAccess(rt)
	if !a.Enabled() || acc == accessOpen || acc == accessMetrics && a.OpenMetrics() {
		return nil
	}
	p, err := h.principal(r)
	if err != nil {
		return err
	}
	topic, group := r.PathValue("topic"), r.PathValue("group")
	var action string
	var ok bool
	switch acc {
	case accessPublish:
		action, ok = auth.Publish, p.Can(auth.Publish, topic)
	case accessConsume:
		action, ok = auth.Consume, p.CanConsume(topic, group)
	case accessRead:
		action, ok = auth.Consume, p.Can(auth.Consume, topic) || p.Can(auth.Admin, topic)
	case accessPublishBody:
		action, ok = auth.Publish, p.CanAny(auth.Publish)
	case accessAdmin:
		action = auth.Admin
		if topic != "" {
			ok = p.Can(auth.Admin, topic)
		} else {
			ok = p.CanAdminAll()
		}
	default: // accessMetrics with closed metrics
		action, ok = auth.Admin, p.CanAdminAll()
	}
	if ok {
		return nil
	}
	return h.denied(r, auth.ReasonForbidden, p.Name, action, protocol.ErrPermissionDenied.Errorf(
		"principal %s may not %s %s %s", p.Name, action, r.Method, r.URL.Path))
}

// principal returns the principal of a request: named by "Authorization: Bearer <token>", else
// by the verified client certificate's common name (mutual TLS); NOT_AUTHENTICATED (logged and
// counted) without one.
func (h *Handler) principal(r *http.Request) (*auth.Principal, error) {
	p, ok := h.principalOf(r)
	if !ok {
		return nil, h.denied(r, auth.ReasonUnauthenticated, "", "", protocol.ErrNotAuthenticated.WithMessage(
			"this request needs a valid token: Authorization: Bearer <token>"))
	}
	return p, nil
}

// allowed checks, for a route whose topic is in the body (accessPublishBody), that the request's
// principal may do action on topic: nil when authentication is off.
func (h *Handler) allowed(r *http.Request, action, topic string) error {
	if !h.auth.Enabled() {
		return nil
	}
	p, err := h.principal(r)
	if err != nil {
		return err
	}
	if p.Can(action, topic) {
		return nil
	}
	return h.denied(r, auth.ReasonForbidden, p.Name, action, protocol.ErrPermissionDenied.Errorf(
		"principal %s may not %s on topic %s", p.Name, action, topic))
}

// denied counts a refused request, logs it (at most one line per reason and principal every
// auth.DenialLogInterval, with the number left out since) and returns e. The token is never
// logged.
func (h *Handler) denied(r *http.Request, reason, principal, action string, e *protocol.Error) error {
	h.metrics.ObserveAuthDenied(reason)
	if log, suppressed := h.auth.LogDenial(reason, principal, time.Now()); log {
		h.logger.WarnContext(r.Context(), "request denied", slog.String("reason", reason), slog.String("principal", principal),
			slog.String("action", action), slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Uint64("suppressed", suppressed))
	}
	return e
}
