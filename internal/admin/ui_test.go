package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/spoolmq/spool/internal/admin/ui"
)

// The dashboard tests drive the real page in headless Chromium against a real broker and admin
// handler on loopback. Each writes a PNG of every page it visits to $SPOOL_TEST_ARTIFACTS (the
// screenshots in docs/img come from there), else to a temporary directory.

// chromiumPath finds the browser: $SPOOL_TEST_CHROMIUM, else chromium (Debian's package),
// chromium-browser or google-chrome on PATH. Without one the test skips, unless
// SPOOL_TEST_REQUIRE_CHROMIUM is set: scripts/test.sh installs chromium and sets it, so there the
// dashboard is always tested.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SPOOL_TEST_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("SPOOL_TEST_REQUIRE_CHROMIUM") != "" {
		t.Fatal("no chromium on PATH but SPOOL_TEST_REQUIRE_CHROMIUM is set (apt-get install chromium)")
	}
	t.Skip("no chromium on PATH (apt-get install chromium); set SPOOL_TEST_REQUIRE_CHROMIUM=1 to fail instead")
	return ""
}

// browser is one headless Chromium tab on the dashboard at base. It records what the page logs
// and every request it makes, and checks at the end that the page threw nothing, logged no error
// (a Content-Security-Policy violation is one) and asked nothing of another origin.
type browser struct {
	t    *testing.T
	ctx  context.Context
	base string
	dir  string

	mu       sync.Mutex
	problems []string
	requests []string
	statuses map[string][]int // API path (without query) -> statuses seen
	// allowErrors: log lines that a test expects (the browser logs each 401 it receives).
	allowErrors []string
}

func newBrowser(t *testing.T, base string) *browser {
	t.Helper()
	exe := chromiumPath(t)
	dir := os.Getenv("SPOOL_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1360, 900),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("lang", "en-US"),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root with its sandbox
	}
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	b := &browser{t: t, ctx: ctx, base: base, dir: dir, statuses: map[string][]int{}}
	t.Cleanup(func() {
		b.check()
		cancel()
		acancel()
	})
	// Listen starts the browser and opens the tab (without a timeout: it would stop the browser).
	if err := chromedp.Listen(ctx, b.event); err != nil {
		t.Fatalf("starting %s: %v", exe, err)
	}
	b.do(chromedp.EmulateViewport(1360, 900))
	t.Logf("dashboard screenshots in %s", dir)
	return b
}

// event records one event of the tab; it runs on chromedp's reader goroutine and must be fast.
func (b *browser) event(ev any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch ev := ev.(type) {
	case *network.EventRequestWillBeSent:
		b.requests = append(b.requests, ev.Request.URL)
	case *network.EventResponseReceived:
		if path, ok := strings.CutPrefix(ev.Response.URL, b.base); ok && strings.HasPrefix(path, "/api/") {
			path, _, _ = strings.Cut(path, "?")
			b.statuses[path] = append(b.statuses[path], int(ev.Response.Status))
		}
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		msg := d.Text
		if d.Exception != nil {
			msg += " " + d.Exception.Description
		}
		b.problems = append(b.problems, fmt.Sprintf("exception at %s:%d: %s", d.URL, d.LineNumber, msg))
	case *runtime.EventConsoleAPICalled:
		if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeWarning {
			b.problems = append(b.problems, fmt.Sprintf("console.%s", ev.Type))
		}
	case *log.EventEntryAdded:
		if ev.Entry.Level == log.EntryLevelError || ev.Entry.Level == log.EntryLevelWarning {
			for _, ok := range b.allowErrors {
				if strings.Contains(ev.Entry.Text, ok) {
					return
				}
			}
			b.problems = append(b.problems, fmt.Sprintf("log %s (%s): %s %s", ev.Entry.Level, ev.Entry.Source, ev.Entry.Text, ev.Entry.URL))
		}
	}
}

// allow makes log errors containing one of texts expected.
func (b *browser) allow(texts ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.allowErrors = append(b.allowErrors, texts...)
}

func (b *browser) check() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.problems {
		b.t.Errorf("page problem: %s", p)
	}
	for _, u := range b.requests {
		if !strings.HasPrefix(u, b.base+"/") && !strings.HasPrefix(u, "data:") {
			b.t.Errorf("the page requested %s, outside its origin %s: it must work offline", u, b.base)
		}
	}
}

func (b *browser) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, waitTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("browser: %v", err)
	}
}

// eval evaluates a JavaScript expression in the page and decodes its value into T.
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, waitTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		b.t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// waitJS waits until the expression is truthy in the page (it is evaluated at each animation
// frame), failing after waitTimeout with what the page shows.
func (b *browser) waitJS(what, expr string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, waitTimeout)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(waitTimeout))); err != nil {
		body := eval[string](b, `document.body.innerText`)
		b.t.Fatalf("waiting for %s (%s): %v\npage text:\n%s", what, expr, err, body)
	}
}

// js quotes s as a JavaScript string literal.
func js(s string) string {
	q, _ := json.Marshal(s)
	return string(q)
}

