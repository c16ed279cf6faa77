// Package ui is the operator dashboard that spool serve shows at "/" of its HTTP listener: plain
// HTML, CSS and JavaScript embedded in the binary (no build step, no framework, nothing loaded
// from another site, so it works offline). The page reads and changes the broker only through the
// REST API under /api/v1, with the caller's token (Authorization: Bearer) when authentication is
// on, so it can do nothing the API would refuse its user. Every datum is put in the page as text
// (textContent), never as markup.
package ui

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed static
var static embed.FS

// asset is one embedded file with its entity tag.
type asset struct {
	data []byte
	etag string
}

// assets maps a file name ("index.html", "app.js") to its content; built once.
var assets = func() map[string]asset {
	out := make(map[string]asset)
	entries, err := fs.ReadDir(static, "static")
	if err != nil {
		panic(err) // the embedded directory is part of the binary
	}
	for _, e := range entries {
		data, err := static.ReadFile("static/" + e.Name())
		if err != nil {
			panic(err)
		}
		sum := sha256.Sum256(data)
		out[e.Name()] = asset{data: data, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
	}
	return out
}()

// Names returns the names of the embedded files.
func Names() []string {
	out := make([]string, 0, len(assets))
	for name := range assets {
		out = append(out, name)
	}
	return out
}

// csp allows the page to load only its own files and to talk only to its own origin: no inline
// script, no third-party resource, no data: URL, no framing.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Serve writes the file of a request: index.html for "/" (and "/ui/"), /ui/<name> for the others.
// It reports false, writing nothing, when there is no such file. Responses carry an ETag and
// Cache-Control: no-cache, so a browser revalidates (304) and never runs stale code after an
// upgrade.
func Serve(w http.ResponseWriter, r *http.Request) bool {
	name := strings.TrimPrefix(r.URL.Path, "/ui/")
	if name == "/" || name == "" {
		name = "index.html"
	}
	// Only plain file names: assets has no others, and this keeps it so should it ever get any.
	if path.Base(name) != name {
		return false
	}
	a, ok := assets[name]
	if !ok {
		return false
	}
	hd := w.Header()
	hd.Set("Content-Security-Policy", csp)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cache-Control", "no-cache")
	hd.Set("ETag", a.etag)
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(a.data))
	return true
}
