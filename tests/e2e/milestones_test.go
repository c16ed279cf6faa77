package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/testutil"
	"github.com/spoolmq/spool/protocol"
)

// TestM1_1AndM1_2 is seed 002's milestone 1 over TCP:
//
//	M1-1: echo "PUBLISH orders.created hello-world" | nc localhost 9092   -> accepted
//	M1-2: echo "SUBSCRIBE orders.created" | nc localhost 9092             -> MESSAGE orders.created hello-world
//
// The publisher behaves like Debian's nc (no half-close at the end of its input): the server
// closes the publisher-only session after text_publisher_idle, so the command ends.
func TestM1_1AndM1_2(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.start()

	pub := b.dialText()
	pub.echo("PUBLISH orders.created hello-world")
	if got := pub.untilClosed(); len(got) != 1 || got[0] != "OK 0" {
		t.Fatalf("M1-1: publisher read %q, want [OK 0] and the server closing", got)
	}

	sub := b.dialText()
	sub.echo("SUBSCRIBE orders.created")
	sub.expect("OK subscribed orders.created")
	if l, _ := sub.line(); l != "MESSAGE orders.created hello-world" {
		t.Fatalf("M1-2: subscriber read %q", l)
	}
	// The subscriber waits; a message published now arrives too.
	if id := b.publish("orders.created", "hello-again"); id != "1" {
		t.Fatalf("second publish id %q", id)
	}
	if l, _ := sub.line(); l != "MESSAGE orders.created hello-again" {
		t.Fatalf("M1-2: subscriber read %q", l)
	}
}

// TestM2_1GroupSharesMessages is seed 002's M2-1: two terminals in group order-processors, ten
// publishes; each message appears in exactly one terminal.
func TestM2_1GroupSharesMessages(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.start()
	terms := make([]*textConn, 2)
	for i := range terms {
		c := b.dialText()
		c.echo(fmt.Sprintf("JOIN_GROUP order-processors consumer-%d\nSUBSCRIBE orders.created", i+1))
		c.expect("OK group order-processors")
		c.expect("OK subscribed orders.created")
		terms[i] = c
	}
	for i := 1; i <= 10; i++ {
		b.publish("orders.created", fmt.Sprintf("message-%d", i))
	}
	got := collect(t, terms, 10)
	checkExactlyOnce(t, got, 10)
}

// collect reads MESSAGE lines from the terminals until n arrived, by terminal.
func collect(t *testing.T, terms []*textConn, n int) [][]string {
	t.Helper()
	type line struct {
		term int
		text string
	}
	lines := make(chan line, n+16)
	for i, c := range terms {
		go func() {
			for {
				_ = c.nc.SetReadDeadline(time.Now().Add(waitTimeout))
				l, err := c.br.ReadString('\n')
				if err != nil {
					return
				}
				lines <- line{i, strings.TrimSuffix(l, "\n")}
			}
		}()
	}
	out := make([][]string, len(terms))
	for total := 0; total < n; {
		select {
		case l := <-lines:
			if strings.HasPrefix(l.text, "MESSAGE ") {
				out[l.term] = append(out[l.term], l.text)
				total++
			}
		case <-time.After(waitTimeout):
			t.Fatalf("got %v, want %d messages", out, n)
		}
	}
	for _, c := range terms {
		c.nc.Close() // ends the reading goroutines
	}
	return out
}

// checkExactlyOnce checks that message-1 .. message-n each appear in exactly one terminal, and
// that every terminal got some (the broker hands new messages to the members in turn).
func checkExactlyOnce(t *testing.T, got [][]string, n int) {
	t.Helper()
	seen := map[string]int{}
	for i, term := range got {
		if len(term) == 0 {
			t.Errorf("terminal %d got nothing: %v", i+1, got)
		}
		for _, l := range term {
			seen[l]++
		}
	}
	for i := 1; i <= n; i++ {
		if k := seen[fmt.Sprintf("MESSAGE orders.created message-%d", i)]; k != 1 {
			t.Errorf("message-%d appeared %d times: %v", i, k, got)
		}
	}
	if len(seen) != n {
		t.Errorf("unexpected lines: %v", got)
	}
	t.Logf("split: %d / %d", len(got[0]), len(got[1]))
}

