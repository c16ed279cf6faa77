package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/client"
	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
)

// TestCLIScenario runs the client commands against a real broker, in the order an operator would:
// create a topic, publish, consume with a group, look at the group, dead-letter messages, inspect
// and replay the DLQ, purge it, and delete the topic.
func TestCLIScenario(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	const topic = "cli.orders"

	// topic create PUB_SUB with 2 partitions; topic list shows it.
	r := s.ok(t, "", "topic", "create", topic, "--semantics", "pub_sub", "--partitions", "2", "--ack-wait", "1m", "--max-messages", "1000")
	if r.stdout != "created topic cli.orders (PUB_SUB, 2 partitions)\n" {
		t.Fatalf("topic create printed %q", r.stdout)
	}
	s.fails(t, 1, "spool: TOPIC_EXISTS: ", "topic", "create", topic)
	row := cliFindRow(t, cliTableRows(t, s.ok(t, "", "topic", "list").stdout), "NAME", topic)
	if row["SEMANTICS"] != "PUB_SUB" || row["PARTITIONS"] != "2" || row["MESSAGES"] != "0" || row["SUBSCRIPTIONS"] != "0" {
		t.Fatalf("topic list row: %v", row)
	}
	var tl admin.TopicList
	cliDecodeJSON(t, s.ok(t, "", "topic", "list", "--json", "--pattern", "cli.#").stdout, &tl)
	if tl.Total != 1 || len(tl.Topics) != 1 || tl.Topics[0].Config.AckWait != admin.Duration(60e9) {
		t.Fatalf("topic list --json: %+v", tl)
	}

	// pub 10 messages: 6 from arguments (--count 3 x 2 payloads), 4 from stdin lines.
	r = s.ok(t, "", "pub", "--count", "3", topic, "arg-{{n}}", "also-{{n}}")
	ids := strings.Fields(r.stdout)
	if len(ids) != 6 || !strings.Contains(r.stderr, "published 6 messages to cli.orders") {
		t.Fatalf("pub arguments: %v", r)
	}
	r = s.ok(t, "line-1\nline-2\n\nline-4\n", "pub", topic, "--json", "--key", "k", "--header", "src=stdin", "--header", "n=4")
	type pubLine struct {
		Seq       int    `json:"seq"`
		Topic     string `json:"topic"`
		ID        string `json:"id"`
		Partition int32  `json:"partition"`
		Offset    int64  `json:"offset"`
	}
	pubs := cliJSONLines[pubLine](t, r.stdout)
	if len(pubs) != 4 || !strings.Contains(r.stderr, "published 4 messages") {
		t.Fatalf("pub stdin: %v", r)
	}
	for i, p := range pubs {
		// One key: one partition, offsets in input order.
		if p.Seq != i+1 || p.Topic != topic || p.Partition != pubs[0].Partition || p.Offset != pubs[0].Offset+int64(i) ||
			p.ID != fmt.Sprintf("%d:%d", p.Partition, p.Offset) {
			t.Fatalf("pub --json line %d: %+v", i, p)
		}
		ids = append(ids, p.ID)
	}
	idPattern := regexp.MustCompile(`^[01]:[0-9]+$`)
	for _, id := range ids {
		if !idPattern.MatchString(id) {
			t.Fatalf("message id %q is not partition:offset", id)
		}
	}
	if slices.Sort(ids); len(slices.Compact(ids)) != 10 {
		t.Fatalf("pub returned duplicate ids: %v", ids)
	}

	// sub --group g --from beginning --max 10 receives the 10 messages.
	r = s.ok(t, "", "sub", "--group", "g", "--from", "beginning", "--max", "10", "--json", "--concurrency", "2", topic)
	type subLine struct {
		Topic   string            `json:"topic"`
		ID      string            `json:"id"`
		Attempt int               `json:"attempt"`
		Key     *string           `json:"key"`
		Headers map[string]string `json:"headers"`
		Payload *string           `json:"payload"`
		Acked   bool              `json:"acked"`
	}
	subs := cliJSONLines[subLine](t, r.stdout)
	var payloads, gotIDs []string
	for _, d := range subs {
		if d.Topic != topic || d.Attempt != 1 || !d.Acked || d.Payload == nil {
			t.Fatalf("sub delivery: %+v", d)
		}
		if strings.HasPrefix(*d.Payload, "line-") || *d.Payload == "" {
			if d.Key == nil || *d.Key != "k" || d.Headers["src"] != "stdin" || d.Headers["n"] != "4" {
				t.Fatalf("stdin message lost its key or headers: %+v", d)
			}
		}
		payloads = append(payloads, *d.Payload)
		gotIDs = append(gotIDs, d.ID)
	}
	slices.Sort(payloads)
	want := []string{"", "also-2", "also-4", "also-6", "arg-1", "arg-3", "arg-5", "line-1", "line-2", "line-4"}
	if !slices.Equal(payloads, want) {
		t.Fatalf("sub received payloads %q, want %q", payloads, want)
	}
	if slices.Sort(gotIDs); !slices.Equal(gotIDs, ids) {
		t.Fatalf("sub received ids %v, published %v", gotIDs, ids)
	}

	// group list shows g with nothing pending.
	row = cliFindRow(t, cliTableRows(t, s.ok(t, "", "group", "list").stdout), "GROUP", "g")
	if row["TOPIC"] != topic || row["STATE"] != "ACTIVE" || row["PENDING"] != "0" || row["IN-FLIGHT"] != "0" || row["DLQ"] != "0" {
		t.Fatalf("group list row: %v", row)
	}

	// Dead-lettering: with max-deliveries 1, two messages left unacked by sub --ack=false go to
	// the DLQ when sub exits (its member leaves and releases them on their last delivery); a third
	// is nacked to the DLQ by a client.
	r = s.ok(t, "", "topic", "update", topic, "--max-deliveries", "1")
	if !strings.Contains(r.stdout, "updated topic cli.orders") || !strings.Contains(r.stdout, "max deliveries 1") ||
		!strings.Contains(r.stdout, "ack wait 1m") {
		t.Fatalf("topic update printed %q", r.stdout)
	}
	deadIDs := strings.Fields(s.ok(t, "", "pub", topic, "dead-1", "dead-2").stdout)
	r = s.ok(t, "", "sub", "--group", "g", "--ack=false", "--max", "2", topic)
	for _, p := range []string{"dead-1", "dead-2"} {
		if !strings.Contains(r.stdout, " attempt=1 "+p+"\n") {
			t.Fatalf("sub --ack=false did not print %s: %v", p, r)
		}
	}
	rejectID := strings.TrimSpace(s.ok(t, "", "pub", topic, "poison").stdout)
	nackToDLQ(t, s, topic, "g", "bad payload")

	var rows []map[string]string
	testutil.Eventually(t, cliWaitTimeout, "three DLQ entries", func() error {
		r := s.ok(t, "", "dlq", "list", topic, "g")
		if r.stdout == "" {
			return errors.New("DLQ empty")
		}
		if rows = cliTableRows(t, r.stdout); len(rows) != 3 {
			return fmt.Errorf("DLQ has %d entries, want 3:\n%s", len(rows), r.stdout)
		}
		return nil
	})
	for _, id := range deadIDs {
		row := cliFindRow(t, rows, "MESSAGE-ID", id)
		if row["REASON"] != "max_deliveries" || row["ATTEMPTS"] != "1" || row["DEAD-AT"] == "-" {
			t.Fatalf("dlq list row of %s: %v", id, row)
		}
	}
	row = cliFindRow(t, rows, "MESSAGE-ID", rejectID)
	if row["REASON"] != "rejected" || row["LAST-ERROR"] != "bad payload" {
		t.Fatalf("dlq list row of the rejected message: %v", row)
	}
	var dl admin.DLQList
	cliDecodeJSON(t, s.ok(t, "", "dlq", "list", topic, "g", "--json", "--limit", "2").stdout, &dl)
	if len(dl.Entries) != 2 || dl.NextAfterID == nil || *dl.NextAfterID != dl.Entries[1].ID {
		t.Fatalf("dlq list --limit 2 --json: %+v", dl)
	}
	row = cliFindRow(t, cliTableRows(t, s.ok(t, "", "group", "list", topic).stdout), "GROUP", "g")
	if row["DLQ"] != "3" || row["PENDING"] != "0" || row["HEALTH"] != "WARN" {
		t.Fatalf("group list after dead-lettering: %v", row)
	}

	// dlq replay of dead-1: sub gets it again, with a fresh attempt count.
	replayID := cliFindRow(t, rows, "MESSAGE-ID", deadIDs[0])["ID"]
	r = s.ok(t, "", "dlq", "replay", topic, "g", replayID)
	if r.stdout != "replayed 1 entry of group g on topic cli.orders\n" {
		t.Fatalf("dlq replay printed %q", r.stdout)
	}
	r = s.ok(t, "", "sub", "--group", "g", "--max", "1", topic)
	if r.stdout != "cli.orders "+deadIDs[0]+" attempt=1 dead-1\n" {
		t.Fatalf("sub after replay printed %q", r.stdout)
	}

	// dlq purge --all removes the two others.
	r = s.ok(t, "", "dlq", "purge", topic, "g", "--all")
	if r.stdout != "purged 2 entries of group g on topic cli.orders\n" {
		t.Fatalf("dlq purge printed %q", r.stdout)
	}
	r = s.ok(t, "", "dlq", "list", topic, "g")
	if r.stdout != "" || !strings.Contains(r.stderr, "no dead-lettered messages in group g of topic cli.orders") {
		t.Fatalf("dlq list after purge: %v", r)
	}

	// group pause, describe, resume.
	if r = s.ok(t, "", "group", "pause", topic, "g"); r.stdout != "group g on topic cli.orders: PAUSED\n" {
		t.Fatalf("group pause printed %q", r.stdout)
	}
	r = s.ok(t, "", "group", "describe", topic, "g")
	for _, want := range []string{"State:          PAUSED\n", "Start:          FROM_BEGINNING\n", "Pending:        0\n",
		"Dead-lettered:  0\n", "Health:         FAIL\nWhy:            PAUSED: receives nothing until resumed", "\nPartitions:\nPARTITION  ACK-FLOOR  CURSOR  HIGH-WATER\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("group describe lacks %q:\n%s", want, r.stdout)
		}
	}
	var g admin.Group
	cliDecodeJSON(t, s.ok(t, "", "group", "resume", topic, "g", "--json").stdout, &g)
	if g.State != "ACTIVE" || g.Group != "g" || g.Topic != topic {
		t.Fatalf("group resume --json: %+v", g)
	}
	r = s.ok(t, "", "topic", "describe", topic)
	for _, want := range []string{"Semantics:                           PUB_SUB\n", "Max deliveries:                      1\n",
		"Ack wait:                            1m\n", "Message retention:                   24h\n", "Max retention:                       30d\n",
		"Zombie TTL:                          7d\n", "Size bound:" + strings.Repeat(" ", 26) + "1000 messages (keep_needed)\n", "\nGroups:\nGROUP  STATE   HEALTH  MEMBERS  PENDING"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("topic describe lacks %q:\n%s", want, r.stdout)
		}
	}

	// topic delete: refused while g lives, done with --force.
	s.fails(t, 1, "spool: TOPIC_HAS_SUBSCRIPTIONS: ", "topic", "delete", topic)
	if r = s.ok(t, "", "topic", "delete", topic, "--force"); r.stdout != "deleted topic cli.orders\n" {
		t.Fatalf("topic delete printed %q", r.stdout)
	}
	s.fails(t, 1, "spool: TOPIC_NOT_FOUND: ", "topic", "describe", topic)
	if r = s.ok(t, "", "topic", "list"); r.stdout != "" || r.stderr != "no topics\n" {
		t.Fatalf("topic list after delete: %v", r)
	}
}

