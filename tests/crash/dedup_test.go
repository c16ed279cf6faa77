package crash

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/pgstore"
	"github.com/spoolmq/spool/internal/storage/wal"
	"github.com/spoolmq/spool/internal/testutil"
)

// The producer-id crash test: a broker process (the child, with the engine embedded) publishes
// messages that all carry producer ids and is killed right after an append returned and before
// its answer reached the producer (the child kills itself there, after a random number of
// appends), while other appends are in flight. The next run first retries, with the same ids,
// every message whose answer the previous run did not report, as a client retries a publish of
// unknown outcome. After every kill the parent reads the whole log: no producer id may be stored
// twice, and every answered id is stored where its answer said. A retry of a message that was
// stored before the kill must be answered Duplicate with the stored position.

const (
	dedupStoreEnv = "SPOOL_CRASH_DEDUP_STORE" // "wal:<dir>" or "pg:<schema>:<url>"
	dedupRetryEnv = "SPOOL_CRASH_DEDUP_RETRY" // file of producer ids to retry first, one a line
	dedupDieEnv   = "SPOOL_CRASH_DEDUP_DIE"   // kill the child after this many appends returned
	dedupTopic    = "crash.dedup"
)

// openDedupStore opens the engine a store locator names.
func openDedupStore(ctx context.Context, store string) (storage.Engine, error) {
	kind, rest, _ := strings.Cut(store, ":")
	switch kind {
	case "wal":
		return wal.Open(rest, wal.Config{})
	case "pg":
		schema, url, _ := strings.Cut(rest, ":")
		if os.Getenv(dedupStoreEnv) != "" {
			url = withAppName(url, childAppName(schema))
		}
		return pgstore.Open(ctx, pgstore.Config{URL: url, Schema: schema, Migrate: true, MaxConns: 8})
	}
	return nil, fmt.Errorf("unknown store %q", store)
}

// childAppName is the application_name of the child's database sessions.
func childAppName(schema string) string { return "crash-child-" + schema }

// withAppName adds application_name to a postgres:// URL.
func withAppName(url, name string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "application_name=" + name
}

// waitChildSessions waits until the killed child's database sessions are gone. A transaction
// whose COMMIT the child sent before it died is still carried out by its backend, which exits only
// when it finds the connection closed: until then the log is not final (an append the child never
// answered may still commit), and a check of it would race with that commit.
func waitChildSessions(t *testing.T, store string) {
	t.Helper()
	kind, rest, _ := strings.Cut(store, ":")
	if kind != "pg" {
		return
	}
	schema, url, _ := strings.Cut(rest, ":")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", childAppName(schema)).Scan(&n); err != nil {
			t.Fatalf("waiting for the killed child's database sessions to end: %v", err)
		}
		if n == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond) // polling a condition that does become true, bounded by ctx
	}
}