// TestM3_1RedeliveredAfterKill is seed 002's M3-1: a published, unacknowledged message is
// delivered again after the broker is killed (SIGKILL) and restarted, both one that a subscriber
// received without ACK and one nobody received yet.
func TestM3_1RedeliveredAfterKill(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.start()
	if id := b.publish("orders.created", "test-persistence"); id != "0" {
		t.Fatalf("publish id %q", id)
	}
	sub := b.dialText()
	sub.echo("SUBSCRIBE orders.created")
	sub.expect("OK subscribed")
	sub.expect("MESSAGE orders.created test-persistence")
	if id := b.publish("other.topic", "never-received"); id != "0" {
		t.Fatalf("publish id %q", id)
	}

	b.kill()
	sub.untilClosed()
	b.start() // same data directory and ports

	again := b.dialText()
	again.echo("VERBOSE ON\nSUBSCRIBE orders.created\nSUBSCRIBE other.topic")
	again.expect("OK verbose on")
	again.expect("OK subscribed orders.created")
	seen := map[string]bool{}
	re := regexp.MustCompile(`^DELIVERY \d+ 0 \d+ (orders\.created test-persistence|other\.topic never-received)$`)
	for len(seen) < 2 {
		l, ok := again.line()
		if !ok {
			t.Fatal("connection closed")
		}
		if strings.HasPrefix(l, "OK subscribed") {
			continue
		}
		m := re.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("after restart read %q", l)
		}
		seen[m[1]] = true
	}
	// Now consume for real: after another restart nothing is pending.
	again.echo("ACK 1 2")
	again.expect("OK 2 acked")
	b.stop()
	b.start()
	for _, topic := range []string{"orders.created", "other.topic"} {
		code, body := b.get("/api/v1/topics/" + topic + "/groups/%24queue")
		if code != 200 || !strings.Contains(body, `"pending":0`) {
			t.Fatalf("group of %s after the acks and a restart: %d %s", topic, code, body)
		}
	}
}