// nackToDLQ consumes one message of (topic, group) with the Go client and nacks it to the DLQ.
func nackToDLQ(t *testing.T, s *cliStack, topic, group, reason string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cliWaitTimeout)
	defer cancel()
	c, err := client.Dial(ctx, s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	done := make(chan struct{}, 1)
	sub, err := c.Subscribe(ctx, client.SubscribeParams{Topic: topic, Group: group, MaxInFlight: 1},
		func(ctx context.Context, d *client.Delivery) error {
			err := d.Nack(ctx, client.ToDLQ(errors.New(reason)))
			done <- struct{}{}
			return err
		}, client.ManualAck())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("no delivery to nack")
	}
	if err := sub.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSubInterruptReleases checks that sub ended by SIGINT (its ctx) exits 0 and that the broker
// takes back the delivery it held unacked at once: it is delivered again, attempt 2.
func TestSubInterruptReleases(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	const topic = "cli.jobs"
	s.ok(t, "", "topic", "create", topic) // QUEUE
	id := strings.TrimSpace(s.ok(t, "", "pub", topic, "job-1").stdout)

	ctx, interrupt := context.WithCancel(context.Background())
	defer interrupt()
	var out, errb testutil.SyncBuffer
	code := make(chan int, 1)
	go func() { code <- runCLI(ctx, s.env("", &out, &errb), runSub, []string{"--ack=false", topic}) }()
	testutil.Eventually(t, cliWaitTimeout, "sub prints the delivery", func() error {
		if out.String() != "cli.jobs "+id+" attempt=1 job-1\n" {
			return fmt.Errorf("sub printed %q", out.String())
		}
		return nil
	})
	var g admin.Group
	cliDecodeJSON(t, s.ok(t, "", "group", "describe", topic, "--json").stdout, &g)
	if g.Group != "$queue" || g.InFlight != 1 || g.MemberCount != 1 {
		t.Fatalf("while sub holds the message: %+v", g)
	}
	interrupt()
	select {
	case c := <-code:
		if c != 0 {
			t.Fatalf("sub after SIGINT: exit %d\n%s", c, errb.String())
		}
	case <-t.Context().Done():
		t.Fatal("test ended")
	}
	cliDecodeJSON(t, s.ok(t, "", "group", "describe", topic, "$queue", "--json").stdout, &g)
	if g.InFlight != 0 || g.MemberCount != 0 || g.Pending != 1 {
		t.Fatalf("after sub exited: %+v", g)
	}
	r := s.ok(t, "", "sub", "--max", "1", topic)
	if r.stdout != "cli.jobs "+id+" attempt=2 job-1\n" {
		t.Fatalf("redelivery printed %q", r.stdout)
	}
	row := cliFindRow(t, cliTableRows(t, s.ok(t, "", "group", "list", "--group", "$queue").stdout), "TOPIC", topic)
	if row["PENDING"] != "0" {
		t.Fatalf("group list after the ack: %v", row)
	}
}

