package admin

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/metrics"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/wal"
)

// Scale measurements of the admin API and /metrics. They build a real broker on the embedded
// engine in t.TempDir() with many topics and consumer groups, check the answers and log, per
// endpoint, the latency and size of a response, and the longest publish while listings and
// scrapes run. By default (CI) the sizes are small; the measurements of docs/benchmarks.md use the
// full ones:
//
//	SPOOL_ADMIN_SCALE=1 go test -run TestScale -v -timeout 20m ./internal/admin/
//
// SPOOL_ADMIN_SCALE_TOPICS (full 10000, small 200) and SPOOL_ADMIN_SCALE_GROUPS (full 2000, small
// 40) set the sizes. The topics are: GROUPS PUB_SUB topics "ps.a.N" and "ps.b.N" (half each) and the rest QUEUE
// topics "q.N" (each with its queue subscription). The consumer groups are: one group "g-N" with
// one member on each "ps.a.N", and the group "audit" with one member subscribed to "ps.b.#" (one
// member attached to GROUPS/2 subscriptions: a wildcard consumer). Every topic holds one message.
// The engine does not fsync (UnsafeNoSync) so that creating the topics is quick; reads do not
// depend on it.

// adminScaleSize returns the positive integer environment variable name, or by default full with
// SPOOL_ADMIN_SCALE=1 and small without.
func adminScaleSize(name string, full, small int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	if os.Getenv("SPOOL_ADMIN_SCALE") == "1" {
		return full
	}
	return small
}

// scaleEnv is a broker with many topics and groups behind the admin handler.
type scaleEnv struct {
	*env
	topics, groups int
	members        []*broker.Member
}

func newScaleEnv(t *testing.T, topics, groups int) *scaleEnv {
	t.Helper()
	// Small segments: every topic's log preallocates one.
	e := &scaleEnv{env: newEnvWith(t, wal.Config{Sync: wal.UnsafeNoSync, SegmentBytes: 16 << 10},
		metrics.CollectorOptions{Timeout: time.Minute}, nil), topics: topics, groups: groups}
	b := e.b
	t.Cleanup(func() { // before the env's: the members first
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, m := range e.members {
			if err := m.Close(ctx); err != nil {
				t.Errorf("member.Close: %v", err)
			}
		}
	})

	ctx := context.Background()
	start := time.Now()
	half := groups / 2
	payload := []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("0123456789abcdef")}}
	create := func(name string, sem storage.Semantics) {
		if _, err := b.CreateTopic(ctx, name, storage.TopicConfig{Semantics: sem}); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		if _, err := b.Publish(ctx, name, payload); err != nil {
			t.Fatalf("publish %s: %v", name, err)
		}
	}
	for i := range half {
		create(fmt.Sprintf("ps.a.%05d", i), storage.PubSub)
		create(fmt.Sprintf("ps.b.%05d", i), storage.PubSub)
	}
	for i := range topics - 2*half {
		create(fmt.Sprintf("q.%05d", i), storage.Queue)
	}
	t.Logf("created %d topics in %s", topics, time.Since(start).Round(time.Millisecond))

	start = time.Now()
	sub := func(p broker.SubscribeParams) {
		p.Start = storage.StartPosition{Kind: storage.FromBeginning}
		mem, err := b.Subscribe(ctx, p)
		if err != nil {
			t.Fatalf("subscribe %+v: %v", p, err)
		}
		e.members = append(e.members, mem)
	}
	for i := range half {
		sub(broker.SubscribeParams{Pattern: fmt.Sprintf("ps.a.%05d", i), Group: fmt.Sprintf("g-%05d", i)})
	}
	sub(broker.SubscribeParams{Pattern: "ps.b.#", Group: "audit", MaxInFlight: 100})
	t.Logf("subscribed %d members (%d durable subscriptions) in %s", len(e.members), 2*half,
		time.Since(start).Round(time.Millisecond))
	return e
}