// text is the expression of the trimmed text of the first element matching a CSS selector ("" if
// none).
func text(sel string) string {
	return fmt.Sprintf(`((document.querySelector(%s)||{}).textContent||'').trim()`, js(sel))
}

// waitText waits until the element's text is want.
func (b *browser) waitText(sel, want string) {
	b.t.Helper()
	b.waitJS(fmt.Sprintf("%s to read %q", sel, want), fmt.Sprintf(`%s === %s`, text(sel), js(want)))
}

// click waits for the element and clicks it. The tables are drawn again at each poll, so the
// click is the element's own click(), not a mouse event at coordinates taken a moment earlier.
func (b *browser) click(sel string) {
	b.t.Helper()
	b.waitJS(sel, fmt.Sprintf(`document.querySelector(%s) !== null`, js(sel)))
	eval[chromedp.Void](b, fmt.Sprintf(`document.querySelector(%s).click()`, js(sel)))
}

// loads is how many times the page has loaded its data (the page counts them on body).
func (b *browser) loads() int {
	return eval[int](b, `Number(document.body.dataset.loaded || 0)`)
}

// waitLoads waits until the page has loaded its data n more times than when before was read.
func (b *browser) waitLoads(before, n int) {
	b.t.Helper()
	b.waitJS(fmt.Sprintf("%d more loads", n), fmt.Sprintf(`Number(document.body.dataset.loaded || 0) >= %d`, before+n))
}

// screenshot writes a PNG of the viewport to name in the artifacts directory and checks it is one.
func (b *browser) screenshot(name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, waitTimeout)
	defer cancel()
	data, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		b.t.Fatalf("screenshot %s is not a PNG: %v", name, err)
	}
	if r := img.Bounds(); r.Dx() != 1360 || r.Dy() != 900 {
		b.t.Errorf("screenshot %s is %dx%d, want 1360x900", name, r.Dx(), r.Dy())
	}
	path := filepath.Join(b.dir, name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot %s (%d bytes)", path, len(data))
}

// hold makes the page's requests to url (exactly) wait until release is called; held receives each
// one as it is held. It uses the DevTools Fetch domain, so the server never sees a held request.
func (b *browser) hold(url string) (held <-chan struct{}, release func()) {
	b.t.Helper()
	ids := make(chan fetch.RequestID, 16)
	ch := make(chan struct{}, 16)
	ctx, cancel := context.WithCancel(b.ctx)
	b.t.Cleanup(cancel)
	var tgt *chromedp.Target
	b.do(func(rctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		tgt = t
		events := cdp.Events(ctx, t, fetch.RequestPaused) // subscribed from here on
		go func() {
			for ev, err := range events {
				if err != nil {
					return
				}
				if ev.Request.URL != url { // not ours (the pattern is a glob): let it through
					_, _ = cdp.Call(ctx, t, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
					continue
				}
				ids <- ev.RequestID
				ch <- struct{}{}
			}
		}()
		_, err := cdp.Call(rctx, t, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{{URLPattern: url}}})
		return chromedp.Void{}, err
	})
	return ch, func() {
		b.t.Helper()
		rctx, rcancel := context.WithTimeout(ctx, waitTimeout)
		defer rcancel()
		for {
			select {
			case id := <-ids:
				if _, err := cdp.Call(rctx, tgt, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: id}); err != nil {
					b.t.Fatalf("releasing a held request: %v", err)
				}
			default:
				if _, err := cdp.Call(rctx, tgt, fetch.Disable, cdp.Empty{}); err != nil {
					b.t.Fatalf("releasing held requests: %v", err)
				}
				return
			}
		}
	}
}

// fakeClock makes the page's performance.now a clock the test moves: pages loaded from here on
// get spoolTestAdvanceClock(ms), which moves it forward. The page times its loads with it.
func (b *browser) fakeClock() {
	b.t.Helper()
	const src = `(() => {
		const real = performance.now.bind(performance);
		let offset = 0;
		performance.now = () => real() + offset;
		window.spoolTestAdvanceClock = (ms) => { offset += ms; };
	})();`
	b.do(func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, t, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: src})
		return chromedp.Void{}, err
	})
}

// requested returns the URLs the page asked for so far.
func (b *browser) requested() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.requests)
}

func (b *browser) sawStatus(path string, status int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Contains(b.statuses[path], status)
}