// runDedupChild retries the ids of the retry file, then publishes from several goroutines until
// it kills itself after the die-th append returned. It prints "TRY <id>" before an append of the
// message with that id (its payload is the id too) and "PUB <id> <partition> <offset> <dup>"
// after the append returned.
func runDedupChild(store string) error {
	ctx := context.Background()
	eng, err := openDedupStore(ctx, store)
	if err != nil {
		return err
	}
	die, _ := strconv.ParseInt(os.Getenv(dedupDieEnv), 10, 64)
	out := bufio.NewWriter(os.Stdout)
	var outMu sync.Mutex
	emit := func(lines ...string) {
		outMu.Lock()
		for _, l := range lines {
			out.WriteString(l)
			out.WriteByte('\n')
		}
		out.Flush()
		outMu.Unlock()
	}
	var appends atomic.Int64
	publish := func(ids []string) error {
		msgs := make([]storage.AppendMessage, len(ids))
		tries := make([]string, len(ids))
		for i, id := range ids {
			msgs[i] = storage.AppendMessage{Partition: storage.PartitionAuto, Key: []byte(id), Payload: []byte(id), ProducerID: id}
			tries[i] = "TRY " + id
		}
		emit(tries...)
		res, err := eng.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: dedupTopic, Messages: msgs})
		if err != nil {
			return err
		}
		if appends.Add(1) == die {
			// Committed, not answered: the crash this test is about.
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		lines := make([]string, len(ids))
		for i, p := range res.Positions {
			lines[i] = fmt.Sprintf("PUB %s %d %d %t", ids[i], p.Partition, p.Offset, p.Duplicate)
		}
		emit(lines...)
		return nil
	}
	if file := os.Getenv(dedupRetryEnv); file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		retry := strings.Fields(string(b))
		for len(retry) > 0 {
			n := min(len(retry), 50)
			if err := publish(retry[:n]); err != nil {
				return err
			}
			retry = retry[n:]
		}
	}
	run := os.Getenv("SPOOL_CRASH_RUN")
	errs := make(chan error, 4)
	for w := range 4 {
		go func() {
			for n := 0; ; n++ {
				ids := []string{fmt.Sprintf("r%s-w%d-n%d", run, w, n)}
				if n%3 == 0 { // some batches, over several partitions
					for i := range 3 {
						ids = append(ids, fmt.Sprintf("%s-b%d", ids[0], i))
					}
				}
				if err := publish(ids); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	return <-errs
}

func TestCrashProducerIDsWAL(t *testing.T) {
	dir := t.TempDir()
	testCrashProducerIDs(t, "wal:"+dir)
}

func TestCrashProducerIDsPostgres(t *testing.T) {
	url := testutil.DatabaseURL(t)
	schema := testutil.PGSchema(t, url, "t_crash_")
	testCrashProducerIDs(t, "pg:"+schema+":"+url)
}

type answer struct {
	at  pos
	dup bool
}

func testCrashProducerIDs(t *testing.T, store string) {
	iterations := 25
	if testing.Short() {
		iterations = 5
	}
	rng := seededRNG(t)
	ctx := context.Background()

	eng, err := openDedupStore(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.TopicCreate(ctx, &storage.TopicCreateParams{Name: dedupTopic, Config: storage.TopicConfig{
		Semantics: storage.PubSub, Partitions: partitions, DedupWindow: time.Hour,
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: dedupTopic, Group: "verifier",
		Start: storage.StartPosition{Kind: storage.FromBeginning}}); err != nil {
		t.Fatal(err)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}

	retryFile := t.TempDir() + "/retry"
	stored := map[string]pos{}     // the log after the last kill
	answered := map[string]bool{}  // ids whose append a run answered
	var pending []string           // tried, never answered: the next run retries them
	dupRetries, newRetries := 0, 0 // retries answered Duplicate (stored before the kill) or stored now
	for it := range iterations {
		if err := os.WriteFile(retryFile, []byte(strings.Join(pending, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
		retrying := map[string]bool{}
		for _, id := range pending {
			retrying[id] = true
		}
		die := 1 + rng.IntN(150)
		lines := runUntilKilled(t, it, store, retryFile, die)
		tried := map[string]bool{}
		for _, l := range lines {
			f := strings.Fields(l)
			switch {
			case len(f) == 2 && f[0] == "TRY":
				tried[f[1]] = true
			case len(f) == 5 && f[0] == "PUB":
				p, _ := strconv.ParseInt(f[2], 10, 32)
				o, _ := strconv.ParseInt(f[3], 10, 64)
				a := answer{pos{int32(p), o}, f[4] == "true"}
				id := f[1]
				if answered[id] {
					t.Fatalf("iteration %d: %s answered twice", it, id)
				}
				answered[id] = true
				if retrying[id] {
					if old, ok := stored[id]; ok {
						// Stored before the kill: the retry must be the duplicate, at that place.
						if !a.dup || a.at != old {
							t.Fatalf("iteration %d: retry of %s (stored at %v before the kill) answered %+v", it, id, old, a)
						}
						dupRetries++
					} else {
						if a.dup {
							t.Fatalf("iteration %d: retry of %s (not stored before the kill) answered as a duplicate: %+v", it, id, a)
						}
						newRetries++
					}
				} else if a.dup {
					t.Fatalf("iteration %d: first publish of %s answered as a duplicate: %+v", it, id, a)
				}
				stored[id] = a.at // checked against the log below
			case strings.HasPrefix(l, "ERR"):
				t.Fatalf("iteration %d: child error: %s", it, l)
			}
		}
		// Tried and not answered (retries included: killed before the retry was answered, they
		// are retried again).
		pending = pending[:0]
		for id := range retrying {
			tried[id] = true // also those the run was killed before it retried them
		}
		for id := range tried {
			if !answered[id] {
				pending = append(pending, id)
			}
		}
		waitChildSessions(t, store)
		stored = verifyProducerIDs(t, store, it, stored, answered, it == iterations-1)
	}
	t.Logf("%d kills, %d messages stored, %d retries answered as duplicates of a copy stored before the kill, %d retries stored",
		iterations, len(stored), dupRetries, newRetries)
	// Each run but the last is followed by a retry of the append it committed and did not answer.
	if dupRetries < iterations-1 {
		t.Fatalf("only %d retries of a message committed before the kill, want at least %d", dupRetries, iterations-1)
	}
}

// runUntilKilled runs the child until it kills itself after die appends (within a minute) and
// returns the complete lines it printed.
func runUntilKilled(t *testing.T, it int, store, retryFile string, die int) []string {
	t.Helper()
	c := startChild(t, dedupStoreEnv+"="+store, dedupRetryEnv+"="+retryFile,
		dedupDieEnv+"="+strconv.Itoa(die), "SPOOL_CRASH_RUN="+strconv.Itoa(it))
	timer := time.NewTimer(time.Minute)
	defer timer.Stop()
	select {
	case <-c.done:
	case <-timer.C:
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		<-c.done
		t.Fatalf("iteration %d: the child did not reach %d appends in a minute", it, die)
	}
	err := c.cmd.Wait()
	lines := c.lines
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		last := ""
		if len(lines) > 0 {
			last = lines[len(lines)-1]
		}
		t.Fatalf("iteration %d: the child ended with %v, not killed by itself (last line: %q)", it, err, last)
	}
	if n := len(lines); n > 0 {
		if f := strings.Fields(lines[n-1]); !(len(f) == 2 && f[0] == "TRY" || len(f) == 5 && f[0] == "PUB") {
			lines = lines[:n-1]
		}
	}
	return lines
}

// verifyProducerIDs reopens the engine and reads the whole log: every producer id at most once,
// every answered id where its answer said. It returns where each id is stored. At the end it also
// drains group "verifier": each id delivered once.
func verifyProducerIDs(t *testing.T, store string, it int, answers map[string]pos, answered map[string]bool, final bool) map[string]pos {
	t.Helper()
	ctx := context.Background()
	eng, err := openDedupStore(ctx, store)
	if err != nil {
		t.Fatalf("iteration %d: reopen: %v", it, err)
	}
	defer eng.Close()
	seen := map[string]pos{}
	readLog(t, eng, dedupTopic, it, func(m *storage.Message) {
		p := m.Partition
		if m.ProducerID != string(m.Payload) {
			t.Fatalf("iteration %d: message %d:%d has producer id %q and payload %q", it, p, m.Offset, m.ProducerID, m.Payload)
		}
		if old, dup := seen[m.ProducerID]; dup {
			t.Fatalf("iteration %d: producer id %s stored twice: at %v and %d:%d", it, m.ProducerID, old, p, m.Offset)
		}
		seen[m.ProducerID] = pos{p, m.Offset}
	})
	for id := range answered {
		got, ok := seen[id]
		if !ok {
			t.Fatalf("iteration %d: answered publish %s is lost", it, id)
		}
		if want := answers[id]; got != want {
			t.Fatalf("iteration %d: %s stored at %v, answered %v", it, id, got, want)
		}
	}
	if final {
		sub, err := eng.SubscriptionGetByGroup(ctx, dedupTopic, "verifier")
		if err != nil {
			t.Fatal(err)
		}
		delivered := map[string]bool{}
		drain(t, ctx, eng, sub.ID, "verifier", func(d *storage.Delivery) {
			if delivered[d.ProducerID] || d.Attempt != 1 {
				t.Fatalf("producer id %s delivered again (attempt %d)", d.ProducerID, d.Attempt)
			}
			delivered[d.ProducerID] = true
		})
		if len(delivered) != len(seen) {
			t.Fatalf("group verifier got %d messages, the log holds %d", len(delivered), len(seen))
		}
	}
	return seen
}