// TestPubStdinKeepsInputOrder publishes many lines through the async window and checks that the
// ids come out in input order (the offsets of a one-partition topic), then starts an ephemeral
// subscription at a message id.
func TestPubStdinKeepsInputOrder(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	s.ok(t, "", "topic", "create", "cli.bulk", "--semantics", "PUB_SUB")
	const n = 3000
	var in strings.Builder
	for i := range n {
		fmt.Fprintf(&in, "m%d\n", i)
	}
	r := s.ok(t, in.String(), "pub", "cli.bulk")
	ids := strings.Fields(r.stdout)
	if len(ids) != n || !strings.Contains(r.stderr, "published 3000 messages to cli.bulk") {
		t.Fatalf("pub of %d lines printed %d ids; stderr %q", n, len(ids), r.stderr)
	}
	for i, id := range ids {
		if id != strconv.Itoa(i) {
			t.Fatalf("id %d is %q, want %d (input order)", i, id, i)
		}
	}
	r = s.ok(t, "", "sub", "--from", "2998", "--max", "2", "cli.bulk")
	if r.stdout != "cli.bulk 2998 attempt=1 m2998\ncli.bulk 2999 attempt=1 m2999\n" {
		t.Fatalf("sub --from 2998 printed %q", r.stdout)
	}
	r = s.ok(t, "", "pub", "--quiet", "--count", "5", "cli.bulk", "q")
	if r.stdout != "" || !strings.Contains(r.stderr, "published 5 messages") {
		t.Fatalf("pub --quiet: %v", r)
	}
}

