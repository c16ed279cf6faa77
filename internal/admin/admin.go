package admin

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/spoolmq/spool/internal/auth"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/metrics"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// Defaults of Config.
const (
	// DefaultMaxBodyBytes bounds the body of every request but publishes.
	DefaultMaxBodyBytes = 1 << 20
	// DefaultMaxPublishBodyBytes bounds the body of a publish: the 10 MiB max frame of the wire
	// protocol with base64's 4/3 overhead and JSON framing.
	DefaultMaxPublishBodyBytes = 16 << 20
	// DefaultPullMaxBatch is the most messages one pull may ask for.
	DefaultPullMaxBatch = 100
	// DefaultPullMaxInFlight bounds the leases a pull session holds for the HTTP consumers of one
	// (topic, group): handed out and not yet acked, nacked or expired, plus claimed and not yet
	// handed out. A pull at the bound waits.
	DefaultPullMaxInFlight = 1000
	// DefaultPullIdleTimeout is how long a pull session lives without requests once the leases it
	// handed out are acked, nacked or expired.
	DefaultPullIdleTimeout = 10 * time.Second
	// DefaultPullWait is how long a pull waits for a first message when the request does not say.
	DefaultPullWait = time.Second
	// DefaultMaxPullWait bounds the wait a pull may ask for. The HTTP server's WriteTimeout must be
	// longer.
	DefaultMaxPullWait = 30 * time.Second
	// DefaultReadyTimeout bounds the default readiness probe.
	DefaultReadyTimeout = 2 * time.Second
)

// Config configures the admin handler. Only Broker is required.
type Config struct {
	// Broker serves every API call. Required. The handler neither starts nor stops it.
	Broker *broker.Broker
	// Gatherer is exported on GET /metrics (promhttp). Nil: /metrics answers 404 NOT_FOUND.
	Gatherer prometheus.Gatherer
	// Metrics receives the hook metrics of HTTP requests, HTTP publishes and pulls, acks and nacks.
	// Nil records nothing.
	Metrics *metrics.Metrics
	// Logger receives the handler's logs. Nil discards them.
	Logger *slog.Logger
	// AllowedHosts are the host names, besides localhost, IP addresses and the machine's name,
	// that a request may name in its Host while Auth is nil (LocalHost); others get 421.
	AllowedHosts []string
	// Auth authenticates and authorizes requests (Authorization: Bearer, or a client
	// certificate). Nil: authentication is off. /healthz, /readyz and the OpenAPI document are
	// always open, /metrics unless auth.open_metrics is off.
	Auth *auth.Authorizer
	// Sessions lists the TCP server's connections for GET /admin/connections (from
	// server.Server.Sessions). Nil: the list is empty.
	Sessions func() []Session
	// Ready is the readiness probe of GET /readyz: nil error means ready. Defaults to
	// BrokerReady(Broker), which fails while the broker is not running or its engine is closed.
	Ready func() error
	// MaxBodyBytes bounds request bodies except publishes. Defaults to DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxPublishBodyBytes bounds publish bodies. Defaults to DefaultMaxPublishBodyBytes.
	MaxPublishBodyBytes int64
	// BodyReadTimeout bounds the reading of a request body from the start of its handler.
	// Defaults to DefaultBodyReadTimeout.
	BodyReadTimeout time.Duration
	// PullMaxBatch is the most messages one pull may ask for. Defaults to DefaultPullMaxBatch.
	PullMaxBatch int
	// PullMaxInFlight bounds the leases of a pull session (see the package documentation).
	// Defaults to DefaultPullMaxInFlight; at least PullMaxBatch, at most broker.MaxInFlightLimit.
	PullMaxInFlight int
	// PullIdleTimeout is how long a pull session lives without requests once no lease it handed
	// out is live. Defaults to DefaultPullIdleTimeout.
	PullIdleTimeout time.Duration
	// MaxPullSessions bounds the open pull sessions (one per topic, group and filter pulled); a
	// pull that needs one more gets LIMIT_EXCEEDED. Defaults to 1024.
	MaxPullSessions int
	// MaxGroupPullSessions bounds the open pull sessions of one (topic, group), one per filter
	// pulled, each a member of the group; past it, LIMIT_EXCEEDED. Defaults to 64.
	MaxGroupPullSessions int
	// DefaultPullWait is the wait of a pull that does not give one. Defaults to DefaultPullWait.
	DefaultPullWait time.Duration
	// MaxPullWait bounds the wait of a pull. Defaults to DefaultMaxPullWait.
	MaxPullWait time.Duration
}