func TestDashboardAssets(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for _, name := range ui.Names() {
		r := e.do("GET", "/ui/"+name, nil).ok(http.StatusOK, nil)
		const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
			"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
		if got := r.header.Get("Content-Security-Policy"); got != csp {
			t.Errorf("/ui/%s: Content-Security-Policy %q, want %q", name, got, csp)
		}
		if r.header.Get("X-Content-Type-Options") != "nosniff" || r.header.Get("X-Frame-Options") != "DENY" {
			t.Errorf("/ui/%s: security headers missing: %v", name, r.header)
		}
		etag := r.header.Get("ETag")
		if etag == "" {
			t.Errorf("/ui/%s without ETag", name)
		}
		e.do("GET", "/ui/"+name, nil, "If-None-Match", etag).ok(http.StatusNotModified, nil)
	}
	r := e.do("GET", "/", nil).ok(http.StatusOK, nil)
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Errorf("GET / Content-Type %q", ct)
	}
	if !bytes.Contains(r.body, []byte(`src="/ui/app.js"`)) {
		t.Errorf("GET / is not the dashboard: %s", r.body)
	}
	// Nothing is loaded from another site.
	for _, name := range ui.Names() {
		body := e.do("GET", "/ui/"+name, nil).body
		for _, bad := range []string{"http://", "https://", "//cdn"} {
			if i := bytes.Index(body, []byte(bad)); i >= 0 && !bytes.HasPrefix(body[i:], []byte("http://www.w3.org/2000/svg")) {
				t.Errorf("/ui/%s refers to another site: %q", name, body[i:min(i+60, len(body))])
			}
		}
	}
	e.do("GET", "/ui/nope.js", nil).fails(http.StatusNotFound, "NOT_FOUND")
	// Unclean paths: the mux redirects them to the clean path, so ui.Serve is asked directly.
	for _, p := range []string{"/ui/../admin.go", "/ui/../ui/app.js", "/ui/./app.js", "/ui//app.js", "/ui/static/app.js", "/ui/x/../app.js"} {
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.URL.Path = p
		if ui.Serve(w, req) || w.Body.Len() > 0 || len(w.Header()) > 0 {
			t.Errorf("ui.Serve(%q) served something: %d %q", p, w.Code, w.Body.String())
		}
	}
	e.do("GET", "/ui/../admin.go", nil).fails(http.StatusNotFound, "NOT_FOUND")
	e.do("GET", "/nope", nil).fails(http.StatusNotFound, "NOT_FOUND")
	e.do("POST", "/", nil).fails(http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED")
	// The files are open when authentication is on; the data is not.
	a := authEnv(t, true)
	a.do("GET", "/", nil).ok(http.StatusOK, nil)
	a.do("GET", "/ui/app.js", nil).ok(http.StatusOK, nil)
	a.do("GET", "/api/v1/topics", nil).fails(http.StatusUnauthorized, "NOT_AUTHENTICATED")
}

// TestDashboardCleanup: the topics page shows the cleanup jobs' health: a retention backlog that
// grows at each run (seed 000's CRITICAL rule) reads BEHIND with the reason.
func TestDashboardCleanup(t *testing.T) {
	var n atomic.Int64
	e := backlogEnv(t, func() int64 { return 1_000_000 + n.Add(1) })
	cleanupJobs(e, func(j map[string]any) bool { return j["behind"] == true })
	b := newBrowser(t, e.srv.URL)
	b.do(chromedp.Navigate(e.srv.URL + "/"))
	b.waitText(`[data-card=cleanup] .value`, "BEHIND")
	b.waitJS("the reason", text(`[data-card=cleanup] .sub`)+`.includes('retention: the backlog grew at each of the last 3 runs')`)
	b.waitJS("a critical card", `document.querySelector('[data-card=cleanup]').classList.contains('crit')`)
}

