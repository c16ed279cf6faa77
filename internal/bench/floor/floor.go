// Package floor measures the ceiling of this machine for synchronous publishers (spool bench
// floor): the fewest moving parts that can do what the Spool benchmark "10 publishers, each
// waiting for its acknowledgement over TCP, fsync before the acknowledgement" asks. It is not part
// of the broker; it is the reference to divide Spool's figures by, since the machines we measure
// on are shared and their speed drifts by a third within minutes (docs/benchmarks.md): a ratio
// measured in one window means something, an absolute figure alone does not.
//
// It starts a server as a child process (as spool serve is one) and runs the publishers in its
// own process (as spool bench does), over loopback TCP. The server is minimal: a goroutine per
// connection reads a length-prefixed frame, queues it for the committer and waits; the committer
// writes every queued frame into a preallocated, zero-filled file with one pwrite, fdatasyncs it
// and releases the waiters, which answer with 16 bytes. Like Spool's committer it gathers: it
// waits (at most maxGather) until as many requests are queued as the last round carried. No
// protocol, no records, no index, no broker: what it costs is the kernel's and the Go runtime's
// share of every message, which Spool pays too.
//
// With Store (a PostgreSQL URL) the committer commits each round there instead, as one
// autocommitted statement that takes the round's offsets from a head row and inserts one row per
// message: the ceiling of any broker in front of PostgreSQL on this machine, to compare with a
// plain queue that its clients write directly (cmd/pgqueue).
//
// It prints messages per second and the CPU time per message of the server and of the
// publishers' process.
package floor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Config is one measurement.
type Config struct {
	Publishers int           // publishers, each on its own connection, each waiting for its answer
	Batch      int           // messages per request
	Size       int           // payload bytes per message
	Duration   time.Duration // measured time
	Warmup     time.Duration // time before the measurement starts
	Dir        string        // directory of the server's file (default: a temporary directory)
	FileSize   int64         // size of the server's preallocated file; writes wrap around
	Gather     bool          // the committer waits for as many requests as its last round carried
	// Store, a PostgreSQL URL, makes the server commit each round there (one statement that takes
	// the round's offsets from a head row and inserts its rows) instead of into the file: the
	// ceiling of a broker in front of PostgreSQL. Schema holds its tables. Committers (with
	// Store) commit rounds side by side, each on its own connection and head row, as the
	// partitions of a topic could.
	Store, Schema string
	Committers    int
	// StoreStdin (the child's) reads Store from the first line of stdin: a URL on the child's
	// command line would show its password to every user of the machine (ps).
	StoreStdin bool
	// Child is the command line that runs this program's server child; the child's own flags
	// (ChildArgs) are appended to it. spool runs itself as "spool bench floor".
	Child []string
}

// Defaults returns the defaults of every setting but Child.
func Defaults() Config {
	return Config{Publishers: 10, Batch: 1, Size: 1024, Duration: 10 * time.Second, Warmup: 2 * time.Second,
		FileSize: 256 << 20, Gather: true, Schema: DefaultSchema, Committers: 1}
}

// Check validates c, naming the setting that is wrong.
func (c Config) Check() error {
	switch {
	case c.Publishers < 1:
		return fmt.Errorf("publishers must be at least 1, got %d", c.Publishers)
	case c.Size < 16 || c.Size > 1<<20:
		return fmt.Errorf("size must be between 16 and 1048576, got %d", c.Size)
	case c.Batch < 1 || c.Batch*(4+c.Size) > 16<<20:
		return fmt.Errorf("batch must be at least 1 and batch x size at most 16 MiB, got %d", c.Batch)
	case c.Duration <= 0 || c.Warmup < 0:
		return errors.New("duration must be positive and warmup not negative")
	case c.FileSize < 1<<20:
		return fmt.Errorf("file-size must be at least 1 MiB, got %d", c.FileSize)
	case c.Store != "" && c.Schema == "":
		return errors.New("schema must be set with store")
	case c.Committers < 1 || c.Committers > 64 || (c.Committers > 1 && c.Store == ""):
		return fmt.Errorf("committers must be between 1 and 64, more than 1 only with store, got %d", c.Committers)
	case len(c.Child) == 0:
		return errors.New("no child command line")
	}
	return nil
}

// ChildArgs are the arguments that make the child serve c into file (or c.Store, which measure
// sends on the child's stdin: StoreStdin).
func ChildArgs(c Config, file string) []string {
	a := []string{"--serve", file, "--file-size", strconv.FormatInt(c.FileSize, 10), "--gather=" + strconv.FormatBool(c.Gather),
		"--batch", strconv.Itoa(c.Batch)}
	if c.Store != "" {
		a = append(a, "--store-stdin", "--schema", c.Schema, "--committers", strconv.Itoa(c.Committers))
	}
	return a
}