// Handler is the HTTP admin API: an http.Handler to mount at the root of the HTTP listener.
// Every method is safe for concurrent use. Close it when the server shuts down (before or after
// stopping the broker) to end its pull sessions.
type Handler struct {
	b           *broker.Broker
	metrics     *metrics.Metrics
	logger      *slog.Logger
	ready       func() error
	sessions    func() []Session
	auth        *auth.Authorizer
	maxBody     int64
	maxPubBody  int64
	bodyTimeout time.Duration
	metricsHTTP http.Handler
	pulls       *pulls
	// allowedHosts: see Config.AllowedHosts.
	allowedHosts []string
	// cop refuses cross-origin browser requests that change something (see checkMutation).
	cop *http.CrossOriginProtection

	mux *http.ServeMux
	// pathMux matches paths without methods, to tell 405 from 404.
	pathMux *http.ServeMux
	// allow lists the methods of each path pattern (for 405's Allow header).
	allow map[string][]string
	// routes are the registered routes, in registration order.
	routes []*route
	// openAPIJSON is the OpenAPI document of routes.
	openAPIJSON []byte
	// topicReadHook, when set, is called by updateTopicConfig with the topic's name after each
	// read of its configuration, before the update based on it is written. Nil except in tests,
	// which land another update there.
	topicReadHook func(topic string)
}

// New validates cfg and returns the handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Broker == nil {
		return nil, errors.New("admin: config: Broker is required")
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"MaxBodyBytes", cfg.MaxBodyBytes}, {"MaxPublishBodyBytes", cfg.MaxPublishBodyBytes},
		{"PullMaxBatch", int64(cfg.PullMaxBatch)}, {"PullMaxInFlight", int64(cfg.PullMaxInFlight)},
		{"PullIdleTimeout", int64(cfg.PullIdleTimeout)}, {"BodyReadTimeout", int64(cfg.BodyReadTimeout)},
		{"DefaultPullWait", int64(cfg.DefaultPullWait)}, {"MaxPullWait", int64(cfg.MaxPullWait)},
		{"MaxPullSessions", int64(cfg.MaxPullSessions)}, {"MaxGroupPullSessions", int64(cfg.MaxGroupPullSessions)},
	} {
		if f.v < 0 {
			return nil, fmt.Errorf("admin: config: %s must not be negative, got %d", f.name, f.v)
		}
	}
	maxBatch := cmp.Or(cfg.PullMaxBatch, DefaultPullMaxBatch)
	maxInFlight := cmp.Or(cfg.PullMaxInFlight, max(DefaultPullMaxInFlight, maxBatch))
	if maxInFlight < maxBatch || maxInFlight > broker.MaxInFlightLimit {
		return nil, fmt.Errorf("admin: config: PullMaxInFlight must be between PullMaxBatch (%d) and %d, got %d",
			maxBatch, broker.MaxInFlightLimit, maxInFlight)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("component", "admin")
	h := &Handler{
		b:            cfg.Broker,
		metrics:      cfg.Metrics,
		logger:       logger,
		ready:        cfg.Ready,
		sessions:     cfg.Sessions,
		auth:         cfg.Auth,
		maxBody:      cmp.Or(cfg.MaxBodyBytes, DefaultMaxBodyBytes),
		maxPubBody:   cmp.Or(cfg.MaxPublishBodyBytes, DefaultMaxPublishBodyBytes),
		bodyTimeout:  cmp.Or(cfg.BodyReadTimeout, DefaultBodyReadTimeout),
		mux:          http.NewServeMux(),
		pathMux:      http.NewServeMux(),
		allow:        make(map[string][]string),
		cop:          http.NewCrossOriginProtection(),
		allowedHosts: cfg.AllowedHosts,
	}
	if h.ready == nil {
		h.ready = BrokerReady(cfg.Broker)
	}
	defWait := cmp.Or(cfg.DefaultPullWait, DefaultPullWait)
	maxWait := cmp.Or(cfg.MaxPullWait, DefaultMaxPullWait)
	if defWait > maxWait {
		return nil, fmt.Errorf("admin: config: DefaultPullWait (%s) exceeds MaxPullWait (%s)", defWait, maxWait)
	}
	h.pulls = newPulls(cfg.Broker, cfg.Metrics, logger, pullConfig{
		maxBatch:         maxBatch,
		maxInFlight:      maxInFlight,
		idle:             cmp.Or(cfg.PullIdleTimeout, DefaultPullIdleTimeout),
		defWait:          defWait,
		maxWait:          maxWait,
		maxSessions:      cmp.Or(cfg.MaxPullSessions, maxPullSessions),
		maxGroupSessions: cmp.Or(cfg.MaxGroupPullSessions, maxGroupPullSessions),
	})
	if cfg.Gatherer != nil {
		h.metricsHTTP = promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{
			ErrorLog:      slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
			ErrorHandling: promhttp.ContinueOnError,
		})
	}
	for _, rt := range h.routeTable() {
		h.register(rt)
	}
	h.registerUI()
	doc, err := json.Marshal(buildOpenAPI(h.routes))
	if err != nil {
		return nil, fmt.Errorf("admin: openapi document: %w", err)
	}
	h.openAPIJSON = doc
	return h, nil
}

