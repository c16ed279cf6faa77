package broker

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Cleanup jobs: the retention job (message cleanup) and the subscription lifecycle job (dead
// detection, CANCELLED -> DELETED). Each run is recorded here; CleanupJobs reports them with seed
// 000's health rule: cleanup that falls behind production is unhealthy. Here a job falls behind
// when it has not completed a run for behindIntervals of its intervals (it fails, or runs so long
// that runs pile up), or when its last run took longer than its interval (it cannot keep pace).
// Times are the broker's clock.

// Job names, the job label of the spool_cleanup_job_* metrics.
const (
	JobRetention             = "retention"
	JobSubscriptionLifecycle = "subscription_lifecycle"
)

// behindIntervals is how many intervals a job may go without a successful run.
const behindIntervals = 3

// CleanupJobStatus is the state of one cleanup job of this broker.
type CleanupJobStatus struct {
	// Job is JobRetention or JobSubscriptionLifecycle.
	Job string `json:"job"`
	// Interval is the longest wait between two runs.
	Interval time.Duration `json:"interval"`
	// Runs and Failures count the runs since the broker started, and the failed ones.
	Runs     int64 `json:"runs"`
	Failures int64 `json:"failures"`
	// Removed counts what the job removed or changed: messages (retention: deleted and expired)
	// or subscriptions (lifecycle: made DEAD or DELETED).
	Removed int64 `json:"removed"`
	// LastRun is when the last run started, LastSuccess when the last successful one did (zero:
	// none yet), LastDuration how long the last run took, LastError its error ("" if none).
	LastRun      time.Time     `json:"last_run,omitzero"`
	LastSuccess  time.Time     `json:"last_success,omitzero"`
	LastDuration time.Duration `json:"last_duration"`
	LastError    string        `json:"last_error,omitempty"`
	// Behind is seed 000's health rule: the job falls behind (Reason says why).
	Behind bool   `json:"behind"`
	Reason string `json:"reason,omitempty"`
}

// cleanupStats holds the jobs' states; its mutex is a leaf.
type cleanupStats struct {
	mu   sync.Mutex
	jobs map[string]*CleanupJobStatus
	// since is when the jobs started (a job without any run is judged from there).
	since time.Time
}

// registerCleanupJob declares a job that runs every interval.
func (b *Broker) registerCleanupJob(job string, interval time.Duration) {
	b.cleanup.mu.Lock()
	defer b.cleanup.mu.Unlock()
	if b.cleanup.jobs == nil {
		b.cleanup.jobs = map[string]*CleanupJobStatus{}
		b.cleanup.since = b.clock.Now()
	}
	b.cleanup.jobs[job] = &CleanupJobStatus{Job: job, Interval: interval}
}

// recordCleanup records one run of a job that started at start and took took.
func (b *Broker) recordCleanup(job string, start time.Time, took time.Duration, removed int64, err error) {
	b.cleanup.mu.Lock()
	defer b.cleanup.mu.Unlock()
	j := b.cleanup.jobs[job]
	if j == nil {
		return // not registered: the job is disabled (a test calls it directly)
	}
	j.Runs++
	j.Removed += removed
	j.LastRun, j.LastDuration, j.LastError = start, took, ""
	if err != nil {
		j.Failures++
		j.LastError = err.Error()
		return
	}
	j.LastSuccess = start
}

// CleanupJobs describes the broker's cleanup jobs, ordered by name, with seed 000's health rule
// evaluated now (Behind, Reason).
func (b *Broker) CleanupJobs() []CleanupJobStatus {
	now := b.clock.Now()
	b.cleanup.mu.Lock()
	defer b.cleanup.mu.Unlock()
	out := make([]CleanupJobStatus, 0, len(b.cleanup.jobs))
	for _, j := range b.cleanup.jobs {
		c := *j
		last := c.LastSuccess
		if last.IsZero() {
			last = b.cleanup.since
		}
		switch {
		case c.Interval > 0 && now.Sub(last) > behindIntervals*c.Interval:
			c.Behind = true
			c.Reason = fmt.Sprintf("no successful run for %s (interval %s)", now.Sub(last).Round(time.Second), c.Interval)
			if c.LastError != "" {
				c.Reason += ": " + c.LastError
			}
		case c.Interval > 0 && c.LastDuration > c.Interval:
			c.Behind = true
			c.Reason = fmt.Sprintf("the last run took %s, longer than the interval %s: cleanup does not keep pace with production",
				c.LastDuration.Round(time.Millisecond), c.Interval)
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, c CleanupJobStatus) int { return strings.Compare(a.Job, c.Job) })
	return out
}

// CleanupBehind returns a description of the cleanup jobs that fall behind, "" when none does.
func (b *Broker) CleanupBehind() string {
	var parts []string
	for _, j := range b.CleanupJobs() {
		if j.Behind {
			parts = append(parts, "cleanup job "+j.Job+" falls behind: "+j.Reason)
		}
	}
	return strings.Join(parts, "; ")
}
