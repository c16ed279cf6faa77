package admin

import (
	"net/http"
	"strings"
	"testing"
)

// TestCrossSiteRequestsRefused: a web page on another site cannot drive the API through a visitor's
// browser (issue 19: a "simple" POST with Content-Type text/plain or without a body was served):
// a request that may change something is refused with 403 FORBIDDEN when the browser marks it
// cross-site (Sec-Fetch-Site) or sends an Origin other than the Host, and with 415 when its body
// is not JSON (a raw publish also takes non-simple types such as application/octet-stream). The
// refused requests change nothing; same-origin and non-browser requests work, and reads are not
// affected.
func TestCrossSiteRequestsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "keep", "semantics": "PUB_SUB"}).ok(201, nil)
	e.do("POST", "/api/v1/topics/keep/messages", map[string]any{"payload": "x"}).ok(201, nil)
	host := strings.TrimPrefix(e.srv.URL, "http://")
	evil := []string{"Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"}

	for _, tc := range []struct {
		method, path string
		body         any
		header       []string
	}{
		{"POST", "/api/v1/topics", map[string]any{"name": "evil"}, evil},
		{"POST", "/api/v1/topics", map[string]any{"name": "evil"}, []string{"Origin", "http://evil.example:8080"}},
		{"POST", "/api/v1/topics", map[string]any{"name": "evil"}, []string{"Sec-Fetch-Site", "cross-site"}},
		{"DELETE", "/api/v1/topics/keep?force=true", nil, evil},
		{"POST", "/api/v1/topics/keep/messages", []byte("planted"), append([]string{"Content-Type", "text/plain"}, evil...)},
		{"PUT", "/api/v1/topics/keep/config", map[string]any{"max_deliveries": 1}, evil},
	} {
		d := e.do(tc.method, tc.path, tc.body, tc.header...).fails(http.StatusForbidden, "FORBIDDEN")
		if !strings.Contains(d.Message, "cross-origin") {
			t.Errorf("%s %s: message %q", tc.method, tc.path, d.Message)
		}
	}

	// Bodies that a page may send to another site without a preflight, or no type at all.
	for _, tc := range []struct {
		path, ct string
	}{
		{"/api/v1/topics", "text/plain"},
		{"/api/v1/topics", "application/x-www-form-urlencoded"},
		{"/api/v1/topics", ""},
		{"/api/v1/topics/keep/messages", "text/plain;charset=UTF-8"},
		{"/api/v1/topics/keep/messages", "multipart/form-data; boundary=x"},
		{"/api/v1/topics/keep/messages", ""},
	} {
		var header []string
		if tc.ct != "" {
			header = []string{"Content-Type", tc.ct}
		}
		e.do("POST", tc.path, []byte(`{"name":"typed","payload":"y"}`), header...).fails(http.StatusUnsupportedMediaType, "UNSUPPORTED_MEDIA_TYPE")
	}

	// Nothing changed: one topic, one message, the config as it was.
	var topics struct {
		Topics []struct {
			Name string `json:"name"`
		} `json:"topics"`
	}
	e.do("GET", "/api/v1/topics", nil).ok(200, &topics)
	if len(topics.Topics) != 1 || topics.Topics[0].Name != "keep" {
		t.Fatalf("topics after the refused requests: %+v", topics)
	}
	var tp struct {
		Config struct {
			MaxDeliveries int `json:"max_deliveries"`
		} `json:"config"`
		Stats struct {
			Messages int64 `json:"messages"`
		} `json:"stats"`
	}
	e.do("GET", "/api/v1/topics/keep", nil).ok(200, &tp)
	if tp.Stats.Messages != 1 || tp.Config.MaxDeliveries == 1 {
		t.Fatalf("topic after the refused requests: %+v", tp)
	}

	// Same origin (the dashboard's own pages), non-browser clients and raw publishes still work.
	e.do("POST", "/api/v1/topics/keep/messages", map[string]any{"payload": "same"}, "Origin", "http://"+host, "Sec-Fetch-Site", "same-origin").ok(201, nil)
	e.do("POST", "/api/v1/topics/keep/messages", []byte("raw"), "Content-Type", "application/octet-stream").ok(201, nil)
	e.do("GET", "/api/v1/topics/keep", nil, evil...).ok(200, nil)
}
