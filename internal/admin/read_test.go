package admin

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/auth"
	"github.com/spoolmq/spool/internal/storage"
)

// TestReadMessagesHTTP: GET /api/v1/topics/{topic}/messages reads one partition from an offset,
// a message id or a time, pages with next_offset, refuses bad parameters with 400, and leaves
// every group's pending, lag and in-flight figures as they were.
func TestReadMessagesHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.do("POST", "/api/v1/topics", map[string]any{"name": "browse", "semantics": "PUB_SUB", "partitions": 2}).ok(http.StatusCreated, nil)
	// A group that exists from the beginning, so that the reads have delivery state to leave alone.
	if _, err := e.eng.SubscriptionCreate(context.Background(), &storage.SubscriptionCreateParams{Topic: "browse", Group: "g",
		Start: storage.StartPosition{Kind: storage.FromBeginning}}); err != nil {
		t.Fatal(err)
	}
	var times []time.Time
	for i := range 6 {
		var res PublishResult
		e.do("POST", "/api/v1/topics/browse/messages", map[string]any{"payload": fmt.Sprintf("m%d", i), "partition": 1,
			"headers": map[string]string{"n": fmt.Sprint(i)}}).ok(http.StatusCreated, &res)
		times = append(times, res.Messages[0].PublishedAt)
	}
	var before Group
	e.do("GET", "/api/v1/topics/browse/groups/g", nil).ok(http.StatusOK, &before)

	read := func(q url.Values) MessageList {
		t.Helper()
		var out MessageList
		e.do("GET", "/api/v1/topics/browse/messages?"+q.Encode(), nil).ok(http.StatusOK, &out)
		return out
	}
	ids := func(l MessageList) []string {
		var out []string
		for _, m := range l.Messages {
			out = append(out, m.ID)
		}
		return out
	}
	page := read(url.Values{"partition": {"1"}, "limit": {"4"}})
	if got := ids(page); !reflect.DeepEqual(got, []string{"1:0", "1:1", "1:2", "1:3"}) || page.NextOffset != 4 || *page.Messages[2].Payload != "m2" {
		t.Fatalf("first page %v next %d", got, page.NextOffset)
	}
	page = read(url.Values{"partition": {"1"}, "from": {fmt.Sprint(page.NextOffset)}})
	if got := ids(page); !reflect.DeepEqual(got, []string{"1:4", "1:5"}) || page.NextOffset != 6 {
		t.Fatalf("second page %v next %d", got, page.NextOffset)
	}
	if page = read(url.Values{"from": {"1:3"}, "limit": {"1"}}); !reflect.DeepEqual(ids(page), []string{"1:3"}) || page.Partition != 1 {
		t.Fatalf("from a message id: %v (partition %d)", ids(page), page.Partition)
	}
	if page = read(url.Values{"partition": {"1"}, "from": {times[4].Format(time.RFC3339Nano)}, "limit": {"1"}}); len(page.Messages) != 1 || page.Messages[0].Offset > 4 {
		t.Fatalf("from the publish time of 1:4: %v", ids(page))
	}
	// An empty page from a time: next_offset is where the time resolved to, the partition's end.
	later := times[5].Add(time.Hour).Format(time.RFC3339Nano)
	if page = read(url.Values{"partition": {"1"}, "from": {later}}); len(page.Messages) != 0 || page.NextOffset != 6 {
		t.Fatalf("from after the last message: %v next %d, want none and 6", ids(page), page.NextOffset)
	}
	if page = read(url.Values{"partition": {"0"}, "from": {later}}); len(page.Messages) != 0 || page.NextOffset != 0 {
		t.Fatalf("from a time on the empty partition: %v next %d", ids(page), page.NextOffset)
	}
	if page = read(url.Values{}); len(page.Messages) != 0 || page.NextOffset != 0 {
		t.Fatalf("partition 0 is empty, got %v", ids(page))
	}
	if page = read(url.Values{"partition": {"1"}, "from": {"99"}}); len(page.Messages) != 0 || page.NextOffset != 99 {
		t.Fatalf("past the end: %v next %d", ids(page), page.NextOffset)
	}
	for _, q := range []string{"partition=-1", "partition=x", "from=yesterday", "from=2026-13-01T00:00:00Z", "limit=1001",
		"from=0:1&partition=1", "partition=7", "from=-3"} {
		e.do("GET", "/api/v1/topics/browse/messages?"+q, nil).fails(http.StatusBadRequest, "INVALID_ARGUMENT")
	}
	e.do("GET", "/api/v1/topics/nope/messages", nil).fails(http.StatusNotFound, "TOPIC_NOT_FOUND")

	var after Group
	e.do("GET", "/api/v1/topics/browse/groups/g", nil).ok(http.StatusOK, &after)
	before.UpdatedAt, after.UpdatedAt = time.Time{}, time.Time{}
	// The age and the health reasons (which give the heartbeat's age) follow the clock.
	before.OldestUnackedAge, after.OldestUnackedAge, before.Reasons, after.Reasons = nil, nil, nil, nil
	if !reflect.DeepEqual(before, after) || after.Pending != 6 || after.Lag != 6 {
		t.Fatalf("group changed by reads: before %+v, after %+v", before, after)
	}
}

// TestReadMessagesNeedsConsumeOrAdmin: reading needs consume (any group) or admin on the topic;
// publish alone is not enough.
func TestReadMessagesNeedsConsumeOrAdmin(t *testing.T) {
	t.Parallel()
	hash := func(tok string) string {
		h, err := auth.HashToken(tok)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	const reader, writer, admin = "reader-0123456789abcdef", "writer-0123456789abcdef", "admin-0123456789abcdef"
	a, err := auth.New(auth.Config{Principals: []auth.Principal{
		{Name: "reader", TokenHash: hash(reader), Permissions: []auth.Permission{{Action: auth.Consume, Topics: "orders.#", Groups: "billing-*"}}},
		{Name: "writer", TokenHash: hash(writer), Permissions: []auth.Permission{{Action: auth.Publish, Topics: "orders.#"}}},
		{Name: "ops", TokenHash: hash(admin), Permissions: []auth.Permission{{Action: auth.Admin, Topics: "orders.#"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) { c.Auth = a })
	e.do("POST", "/api/v1/topics/orders.x/messages", map[string]any{"payload": "hi"}, bearer(writer)...).ok(http.StatusCreated, nil)
	e.do("GET", "/api/v1/topics/orders.x/messages", nil, bearer(writer)...).fails(http.StatusForbidden, "PERMISSION_DENIED")
	e.do("GET", "/api/v1/topics/orders.x/messages", nil).fails(http.StatusUnauthorized, "NOT_AUTHENTICATED")
	for _, tok := range []string{reader, admin} {
		var l MessageList
		e.do("GET", "/api/v1/topics/orders.x/messages", nil, bearer(tok)...).ok(http.StatusOK, &l)
		if len(l.Messages) != 1 || *l.Messages[0].Payload != "hi" {
			t.Fatalf("read: %+v", l)
		}
	}
	e.do("GET", "/api/v1/topics/billing.x/messages", nil, bearer(reader)...).fails(http.StatusForbidden, "PERMISSION_DENIED")
}
