package broker

import (
	"errors"
	"strings"
	"testing"
	"time"
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