// TestDashboard walks the dashboard's pages over real data: the topic list (depth, live
// update), a topic (its group's state, members, lag, DLQ count; pause and resume), the group's
// DLQ (inspect, replay, purge with confirmation), checking each action's effect through the API,
// and a broker that stops answering.
func TestDashboard(t *testing.T) {
	// The pull session's member stays for the whole test, so the group has one member.
	e := newEnv(t, func(c *Config) { c.PullIdleTimeout = time.Hour })
	const topic, group = "orders.created", "billing"
	e.do("POST", "/api/v1/topics", map[string]any{"name": topic, "semantics": "PUB_SUB"}).ok(http.StatusCreated, nil)
	// Markup in data must stay text: the page builds no element from it.
	evil := `{"order":42,"note":"<img src=x id=pwned-payload onerror=alert(1)>"}`
	e.do("POST", "/api/v1/topics/"+topic+"/messages", map[string]any{"messages": []map[string]any{
		{"payload": `{"order":40}`},
		{"payload": `{"order":41}`},
		{"payload": evil, "key": "customer-7", "headers": map[string]string{"trace-id": "abc123", "x-html": "<b id=pwned-header>"}},
	}}).ok(http.StatusCreated, nil)
	msgs := e.pullN(topic, group, 3, map[string]any{"start": map[string]any{"kind": "FROM_BEGINNING"}})
	e.do("POST", "/api/v1/topics/"+topic+"/groups/"+group+"/ack", map[string]any{"ids": []string{msgs[0].ID, msgs[1].ID}}).ok(http.StatusOK, nil)
	reason := "card declined <script id=pwned-reason>alert(1)</script>"
	e.do("POST", "/api/v1/topics/"+topic+"/groups/"+group+"/nack", map[string]any{"ids": []string{msgs[2].ID}, "to_dlq": true, "reason": reason}).ok(http.StatusOK, nil)

	e.do("POST", "/api/v1/topics", map[string]any{"name": "audit.log", "semantics": "PUB_SUB"}).ok(http.StatusCreated, nil)

	b := newBrowser(t, e.srv.URL)
	row := `tr[data-topic="` + topic + `"] `

	// Topics: depth, groups, health.
	b.do(chromedp.Navigate(e.srv.URL + "/"))
	b.waitText(row+`[data-col=depth]`, "3")
	b.waitText(row+`[data-col=groups]`, "1")
	b.waitJS("the topic's health to say WARN (a DLQ entry)", text(row+`[data-col=health]`)+`.startsWith('WARN')`)
	b.waitJS("a topic nobody consumes", text(`tr[data-topic="audit.log"] [data-col=health]`)+`.startsWith('NO GROUPS')`)
	// Live update: two more messages appear without a reload, and the rate is measured.
	n := b.loads()
	e.do("POST", "/api/v1/topics/"+topic+"/messages", map[string]any{"messages": []map[string]any{{"payload": "a"}, {"payload": "b"}}}).ok(http.StatusCreated, nil)
	b.waitText(row+`[data-col=depth]`, "5")
	b.waitLoads(n, 2)
	b.waitJS("a publish rate", text(row+`[data-col=rate]`)+`.endsWith('/s')`)
	b.waitJS("the poll interval", `document.body.dataset.poll === '2000'`)
	b.waitText(`[data-card=cleanup] .value`, "OK")
	b.waitText(`[data-card=cleanup] .sub`, "backlog 0 messages")
	b.screenshot("dashboard-topics.png")
	// The poll reads one page of groups (the figures of 1,000 subscriptions at most), never the
	// unpaged listing.
	for _, u := range b.requested() {
		if strings.Contains(u, "/api/v1/groups") && !strings.Contains(u, "/api/v1/groups?limit=1000") {
			t.Errorf("the dashboard polled %s, want /api/v1/groups?limit=1000", u)
		}
	}

	// Topic: the group's state, members, lag and DLQ count.
	b.click(row + `a`)
	grow := `tr[data-group="` + group + `"] `
	b.waitText(grow+`[data-col=state]`, "ACTIVE")
	b.waitJS("one member", text(grow+`[data-col=members]`)+`.startsWith('1')`)
	b.waitText(grow+`[data-col=lag]`, "2") // the two messages published last were not pulled
	b.waitText(grow+`[data-col=dlq]`, "1 →")
	b.waitText(grow+`[data-col=processed]`, "2"+"1 failed") // two acked; one nacked to the DLQ (the line below)
	b.waitText(`[data-card=depth] .value`, "5")
	b.screenshot("dashboard-topic.png")

	// Pause (after the confirmation) and resume the group from its row.
	b.click(grow + `[data-action=pause]`)
	b.waitJS("the pause question", text(`#confirm-text`)+`.startsWith('Pause group billing on topic orders.created?')`)
	b.do(chromedp.Click(chromedp.ID("confirm-ok")))
	b.waitText(grow+`[data-col=state]`, "PAUSED")
	var g Group
	e.do("GET", "/api/v1/topics/"+topic+"/groups/"+group, nil).ok(http.StatusOK, &g)
	if g.State != "PAUSED" {
		t.Fatalf("group state after pause: %s", g.State)
	}
	b.click(grow + `[data-action=resume]`)
	b.waitText(grow+`[data-col=state]`, "ACTIVE")
	e.do("GET", "/api/v1/topics/"+topic+"/groups/"+group, nil).ok(http.StatusOK, &g)
	if g.State != "ACTIVE" {
		t.Fatalf("group state after resume: %s", g.State)
	}

	// DLQ: the entry, then the inspector with payload, headers and reason as text.
	b.click(grow + `[data-col=dlq] a`)
	b.waitJS("the DLQ entry", `document.querySelectorAll('tr[data-entry]').length === 1`)
	b.waitText(`tr[data-entry] [data-col=last_error]`, reason)
	b.waitText(`tr[data-entry] [data-col=message]`, msgs[2].ID+"key customer-7")
	// The keyboard works too, and the focus survives the redraws of the live updates.
	eval[chromedp.Void](b, `document.querySelector('tr[data-entry]').focus()`)
	b.waitLoads(b.loads(), 2)
	if !eval[bool](b, `document.activeElement.matches('tr[data-entry]')`) {
		t.Errorf("the focused DLQ row lost the focus at a refresh")
	}
	b.do(chromedp.KeyEvent("\r"))
	b.waitJS("the inspector", `document.getElementById('inspect-payload') !== null`)
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, []byte(evil), "", "  "); err != nil {
		t.Fatal(err)
	}
	if got := eval[string](b, `document.getElementById('inspect-payload').textContent`); got != pretty.String() {
		t.Errorf("inspected payload %q, want %q", got, pretty.String())
	}
	b.waitJS("the trace-id header", text(`#inspect-headers`)+`.includes('trace-idabc123')`)
	// The polled list came without payloads; the inspector fetched its entry whole. The DLQ page
	// polls every 5 s.
	entryID := eval[string](b, `document.querySelector('tr[data-entry]').dataset.entry`)
	dlqURL := e.srv.URL + "/api/v1/topics/" + topic + "/groups/" + group + "/dlq"
	lists, entryFetched := 0, false
	for _, u := range b.requested() {
		if strings.HasPrefix(u, dlqURL+"?") {
			lists++
			if !strings.Contains(u, "payload=false") {
				t.Errorf("the DLQ list was asked with its payloads: %s", u)
			}
		}
		entryFetched = entryFetched || u == dlqURL+"/"+entryID
	}
	if lists == 0 || !entryFetched {
		t.Errorf("DLQ requests: %d lists, entry %s fetched %v; requests: %q", lists, entryID, entryFetched, b.requested())
	}
	b.waitJS("the DLQ poll interval", `document.body.dataset.poll === '5000'`)
	if n := eval[int](b, `document.querySelectorAll('#pwned-payload, #pwned-header, #pwned-reason').length`); n != 0 {
		t.Errorf("message data became markup: %d elements", n)
	}
	b.screenshot("dashboard-dlq.png")

	// Replay from the inspector, after the confirmation: the DLQ is empty and the message is
	// delivered again to the group.
	b.click(`#inspect-replay`)
	b.waitJS("the confirmation", `!document.getElementById('confirm').hidden`)
	b.waitJS("the replay question", text(`#confirm-text`)+`.startsWith('Replay 1 entry')`)
	b.do(chromedp.Click(chromedp.ID("confirm-ok")))
	b.waitJS("the inspector to say the entry is gone", `document.getElementById('inspect-gone') !== null`)
	var dl DLQList
	e.do("GET", "/api/v1/topics/"+topic+"/groups/"+group+"/dlq", nil).ok(http.StatusOK, &dl)
	if len(dl.Entries) != 0 {
		t.Fatalf("DLQ after replay: %+v", dl.Entries)
	}
	again := e.pullN(topic, group, 3, nil) // the replayed message and the two published later
	var replayed *PulledMessage
	for i := range again {
		if again[i].ID == msgs[2].ID {
			replayed = &again[i]
		}
	}
	if replayed == nil || replayed.Attempt != 1 {
		t.Fatalf("pull after replay: %+v, want %s again with a fresh attempt count", again, msgs[2].ID)
	}
	var ack []string
	for _, m := range again {
		if m.ID != msgs[2].ID {
			ack = append(ack, m.ID)
		}
	}
	e.do("POST", "/api/v1/topics/"+topic+"/groups/"+group+"/ack", map[string]any{"ids": ack}).ok(http.StatusOK, nil)
	e.do("POST", "/api/v1/topics/"+topic+"/groups/"+group+"/nack", map[string]any{"ids": []string{msgs[2].ID}, "to_dlq": true, "reason": "still bad"}).ok(http.StatusOK, nil)

	// The new entry shows up by itself. Purge all: cancelling changes nothing, confirming purges.
	b.waitText(`tr[data-entry] [data-col=last_error]`, "still bad")
	b.click(`#purge-all`)
	b.waitJS("the purge question", text(`#confirm-text`)+`.startsWith('Purge all 1 entries')`)
	b.do(chromedp.Click(chromedp.ID("confirm-cancel")))
	b.waitJS("the dialog to close", `document.getElementById('confirm').hidden`)
	e.do("GET", "/api/v1/topics/"+topic+"/groups/"+group+"/dlq", nil).ok(http.StatusOK, &dl)
	if len(dl.Entries) != 1 {
		t.Fatalf("DLQ after a cancelled purge: %+v", dl.Entries)
	}
	b.click(`#purge-all`)
	b.waitJS("the confirmation", `!document.getElementById('confirm').hidden`)
	b.do(chromedp.Click(chromedp.ID("confirm-ok")))
	b.waitJS("the empty DLQ", text(`#entries`)+` === 'The dead-letter queue is empty.'`)
	e.do("GET", "/api/v1/topics/"+topic+"/groups/"+group+"/dlq", nil).ok(http.StatusOK, &dl)
	if len(dl.Entries) != 0 {
		t.Fatalf("DLQ after purge: %+v", dl.Entries)
	}
	e.do("GET", "/api/v1/topics/"+topic+"/groups/"+group, nil).ok(http.StatusOK, &g)
	if g.Pending != 0 || g.DeadLettered != 0 {
		t.Fatalf("group after purge: pending %d, dead-lettered %d; want nothing left", g.Pending, g.DeadLettered)
	}
	b.waitText(`[data-card=dead_lettered] .value`, "0")

	// The broker stops answering: the page says so and keeps the last data on screen.
	b.allow("ERR_CONNECTION_REFUSED")
	e.srv.Close()
	b.waitJS("the unreachable banner", text(`#banner`)+`.startsWith('UNREACHABLE')`)
	b.waitText(`#live`, "broker unreachable")
	b.waitText(`[data-card=dead_lettered] .value`, "0")
}

