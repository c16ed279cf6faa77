package testutil

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
)

// PGCluster is a throwaway PostgreSQL cluster owned by one test, for tests that stop and restart
// the database (the shared test database of TEST_DATABASE_URL must never be restarted: other
// packages use it at the same time).
type PGCluster struct {
	// URL connects to the cluster's "postgres" database as the superuser "spool".
	URL  string
	t    testing.TB
	bin  string
	dir  string
	port int
}

// pgBinDir finds the PostgreSQL server binaries: next to $SPOOL_TEST_PG_CTL (set by
// scripts/test.sh), else /usr/lib/postgresql/*/bin.
func pgBinDir() string {
	if ctl := os.Getenv("SPOOL_TEST_PG_CTL"); ctl != "" {
		return filepath.Dir(ctl)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i]
		}
	}
	return ""
}

// StartPGCluster initializes and starts a new cluster in a temporary directory (as the user
// postgres when the test runs as root: initdb refuses root) and stops and removes it when the
// test ends. Without PostgreSQL binaries the test is skipped, or fails when
// SPOOL_TEST_REQUIRE_PG=1 (CI).
func StartPGCluster(t testing.TB) *PGCluster {
	t.Helper()
	bin := pgBinDir()
	if bin == "" {
		if os.Getenv("SPOOL_TEST_REQUIRE_PG") == "1" {
			t.Fatal("PostgreSQL binaries not found but SPOOL_TEST_REQUIRE_PG=1 (use ./scripts/test.sh)")
		}
		t.Skip("PostgreSQL binaries not found: test skipped (./scripts/test.sh installs them)")
	}
	dir, err := os.MkdirTemp("", "spool-pgc-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Getuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs the user postgres: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	c := &PGCluster{t: t, bin: bin, dir: dir, port: port,
		URL: fmt.Sprintf("postgres://spool@127.0.0.1:%d/postgres?sslmode=disable", port)}
	t.Cleanup(func() {
		_ = c.run("pg_ctl", "-D", c.data(), "-m", "immediate", "stop")
		os.RemoveAll(dir)
	})
	if err := c.run("initdb", "-D", c.data(), "-U", "spool", "--auth=trust", "-E", "UTF8"); err != nil {
		t.Fatalf("initdb: %v", err)
	}
	c.Start()
	return c
}

func (c *PGCluster) data() string { return filepath.Join(c.dir, "data") }

// run runs a PostgreSQL binary, as postgres when we are root.
func (c *PGCluster) run(name string, args ...string) error {
	path := filepath.Join(c.bin, name)
	var cmd *exec.Cmd
	if os.Getuid() == 0 {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %v: %w\n%s", name, args, err, out)
	}
	return nil
}

// Start starts the cluster and waits until it accepts connections.
func (c *PGCluster) Start() {
	c.t.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=on -c synchronous_commit=on", c.port, c.dir)
	if err := c.run("pg_ctl", "-D", c.data(), "-l", filepath.Join(c.dir, "log"), "-w", "-t", "60", "-o", opts, "start"); err != nil {
		c.t.Fatalf("start PostgreSQL: %v", err)
	}
}

// Stop stops the cluster: mode "fast" (disconnect everyone, clean shutdown) or "immediate" (like
// a crash: recovery replays the WAL at the next start).
func (c *PGCluster) Stop(mode string) {
	c.t.Helper()
	if err := c.run("pg_ctl", "-D", c.data(), "-m", mode, "-w", "stop"); err != nil {
		c.t.Fatalf("stop PostgreSQL: %v", err)
	}
}

// Log returns the server log (for failure messages).
func (c *PGCluster) Log() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "log"))
	return string(b)
}
