package crash

import (
	"bufio"
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal"
)

// The harness the crash tests share: children print one line per finished step, the parent kills
// them (runChildAndKill) and checks the engine against the lines.

// newEmitter returns the line printer of a child: each line is written to stdout at once (the
// parent reads what a child printed up to its kill); safe for concurrent use.
func newEmitter() func(line string) {
	out := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex
	return func(line string) {
		mu.Lock()
		defer mu.Unlock()
		out.WriteString(line)
		out.WriteByte('\n')
		out.Flush()
	}
}

// seededRNG returns a generator seeded from $SPOOL_TEST_SEED, else the clock, and logs the seed so that
// a failing run can be repeated.
func seededRNG(t *testing.T) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("SPOOL_TEST_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (set SPOOL_TEST_SEED to repeat)", seed)
	return rand.New(rand.NewPCG(seed, seed))
}

// createTopic creates, in a wal engine at dir, a pub-sub topic of parts partitions (up to 1000
// deliveries a message) with one subscription from the beginning per group, and closes it.
func createTopic(t *testing.T, dir, topic string, parts int, groups ...string) {
	t.Helper()
	ctx := context.Background()
	eng, err := wal.Open(dir, wal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.TopicCreate(ctx, &storage.TopicCreateParams{Name: topic, Config: storage.TopicConfig{
		Semantics: storage.PubSub, Partitions: parts, MaxDeliveries: 1000,
	}}); err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		if _, err := eng.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: topic, Group: g,
			Start: storage.StartPosition{Kind: storage.FromBeginning}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
}

// parsePos parses the "<partition> <offset>" fields of a child's line.
func parsePos(partition, offset string) pos {
	p, _ := strconv.ParseInt(partition, 10, 32)
	o, _ := strconv.ParseInt(offset, 10, 64)
	return pos{int32(p), o}
}

// child is the test binary running as a child process (TestMain picks its role by environment).
type child struct {
	cmd *exec.Cmd
	// lines are what it printed; read them once done is closed.
	lines []string
	// done is closed when its stdout ended (it exited or was killed).
	done chan struct{}
}

// startChild starts a child with env ("KEY=value") added to the environment and collects the
// lines it prints.
func startChild(t *testing.T, env ...string) *child {
	t.Helper()
	c := &child{cmd: exec.Command(os.Args[0], "-test.run=^$"), done: make(chan struct{})}
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stderr = os.Stderr
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines = append(c.lines, sc.Text())
		}
	}()
	return c
}
