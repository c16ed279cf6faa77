package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/spoolmq/spool/internal/testutil"
)

// helpExamples returns the example command lines of "spool <words> -h" (its Examples: section;
// a line ending in a backslash continues on the next).
func helpExamples(t *testing.T, words ...string) []string {
	t.Helper()
	out, _ := exec.Command(spoolBin, append(words, "-h")...).CombinedOutput()
	var exs []string
	in, cont := false, false
	for line := range strings.Lines(string(out)) {
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "Examples:":
			in = true
		case in && strings.TrimSpace(line) == "":
			in = false
		case in && cont:
			exs[len(exs)-1] += " " + strings.TrimSpace(strings.TrimSuffix(line, "\\"))
			cont = strings.HasSuffix(line, "\\")
		case in:
			exs = append(exs, strings.TrimSpace(strings.TrimSuffix(line, "\\")))
			cont = strings.HasSuffix(line, "\\")
		}
	}
	return exs
}

// helpSubcommands returns the subcommands listed by "spool <group> -h".
func helpSubcommands(t *testing.T, group string) []string {
	t.Helper()
	out, _ := exec.Command(spoolBin, group, "-h").CombinedOutput()
	var subs []string
	in := false
	for line := range strings.Lines(string(out)) {
		switch {
		case strings.TrimSpace(line) == "Commands:":
			in = true
		case in && strings.TrimSpace(line) == "":
			in = false
		case in:
			subs = append(subs, strings.Fields(line)[0])
		}
	}
	return subs
}

