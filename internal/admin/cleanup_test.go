package admin

import (
	"context"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
	"github.com/spoolmq/spool/internal/storage/wal"
)

// GET /api/v1/cleanup reports the cleanup jobs; when one falls behind (seed 000's health rule)
// the API says unhealthy and /readyz stays 200 with the reason in detail.
func TestCleanupJobsAPI(t *testing.T) {
	t.Parallel()
	clock := storagetest.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	eng, err := wal.Open(t.TempDir(), wal.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	b, err := broker.New(broker.Config{Engine: eng, Clock: clock, Logger: testLogger(t), RetentionInterval: time.Hour, LifecycleInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	h, err := New(Config{Broker: b, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	e := &env{t: t, b: b, eng: eng, h: h, srv: srv}
	t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		_ = b.Stop(ctx)
		_ = eng.Close()
	})

	var list CleanupList
	e.do("GET", "/api/v1/cleanup", nil).ok(200, &list)
	if !list.Healthy || len(list.Jobs) != 2 || list.Jobs[0].Job != broker.JobRetention || time.Duration(list.Jobs[0].Interval) != time.Hour {
		t.Fatalf("cleanup at start: %+v", list)
	}
	var st Status
	e.do("GET", "/readyz", nil).ok(200, &st)
	if st.Status != "ready" || st.Detail != "" {
		t.Fatalf("readyz at start: %+v", st)
	}
	clock.Advance(3*time.Hour + time.Second)
	e.do("GET", "/api/v1/cleanup", nil).ok(200, &list)
	if list.Healthy || !list.Jobs[0].Behind || !strings.Contains(list.Jobs[0].Reason, "no successful run") {
		t.Fatalf("cleanup after 3 intervals without a run: %+v", list)
	}
	e.do("GET", "/readyz", nil).ok(200, &st)
	if st.Status != "ready" || !strings.Contains(st.Detail, "cleanup job retention falls behind") {
		t.Fatalf("readyz with cleanup behind: %+v", st)
	}
}

// backlogEngine is an engine whose retention runs report the backlog next returns.
type backlogEngine struct {
	storage.Engine
	next func() int64
}

func (e *backlogEngine) RetentionApply(ctx context.Context) (*storage.RetentionResult, error) {
	res, err := e.Engine.RetentionApply(ctx)
	if res != nil {
		res.Backlog = e.next()
	}
	return res, err
}

// cleanupJobs polls GET /api/v1/cleanup (the broker's retention loop runs on a short real
// interval) until done accepts the retention job, for at most waitTimeout.
func cleanupJobs(e *env, done func(map[string]any) bool) (bool, []map[string]any) {
	e.t.Helper()
	var raw struct {
		Healthy bool             `json:"healthy"`
		Jobs    []map[string]any `json:"jobs"`
	}
	deadline := time.Now().Add(waitTimeout)
	for {
		e.do("GET", "/api/v1/cleanup", nil).ok(200, &raw)
		if len(raw.Jobs) == 2 && done(raw.Jobs[0]) {
			return raw.Healthy, raw.Jobs
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("retention job not as expected after %s: %+v", waitTimeout, raw)
		}
		runtime.Gosched()
	}
}

// backlogEnv is a broker whose retention job runs every 5 ms (real time) on an engine reporting
// the backlogs next returns, with its admin API.
func backlogEnv(t *testing.T, next func() int64) *env {
	clock := storagetest.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	wl, err := wal.Open(t.TempDir(), wal.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	b, err := broker.New(broker.Config{Engine: &backlogEngine{Engine: wl, next: next}, Clock: clock, Logger: testLogger(t),
		RetentionInterval: 5 * time.Millisecond, LifecycleInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	h, err := New(Config{Broker: b, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		_ = b.Stop(ctx)
		_ = wl.Close()
	})
	return &env{t: t, b: b, eng: wl, h: h, srv: srv}
}

// GET /api/v1/cleanup carries the retention backlog and the rules it fired, and /readyz stays
// 200 and says so in detail: a backlog one message larger at each run from 1,000,001 fires both
// seed 000 rules (grew at each of the last 3 runs: behind; above 1,000,000: warning); a steady
// backlog of 2,000,000 only the warning, which makes the API unhealthy all the same.
func TestCleanupBacklogAPI(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	e := backlogEnv(t, func() int64 { return 1_000_000 + n.Add(1) })
	healthy, jobs := cleanupJobs(e, func(j map[string]any) bool { return j["behind"] == true })
	j := jobs[0]
	backlog, _ := j["backlog"].(float64)
	reason, _ := j["reason"].(string)
	if healthy || j["job"] != broker.JobRetention || backlog <= 1_000_003 || j["warning"] != true ||
		!strings.Contains(reason, "the backlog grew at each of the last 3 runs") || !strings.Contains(reason, "exceeds 1000000") {
		t.Fatalf("cleanup with a growing backlog above 1,000,000: %+v", jobs)
	}
	if lc := jobs[1]; lc["backlog"] != float64(0) || lc["warning"] != false {
		t.Fatalf("subscription lifecycle job: %+v", lc)
	}
	var st Status
	e.do("GET", "/readyz", nil).ok(200, &st)
	if st.Status != "ready" || !strings.Contains(st.Detail, "cleanup job retention falls behind: the backlog grew") ||
		!strings.Contains(st.Detail, "warning: the backlog of") {
		t.Fatalf("readyz with a growing backlog: %+v", st)
	}

	e = backlogEnv(t, func() int64 { return 2_000_000 })
	healthy, jobs = cleanupJobs(e, func(j map[string]any) bool { return j["backlog"] == float64(2_000_000) })
	if j := jobs[0]; healthy || j["behind"] != false || j["warning"] != true ||
		j["reason"] != "warning: the backlog of 2000000 messages exceeds 1000000" {
		t.Fatalf("cleanup with a steady backlog above 1,000,000: %+v", jobs)
	}
	e.do("GET", "/readyz", nil).ok(200, &st)
	if st.Status != "ready" || st.Detail != "cleanup job retention: warning: the backlog of 2000000 messages exceeds 1000000" {
		t.Fatalf("readyz with a steady backlog above 1,000,000: %+v", st)
	}
}
