package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/testutil"
)

// waitTimeout bounds every wait: nothing here is timed, a test fails only when an expected event
// never happens.
const waitTimeout = 30 * time.Second

// spoolBin is the binary under test, built once by TestMain.
var spoolBin string

// e2eVersion is the version stamped into spoolBin.
const e2eVersion = "v0.0.0-e2e"

// TestMain builds the real binary once (with the race detector when the tests run with it), runs
// the tests, and removes it.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "spool-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	spoolBin = filepath.Join(dir, "spool")
	// The version is stamped as a release build stamps it (TestVersionAndCompletion).
	args := []string{"build", "-o", spoolBin, "-ldflags", "-X main.version=" + e2eVersion}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "./cmd/spool")
	build := exec.Command("go", args...)
	build.Dir = moduleRoot()
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building spool:", err)
		os.RemoveAll(dir)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// moduleRoot returns the repository root (this package is tests/e2e).
func moduleRoot() string {
	wd, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	return filepath.Join(wd, "..", "..")
}

// freeAddr returns a 127.0.0.1 address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// broker is one spool serve process.
type broker struct {
	t       *testing.T
	dataDir string
	tcp     string
	http    string
	extra   []string
	env     []string
	cmd     *exec.Cmd
	logs    *testutil.SyncBuffer
	exited  chan struct{}
	waitErr error
}

// newBroker prepares a broker on free ports with a temporary data directory; start runs it.
func newBroker(t *testing.T, extra ...string) *broker {
	t.Helper()
	return &broker{
		t: t, dataDir: filepath.Join(t.TempDir(), "data"), tcp: freeAddr(t), http: freeAddr(t), extra: extra,
		// Small segments keep the preallocated files of these tests light (and check that SPOOL_*
		// variables reach the engine).
		env: []string{"SPOOL_WAL_SEGMENT_BYTES=4194304"},
	}
}

// start runs spool serve and waits until /readyz answers 200.
func (b *broker) start() {
	b.t.Helper()
	args := append([]string{"serve", "--listen", b.tcp, "--http", b.http, "--data-dir", b.dataDir}, b.extra...)
	b.cmd = exec.Command(spoolBin, args...)
	b.cmd.Env = childEnv(b.env...)
	b.logs = &testutil.SyncBuffer{}
	b.cmd.Stdout, b.cmd.Stderr = b.logs, b.logs
	if err := b.cmd.Start(); err != nil {
		b.t.Fatalf("start spool: %v", err)
	}
	b.exited = make(chan struct{})
	go func() {
		b.waitErr = b.cmd.Wait()
		close(b.exited)
	}()
	b.t.Cleanup(func() {
		b.kill()
		if b.t.Failed() {
			b.t.Logf("spool logs:\n%s", b.logs.String())
		}
	})
	eventually(b.t, "spool ready", func() error {
		select {
		case <-b.exited:
			b.t.Fatalf("spool exited during start-up: %v\n%s", b.waitErr, b.logs.String())
		default:
		}
		if code, body := b.get("/readyz"); code != http.StatusOK {
			return fmt.Errorf("/readyz: %d %s", code, body) // the cleanup prints the logs
		}
		return nil
	})
}

// get fetches an HTTP path; code 0 means the request failed.
func (b *broker) get(path string) (int, string) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + b.http + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// kill sends SIGKILL (no graceful shutdown) and waits for the process to end.
func (b *broker) kill() {
	if b.cmd == nil || b.cmd.Process == nil {
		return
	}
	select {
	case <-b.exited:
		return
	default:
	}
	_ = b.cmd.Process.Signal(syscall.SIGKILL)
	<-b.exited
}

// stop sends SIGTERM and waits for a clean exit.
func (b *broker) stop() {
	b.t.Helper()
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		b.t.Fatal(err)
	}
	select {
	case <-b.exited:
	case <-time.After(waitTimeout):
		b.t.Fatalf("spool did not exit within %s after SIGTERM\n%s", waitTimeout, b.logs.String())
	}
	if b.waitErr != nil {
		b.t.Fatalf("spool exited with %v after SIGTERM\n%s", b.waitErr, b.logs.String())
	}
}