// TestDashboardAuth: with principals configured, the page asks for a token (its API calls get
// 401), refuses a wrong one, works with a good one kept in session storage only, and signs out.
func TestDashboardAuth(t *testing.T) {
	e := authEnv(t, true)
	e.do("POST", "/api/v1/topics/orders.x/messages", map[string]any{"payload": "hi"}, bearer(pubToken)...).ok(http.StatusCreated, nil)
	e.do("GET", "/api/v1/topics", nil).fails(http.StatusUnauthorized, "NOT_AUTHENTICATED")

	b := newBrowser(t, e.srv.URL)
	b.allow("401 (Unauthorized)", "403 (Forbidden)") // the browser logs each refusal
	b.do(chromedp.Navigate(e.srv.URL + "/"))
	b.waitJS("the sign-in dialog", `!document.getElementById('login').hidden`)
	if !b.sawStatus("/api/v1/topics", http.StatusUnauthorized) {
		t.Errorf("the page's API call without a token did not get 401: %v", b.statuses)
	}
	if n := eval[int](b, `document.querySelectorAll('tr[data-topic]').length`); n != 0 {
		t.Errorf("topics shown without a token: %d", n)
	}
	b.screenshot("dashboard-login.png")

	// A wrong token is refused and not kept.
	b.do(chromedp.SendKeys(chromedp.ID("token"), "wrong-0123456789abcdef"), chromedp.Click(chromedp.ID("login-submit")))
	b.waitJS("the refusal", text(`#login-error`)+`.startsWith('That token was refused')`)
	if tok := eval[*string](b, `sessionStorage.getItem('spool.token')`); tok != nil {
		t.Errorf("a refused token was kept: %q", *tok)
	}
	// A principal without admin rights sees why the API refuses it.
	b.do(chromedp.SendKeys(chromedp.ID("token"), pubToken), chromedp.Click(chromedp.ID("login-submit")))
	b.waitJS("the permission banner", text(`#banner`)+`.startsWith('PERMISSION_DENIED')`)
	// The admin token works; it is in this tab's session storage, nowhere else.
	b.click(`#signout`)
	b.waitJS("the sign-in dialog", `!document.getElementById('login').hidden`)
	b.do(chromedp.SendKeys(chromedp.ID("token"), adminToken), chromedp.Click(chromedp.ID("login-submit")))
	b.waitText(`tr[data-topic="orders.x"] [data-col=depth]`, "1")
	if tok := eval[string](b, `sessionStorage.getItem('spool.token')`); tok != adminToken {
		t.Errorf("session storage holds %q", tok)
	}
	if n := eval[int](b, `localStorage.length + document.cookie.length`); n != 0 {
		t.Errorf("the token went to local storage or a cookie")
	}
	// Signing out forgets the token and asks again.
	b.click(`#signout`)
	b.waitJS("the sign-in dialog", `!document.getElementById('login').hidden`)
	if tok := eval[*string](b, `sessionStorage.getItem('spool.token')`); tok != nil {
		t.Errorf("token kept after sign-out")
	}
}