// TestHelpExamples runs every example of every command's -h as printed, through bash, against a
// real broker holding the topics and group the examples name (orders.created with group billing,
// jobs, invoices, reminders, audit.events (refcount); invoice.pdf in the working directory). An example must succeed, or
// fail only with the broker's answer listed below (an id that does not exist, a topic that
// exists); never with a usage error. spool sub without --max runs until SIGINT: it must print a
// delivery first, then end cleanly. The data examples run on an empty directory instead of
// /var/lib/spool. Not run: serve (it would serve) and bench (it would load the machine for
// minutes).
func TestHelpExamples(t *testing.T) {
	b := newBroker(t)
	b.start()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "invoice.pdf"), []byte("%PDF-1.4 test"), 0o644); err != nil {
		t.Fatal(err)
	}
	// HOME is the test's: the completion examples write under ~.
	env := childEnv("SPOOL_ADDR="+b.tcp, "SPOOL_HTTP="+b.http, "PATH="+filepath.Dir(spoolBin)+":"+os.Getenv("PATH"), "HOME="+dir)
	must := func(args ...string) {
		t.Helper()
		if out, errOut, code := runSpool(t, b, "", args...); code != 0 {
			t.Fatalf("spool %s: exit %d, %q, %q", strings.Join(args, " "), code, out, errOut)
		}
	}
	must("topic", "create", "orders.created", "--semantics", "PUB_SUB", "--partitions", "2")
	must("topic", "create", "invoices")
	must("topic", "create", "reminders")
	must("pub", "orders.created", "first")
	must("sub", "--group", "billing", "--from", "beginning", "--max", "1", "orders.created")
	must("pub", "--count", "3", "orders.created", "more {{n}}")
	must("topic", "create", "jobs", "--semantics", "QUEUE")
	must("pub", "jobs", "job-1")
	must("topic", "create", "audit.events", "--semantics", "PUB_SUB", "--completion-tracking", "refcount")
	must("pub", "audit.events", "login")

	// What a run of each example answers when it does not succeed, and why that is right.
	expected := map[string]string{
		// jobs exists: the fixture made it (the other create example runs after orders.created
		// was deleted).
		"spool topic create jobs --ack-wait 5m --max-deliveries 3 --message-retention 7d": "TOPIC_EXISTS",
		// No ordered group accounts/ledger here: the broker's answer shows the command reached it.
		"spool group rebalance accounts ledger":                                                    "SUBSCRIPTION_NOT_FOUND",
		"spool group rebalance --strategy sticky accounts ledger":                                  "SUBSCRIPTION_NOT_FOUND",
		"spool group rebalance --drop-foreign accounts ledger   # after a broker instance crashed": "SUBSCRIPTION_NOT_FOUND",
		// No DLQ entries here (none was dead-lettered).
		"spool dlq inspect orders.created billing 12": "NOT_FOUND",
		"spool dlq inspect jobs '$queue' 7 --json":    "NOT_FOUND",
		// billing is ACTIVE: only a DEAD group can be resurrected (DEAD takes its heartbeat
		// timeout, 5 minutes by default, without a consumer).
		"spool group resurrect --backfill orders.created billing": "INVALID_TRANSITION",
		// billing's backfill (the one message before it subscribed) is COMPLETED: only an
		// IN_PROGRESS one is cancelled, only a CANCELLED or FAILED one resumed.
		"spool group backfill cancel orders.created billing": "INVALID_TRANSITION",
		"spool group backfill resume orders.created billing": "INVALID_TRANSITION",
	}
	// What must hold before an example: --force is for a topic with a live group.
	before := map[string][][]string{
		// The group examples made shipping, audit and ledger on orders.created; a plain delete
		// needs no live group.
		"spool topic delete orders.created": {
			{"group", "cancel", "orders.created", "shipping"}, {"group", "cancel", "orders.created", "audit"},
			{"group", "cancel", "orders.created", "ledger"},
		},
		"spool topic delete --force orders.created": {
			{"topic", "create", "orders.created", "--semantics", "PUB_SUB"}, {"pub", "orders.created", "x"},
			{"sub", "--group", "billing", "--from", "beginning", "--max", "1", "orders.created"},
		},
	}
	// The broker's answer code of an error line ("spool: CODE: message").
	codeRe := regexp.MustCompile(`^spool: ([A-Z_]+): `)

	type example struct{ words, line string }
	var all []example
	for _, words := range [][]string{{"pub"}, {"sub"}, {"token"}, {"migrate"}, {"completion"}} {
		for _, ex := range helpExamples(t, words...) {
			all = append(all, example{strings.Join(words, " "), ex})
		}
	}
	for _, group := range []string{"topic", "group", "dlq", "data"} {
		subs := helpSubcommands(t, group)
		if len(subs) == 0 {
			t.Fatalf("spool %s -h lists no subcommands", group)
		}
		for _, sub := range subs {
			exs := helpExamples(t, group, sub)
			if len(exs) == 0 {
				t.Errorf("spool %s %s -h has no example", group, sub)
			}
			for _, ex := range exs {
				all = append(all, example{group + " " + sub, ex})
			}
		}
	}
	for _, words := range []string{"serve", "bench"} {
		if len(helpExamples(t, words)) == 0 {
			t.Errorf("spool %s -h has no example", words)
		}
	}
	// Reading and publishing first, then what changes groups, then what ends them, then changing
	// a QUEUE topic to PUB_SUB, then deleting and creating topics.
	phase := func(ex example) int {
		switch {
		case strings.Contains(ex.line, "--queue-to-group"):
			return 3
		case strings.Contains(ex.line, "--force"):
			return 5
		}
		return map[string]int{"topic update": 1, "group pause": 1, "group resume": 1, "dlq replay": 1, "dlq purge": 1,
			"group cancel": 2, "topic delete": 4, "topic create": 6}[ex.words]
	}
	slices.SortStableFunc(all, func(a, b example) int { return phase(a) - phase(b) })

	seen := map[string]bool{}
	for _, ex := range all {
		seen[ex.line] = true
		for _, args := range before[ex.line] {
			must(args...)
		}
		line := ex.line
		// The data examples name the service's data directory: never touch a real one.
		line = strings.ReplaceAll(line, "/var/lib/spool", filepath.Join(dir, "no-such-data-dir"))
		if strings.Contains(line, "completion zsh") || strings.Contains(line, "completion fish") {
			// For another shell than bash: that it prints its script is what bash can check.
			line = "spool completion " + map[bool]string{true: "zsh", false: "fish"}[strings.Contains(line, "zsh")] + " | grep -q spool"
		}
		if strings.HasPrefix(ex.line, "spool sub") && !strings.Contains(ex.line, "--max") {
			runBlockingExample(t, b, dir, env, ex.line)
			continue
		}
		cmd := exec.Command("bash", "-c", "set -o pipefail; "+line)
		cmd.Dir, cmd.Env = dir, env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		stderr := errb.String()
		m := codeRe.FindStringSubmatch(stderr)
		want, listed := expected[ex.line]
		switch {
		case code == 0 && !listed:
		case ex.words == "data verify" || ex.words == "data truncate" || ex.words == "migrate":
			// No data directory or database here: any failure but a usage error will do.
			if code == 2 || strings.Contains(stderr, "Usage:") || strings.Contains(stderr, "flag provided but not defined") {
				t.Errorf("%s: a usage error: exit %d\n%s", ex.line, code, stderr)
			}
		case listed && code == 1 && m != nil && m[1] == want:
		default:
			t.Errorf("%s: exit %d (want 0%s)\nstdout: %s\nstderr: %s", ex.line, code,
				map[bool]string{true: " or " + want}[listed], out.String(), stderr)
		}
	}
	for line := range expected {
		if !seen[line] {
			t.Errorf("expected failure of %q, which no help text shows any more", line)
		}
	}
}

// runBlockingExample runs a spool sub example that runs until SIGINT: it must print something
// (messages are published to orders.created until it does), then end with SIGINT.
func runBlockingExample(t *testing.T, b *broker, dir string, env []string, line string) {
	t.Helper()
	out := &testutil.SyncBuffer{}
	cmd := exec.Command("bash", "-c", line)
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	n := 0
	eventually(t, line+" prints a delivery", func() error {
		if strings.TrimSpace(out.String()) != "" {
			return nil
		}
		n++
		if _, errOut, code := runSpool(t, b, "", "pub", "orders.created", fmt.Sprintf(`{"n":%d}`, n)); code != 0 {
			return fmt.Errorf("pub: %s", errOut)
		}
		return fmt.Errorf("nothing printed yet")
	})
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	err := <-exited
	var ee *exec.ExitError
	// SIGINT ends spool sub with status 0; in a pipeline (| jq) the last command's status is
	// the pipeline's, and jq gets the SIGINT too (130).
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 130 && strings.Contains(line, "|")) {
		t.Errorf("%s after SIGINT: %v\n%s", line, err, out.String())
	}
	if strings.Contains(out.String(), "Usage:") {
		t.Errorf("%s: a usage error:\n%s", line, out.String())
	}
}
