package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/testutil"
)

// runSpool runs the spool binary with the client environment of b (SPOOL_ADDR and SPOOL_HTTP in
// the host:port form spool serve takes) and returns its output and exit status.
func runSpool(t *testing.T, b *broker, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(spoolBin, args...)
	cmd.Env = childEnv("SPOOL_ADDR="+b.tcp, "SPOOL_HTTP="+b.http)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(waitTimeout):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("spool %s did not finish; stderr %q", strings.Join(args, " "), errb.String())
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// TestCLIBinary checks what only the real binary shows: exit statuses through main, the
// environment variables, stdin, and SIGINT ending spool sub cleanly.
func TestCLIBinary(t *testing.T) {
	b := newBroker(t)
	b.start()

	out, errOut, code := runSpool(t, b, "", "topic", "create", "e2e.cli", "--semantics", "PUB_SUB", "--partitions", "2")
	if code != 0 || out != "created topic e2e.cli (PUB_SUB, 2 partitions)\n" {
		t.Fatalf("topic create: exit %d, %q, %q", code, out, errOut)
	}
	if _, errOut, code = runSpool(t, b, "", "topic"); code != 2 || !strings.Contains(errOut, "Usage: spool topic <command>") {
		t.Fatalf("spool topic: exit %d, %q", code, errOut)
	}
	if _, errOut, code = runSpool(t, b, "", "topic", "describe", "nope"); code != 1 || !strings.HasPrefix(errOut, "spool: TOPIC_NOT_FOUND: ") {
		t.Fatalf("topic describe nope: exit %d, %q", code, errOut)
	}
	if _, errOut, code = runSpool(t, b, "", "sub", "-h"); code != 0 || !strings.Contains(errOut, "Examples:") {
		t.Fatalf("sub -h: exit %d, %q", code, errOut)
	}
	out, errOut, code = runSpool(t, b, "first\nsecond\n", "pub", "--key", "k", "e2e.cli")
	if ids := strings.Fields(out); code != 0 || len(ids) != 2 || !strings.Contains(errOut, "published 2 messages") {
		t.Fatalf("pub from stdin: exit %d, %q, %q", code, out, errOut)
	}

	// spool sub until SIGINT.
	sub := startSub(t, b, "--group", "g", "--from", "beginning", "e2e.cli")
	sub.waitLines(t, "sub prints both messages", 2)
	if s := sub.out.String(); !strings.Contains(s, " attempt=1 key=k first\n") || !strings.Contains(s, " attempt=1 key=k second\n") {
		t.Fatalf("sub printed %q", s)
	}
	if err := sub.signal(t, os.Interrupt); err != nil {
		t.Fatalf("sub after SIGINT: %v; stderr %q", err, sub.err.String())
	}

	// Both deliveries were acked before the SIGINT; the member left.
	out, errOut, code = runSpool(t, b, "", "group", "list", "e2e.cli")
	if code != 0 || !regexp.MustCompile(`(?m)^e2e\.cli +g +ACTIVE +WARN +0 +0 +0 +0 +0 +0 +\d+s ago +- +\S+$`).MatchString(out) {
		t.Fatalf("group list: exit %d, %q, %q", code, out, errOut)
	}
}

// subProc is a long-running `spool sub` started by a test, with its output captured.
type subProc struct {
	cmd      *exec.Cmd
	out, err *testutil.SyncBuffer
	exited   chan struct{}
	waitErr  error // cmd.Wait's result, set before exited is closed
}

// startSub starts `spool sub args...` against b. The test's cleanup kills it if it still runs.
func startSub(t *testing.T, b *broker, args ...string) *subProc {
	t.Helper()
	s := &subProc{cmd: exec.Command(spoolBin, append([]string{"sub"}, args...)...), out: &testutil.SyncBuffer{}, err: &testutil.SyncBuffer{}, exited: make(chan struct{})}
	s.cmd.Env = childEnv("SPOOL_ADDR=" + b.tcp)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.err
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		s.waitErr = s.cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-s.exited:
		default:
			_ = s.cmd.Process.Kill() // the process this test started
			<-s.exited
		}
	})
	return s
}

// waitLines polls until the process has printed exactly n lines.
func (s *subProc) waitLines(t *testing.T, what string, n int) {
	t.Helper()
	eventually(t, what, func() error {
		if got := strings.Count(s.out.String(), "\n"); got != n {
			return fmt.Errorf("%d lines: %q (stderr %q)", got, s.out.String(), s.err.String())
		}
		return nil
	})
}