// TestAddressesFromEnvAndFlags checks that flags override SPOOL_ADDR and SPOOL_HTTP.
func TestAddressesFromEnvAndFlags(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	down := &cliStack{addr: "127.0.0.1:1", httpURL: "http://127.0.0.1:1"} // nothing listens on port 1
	r := down.run(t, "", "topic", "list")
	if r.code != 1 || !strings.Contains(r.stderr, "spool: cannot reach the admin API at http://127.0.0.1:1 (set --http or SPOOL_HTTP)") {
		t.Fatalf("unreachable SPOOL_HTTP: %v", r)
	}
	r = down.run(t, "", "pub", "x", "y")
	if r.code != 1 || !strings.Contains(r.stderr, "spool: cannot connect to the broker at 127.0.0.1:1 (set --addr or SPOOL_ADDR)") {
		t.Fatalf("unreachable SPOOL_ADDR: %v", r)
	}
	host := strings.TrimPrefix(s.httpURL, "http://") // host:port works as well as a URL
	down.ok(t, "", "topic", "create", "cli.env", "--http", host)
	r = down.ok(t, "", "pub", "--addr", s.addr, "cli.env", "hello")
	if r.stdout != "0\n" || r.stderr != "" {
		t.Fatalf("pub --addr: %v", r)
	}
	if r := down.ok(t, "", "topic", "list", "--http", s.httpURL); !strings.Contains(r.stdout, "cli.env") {
		t.Fatalf("topic list --http: %v", r)
	}
}

