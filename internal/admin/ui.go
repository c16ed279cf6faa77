package admin

import (
	"net/http"

	"github.com/spoolmq/spool/internal/admin/ui"
)

// registerUI serves the dashboard (package ui): the page at GET / and its files at GET /ui/.
// These routes are open, like the probes: the files hold no data, and every API call the page
// makes carries the user's own token. They are not API routes, so neither Routes nor the OpenAPI
// document lists them; they still get the request id, logs, metrics and panic recovery of wrap.
func (h *Handler) registerUI() {
	serve := func(w http.ResponseWriter, r *http.Request) error {
		if !ui.Serve(w, r) {
			return httpErr(http.StatusNotFound, "NOT_FOUND", "no dashboard file %s", r.URL.Path)
		}
		return nil
	}
	for _, path := range []string{"/{$}", "/ui/{file...}"} {
		rt := &route{method: http.MethodGet, path: path, handle: serve, doc: opDoc{id: "ui"}}
		h.mux.Handle(rt.pattern(), h.wrap(rt))
		h.pathMux.Handle(path, http.NotFoundHandler())
		h.allow[path] = []string{http.MethodGet}
	}
}
