package broker

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

func jobStatus(t *testing.T, b *Broker, job string) CleanupJobStatus {
	t.Helper()
	for _, j := range b.CleanupJobs() {
		if j.Job == job {
			return j
		}
	}
	t.Fatalf("no cleanup job %q in %+v", job, b.CleanupJobs())
	return CleanupJobStatus{}
}

// Seed 000's health rule: a cleanup job without a successful run for 3 intervals, or whose last
// run took longer than its interval, falls behind; a successful run clears it.
func TestCleanupJobsBehind(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.RetentionInterval = time.Hour
		c.LifecycleInterval = time.Hour
	})
	ctx := e.ctx()
	if s := e.b.CleanupBehind(); s != "" {
		t.Fatalf("behind at start: %s", s)
	}
	e.clock.Advance(3 * time.Hour)
	if s := e.b.CleanupBehind(); s != "" {
		t.Fatalf("behind exactly 3 intervals after the start: %s", s)
	}
	e.clock.Advance(time.Second)
	for _, job := range []string{JobRetention, JobSubscriptionLifecycle} {
		if j := jobStatus(t, e.b, job); !j.Behind || !strings.Contains(j.Reason, "no successful run") {
			t.Errorf("%s after 3 intervals without a run: %+v", job, j)
		}
	}
	e.b.runRetention(ctx)
	e.b.runLifecycle(ctx)
	if s := e.b.CleanupBehind(); s != "" {
		t.Fatalf("behind after successful runs: %s", s)
	}
	if j := jobStatus(t, e.b, JobRetention); j.Runs != 1 || j.Failures != 0 || !j.LastSuccess.Equal(e.clock.Now()) {
		t.Errorf("retention after one run: %+v", j)
	}

	// A run longer than the interval: cleanup does not keep pace.
	e.b.recordCleanup(JobRetention, e.clock.Now(), 2*time.Hour, 7, nil)
	if j := jobStatus(t, e.b, JobRetention); !j.Behind || !strings.Contains(j.Reason, "longer than the interval") || j.Removed != 7 {
		t.Errorf("retention after a 2 h run: %+v", j)
	}
	// Failures: counted, and behind once no run succeeded for 3 intervals, with the error.
	e.b.recordCleanup(JobSubscriptionLifecycle, e.clock.Now(), time.Second, 0, errors.New("database down"))
	e.clock.Advance(3*time.Hour + time.Second)
	e.b.recordCleanup(JobSubscriptionLifecycle, e.clock.Now(), time.Second, 0, errors.New("database down"))
	j := jobStatus(t, e.b, JobSubscriptionLifecycle)
	if !j.Behind || j.Failures != 2 || !strings.Contains(j.Reason, "database down") {
		t.Errorf("lifecycle after failures: %+v", j)
	}
	if s := e.b.CleanupBehind(); !strings.Contains(s, "cleanup job subscription_lifecycle falls behind") {
		t.Errorf("CleanupBehind: %q", s)
	}
}

// Disabled jobs are not reported (another instance or a test runs them).
func TestCleanupJobsDisabled(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.LifecycleInterval = -1 })
	if jobs := e.b.CleanupJobs(); len(jobs) != 0 {
		t.Fatalf("jobs with retention and lifecycle disabled: %+v", jobs)
	}
}

// backlogEngine reports a set retention backlog (storage.RetentionResult.Backlog).
type backlogEngine struct {
	storage.Engine
	backlog atomic.Int64
}

func (e *backlogEngine) RetentionApply(ctx context.Context) (*storage.RetentionResult, error) {
	res, err := e.Engine.RetentionApply(ctx)
	if res != nil {
		res.Backlog = e.backlog.Load()
	}
	return res, err
}

// Seed 000's backlog rules: the retention job's backlog is the engine's after its last
// successful run; the job falls behind (CRITICAL) when it grew at each of the last 3 runs, not
// when it merely stays, and a backlog above 1,000,000 messages is a WARNING that does not make
// the job fall behind. A failed run leaves the backlog as it was.
func TestCleanupBacklogRules(t *testing.T) {
	e := newEnv(t, nil)
	eng := &backlogEngine{Engine: e.engine}
	b, err := New(Config{Engine: eng, Clock: e.clock, Logger: testLogger(t), PollInterval: time.Hour,
		RetentionInterval: time.Hour, LifecycleInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(e.ctx()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	run := func(backlog int64) CleanupJobStatus {
		t.Helper()
		e.clock.Advance(time.Hour)
		eng.backlog.Store(backlog)
		b.runRetention(e.ctx())
		return jobStatus(t, b, JobRetention)
	}
	for _, n := range []int64{0, 10, 20} {
		if j := run(n); j.Backlog != n || j.Behind || j.Warning || j.Reason != "" {
			t.Fatalf("after a run leaving %d: %+v", n, j)
		}
	}
	j := run(30)
	if !j.Behind || j.Warning || j.Backlog != 30 || !strings.Contains(j.Reason, "grew at each of the last 3 runs (0 -> 10 -> 20 -> 30 messages)") {
		t.Fatalf("after the backlog grew 3 runs in a row: %+v", j)
	}
	if s := b.CleanupBehind(); !strings.Contains(s, "cleanup job retention falls behind: the backlog grew") {
		t.Fatalf("CleanupBehind: %q", s)
	}
	if j := run(30); j.Behind || j.Reason != "" {
		t.Fatalf("after a run where the backlog stayed: %+v", j)
	}
	b.recordCleanupRun(JobRetention, e.clock.Now(), time.Second, 0, 99, errors.New("disk gone"))
	if j := jobStatus(t, b, JobRetention); j.Backlog != 30 || j.Failures != 1 {
		t.Fatalf("after a failed run: %+v", j)
	}
	if j := run(backlogWarning); j.Warning || j.Behind {
		t.Fatalf("backlog at the warning threshold: %+v", j)
	}
	j = run(backlogWarning + 1)
	if !j.Warning || j.Behind || !strings.Contains(j.Reason, "warning: the backlog of 1000001 messages exceeds 1000000") {
		t.Fatalf("backlog above the warning threshold, grown 2 runs: %+v", j)
	}
	if s := b.CleanupBehind(); !strings.Contains(s, "cleanup job retention: warning: the backlog of 1000001") {
		t.Fatalf("CleanupBehind with a warning: %q", s)
	}
	j = run(backlogWarning + 2)
	if !j.Warning || !j.Behind || !strings.Contains(j.Reason, "grew at each") || !strings.Contains(j.Reason, "warning:") {
		t.Fatalf("backlog above the warning threshold, grown 3 runs: %+v", j)
	}
	if j := run(0); j.Warning || j.Behind || j.Backlog != 0 {
		t.Fatalf("after a run that removed everything: %+v", j)
	}
}