// BrokerReady returns a readiness probe for Config.Ready: it fails (with broker.ErrNotRunning,
// storage.ErrClosed, or a timeout after DefaultReadyTimeout) unless the broker is running and its
// engine answers a cheap read, and while its storage is full (broker.StorageFull: publishes are
// refused, so a load balancer should send publishers elsewhere; deliveries go on).
func BrokerReady(b *broker.Broker) func() error {
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), DefaultReadyTimeout)
		defer cancel()
		if _, err := b.Bindings(ctx); err != nil {
			return err
		}
		if since, full := b.StorageFull(); full {
			return fmt.Errorf("%w since %s: publishes are refused (STORAGE_FULL) until space is freed; deliveries of stored messages go on",
				storage.ErrFull, since.UTC().Format(time.RFC3339))
		}
		return nil
	}
}

// Close ends the pull sessions: their members leave, so the leases they hold (handed out to HTTP
// consumers or not) are released and redelivered at once. Later pulls, acks and nacks fail with
// CLOSED; the rest of the API keeps working. Close is idempotent.
func (h *Handler) Close(ctx context.Context) error {
	return h.pulls.close(ctx)
}

// Routes returns the registered routes as "METHOD /path/{param}" patterns, in registration order.
func (h *Handler) Routes() []string {
	out := make([]string, len(h.routes))
	for i, rt := range h.routes {
		out[i] = rt.pattern()
	}
	return out
}

// route is one endpoint: its pattern, its handler and its OpenAPI description.
type route struct {
	method string
	// path is an http.ServeMux path pattern and an OpenAPI path template at once.
	path string
	// publish selects the publish body limit.
	publish bool
	// curlForm accepts a JSON body sent as application/x-www-form-urlencoded, the type of
	// curl -d: seed 002's POST /publish check sends it so. Cross-origin browser requests are still
	// refused by the origin check.
	curlForm bool
	handle   func(w http.ResponseWriter, r *http.Request) error
	doc      opDoc
}

func (rt *route) pattern() string { return rt.method + " " + rt.path }

func (h *Handler) register(rt *route) {
	h.routes = append(h.routes, rt)
	h.mux.Handle(rt.pattern(), h.wrap(rt))
	if _, ok := h.allow[rt.path]; !ok {
		h.pathMux.Handle(rt.path, http.NotFoundHandler())
	}
	h.allow[rt.path] = append(h.allow[rt.path], rt.method)
}

// ServeHTTP serves the API. Unknown paths get 404 NOT_FOUND, known paths with another method 405
// METHOD_NOT_ALLOWED with an Allow header, both as JSON errors.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.auth.Enabled() && !LocalHost(r, h.allowedHosts) {
		h.logger.WarnContext(r.Context(), "request naming another host refused (DNS rebinding?)",
			slog.String("host", r.Host), slog.String("method", r.Method), slog.String("path", r.URL.Path))
		sw := &statusWriter{ResponseWriter: w}
		h.writeError(sw, r, misdirected(r))
		h.metrics.ObserveHTTPRequest("misdirected", sw.code(), 0)
		return
	}
	if _, pattern := h.mux.Handler(r); pattern != "" {
		h.mux.ServeHTTP(w, r)
		return
	}
	start := time.Now()
	sw := &statusWriter{ResponseWriter: w}
	setRequestID(sw, r)
	if _, p := h.pathMux.Handler(r); p != "" {
		methods := slices.Clone(h.allow[p])
		if slices.Contains(methods, http.MethodGet) {
			methods = append(methods, http.MethodHead)
		}
		sw.Header().Set("Allow", strings.Join(methods, ", "))
		h.writeError(sw, r, httpErr(http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED",
			"method %s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, strings.Join(methods, ", ")))
	} else {
		h.writeError(sw, r, httpErr(http.StatusNotFound, "NOT_FOUND", "no route %s %s", r.Method, r.URL.Path))
	}
	h.metrics.ObserveHTTPRequest("unmatched", sw.code(), time.Since(start))
}

// wrap adds to a route's handler: the request id, the body limits (size and read time), JSON
// errors, panic recovery, logging and request metrics, and for publish routes the count of
// failed publishes.
func (h *Handler) wrap(rt *route) http.Handler {
	pattern := rt.pattern()
	limit := h.maxBody
	if rt.publish {
		limit = h.maxPubBody
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		rid := setRequestID(sw, r)
		// fail answers err. Every failed publish counts in spool_publish_errors_total by the code
		// of the answer, wherever it failed (auth, CSRF check, body, validation, broker), as the
		// TCP server counts its refusals.
		fail := func(err error) {
			code := h.writeError(sw, r, err)
			if rt.publish {
				h.metrics.ObservePublishError(code)
			}
		}
		if r.Body != nil && r.Body != http.NoBody {
			rc := http.NewResponseController(w)
			if rc.SetReadDeadline(time.Now().Add(h.bodyTimeout)) == nil {
				r.Body = &deadlineBody{ReadCloser: r.Body, timeout: h.bodyTimeout}
			}
		}
		if r.Body != nil {
			r.Body = http.MaxBytesReader(sw, r.Body, limit)
		}
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				h.logger.ErrorContext(r.Context(), "admin handler panicked", slog.String("route", pattern),
					slog.String("request_id", rid), slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
				if !sw.wrote {
					fail(protocol.ErrInternal.WithMessage("internal error"))
				}
			}
			took := time.Since(start)
			h.metrics.ObserveHTTPRequest(pattern, sw.code(), took)
			h.logger.DebugContext(r.Context(), "http request", slog.String("route", pattern), slog.String("path", r.URL.Path),
				slog.Int("status", sw.code()), slog.Duration("took", took), slog.String("request_id", rid))
		}()
		if err := h.authorize(rt, r); err != nil {
			if errors.Is(err, protocol.ErrNotAuthenticated) {
				sw.Header().Set("WWW-Authenticate", `Bearer realm="spool"`)
			}
			fail(err)
			return
		}
		if err := h.checkMutation(rt, r); err != nil {
			fail(err)
			return
		}
		if err := rt.handle(sw, r); err != nil {
			fail(err)
		}
	})
}

