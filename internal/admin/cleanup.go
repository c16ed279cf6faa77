package admin

import (
	"net/http"

	api "github.com/spoolmq/spool/client/admin"
)

// CleanupJob is one cleanup job of this broker (broker.CleanupJobStatus with durations as
// strings): the retention job (message cleanup) or the subscription lifecycle job (dead detection,
// CANCELLED -> DELETED). Behind and Warning are seed 000's health rules.
type CleanupJob = api.CleanupJob

// CleanupList is the response of GET /api/v1/cleanup; Healthy is false when a job falls behind
// or has a warning.
type CleanupList = api.CleanupList

func (h *Handler) listCleanup(w http.ResponseWriter, r *http.Request) error {
	out := CleanupList{Healthy: true, Jobs: []CleanupJob{}}
	for _, j := range h.b.CleanupJobs() {
		out.Jobs = append(out.Jobs, CleanupJob{
			Job: j.Job, Interval: Duration(j.Interval), Runs: j.Runs, Failures: j.Failures, Removed: j.Removed,
			LastRun: j.LastRun, LastSuccess: j.LastSuccess, LastDuration: Duration(j.LastDuration), LastError: j.LastError,
			Backlog: j.Backlog, Behind: j.Behind, Warning: j.Warning, Reason: j.Reason,
		})
		out.Healthy = out.Healthy && !j.Behind && !j.Warning
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
