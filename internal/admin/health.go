package admin

import (
	"net/http"

	api "github.com/spoolmq/spool/client/admin"
	"github.com/spoolmq/spool/internal/errmap"
)

// Status is the body of the probes. Its Detail says what is degraded while the broker stays
// ready: the cleanup jobs that fall behind or whose backlog exceeds 1,000,000 messages (seed
// 000's CRITICAL and WARNING rules; GET /api/v1/cleanup has the figures).
type Status = api.Status

func (h *Handler) healthz(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, Status{Status: "ok"})
	return nil
}

// readyz answers 200 {"status":"ready"} when Config.Ready returns nil, else 503 with the mapped
// error (CLOSED when the broker is not running or the engine is closed).
func (h *Handler) readyz(w http.ResponseWriter, r *http.Request) error {
	if err := h.ready(); err != nil {
		// Any failure is 503, also one that maps to another status (an unexpected error, INTERNAL).
		pe := errmap.ErrorFrom(err)
		writeJSON(w, http.StatusServiceUnavailable, errorBody{Error: errorDetail{Code: pe.Name, Message: pe.Message, Retryable: true}})
		return nil
	}
	writeJSON(w, http.StatusOK, Status{Status: "ready", Detail: h.b.CleanupBehind()})
	return nil
}

func (h *Handler) serveMetrics(w http.ResponseWriter, r *http.Request) error {
	if h.metricsHTTP == nil {
		return httpErr(http.StatusNotFound, "NOT_FOUND", "metrics are not enabled on this server")
	}
	h.metricsHTTP.ServeHTTP(w, r)
	return nil
}

func (h *Handler) serveOpenAPI(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(h.openAPIJSON)
	return nil
}
