package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// runSpool runs the spool binary with the client environment of b (SPOOL_ADDR and SPOOL_HTTP in
// the host:port form spool serve takes) and returns its output and exit status.
func runSpool(t *testing.T, b *broker, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(spoolBin, args...)
	cmd.Env = append(os.Environ(), "SPOOL_ADDR="+b.tcp, "SPOOL_HTTP="+b.http)
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
	sub := exec.Command(spoolBin, "sub", "--group", "g", "--from", "beginning", "e2e.cli")
	sub.Env = append(os.Environ(), "SPOOL_ADDR="+b.tcp)
	subOut, subErr := &syncBuffer{}, &syncBuffer{}
	sub.Stdout, sub.Stderr = subOut, subErr
	if err := sub.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = sub.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = sub.Process.Kill() // the process this test started
			<-exited
		}
	})
	eventually(t, "sub prints both messages", func() error {
		if n := strings.Count(subOut.String(), "\n"); n != 2 {
			return fmt.Errorf("%d lines: %q (stderr %q)", n, subOut.String(), subErr.String())
		}
		return nil
	})
	if s := subOut.String(); !strings.Contains(s, " attempt=1 key=k first\n") || !strings.Contains(s, " attempt=1 key=k second\n") {
		t.Fatalf("sub printed %q", s)
	}
	if err := sub.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("sub after SIGINT: %v; stderr %q", waitErr, subErr.String())
		}
	case <-time.After(waitTimeout):
		t.Fatal("sub did not exit after SIGINT")
	}

	// Both deliveries were acked before the SIGINT; the member left.
	out, errOut, code = runSpool(t, b, "", "group", "list", "e2e.cli")
	if code != 0 || !regexp.MustCompile(`(?m)^e2e\.cli +g +ACTIVE +0 +0 +0 +0 +0 +0$`).MatchString(out) {
		t.Fatalf("group list: exit %d, %q, %q", code, out, errOut)
	}
}