// Run measures the floor and prints the figures to out.
func Run(c Config, out io.Writer) error {
	if err := c.Check(); err != nil {
		return err
	}
	if c.Dir == "" && c.Store == "" { // into PostgreSQL the child makes no file
		d, err := os.MkdirTemp("", "spool-floor-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		c.Dir = d
	}
	return measure(out, c, filepath.Join(c.Dir, "floor.dat"))
}

// measure starts the server child, runs the publishers and prints the figures.
func measure(out io.Writer, c Config, file string) error {
	gather, publishers, size, warmup, duration := c.Gather, c.Publishers, c.Size, c.Warmup, c.Duration
	args := append(append([]string(nil), c.Child[1:]...), ChildArgs(c, file)...)
	cmd := exec.Command(c.Child[0], args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() {
		stdin.Close() // the child exits when its stdin closes
		cmd.Wait()
	}()
	if c.Store != "" {
		if _, err := fmt.Fprintln(stdin, c.Store); err != nil { // StoreStdin
			return err
		}
	}
	lines := bufio.NewScanner(stdout)
	ask := func(q string) (string, error) {
		if _, err := fmt.Fprintln(stdin, q); err != nil {
			return "", err
		}
		if !lines.Scan() {
			return "", fmt.Errorf("server: no answer to %q (%v)", q, lines.Err())
		}
		return lines.Text(), nil
	}
	addr, err := ask("addr")
	if err != nil {
		return err
	}
	load, err := startLoad(addr, publishers, size, c.Batch)
	if err != nil {
		return err
	}
	defer load.stop()
	time.Sleep(warmup)
	srv0, err := ask("cpu")
	if err != nil {
		return err
	}
	cli0, n0, t0 := selfCPU(), load.count(), time.Now()
	time.Sleep(duration)
	srv1, err := ask("cpu")
	if err != nil {
		return err
	}
	cli1, n1, elapsed := selfCPU(), load.count(), time.Since(t0)
	if err := load.stop(); err != nil {
		return err
	}
	s0, err0 := time.ParseDuration(srv0)
	s1, err1 := time.ParseDuration(srv1)
	if err := errors.Join(err0, err1); err != nil {
		return fmt.Errorf("server cpu: %w", err)
	}
	msgs := n1 - n0
	if msgs == 0 {
		return errors.New("no message was acknowledged in the measured time")
	}
	perMsg := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(msgs) }
	into := "a file"
	if c.Store != "" {
		into = fmt.Sprintf("PostgreSQL (%d committers)", c.Committers)
	}
	fmt.Fprintf(out, "%d publishers, batches of %d, %d-byte payloads, gather %v, into %s: %d messages in %v, %.0f msg/s\n",
		publishers, c.Batch, size, gather, into, msgs, elapsed.Round(time.Millisecond), float64(msgs)/elapsed.Seconds())
	fmt.Fprintf(out, "cpu per message: server %.1f us, publishers %.1f us\n", perMsg(s1-s0), perMsg(cli1-cli0))
	return nil
}

// maxFrame is the largest frame the server accepts (Check bounds Size below it).
const maxFrame = 4 + 1<<20

// Serve is the server process of c, writing into file or c.Store: it answers "addr" with its
// listening address and "cpu" with its CPU time so far, one line each, on stdin and stdout, and
// exits when stdin closes.
func Serve(c Config, file string) error {
	in := bufio.NewScanner(os.Stdin)
	if c.StoreStdin {
		if !in.Scan() {
			return fmt.Errorf("no store URL on stdin (%v)", in.Err())
		}
		c.Store = strings.TrimSpace(in.Text())
	}
	var sinks []sink
	if c.Store != "" {
		var err error
		if sinks, err = newPGSinks(c.Store, c.Schema, c.Committers); err != nil {
			return err
		}
	} else {
		sk, err := newFileSink(file, c.FileSize)
		if err != nil {
			return err
		}
		sinks = []sink{sk}
	}
	s := newServer(sinks, min(maxFrame, c.FileSize), c.Batch, c.Gather)
	defer s.close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	go s.accept(ln)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	for in.Scan() && ctx.Err() == nil {
		switch q := strings.TrimSpace(in.Text()); q {
		case "addr":
			fmt.Println(ln.Addr())
		case "cpu":
			fmt.Println(selfCPU())
		default:
			return fmt.Errorf("unknown request %q", q)
		}
	}
	return in.Err()
}

// selfCPU returns the user and system CPU time of this process so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