// TestSubEndsWithItsGroup checks that sub exits with the broker's code when an operator cancels
// its group under it.
func TestSubEndsWithItsGroup(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	const topic = "cli.fanout"
	s.ok(t, "", "topic", "create", topic, "--semantics", "PUB_SUB")
	var out, errb testutil.SyncBuffer
	code := make(chan int, 1)
	go func() {
		code <- runCLI(t.Context(), s.env("", &out, &errb), runSub, []string{"--group", "g", topic})
	}()
	testutil.Eventually(t, cliWaitTimeout, "sub joins group g", func() error {
		r := s.run(t, "", "group", "describe", topic, "g", "--json")
		var g admin.Group
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &g) != nil || g.MemberCount != 1 {
			return fmt.Errorf("group g not there with one member yet: %v", r)
		}
		return nil
	})
	if r := s.ok(t, "", "group", "cancel", topic, "g"); r.stdout != "group g on topic cli.fanout: CANCELLED\n" {
		t.Fatalf("group cancel printed %q", r.stdout)
	}
	select {
	case c := <-code:
		if c != 1 || !strings.HasPrefix(errb.String(), "spool: SUBSCRIPTION_NOT_ACTIVE: ") || strings.Count(errb.String(), "\n") != 1 {
			t.Fatalf("sub after its group was cancelled: exit %d, stderr %q", c, errb.String())
		}
	case <-time.After(cliWaitTimeout):
		t.Fatal("sub still runs after its group was cancelled")
	}
}

// TestMessageIDsAgree: spool pub, spool sub (text and --json) and the admin API show the same
// message id (BRIEF.md 2b): the offset alone on a one-partition topic, partition:offset on a topic
// with more. pub and sub used to print partition:offset always.
func TestMessageIDsAgree(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	s.ok(t, "", "topic", "create", "cli.one")
	s.ok(t, "", "topic", "create", "cli.two", "--partitions", "2")
	for _, c := range []struct {
		topic    string
		args     []string
		id, next string
	}{
		{"cli.one", nil, "0", "1"},
		{"cli.two", []string{"--partition", "1"}, "1:0", "1:1"},
	} {
		args := append(append([]string{"pub"}, c.args...), c.topic, "x")
		if r := s.ok(t, "", args...); r.stdout != c.id+"\n" {
			t.Errorf("pub to %s printed %q, want %s", c.topic, r.stdout, c.id)
		}
		args = append(append([]string{"pub", "--json"}, c.args...), c.topic, "y")
		if r := s.ok(t, "", args...); !strings.Contains(r.stdout, `"id":"`+c.next+`"`) {
			t.Errorf("pub --json to %s printed %q, want id %s", c.topic, r.stdout, c.next)
		}
		if r := s.ok(t, "", "sub", "--from", "beginning", "--max", "1", c.topic); r.stdout != c.topic+" "+c.id+" attempt=1 x\n" {
			t.Errorf("sub of %s printed %q, want id %s", c.topic, r.stdout, c.id)
		}
		// A QUEUE topic: the first sub acked the first message.
		if r := s.ok(t, "", "sub", "--json", "--max", "1", c.topic); !strings.Contains(r.stdout, `"id":"`+c.next+`"`) {
			t.Errorf("sub --json of %s printed %q, want id %s", c.topic, r.stdout, c.next)
		}
	}
	// The admin API, for the next message of each topic.
	for _, c := range []struct{ topic, body, id string }{
		{"cli.one", `{"payload":"z"}`, "2"},
		{"cli.two", `{"payload":"z","partition":1}`, "1:2"},
	} {
		res, err := http.Post(s.httpURL+"/api/v1/topics/"+c.topic+"/messages", "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if !strings.Contains(string(body), `"id":"`+c.id+`"`) {
			t.Errorf("HTTP publish to %s answered %s, want id %s", c.topic, body, c.id)
		}
	}
}

