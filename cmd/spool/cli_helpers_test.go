package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/server"
	"github.com/spoolmq/spool/internal/storage/wal"
	"github.com/spoolmq/spool/internal/testutil"
)

// cliWaitTimeout bounds every wait of these tests; nothing is timed, a test fails only when an
// expected event never happens.
const cliWaitTimeout = 20 * time.Second

// cliCommands are the client commands by name, as main dispatches them.
var cliCommands = map[string]cliFunc{"pub": runPub, "sub": runSub, "topic": runTopic, "group": runGroup, "dlq": runDLQ, "doctor": runDoctor}

// cliStack is a real broker in-process: the wal engine in a temporary directory, the broker, the TCP
// server on 127.0.0.1 and the admin API over httptest, as spool serve wires them.
type cliStack struct {
	addr    string // TCP address of the binary protocol
	httpURL string // base URL of the admin API
	broker  *broker.Broker
	engine  *wal.Engine
}

// startCLIStack starts a stack and stops it, in serve's order, at the end of the test; mods may
// change the engine's and the broker's config.
func startCLIStack(t *testing.T, mods ...func(*wal.Config, *broker.Config)) *cliStack {
	t.Helper()
	ctx := context.Background()
	walCfg := wal.Config{SegmentBytes: 1 << 20}
	brCfg := broker.Config{RetentionInterval: -1}
	for _, mod := range mods {
		mod(&walCfg, &brCfg)
	}
	eng, err := wal.Open(t.TempDir(), walCfg)
	if err != nil {
		t.Fatalf("wal.Open: %v", err)
	}
	brCfg.Engine = eng
	br, err := broker.New(brCfg)
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	if err := br.Start(ctx); err != nil {
		t.Fatalf("broker.Start: %v", err)
	}
	srv, err := server.New(server.Config{Name: "cli-test", GoodbyeGrace: time.Second}, br)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx, ln); err != nil {
		t.Fatalf("server.Start: %v", err)
	}
	h, err := admin.New(admin.Config{Broker: br, Sessions: adminSessions(srv)})
	if err != nil {
		t.Fatalf("admin.New: %v", err)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, cliWaitTimeout)
		defer cancel()
		if err := srv.Stop(sctx); err != nil {
			t.Errorf("server.Stop: %v", err)
		}
		if err := h.Close(sctx); err != nil {
			t.Errorf("admin Close: %v", err)
		}
		hs.Close()
		if err := br.Stop(sctx); err != nil {
			t.Errorf("broker.Stop: %v", err)
		}
		if err := eng.Close(); err != nil {
			t.Errorf("engine.Close: %v", err)
		}
	})
	return &cliStack{addr: ln.Addr().String(), httpURL: hs.URL, broker: br, engine: eng}
}

// cliResult is what a command printed and its exit status.
type cliResult struct {
	stdout, stderr string
	code           int
}

func (r cliResult) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// env returns a command environment whose SPOOL_ADDR and SPOOL_HTTP point at the stack.
func (s *cliStack) env(stdin string, stdout, stderr *testutil.SyncBuffer) *cliEnv {
	return &cliEnv{
		stdin: strings.NewReader(stdin), stdout: stdout, stderr: stderr, loc: time.UTC,
		getenv: func(k string) string {
			switch k {
			case envAddr:
				return s.addr
			case envHTTP:
				return s.httpURL
			}
			return ""
		},
	}
}

// run runs "spool <args>" in-process with stdin and returns its output and exit status.
func (s *cliStack) run(t *testing.T, stdin string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cliWaitTimeout)
	defer cancel()
	var out, errb testutil.SyncBuffer
	code := runCLI(ctx, s.env(stdin, &out, &errb), cliCommands[args[0]], args[1:])
	return cliResult{stdout: out.String(), stderr: errb.String(), code: code}
}

// ok runs a command that must succeed.
func (s *cliStack) ok(t *testing.T, stdin string, args ...string) cliResult {
	t.Helper()
	r := s.run(t, stdin, args...)
	if r.code != 0 {
		t.Fatalf("spool %s: %v", strings.Join(args, " "), r)
	}
	return r
}

// fails runs a command that must exit with code and print want on stderr.
func (s *cliStack) fails(t *testing.T, code int, want string, args ...string) cliResult {
	t.Helper()
	r := s.run(t, "", args...)
	if r.code != code || !strings.Contains(r.stderr, want) {
		t.Fatalf("spool %s: want exit %d and %q on stderr, got %v", strings.Join(args, " "), code, want, r)
	}
	return r
}

// cliTableRows parses a table printed by cli.Table (columns separated by two or more spaces) into
// one map per row, keyed by the header's titles.
func cliTableRows(t *testing.T, out string) []map[string]string {
	t.Helper()
	sep := regexp.MustCompile(`\s{2,}`)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) == 0 || lines[0] == "" {
		t.Fatalf("no table in %q", out)
	}
	head := sep.Split(lines[0], -1)
	var rows []map[string]string
	for _, l := range lines[1:] {
		cells := sep.Split(l, -1)
		if len(cells) != len(head) {
			t.Fatalf("row %q has %d cells, header %q has %d", l, len(cells), lines[0], len(head))
		}
		row := map[string]string{}
		for i, h := range head {
			row[h] = cells[i]
		}
		rows = append(rows, row)
	}
	return rows
}

// cliFindRow returns the row whose column has value, or fails.
func cliFindRow(t *testing.T, rows []map[string]string, column, value string) map[string]string {
	t.Helper()
	for _, r := range rows {
		if r[column] == value {
			return r
		}
	}
	t.Fatalf("no row with %s=%s in %v", column, value, rows)
	return nil
}

// cliJSONLines decodes one JSON object per line.
func cliJSONLines[T any](t *testing.T, out string) []T {
	t.Helper()
	var vs []T
	for l := range strings.Lines(out) {
		var v T
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		vs = append(vs, v)
	}
	return vs
}

// cliDecodeJSON decodes a command's JSON output into v.
func cliDecodeJSON(t *testing.T, out string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("output %q: %v", out, err)
	}
}