// checkMutation keeps web pages from driving the API through a browser (CSRF): a request that
// may change something (any method but GET, HEAD and OPTIONS) is refused with 403 FORBIDDEN when
// the browser says it comes from another origin (Sec-Fetch-Site, or an Origin that is not the
// Host: http.CrossOriginProtection), and with 415 UNSUPPORTED_MEDIA_TYPE when it has a body that
// is not JSON. Only a raw publish takes another Content-Type, and not one of the three that a
// page may send to another site without asking it first (text/plain, form data, multipart):
// application/octet-stream, for example.
func (h *Handler) checkMutation(rt *route, r *http.Request) error {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return nil
	}
	if err := h.cop.Check(r); err != nil {
		h.logger.WarnContext(r.Context(), "cross-origin request refused", slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.String("origin", r.Header.Get("Origin")), slog.String("sec_fetch_site", r.Header.Get("Sec-Fetch-Site")))
		return httpErr(http.StatusForbidden, "FORBIDDEN", "cross-origin request refused (%v): the API changes nothing for another site's pages", err)
	}
	if r.ContentLength == 0 {
		return nil
	}
	ct := r.Header.Get("Content-Type")
	if isJSON(ct) || rt.publish && ct != "" && !browserSimpleType(ct) || rt.curlForm && isCurlForm(ct) {
		return nil
	}
	want := "application/json"
	if rt.publish {
		want += " (or, for a raw payload, a type such as application/octet-stream; not text/plain or form data)"
	}
	if ct == "" {
		ct = "none"
	}
	return httpErr(http.StatusUnsupportedMediaType, "UNSUPPORTED_MEDIA_TYPE", "request body of Content-Type %s: want %s", ct, want)
}

// isCurlForm reports whether a Content-Type is application/x-www-form-urlencoded (curl -d).
func isCurlForm(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/x-www-form-urlencoded")
}

// browserSimpleType reports whether a Content-Type is one a page may send to another site without
// a preflight (the CORS "simple" types).
func browserSimpleType(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	switch strings.ToLower(strings.TrimSpace(mt)) {
	case "text/plain", "application/x-www-form-urlencoded", "multipart/form-data":
		return true
	}
	return false
}

// setRequestID takes the request's X-Request-Id (a correlation id set by a proxy or the caller) or
// makes one, and echoes it in the response.
func setRequestID(w http.ResponseWriter, r *http.Request) string {
	rid := r.Header.Get("X-Request-Id")
	if rid == "" || len(rid) > 128 {
		rid = rand.Text()[:16]
	}
	w.Header().Set("X-Request-Id", rid)
	return rid
}

// statusWriter records the status code written.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status = code
		w.wrote = true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if !w.wrote {
		w.status = http.StatusOK
		w.wrote = true
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) code() int {
	if !w.wrote {
		return http.StatusOK
	}
	return w.status
}