// TestGracefulShutdown: SIGTERM tells text sessions ERR CLOSED and binary sessions Goodbye, lets
// the binary client ack during the grace period, and exits 0; what was not acked is delivered
// again after the restart.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.start()
	b.publish("jobs", "acked-in-grace")
	b.publish("jobs", "never-acked")

	nc, err := net.DialTimeout("tcp", b.tcp, waitTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	r, w := protocol.NewReader(nc, 0), protocol.NewWriter(nc, 0)
	_ = nc.SetDeadline(time.Now().Add(waitTimeout))
	if _, err := protocol.ClientHandshake(r, w, &protocol.Hello{ClientName: "e2e"}); err != nil {
		t.Fatal(err)
	}
	send := func(corr uint32, m protocol.Message) {
		t.Helper()
		if err := w.WriteMessage(corr, m); err != nil {
			t.Fatal(err)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	send(2, &protocol.Subscribe{Topic: "jobs", MaxInFlight: 1})
	var first protocol.Delivery
	for first.Offset == 0 && len(first.Payload) == 0 {
		_, m, err := r.ReadServerMessage()
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := m.(*protocol.Deliver); ok {
			first = d.Deliveries[0]
		}
	}
	if string(first.Payload) != "acked-in-grace" {
		t.Fatalf("first delivery %q", first.Payload)
	}
	text := b.dialText()
	text.echo("SUBSCRIBE idle.topic")
	text.expect("OK subscribed")

	if err := b.cmd.Process.Signal(os.Interrupt); err != nil { // Ctrl+C, like SIGTERM
		t.Fatal(err)
	}
	if got := text.untilClosed(); len(got) != 1 || !strings.HasPrefix(got[0], "ERR CLOSED") {
		t.Fatalf("text session read %q at shutdown", got)
	}
	var bye uint32
	for bye == 0 {
		corr, m, err := r.ReadServerMessage()
		if err != nil {
			t.Fatal(err)
		}
		if g, ok := m.(*protocol.Goodbye); ok && g.Code == protocol.CodeClosed {
			bye = corr
		}
	}
	send(3, &protocol.Ack{Refs: []protocol.Ref{first.Ref()}})
	for {
		corr, m, err := r.ReadServerMessage()
		if err != nil {
			t.Fatal(err)
		}
		if corr == 3 {
			if ack, ok := m.(*protocol.AckOK); !ok || ack.Acked != 1 {
				t.Fatalf("ack during the grace period: %v", m)
			}
			break
		}
	}
	send(bye, &protocol.GoodbyeOK{})
	select {
	case <-b.exited:
	case <-time.After(waitTimeout):
		t.Fatal("spool did not exit after SIGINT")
	}
	if b.waitErr != nil {
		t.Fatalf("exit: %v\n%s", b.waitErr, b.logs.String())
	}
	for _, want := range []string{`"msg":"shutting down"`, `"msg":"tcp server stopped"`, `"msg":"broker stopped"`} {
		if !strings.Contains(b.logs.String(), want) {
			t.Fatalf("logs lack %s:\n%s", want, b.logs.String())
		}
	}

	b.start()
	sub := b.dialText()
	sub.echo("SUBSCRIBE jobs")
	sub.expect("OK subscribed")
	sub.expect("MESSAGE jobs never-acked")
}

// TestSeedCommandsWithRealNc runs the seed's shell commands verbatim with the real nc (Debian's
// OpenBSD nc, which does not half-close): M1-1, M1-2 and M2-1.
func TestSeedCommandsWithRealNc(t *testing.T) {
	t.Parallel()
	ncPath(t)
	b := newBroker(t)
	b.start()
	_, port, _ := net.SplitHostPort(b.tcp)

	// M1-2's subscriber waits first; then M1-1 publishes.
	sub := startShell(t, fmt.Sprintf(`echo "SUBSCRIBE orders.created" | nc localhost %s`, port))
	eventually(t, "subscriber connected", func() error {
		if !strings.Contains(sub.out.String(), "OK subscribed orders.created") {
			return fmt.Errorf("subscriber printed %q", sub.out.String())
		}
		return nil
	})
	out := startShell(t, fmt.Sprintf(`echo "PUBLISH orders.created hello-world" | nc localhost %s`, port)).wait(t)
	if out != "OK 0\n" {
		t.Fatalf("M1-1 printed %q", out)
	}
	eventually(t, "M1-2", func() error {
		if !strings.Contains(sub.out.String(), "MESSAGE orders.created hello-world\n") {
			return fmt.Errorf("subscriber printed %q", sub.out.String())
		}
		return nil
	})
	sub.kill() // Ctrl+C: its lease (session-long) is released at once

	// M2-1.
	var terms []*shell
	for i := 1; i <= 2; i++ {
		terms = append(terms, startShell(t, fmt.Sprintf(`echo -e "JOIN_GROUP order-processors consumer-%d\nSUBSCRIBE orders.created" | nc localhost %s`, i, port)))
	}
	for _, term := range terms {
		eventually(t, "consumer subscribed", func() error {
			if !strings.Contains(term.out.String(), "OK subscribed") {
				return fmt.Errorf("printed %q", term.out.String())
			}
			return nil
		})
	}
	out = startShell(t, fmt.Sprintf(`for i in {1..10}; do echo "PUBLISH orders.created message-$i" | nc localhost %s; done`, port)).wait(t)
	if strings.Count(out, "OK ") != 10 {
		t.Fatalf("publisher loop printed %q", out)
	}
	var got [][]string
	eventually(t, "ten messages in the terminals", func() error {
		got = [][]string{nil, nil}
		total := 0
		for i, term := range terms {
			for _, l := range strings.Split(term.out.String(), "\n") {
				if strings.HasPrefix(l, "MESSAGE orders.created message-") {
					got[i] = append(got[i], l)
					total++
				}
			}
		}
		if total < 10 {
			return fmt.Errorf("%d messages: %v", total, got)
		}
		return nil
	})
	for _, term := range terms {
		term.kill()
	}
	checkExactlyOnce(t, got, 10)
}

// TestBinaryProtocolAndHTTP: the binary protocol through the real binary (M1-3), and the HTTP
// listener's health, readiness and metrics (M4-1).
func TestBinaryProtocolAndHTTP(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.start()
	nc, err := net.DialTimeout("tcp", b.tcp, waitTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(waitTimeout))
	r, w := protocol.NewReader(nc, 0), protocol.NewWriter(nc, 0)
	hello, err := protocol.ClientHandshake(r, w, &protocol.Hello{ClientName: "e2e"})
	if err != nil {
		t.Fatal(err)
	}
	if hello.HeartbeatInterval != 10*time.Second || hello.SessionTimeout != 30*time.Second || hello.Properties["server.version"] == "" {
		t.Fatalf("HelloOK %+v", hello)
	}
	_ = w.WriteMessage(2, &protocol.Publish{Topic: "bin.topic", Messages: []protocol.PublishMessage{{Partition: -1, Payload: []byte("x")}}})
	_ = w.WriteMessage(3, &protocol.Subscribe{Topic: "bin.topic"})
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	var delivered *protocol.Delivery
	for delivered == nil {
		corr, m, err := r.ReadServerMessage()
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *protocol.Error:
			t.Fatalf("corr %d: %v", corr, m)
		case *protocol.Deliver:
			delivered = &m.Deliveries[0]
		}
	}
	_ = w.WriteMessage(4, &protocol.Ack{Refs: []protocol.Ref{delivered.Ref()}})
	_ = w.Flush()
	if corr, m, err := r.ReadServerMessage(); err != nil || corr != 4 || m.(*protocol.AckOK).Acked != 1 {
		t.Fatalf("ack: %d %v %v", corr, m, err)
	}

	if code, _ := b.get("/healthz"); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	// The binary serves the dashboard (internal/admin/ui) at the root of its HTTP port.
	if code, body := b.get("/"); code != 200 || !strings.Contains(body, `src="/ui/app.js"`) {
		t.Fatalf("GET / (dashboard): %d %.200s", code, body)
	}
	eventually(t, "metrics", func() error {
		code, body := b.get("/metrics")
		for _, want := range []string{"queue_depth{", "consumer_lag{", "message_throughput{",
			// Hook metrics of the TCP server and the engine.
			`spool_connections{protocol="binary"} 1`, `spool_messages_published_total{topic="bin.topic"} 1`,
			`spool_messages_delivered_total{group="$queue",topic="bin.topic"} 1`, `spool_messages_acked_total{group="$queue",topic="bin.topic"} 1`,
			"spool_wal_fsync_duration_seconds_count", "spool_wal_open_files ", "spool_wal_max_open_files "} {
			if code != 200 || !strings.Contains(body, want) {
				return fmt.Errorf("/metrics %d lacks %s", code, want)
			}
		}
		return nil
	})
}

// TestConfigAndStoreFlag: a YAML file configures the listeners; a postgres:// store is refused
// with a clear error until the PostgreSQL engine exists.
func TestConfigAndStoreFlag(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	file := filepath.Join(t.TempDir(), "spool.yaml")
	yaml := fmt.Sprintf("listen: %q\nhttp: %q\ndata_dir: %q\nserver:\n  text_publisher_idle: 50ms\n", b.tcp, b.http, b.dataDir)
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(spoolBin, "serve", "--config", file)
	cmd.Env = childEnv()
	b.cmd = cmd
	// start() adds the listen flags; here the file alone must be enough.
	b.logs = &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = b.logs, b.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	b.exited = make(chan struct{})
	go func() { b.waitErr = cmd.Wait(); close(b.exited) }()
	t.Cleanup(b.kill)
	eventually(t, "ready", func() error {
		if code, body := b.get("/readyz"); code != 200 {
			return fmt.Errorf("/readyz %d %s", code, body)
		}
		return nil
	})
	c := b.dialText()
	c.echo("PUBLISH cfg.topic x")
	if got := c.untilClosed(); len(got) != 1 || got[0] != "OK 0" {
		t.Fatalf("got %q", got)
	}
	b.stop()

	// A database that does not answer: a clear error naming the store, without its password.
	pgServe := exec.Command(spoolBin, "serve", "--store", "postgres://spool:secret@127.0.0.1:1/spool", "--data-dir", t.TempDir())
	pgServe.Env = childEnv()
	out, err := pgServe.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "open PostgreSQL engine postgres://spool:***@127.0.0.1:1/spool") || strings.Contains(string(out), "secret") {
		t.Fatalf("--store postgres://: %v\n%s", err, out)
	}
	emptyListen := exec.Command(spoolBin, "serve", "--listen", "")
	emptyListen.Env = childEnv()
	out, err = emptyListen.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "listen: must not be empty") {
		t.Fatalf("--listen '': %v\n%s", err, out)
	}
}