// signal sends sig and waits for the process to exit; it returns cmd.Wait's error.
func (s *subProc) signal(t *testing.T, sig os.Signal) error {
	t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.exited:
		return s.waitErr
	case <-time.After(waitTimeout):
		t.Fatalf("spool sub did not exit after %v", sig)
		return nil
	}
}

// TestBenchFloorBinary runs spool bench floor on the real binary: it starts itself as the server
// child (spool bench floor --serve) and prints the machine's figures, into a file and into
// PostgreSQL (batches, two committers).
func TestBenchFloorBinary(t *testing.T) {
	out, errOut, code := runSpool(t, &broker{}, "", "bench", "floor", "--publishers", "2", "--duration", "300ms",
		"--warmup", "50ms", "--file-size", "16777216", "--dir", t.TempDir())
	if code != 0 || !regexp.MustCompile(`^2 publishers, batches of 1, 1024-byte payloads, gather true, into a file: [1-9]\d* messages in .*msg/s\ncpu per message: server [\d.]+ us`).MatchString(out) {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	url := testutil.DatabaseURL(t)
	out, errOut, code = runSpool(t, &broker{}, "", "bench", "floor", "--publishers", "2", "--duration", "300ms",
		"--warmup", "50ms", "--batch", "3", "--committers", "2", "--store", url, "--schema", testutil.PGSchema(t, url, "floor_"))
	if code != 0 || !regexp.MustCompile(`^2 publishers, batches of 3, 1024-byte payloads, gather true, into PostgreSQL \(2 committers\): [1-9]\d* messages in `).MatchString(out) {
		t.Fatalf("--store: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if _, errOut, code := runSpool(t, &broker{}, "", "bench", "floor", "--size", "8"); code != 1 || !strings.Contains(errOut, "size must be between") {
		t.Fatalf("--size 8: exit %d, stderr %q", code, errOut)
	}
}

// TestBenchScenarioKillBinary runs spool bench scenario kill-resurrect small on the real binary
// against spool serve (lifecycle and retention every second): it starts itself as the consumer
// child (spool bench scenario kill-child), SIGKILLs it, sees the group DEAD, brings a consumer
// back and prints its verdicts.
func TestBenchScenarioKillBinary(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.env = append(b.env, "SPOOL_BROKER_LIFECYCLE_INTERVAL=1s", "SPOOL_BROKER_RETENTION_INTERVAL=1s")
	b.start()
	out, errOut, code := runSpool(t, b, "", "bench", "scenario", "kill-resurrect", "--addr", b.tcp, "--admin", b.http,
		"--rate", "50", "--size", "64", "--heartbeat-timeout", "5s", "--live", "1s", "--dead-for", "1s", "--after", "1s",
		"--message-retention", "1s", "--stall", "1m", "--sample", "100ms", "--drain", "10s")
	if code != 0 {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	for _, re := range []string{`(PASS|FAIL) +inventory DEAD: [\d.]+ s after the kill`, `PASS +inventory resurrected: ACTIVE`,
		`PASS +email never blocked`, `\nscenario kill-resurrect: (PASS|FAIL|INCONCLUSIVE)\n$`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Fatalf("stdout lacks %s:\n%s\nstderr %s", re, out, errOut)
		}
	}
}

// TestVersionAndCompletion: spool --version prints the version stamped with -ldflags, and the
// bash completion script, sourced by a real bash, completes commands, subcommands and flags by
// asking the binary (spool __complete).
func TestVersionAndCompletion(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(spoolBin, "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "spool "+e2eVersion+" (") {
		t.Fatalf("spool --version: %v, %q", err, out)
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	script, err := exec.Command(spoolBin, "completion", "bash").Output()
	if err != nil {
		t.Fatalf("spool completion bash: %v", err)
	}
	for _, c := range []struct{ line, want string }{
		{"spool to", "token topic"},
		{"spool topic de", "delete describe"},
		{"spool topic create orders --part", "--partitions"},
		{"spool pub --producer", "--producer-id"},
		{"spool completion z", "zsh"},
		{"spool --vers", "--version"},
	} {
		words := strings.Fields(c.line)
		cmd := exec.Command(bash, "--norc", "-c", string(script)+`
COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _spool; echo "${COMPREPLY[*]}"`, "bash")
		cmd.Args = append(cmd.Args, words...)
		cmd.Env = append(childEnv(), "PATH="+filepath.Dir(spoolBin)+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != c.want {
			t.Errorf("completing %q: %v, got %q, want %q", c.line, err, out, c.want)
		}
	}
}
