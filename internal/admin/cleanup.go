package admin

import (
	"net/http"
	"time"
)

// CleanupJob is one cleanup job of this broker (broker.CleanupJobStatus with durations as
// strings): the retention job (message cleanup) or the subscription lifecycle job (dead detection,
// CANCELLED -> DELETED).
type CleanupJob struct {
	Job          string    `json:"job"`
	Interval     Duration  `json:"interval"`
	Runs         int64     `json:"runs"`
	Failures     int64     `json:"failures"`
	Removed      int64     `json:"removed"`
	LastRun      time.Time `json:"last_run,omitzero"`
	LastSuccess  time.Time `json:"last_success,omitzero"`
	LastDuration Duration  `json:"last_duration"`
	LastError    string    `json:"last_error,omitempty"`
	// Behind is seed 000's health rule: the job falls behind production (Reason says why).
	Behind bool   `json:"behind"`
	Reason string `json:"reason,omitempty"`
}

// CleanupList is the response of GET /api/v1/cleanup.
type CleanupList struct {
	// Healthy is false when a job falls behind.
	Healthy bool         `json:"healthy"`
	Jobs    []CleanupJob `json:"jobs"`
}

func (h *Handler) listCleanup(w http.ResponseWriter, r *http.Request) error {
	out := CleanupList{Healthy: true, Jobs: []CleanupJob{}}
	for _, j := range h.b.CleanupJobs() {
		out.Jobs = append(out.Jobs, CleanupJob{
			Job: j.Job, Interval: Duration(j.Interval), Runs: j.Runs, Failures: j.Failures, Removed: j.Removed,
			LastRun: j.LastRun, LastSuccess: j.LastSuccess, LastDuration: Duration(j.LastDuration), LastError: j.LastError,
			Behind: j.Behind, Reason: j.Reason,
		})
		out.Healthy = out.Healthy && !j.Behind
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