// get fetches path n times and logs the fastest and slowest response and the size.
func (e *scaleEnv) get(path string, n int) (lo time.Duration, size int) {
	e.t.Helper()
	var hi time.Duration
	for i := range n {
		start := time.Now()
		res, err := http.Get(e.srv.URL + path)
		if err != nil {
			e.t.Fatalf("GET %s: %v", path, err)
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			e.t.Fatalf("GET %s: %v", path, err)
		}
		if res.StatusCode != http.StatusOK {
			e.t.Fatalf("GET %s: status %d: %.300s", path, res.StatusCode, body)
		}
		d := time.Since(start)
		if i == 0 || d < lo {
			lo = d
		}
		hi, size = max(hi, d), len(body)
	}
	e.t.Logf("GET %-58s min %9s  max %9s  %9d bytes", path, lo.Round(time.Microsecond), hi.Round(time.Microsecond), size)
	return lo, size
}

// publishLatencies publishes one message at a time to topic while during runs, and returns the
// slowest publish and the number of publishes.
func (e *scaleEnv) publishLatencies(topic string, during func()) (time.Duration, int) {
	var (
		stop    atomic.Bool
		slowest time.Duration
		n       int
		wg      sync.WaitGroup
	)
	msg := []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: []byte("x")}}
	wg.Go(func() {
		for !stop.Load() {
			start := time.Now()
			if _, err := e.b.Publish(context.Background(), topic, msg); err != nil {
				e.t.Errorf("publish: %v", err)
				return
			}
			slowest = max(slowest, time.Since(start))
			n++
		}
	})
	during()
	stop.Store(true)
	wg.Wait()
	return slowest, n
}

func TestScaleAdmin(t *testing.T) {
	topics := adminScaleSize("SPOOL_ADMIN_SCALE_TOPICS", 10000, 200)
	groups := adminScaleSize("SPOOL_ADMIN_SCALE_GROUPS", 2000, 40)
	e := newScaleEnv(t, topics, groups)
	defer http.DefaultClient.CloseIdleConnections()

	paths := []string{
		"/admin/topics",
		"/admin/groups",
		"/api/v1/topics",
		"/api/v1/topics?limit=1000",
		"/api/v1/topics?limit=100&offset=9000",
		"/api/v1/topics?pattern=ps.b.%23&limit=10",
		"/api/v1/topics/ps.a.00001",
		"/api/v1/groups",
		"/api/v1/groups?group=audit",
		"/api/v1/topics/ps.b.00001/groups",
		"/api/v1/topics/ps.b.00001/groups/audit",
		"/api/v1/members",
		"/api/v1/bindings",
		"/metrics",
	}
	runtime.GC()
	for _, p := range paths {
		e.get(p, 3)
	}

	// Publishing while the listings and scrapes run: the slowest publish, against a quiet
	// baseline of the same length.
	quiet, qn := e.publishLatencies("ps.a.00000", func() { time.Sleep(2 * time.Second) })
	t.Logf("publish alone for 2s:                      slowest %9s (%d publishes)", quiet.Round(time.Microsecond), qn)
	for _, p := range []string{"/admin/groups", "/admin/topics", "/metrics"} {
		slow, n := e.publishLatencies("ps.a.00000", func() { e.get(p, 3) })
		t.Logf("publish during 3 x GET %-20s slowest %9s (%d publishes)", p, slow.Round(time.Microsecond), n)
	}

	// Series of a scrape by metric name, and how the scrape's time splits between reading the
	// broker (spool_metrics_collect_duration_seconds), gathering and encoding.
	start := time.Now()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	gathered := time.Since(start)
	var names []string
	total := 0
	for _, mf := range mfs {
		if mf.GetName() == "spool_metrics_collect_duration_seconds" {
			t.Logf("/metrics: reading the broker %s, Gather in all %s", time.Duration(mf.GetMetric()[0].GetGauge().GetValue()*float64(time.Second)).Round(time.Microsecond), gathered.Round(time.Microsecond))
		}
		names = append(names, fmt.Sprintf("%s=%d", mf.GetName(), len(mf.GetMetric())))
		total += len(mf.GetMetric())
	}
	slices.Sort(names)
	t.Logf("/metrics: %d series: %v", total, names)
}