// curlPath returns the path of curl, or skips the test. The test script installs curl and sets
// SPOOL_TEST_REQUIRE_CURL, so the curl checks never skip there.
func curlPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("curl")
	if err != nil {
		if os.Getenv("SPOOL_TEST_REQUIRE_CURL") != "" {
			t.Fatal("curl not found and SPOOL_TEST_REQUIRE_CURL is set")
		}
		t.Skip("curl not installed")
	}
	return p
}

// seedCurl runs one of seed 002's curl commands verbatim through bash (localhost:8080 is the
// broker's HTTP address) and decodes the JSON it prints into v.
func seedCurl(t *testing.T, b *broker, command string, v any) {
	t.Helper()
	curlPath(t)
	cmd := exec.Command("bash", "-c", strings.ReplaceAll(command, "localhost:8080", b.http))
	cmd.Env = childEnv()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", command, err, out)
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("%s printed %q: %v", command, out, err)
	}
}

// TestSeedHTTPPaths runs seed 002's HTTP checks verbatim with curl: M1-18 (POST /publish, the
// message survives a restart), M4-9 (GET /api/v1/metrics/topics), M4-10 (GET
// /api/v1/health/consumers: the group is unhealthy once its consumer is gone, its message
// released), and the operator views GET /admin/pending and GET /admin/connections.
func TestSeedHTTPPaths(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.start()
	var pub struct {
		Messages []struct {
			ID string `json:"id"`
		} `json:"messages"`
	}
	seedCurl(t, b, `curl -X POST localhost:8080/publish -d '{"topic":"test","message":"hello"}'`, &pub)
	if len(pub.Messages) != 1 || pub.Messages[0].ID != "0" {
		t.Fatalf("POST /publish answered %+v", pub)
	}
	b.stop()
	b.start()
	var read struct {
		Messages []struct {
			Payload string `json:"payload"`
		} `json:"messages"`
	}
	seedCurl(t, b, `curl -s localhost:8080/api/v1/topics/test/messages`, &read)
	if len(read.Messages) != 1 || read.Messages[0].Payload != "hello" {
		t.Fatalf("after a restart, test holds %+v", read)
	}
	var metrics struct {
		Topics []struct {
			Topic          string `json:"topic"`
			Messages       int64  `json:"messages"`
			PublishedTotal int64  `json:"published_total"`
		} `json:"topics"`
	}
	seedCurl(t, b, `curl http://localhost:8080/api/v1/metrics/topics | jq '.'`, &metrics)
	if len(metrics.Topics) != 1 || metrics.Topics[0].Topic != "test" || metrics.Topics[0].Messages != 1 || metrics.Topics[0].PublishedTotal != 1 {
		t.Fatalf("metrics/topics: %+v", metrics)
	}

	// A consumer of group g holds a message (text deliveries wait for ACK).
	var created struct {
		Name string `json:"name"`
	}
	seedCurl(t, b, `curl -s -X POST localhost:8080/api/v1/topics -H "Content-Type: application/json" -d '{"name":"orders.created","semantics":"PUB_SUB"}'`, &created)
	c := b.dialText()
	c.echo("JOIN_GROUP g consumer-1\nSUBSCRIBE orders.created")
	c.expect("OK group g")
	c.expect("OK subscribed orders.created")
	b.publish("orders.created", "work")
	c.expect("MESSAGE orders.created work")
	var pending struct {
		Pending []struct {
			MessageID string    `json:"message_id"`
			Topic     string    `json:"topic"`
			Group     string    `json:"group"`
			Consumer  string    `json:"consumer"`
			Deadline  time.Time `json:"deadline"`
		} `json:"pending"`
		Total int `json:"total"`
	}
	seedCurl(t, b, `curl -s localhost:8080/admin/pending`, &pending)
	if pending.Total != 1 || pending.Pending[0].Topic != "orders.created" || pending.Pending[0].Group != "g" ||
		pending.Pending[0].MessageID != "0" || pending.Pending[0].Consumer == "" || pending.Pending[0].Deadline.IsZero() {
		t.Fatalf("admin/pending: %+v", pending)
	}
	var conns struct {
		Connections []struct {
			Mode    string   `json:"mode"`
			Remote  string   `json:"remote"`
			Members []string `json:"members"`
		} `json:"connections"`
	}
	seedCurl(t, b, `curl -s localhost:8080/admin/connections`, &conns)
	if len(conns.Connections) != 1 || conns.Connections[0].Mode != "text" || conns.Connections[0].Remote != c.nc.LocalAddr().String() ||
		len(conns.Connections[0].Members) != 1 || conns.Connections[0].Members[0] != pending.Pending[0].Consumer {
		t.Fatalf("admin/connections: %+v (consumer %s at %s)", conns, pending.Pending[0].Consumer, c.nc.LocalAddr())
	}
	type health struct {
		Groups []struct {
			Group   string `json:"group"`
			Healthy bool   `json:"healthy"`
			Status  string `json:"status"`
		} `json:"groups"`
	}
	var h health
	seedCurl(t, b, `curl http://localhost:8080/api/v1/health/consumers?group_name=g | jq '.'`, &h)
	if len(h.Groups) != 1 || !h.Groups[0].Healthy || h.Groups[0].Status != "healthy" {
		t.Fatalf("health/consumers with a consumer: %+v", h)
	}
	// The consumer dies: the group is unhealthy and its message is no longer held.
	c.nc.Close()
	eventually(t, "the group is unhealthy without its consumer", func() error {
		var h health
		seedCurl(t, b, `curl http://localhost:8080/api/v1/health/consumers | jq '.'`, &h)
		var p struct {
			Total int `json:"total"`
		}
		seedCurl(t, b, `curl -s localhost:8080/admin/pending`, &p)
		if len(h.Groups) != 2 || p.Total != 0 { // g and the queue subscription of test
			return fmt.Errorf("health %+v, %d pending", h, p.Total)
		}
		for _, g := range h.Groups {
			if g.Group == "g" && (g.Healthy || g.Status != "no_consumers") {
				return fmt.Errorf("group g: %+v", g)
			}
		}
		return nil
	})
}