// TestDashboardDLQSelection: a DLQ longer than a page shows "Show more"; entries are selected
// one by one or all at once, and only the selected ones are purged.
func TestDashboardDLQSelection(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.PullIdleTimeout, c.PullMaxBatch = time.Hour, 200 })
	const n = 101 // one more than the page
	msgs := make([]map[string]any, n)
	for i := range msgs {
		msgs[i] = map[string]any{"payload": fmt.Sprintf("job %d", i)}
	}
	e.do("POST", "/api/v1/topics/jobs/messages", map[string]any{"messages": msgs}).ok(http.StatusCreated, nil)
	pulled := e.pullN("jobs", "$queue", n, nil)
	ids := make([]string, len(pulled))
	for i, m := range pulled {
		ids[i] = m.ID
	}
	e.do("POST", "/api/v1/topics/jobs/groups/$queue/nack", map[string]any{"ids": ids, "to_dlq": true, "reason": "bad job"}).ok(http.StatusOK, nil)

	b := newBrowser(t, e.srv.URL)
	b.do(chromedp.Navigate(e.srv.URL + "/#/topics/jobs/groups/%24queue/dlq"))
	rows := `document.querySelectorAll('tr[data-entry]').length`
	b.waitJS("a page of entries", rows+` === 100`)
	b.waitText(`[data-card=dead_lettered] .value`, "101")
	b.click(`#more button`)
	b.waitJS("every entry", rows+` === 101`)
	// Select all, then leave the first entry out: 100 selected.
	b.click(`#select-all`)
	b.waitText(`#purge-selected`, "Purge selected (101)")
	b.click(`tr[data-entry] input[type=checkbox]`)
	b.waitText(`#purge-selected`, "Purge selected (100)")
	b.waitJS("select-all half checked", `document.getElementById('select-all').indeterminate`)
	first := eval[string](b, `document.querySelector('tr[data-entry]').dataset.entry`)
	b.click(`#purge-selected`)
	b.waitJS("the purge question", text(`#confirm-text`)+`.startsWith('Purge 100 entries from the DLQ of group $queue on topic jobs?')`)
	b.do(chromedp.Click(chromedp.ID("confirm-ok")))
	b.waitJS("one entry left", rows+` === 1`)
	var dl DLQList
	e.do("GET", "/api/v1/topics/jobs/groups/$queue/dlq", nil).ok(http.StatusOK, &dl)
	if len(dl.Entries) != 1 || fmt.Sprint(dl.Entries[0].ID) != first {
		t.Fatalf("DLQ after purging the selection: %+v, want entry %s alone", dl.Entries, first)
	}
	b.waitText(`#purge-selected`, "Purge selected (0)")
}