// textConn drives the text mode exactly as Debian's nc does: it writes the lines it is given and
// does not half-close when its input ends; it prints what the server sends.
type textConn struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

func (b *broker) dialText() *textConn {
	b.t.Helper()
	nc, err := net.DialTimeout("tcp", b.tcp, waitTimeout)
	if err != nil {
		b.t.Fatalf("dial %s: %v", b.tcp, err)
	}
	b.t.Cleanup(func() { nc.Close() })
	return &textConn{t: b.t, nc: nc, br: bufio.NewReader(nc)}
}

// echo writes s like `echo -e s` does (with its trailing newline).
func (c *textConn) echo(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.nc, s+"\n"); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// line reads one line; ok is false when the server closed the connection.
func (c *textConn) line() (string, bool) {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(waitTimeout))
	l, err := c.br.ReadString('\n')
	if err != nil {
		if errors.Is(err, io.EOF) || strings.Contains(err.Error(), "connection reset") {
			return "", false
		}
		c.t.Fatalf("read: %v (after %q)", err, l)
	}
	return strings.TrimSuffix(l, "\n"), true
}

// expect reads the next line and checks its prefix.
func (c *textConn) expect(prefix string) string {
	c.t.Helper()
	l, ok := c.line()
	if !ok || !strings.HasPrefix(l, prefix) {
		c.t.Fatalf("got %q (open %v), want a line starting with %q", l, ok, prefix)
	}
	return l
}

// untilClosed reads lines until the server closes the connection.
func (c *textConn) untilClosed() []string {
	c.t.Helper()
	var out []string
	for {
		l, ok := c.line()
		if !ok {
			return out
		}
		out = append(out, l)
	}
}

// publish is `echo "PUBLISH topic payload" | nc -N host port`: it reads the OK and closes.
func (b *broker) publish(topic, payload string) string {
	b.t.Helper()
	c := b.dialText()
	c.echo("PUBLISH " + topic + " " + payload)
	l := c.expect("OK ")
	c.nc.Close()
	return strings.TrimPrefix(l, "OK ")
}

// ncPath returns the path of nc, or skips the test. The test script installs nc and sets
// SPOOL_TEST_REQUIRE_NC, so the real-nc checks never skip in CI.
func ncPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("nc")
	if err != nil {
		if os.Getenv("SPOOL_TEST_REQUIRE_NC") != "" {
			t.Fatal("nc is not installed but SPOOL_TEST_REQUIRE_NC is set")
		}
		t.Skip("nc is not installed")
	}
	return p
}

// shell runs a bash command line as a user would type it, with its output captured.
type shell struct {
	cmd    *exec.Cmd
	out    *testutil.SyncBuffer
	exited chan struct{}
}

func startShell(t *testing.T, script string) *shell {
	t.Helper()
	s := &shell{cmd: exec.Command("bash", "-c", script), out: &testutil.SyncBuffer{}, exited: make(chan struct{})}
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	// Its own process group, so that kill ends the pipeline's nc too.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = s.cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(s.kill)
	return s
}

// kill ends the shell (started by this test) and its pipeline: the process group it leads.
func (s *shell) kill() {
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
}

func (s *shell) wait(t *testing.T) string {
	t.Helper()
	select {
	case <-s.exited:
	case <-time.After(waitTimeout):
		t.Fatalf("command did not finish; output so far %q", s.out.String())
	}
	return s.out.String()
}

// eventually polls f until it returns nil or waitTimeout passes.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	testutil.Eventually(t, waitTimeout, what, f)
}

// ctx returns a context bounded by waitTimeout.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return c
}

// childEnv is the environment of a spool process a test starts: the test's own without its SPOOL_*
// variables (a developer's test knobs, such as SPOOL_PG_SCALE, are not settings, and spool serve
// refuses unknown SPOOL_* variables), but SPOOL_TEST_*, plus extra.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "SPOOL_") && !strings.HasPrefix(kv, "SPOOL_TEST_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}
