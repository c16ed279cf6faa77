package admin

import (
	"net/http"
	"runtime"
	"strings"
	"testing"
)

// TestPublishListStopsPastTheBatchLimit: a body of many tiny elements is refused once past
// maxPublishBatch, without decoding the rest into structs; unknown fields are still refused.
func TestPublishListStopsPastTheBatchLimit(t *testing.T) {
	// Not parallel: TotalAlloc counts the whole process.
	const n = 400_000
	body := []byte(`{"messages":[` + strings.Repeat(`{},`, n-1) + `{}]}`)
	var req PublishRequest
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := unmarshalJSON(body, &req, false)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "at most 10000 messages per request") {
		t.Fatalf("%d elements: %v", n, err)
	}
	// Decoding them all takes n structs of PublishMessage (over 100 MB); stopping at the limit
	// takes about 10,000 of them plus the decoder's copy of the body.
	if got := after.TotalAlloc - before.TotalAlloc; got > 40<<20 {
		t.Fatalf("allocated %d MiB refusing %d elements", got>>20, n)
	}

	ok := []byte(`{"messages":[{"payload":"a"},{"payload":"b","key":"k"}]}`)
	req = PublishRequest{}
	if err := unmarshalJSON(ok, &req, false); err != nil || len(req.Messages) != 2 || *req.Messages[1].Key != "k" {
		t.Fatalf("two messages: %v %+v", err, req)
	}
	for body, want := range map[string]string{
		`{"messages":[{"payload":"a","nope":1}]}`: "unknown field",
		`{"messages":{"payload":"a"}}`:            "must be an array",
		`{"messages":[]}`:                         "",
	} {
		req = PublishRequest{}
		err := unmarshalJSON([]byte(body), &req, false)
		if want == "" && (err != nil || req.Messages == nil) || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Fatalf("%s: %v (messages %v), want %q", body, err, req.Messages, want)
		}
	}
}

// TestPublishBatchPastTheLimitHTTP: over HTTP, a batch of 20,000 empty messages is refused with
// 400 INVALID_ARGUMENT and the batch limit's message, as before it was decoded element-wise.
func TestPublishBatchPastTheLimitHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	body := `{"messages":[` + strings.Repeat(`{},`, 19_999) + `{}]}`
	d := e.do("POST", "/api/v1/topics/batch/messages", body).fails(http.StatusBadRequest, "INVALID_ARGUMENT")
	if want := "invalid argument: at most 10000 messages per request"; !strings.HasPrefix(d.Message, want) {
		t.Fatalf("message %q, want it to start %q", d.Message, want)
	}
	e.do("POST", "/api/v1/topics/batch/messages", `{"messages":[{"payload":"a","nope":1}]}`).fails(http.StatusBadRequest, "INVALID_ARGUMENT")
}