// TestDashboardLagGrowing: a group whose lag rose at each of the last five polls is flagged.
func TestDashboardLagGrowing(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.PullIdleTimeout = time.Hour })
	e.do("POST", "/api/v1/topics", map[string]any{"name": "events", "semantics": "PUB_SUB"}).ok(http.StatusCreated, nil)
	e.do("POST", "/api/v1/topics/events/groups/slow/pull", map[string]any{"max": 1, "wait": "0s"}).ok(http.StatusOK, nil)

	b := newBrowser(t, e.srv.URL)
	b.do(chromedp.Navigate(e.srv.URL + "/#/topics/events"))
	health := `tr[data-group="slow"] [data-col=health]`
	b.waitText(health, "OK")
	// One more message before each poll: the lag the page sees rises five times in a row.
	for i := range 5 {
		n := b.loads()
		e.do("POST", "/api/v1/topics/events/messages", map[string]any{"payload": fmt.Sprint(i)}).ok(http.StatusCreated, nil)
		b.waitLoads(n, 1)
	}
	b.waitJS("lag growing", text(health)+`.includes('lag growing')`)
	b.waitText(`tr[data-group="slow"] [data-col=lag]`, "5")
}

// TestDashboardStaleLoad: an answer that arrives after the user moved to another page is not drawn
// there. The topic page's groups request is held while the user opens a DLQ (whose page has the
// same #head and #cards); once released, the topic's data must not show on the DLQ page.
func TestDashboardStaleLoad(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.PullIdleTimeout = time.Hour })
	const topic, group = "orders", "billing"
	e.do("POST", "/api/v1/topics", map[string]any{"name": topic, "semantics": "PUB_SUB"}).ok(http.StatusCreated, nil)
	e.do("POST", "/api/v1/topics/"+topic+"/messages", map[string]any{"payload": "x"}).ok(http.StatusCreated, nil)
	msgs := e.pullN(topic, group, 1, map[string]any{"start": map[string]any{"kind": "FROM_BEGINNING"}})
	e.do("POST", "/api/v1/topics/"+topic+"/groups/"+group+"/nack", map[string]any{"ids": []string{msgs[0].ID}, "to_dlq": true, "reason": "bad"}).ok(http.StatusOK, nil)

	b := newBrowser(t, e.srv.URL)
	held, release := b.hold(e.srv.URL + "/api/v1/topics/" + topic + "/groups")
	b.do(chromedp.Navigate(e.srv.URL + "/#/topics/" + topic))
	select {
	case <-held:
	case <-time.After(waitTimeout):
		t.Fatal("the topic page did not ask for its groups")
	}
	eval[chromedp.Void](b, `location.hash = '#/topics/orders/groups/billing/dlq'`)
	b.waitText(`#head h1`, "Dead letters of billing")
	// Record every heading and card the page shows from here on.
	eval[chromedp.Void](b, `window.seen = [];
		new MutationObserver(() => {
			for (const e of document.querySelectorAll('#head h1, #cards [data-card]')) window.seen.push(e.dataset.card || e.textContent);
		}).observe(document.getElementById('main'), { childList: true, subtree: true, characterData: true })`)
	release()
	b.waitJS("the DLQ entry", `document.querySelectorAll('tr[data-entry]').length === 1`)
	seen := eval[[]string](b, `window.seen`)
	for _, s := range seen {
		if s == topic || s == "members" || s == "bytes" {
			t.Fatalf("the topic page's late answer was drawn on the DLQ page: saw %q (all: %q)", s, seen)
		}
	}
	if !slices.Contains(seen, "Dead letters of billing") {
		t.Errorf("the DLQ page was not drawn: %q", seen)
	}
}

// TestDashboardSlowPoll: after a slow load the page waits 5 times as long before the next poll
// (a loaded broker is not kept busier by its dashboard), and returns to 2 s once loads are fast.
// The load is slow on the page's clock: the test holds the request and moves performance.now,
// which the page times its loads with, by 1.5 s meanwhile; nothing waits for real time.
func TestDashboardSlowPoll(t *testing.T) {
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "slow", "semantics": "PUB_SUB"}).ok(http.StatusCreated, nil)
	b := newBrowser(t, e.srv.URL)
	b.fakeClock()
	held, release := b.hold(e.srv.URL + "/api/v1/topics/slow/groups")
	b.do(chromedp.Navigate(e.srv.URL + "/#/topics/slow"))
	select {
	case <-held:
	case <-time.After(waitTimeout):
		t.Fatal("the topic page did not ask for its groups")
	}
	eval[chromedp.Void](b, `spoolTestAdvanceClock(1500)`) // the load under way takes 1.5 s: a slow broker
	release()
	b.waitJS("the topic page", text(`[data-card=groups] .value`)+` === '0'`)
	b.waitJS("a stretched poll interval", `Number(document.body.dataset.poll) >= 7500`)
	// A fast load brings the interval back: Resume loads at once (the stretched poll would come
	// 7.5 s later).
	n := b.loads()
	b.click(`#pause`)
	b.click(`#pause`)
	b.waitLoads(n, 1)
	b.waitJS("the poll interval back to 2 s", `document.body.dataset.poll === '2000'`)
}