// TestCLIPubProducerID: spool pub --producer-id stores a message once per producer id (within the
// topic's dedup window) and prints the first message's id, marked, for a repeat; "{{n}}" in the
// producer id numbers the messages of one run; topic create --dedup-window sets the window.
func TestCLIPubProducerID(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	const topic = "cli.dedup"
	s.ok(t, "", "topic", "create", topic, "--dedup-window", "10m")
	if r := s.ok(t, "", "topic", "describe", topic); !strings.Contains(r.stdout, "10m") {
		t.Fatalf("topic describe does not show the dedup window: %q", r.stdout)
	}
	if r := s.ok(t, "", "pub", "--producer-id", "order-1001", topic, "x"); r.stdout != "0\n" {
		t.Fatalf("first publish printed %q", r.stdout)
	}
	if r := s.ok(t, "", "pub", "--producer-id", "order-1001", topic, "x"); r.stdout != "0 (duplicate)\n" {
		t.Fatalf("second publish printed %q, want the first one's id marked as a duplicate", r.stdout)
	}
	r := s.ok(t, "", "pub", "--count", "2", "--producer-id", "row-{{n}}", topic, "r{{n}}")
	if ids := strings.Fields(r.stdout); !slices.Equal(ids, []string{"1", "2"}) {
		t.Fatalf("pub --count 2 with numbered producer ids printed %q", r.stdout)
	}
	r = s.ok(t, "", "pub", "--count", "3", "--producer-id", "row-{{n}}", topic, "r{{n}}")
	if r.stdout != "1 (duplicate)\n2 (duplicate)\n3\n" {
		t.Fatalf("pub repeating row-1 and row-2 printed %q", r.stdout)
	}
}

