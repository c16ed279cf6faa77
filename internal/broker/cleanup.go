package broker

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Cleanup jobs: the retention job (message cleanup) and the subscription lifecycle job (dead
// detection, CANCELLED -> DELETED). Each run is recorded here; CleanupJobs reports them with seed
// 000's health rule: cleanup that falls behind production is unhealthy (CRITICAL), and a backlog
// above backlogWarning messages is a WARNING. Here a job falls behind when it has not completed a
// run for behindIntervals of its intervals (it fails, or runs so long that runs pile up), when its
// last run took longer than its interval (it cannot keep pace), or when its backlog (what it
// could remove now and has not: storage.RetentionResult.Backlog) grew at each of its last
// behindIntervals successful runs (it removes less than production adds). Times are the broker's
// clock.
//
// The lifecycle job's backlog is 0: both engines make every due transition (ACTIVE past its
// heartbeat timeout to DEAD, CANCELLED past subscription_retention to DELETED) in one call, so
// none is left after a successful run, and a failing one is caught by the time rule.

// Job names, the task label of the spool_cleanup_job_* metrics.
const (
	JobRetention             = "retention"
	JobSubscriptionLifecycle = "subscription_lifecycle"
)

// behindIntervals is how many intervals a job may go without a successful run, and how many
// successful runs in a row its backlog may grow.
const behindIntervals = 3

// backlogWarning is seed 000's WARNING threshold: a backlog above it, in messages.
const backlogWarning = 1_000_000

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
	// Backlog is what the job could remove now and has not, as of its last successful run
	// (retention: messages, storage.RetentionResult.Backlog; lifecycle: always 0).
	Backlog int64 `json:"backlog"`
	// Behind is seed 000's CRITICAL rule: the job falls behind production. Warning is its
	// WARNING rule: the backlog exceeds 1,000,000 messages. Reason says which rules fired, with
	// the figures.
	Behind  bool   `json:"behind"`
	Warning bool   `json:"warning"`
	Reason  string `json:"reason,omitempty"`
}

// cleanupStats holds the jobs' states; its mutex is a leaf.
type cleanupStats struct {
	mu   sync.Mutex
	jobs map[string]*cleanupJob
	// since is when the jobs started (a job without any run is judged from there).
	since time.Time
}

// cleanupJob is a job's state and the backlogs of its last behindIntervals+1 successful runs,
// oldest first.
type cleanupJob struct {
	status   CleanupJobStatus
	backlogs []int64
}

// registerCleanupJob declares a job that runs every interval.
func (b *Broker) registerCleanupJob(job string, interval time.Duration) {
	b.cleanup.mu.Lock()
	defer b.cleanup.mu.Unlock()
	if b.cleanup.jobs == nil {
		b.cleanup.jobs = map[string]*cleanupJob{}
		b.cleanup.since = b.clock.Now()
	}
	b.cleanup.jobs[job] = &cleanupJob{status: CleanupJobStatus{Job: job, Interval: interval}}
}

// recordCleanup records one run of a job without a backlog (the lifecycle job).
func (b *Broker) recordCleanup(job string, start time.Time, took time.Duration, removed int64, err error) {
	b.recordCleanupRun(job, start, took, removed, 0, err)
}

// recordCleanupRun records one run of a job that started at start and took took, and what it left
// to remove (backlog). A failed run leaves the backlog as the last successful run saw it: what it
// saw is partial.
func (b *Broker) recordCleanupRun(job string, start time.Time, took time.Duration, removed, backlog int64, err error) {
	b.cleanup.mu.Lock()
	defer b.cleanup.mu.Unlock()
	c := b.cleanup.jobs[job]
	if c == nil {
		return // not registered: the job is disabled (a test calls it directly)
	}
	j := &c.status
	j.Runs++
	j.Removed += removed
	j.LastRun, j.LastDuration, j.LastError = start, took, ""
	if err != nil {
		j.Failures++
		j.LastError = err.Error()
		return
	}
	j.LastSuccess = start
	j.Backlog = backlog
	c.backlogs = append(c.backlogs, backlog)
	if n := len(c.backlogs) - (behindIntervals + 1); n > 0 {
		c.backlogs = slices.Delete(c.backlogs, 0, n)
	}
}

// backlogGrowing reports whether the backlog grew at each of the last behindIntervals successful
// runs.
func (c *cleanupJob) backlogGrowing() bool {
	if len(c.backlogs) < behindIntervals+1 {
		return false
	}
	for i := 1; i < len(c.backlogs); i++ {
		if c.backlogs[i] <= c.backlogs[i-1] {
			return false
		}
	}
	return true
}

// CleanupJobs describes the broker's cleanup jobs, ordered by name, with seed 000's health rule
// evaluated now (Behind, Warning, Reason).
func (b *Broker) CleanupJobs() []CleanupJobStatus {
	now := b.clock.Now()
	b.cleanup.mu.Lock()
	defer b.cleanup.mu.Unlock()
	out := make([]CleanupJobStatus, 0, len(b.cleanup.jobs))
	for _, cj := range b.cleanup.jobs {
		c := cj.status
		var reasons []string
		last := c.LastSuccess
		if last.IsZero() {
			last = b.cleanup.since
		}
		switch {
		case c.Interval > 0 && now.Sub(last) > behindIntervals*c.Interval:
			r := fmt.Sprintf("no successful run for %s (interval %s)", now.Sub(last).Round(time.Second), c.Interval)
			if c.LastError != "" {
				r += ": " + c.LastError
			}
			reasons = append(reasons, r)
		case c.Interval > 0 && c.LastDuration > c.Interval:
			reasons = append(reasons, fmt.Sprintf("the last run took %s, longer than the interval %s: cleanup does not keep pace with production",
				c.LastDuration.Round(time.Millisecond), c.Interval))
		}
		if cj.backlogGrowing() {
			steps := make([]string, len(cj.backlogs))
			for i, n := range cj.backlogs {
				steps[i] = strconv.FormatInt(n, 10)
			}
			reasons = append(reasons, fmt.Sprintf("the backlog grew at each of the last %d runs (%s messages): cleanup is slower than production",
				behindIntervals, strings.Join(steps, " -> ")))
		}
		c.Behind = len(reasons) > 0
		if c.Backlog > backlogWarning {
			c.Warning = true
			reasons = append(reasons, fmt.Sprintf("warning: the backlog of %d messages exceeds %d", c.Backlog, backlogWarning))
		}
		c.Reason = strings.Join(reasons, "; ")
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, c CleanupJobStatus) int { return strings.Compare(a.Job, c.Job) })
	return out
}

// CleanupBehind returns a description of the cleanup jobs that fall behind or whose backlog
// exceeds the warning threshold, "" when none does.
func (b *Broker) CleanupBehind() string {
	var parts []string
	for _, j := range b.CleanupJobs() {
		switch {
		case j.Behind:
			parts = append(parts, "cleanup job "+j.Job+" falls behind: "+j.Reason)
		case j.Warning:
			parts = append(parts, "cleanup job "+j.Job+": "+j.Reason)
		}
	}
	return strings.Join(parts, "; ")
}