// TestDashboardMessages: the topic page reads a partition's messages without consuming them: the
// partition picker, a from (offset, id or time), paging on with next_offset, and the inspector
// with headers and payload as text.
func TestDashboardMessages(t *testing.T) {
	e := newEnv(t, nil)
	const topic = "payments"
	e.do("POST", "/api/v1/topics", map[string]any{"name": topic, "semantics": "PUB_SUB", "partitions": 2}).ok(http.StatusCreated, nil)
	one := int32(1)
	var msgs []map[string]any
	for i := range 25 {
		msgs = append(msgs, map[string]any{"partition": one, "key": fmt.Sprintf("customer-%d", i),
			"payload": fmt.Sprintf(`{"payment":%d,"amount":"12.50"}`, i)})
	}
	evil := `{"payment":25,"note":"<img src=x id=pwned-payload onerror=alert(1)>"}`
	msgs = append(msgs, map[string]any{"partition": one, "key": "customer-25", "payload": evil,
		"headers": map[string]string{"trace-id": "t-25", "x-html": "<b id=pwned-header>"}})
	e.do("POST", "/api/v1/topics/"+topic+"/messages", map[string]any{"messages": msgs}).ok(http.StatusCreated, nil)
	e.do("POST", "/api/v1/topics/"+topic+"/messages", map[string]any{"partition": 0, "payload": "in partition 0"}).ok(http.StatusCreated, nil)

	b := newBrowser(t, e.srv.URL)
	b.do(chromedp.Navigate(e.srv.URL + "/#/topics/" + topic))
	rows := `document.querySelectorAll('tr[data-message]').length`
	b.waitJS("the partition picker", `document.getElementById('msg-partition').options.length === 2`)
	// Partition 0 from its start: one message.
	b.click(`#msg-read`)
	b.waitJS("partition 0's message", rows+` === 1`)
	b.waitText(`tr[data-message] [data-col=offset]`, "0")
	// Partition 1: a page of 20, then the next page from next_offset.
	eval[chromedp.Void](b, `document.getElementById('msg-partition').value = '1'`)
	b.click(`#msg-read`)
	b.waitJS("a page of 20", rows+` === 20`)
	b.waitText(`tr[data-message="1:19"] [data-col=key]`, "customer-19")
	b.click(`#msg-next`)
	b.waitJS("the last 6", rows+` === 6`)
	b.waitText(`tr[data-message] [data-col=offset]`, "20")
	b.waitJS("the end of the partition", text(`#msg-note`)+`.includes('the end of the partition for now')`)
	// From a message id (it names its partition) and from a time.
	eval[chromedp.Void](b, `document.getElementById('msg-partition').value = '0'`)
	b.do(chromedp.SendKeys(chromedp.ID("msg-from"), "1:23"))
	b.click(`#msg-read`)
	b.waitJS("3 messages from 1:23", rows+` === 3 && document.getElementById('msg-partition').value === '1'`)
	eval[chromedp.Void](b, `document.getElementById('msg-from').value = '2000-01-01T00:00:00Z'`)
	b.click(`#msg-read`)
	b.waitJS("a page from a time", rows+` === 20`)
	eval[chromedp.Void](b, `document.getElementById('msg-from').value = 'yesterday'`)
	b.allow("400 (Bad Request)")
	b.click(`#msg-read`)
	b.waitJS("the refusal", text(`#msg-error`)+`.startsWith('INVALID_ARGUMENT')`)
	eval[chromedp.Void](b, `document.getElementById('msg-from').value = '24'`)
	b.click(`#msg-read`)
	b.waitJS("two messages from offset 24", rows+` === 2`)

	// The inspector: fields, headers and payload as text; polls leave it alone.
	b.click(`tr[data-message="1:25"]`)
	b.waitJS("the inspector", `document.getElementById('msg-payload') !== null`)
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, []byte(evil), "", "  "); err != nil {
		t.Fatal(err)
	}
	if got := eval[string](b, `document.getElementById('msg-payload').textContent`); got != pretty.String() {
		t.Errorf("inspected payload %q, want %q", got, pretty.String())
	}
	b.waitJS("the trace-id header", text(`#msg-headers`)+`.includes('trace-idt-25')`)
	b.waitJS("the key", text(`#msg-inspector [data-field=key]`)+` === 'customer-25'`)
	b.waitLoads(b.loads(), 2)
	if eval[string](b, `document.getElementById('msg-payload').textContent`) != pretty.String() {
		t.Errorf("the inspector changed at a poll")
	}
	if n := eval[int](b, `document.querySelectorAll('#pwned-payload, #pwned-header').length`); n != 0 {
		t.Errorf("message data became markup: %d elements", n)
	}
	eval[chromedp.Void](b, `document.getElementById('messages-section').scrollIntoView()`)
	b.screenshot("dashboard-messages.png")

	// Reading consumed nothing: the topic has no subscription, and a new group still gets all.
	got := e.pullN(topic, "late", 27, map[string]any{"start": map[string]any{"kind": "FROM_BEGINNING"}})
	if len(got) != 27 {
		t.Fatalf("a group after reading got %d messages, want 27", len(got))
	}
	b.click(`#msg-close`)
	b.waitJS("the inspector closed", `document.getElementById('msg-inspector').hidden`)
}