// TestCLITopicReadAndPubDelayTTL: spool pub --delay and --ttl store the message's not-before and
// expiry times (seen through spool topic read --json), and spool topic read prints a partition's
// messages page after page, from an offset, a message id or a time, without consuming them.
func TestCLITopicReadAndPubDelayTTL(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	const topic = "cli.read"
	s.ok(t, "", "topic", "create", topic, "--semantics", "PUB_SUB", "--partitions", "2")
	// Group g exists and has consumed nothing: its only member leaves before anything is published.
	ctx := context.Background()
	member, err := s.broker.Subscribe(ctx, broker.SubscribeParams{Pattern: topic, Group: "g",
		Start: storage.StartPosition{Kind: storage.FromBeginning}})
	if err != nil {
		t.Fatal(err)
	}
	if err := member.Close(ctx); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	s.ok(t, "", "pub", "--partition", "1", "--delay", "1h", "--ttl", "2h", "--header", "h=v", "--key", "k", topic, "later")
	r := s.ok(t, "", "topic", "read", "--from", "1:0", "--json", topic)
	msgs := cliJSONLines[admin.Message](t, r.stdout)
	if len(msgs) != 1 || *msgs[0].Payload != "later" {
		t.Fatalf("topic read --json: %q", r.stdout)
	}
	m := msgs[0]
	if nb := m.NotBefore.Sub(before); nb < time.Hour || nb > time.Hour+cliWaitTimeout {
		t.Errorf("not_before %s is not an hour after the publish (%s)", m.NotBefore, before)
	}
	// The broker takes the not-before's and the expiry's clock reading just before the append's.
	if nb := m.NotBefore.Sub(m.PublishedAt); nb > time.Hour || nb < time.Hour-time.Second {
		t.Errorf("not_before - published_at = %s, want 1h", nb)
	}
	if exp := m.ExpiresAt.Sub(m.PublishedAt); exp > 2*time.Hour || exp < 2*time.Hour-time.Second {
		t.Errorf("expires_at - published_at = %s, want 2h", exp)
	}
	s.fails(t, 2, "--ttl and --delay must not be negative", "pub", "--ttl", "-1s", topic, "x")

	for i := range 5 {
		s.ok(t, "", "pub", "--partition", "1", topic, fmt.Sprintf("m%d", i))
	}
	// --limit 5 prints ids 1:0 to 1:4 of the six.
	r = s.ok(t, "", "topic", "read", "--partition", "1", "--limit", "5", topic)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "1:0 ") || !strings.HasSuffix(lines[0], " key=k [h=v] later") ||
		!strings.HasPrefix(lines[4], "1:4 ") || !strings.HasSuffix(lines[4], " m3") {
		t.Fatalf("topic read --limit 5:\n%s", r.stdout)
	}
	if r = s.ok(t, "", "topic", "read", "--partition", "1", "--from", "5", topic); !strings.HasPrefix(r.stdout, "1:5 ") || strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("topic read --from 5: %q", r.stdout)
	}
	if r = s.ok(t, "", "topic", "read", "--partition", "1", "--from", time.Now().Add(time.Hour).UTC().Format(time.RFC3339), topic); r.stdout != "" {
		t.Fatalf("topic read from a future time: %q", r.stdout)
	}
	s.fails(t, 1, "INVALID_ARGUMENT", "topic", "read", "--from", "soon", topic)
	// Nothing was consumed: group g still has all six pending and never delivered.
	r = s.ok(t, "", "group", "describe", "--json", topic, "g")
	var g admin.Group
	cliDecodeJSON(t, r.stdout, &g)
	if g.Pending != 6 || g.Lag != 6 || g.InFlight != 0 {
		t.Fatalf("group g after reads: pending %d lag %d in flight %d, want 6, 6, 0", g.Pending, g.Lag, g.InFlight)
	}
}

// TestSubFilter: spool sub --filter takes only the messages whose headers match; a bad filter is
// the broker's INVALID_ARGUMENT with the position, and --filter with --ordered a usage error.
func TestSubFilter(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	const topic = "cli.filter"
	s.ok(t, "", "topic", "create", topic, "--semantics", "PUB_SUB")
	s.ok(t, "", "pub", "--header", "region=us", topic, "us-1")
	s.ok(t, "", "pub", "--header", "region=eu", topic, "eu-1")
	s.ok(t, "", "pub", "--header", "region=ap", topic, "ap-1")
	s.ok(t, "", "pub", "--header", "region=eu", topic, "eu-2")
	r := s.ok(t, "", "sub", "--group", "g", "--from", "beginning", "--filter", "region in (eu)", "--max", "2", "--json", topic)
	type subLine struct {
		Payload string            `json:"payload"`
		Headers map[string]string `json:"headers"`
	}
	lines := cliJSONLines[subLine](t, r.stdout)
	if len(lines) != 2 || lines[0].Payload != "eu-1" || lines[1].Payload != "eu-2" {
		t.Fatalf("sub --filter printed %q", r.stdout)
	}
	s.fails(t, 1, "INVALID_ARGUMENT", "sub", "--group", "g", "--filter", "region in (eu", "--max", "1", topic)
	s.fails(t, 2, "--filter does not go with --ordered", "sub", "--group", "g", "--ordered", "--filter", "region=eu", topic)
	// The ap message was completed for g without a delivery.
	r = s.ok(t, "", "group", "describe", topic, "g", "--json")
	t.Logf("describe: %s", r.stdout)
	if !strings.Contains(r.stdout, `"pending":0`) && !strings.Contains(r.stdout, `"pending": 0`) {
		t.Fatalf("group describe after the filtered sub: %s", r.stdout)
	}
}
