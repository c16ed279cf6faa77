package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// Scenarios are seed 000's pre-GA tests (its "Pre-GA Decision Checkpoints") scaled to one machine
// and run against a running broker (spool bench scenario <name>): each drives the broker through
// its TCP and HTTP admin addresses, measures, and judges the figures against the seed's targets
// with one Verdict per criterion; the fourth, backfill against OLTP, is ScenarioOLTP
// (scenario_oltp.go).
const (
	// ScenarioKill is kill-and-resurrect (seed 000 section "Kill-and-resurrect chaos test").
	ScenarioKill = "kill-resurrect"
	// ScenarioIsolation is multi-tenant isolation: a small topic beside a busy one.
	ScenarioIsolation = "isolation"
	// ScenarioFanout is the fan-out write amplification matrix on PostgreSQL.
	ScenarioFanout = "fanout"
)

// Verdict is one criterion of a scenario judged against its target.
type Verdict struct {
	// Check names the criterion; Target is the seed's target, Measured what the run saw.
	Check    string `json:"check"`
	Target   string `json:"target"`
	Measured string `json:"measured"`
	// Outcome is PASS, FAIL or INCONCLUSIVE (the run could not judge: Note says why).
	Outcome string `json:"outcome"`
	Note    string `json:"note,omitempty"`
}

// Verdict outcomes.
const (
	Pass         = "PASS"
	Fail         = "FAIL"
	Inconclusive = "INCONCLUSIVE"
)

func verdict(check, target string, ok bool, measured string, args ...any) Verdict {
	out := Fail
	if ok {
		out = Pass
	}
	return Verdict{Check: check, Target: target, Measured: fmt.Sprintf(measured, args...), Outcome: out}
}

// overall is PASS when every verdict passed, FAIL when one failed, INCONCLUSIVE otherwise.
func overall(vs []Verdict) string {
	out := Pass
	for _, v := range vs {
		switch v.Outcome {
		case Fail:
			return Fail
		case Inconclusive:
			out = Inconclusive
		}
	}
	return out
}

// writeVerdicts prints the verdicts, one a line, and the overall outcome.
func writeVerdicts(w io.Writer, name string, vs []Verdict) {
	fmt.Fprintf(w, "verdicts (seed 000 targets):\n")
	for _, v := range vs {
		fmt.Fprintf(w, "  %-12s %s: %s (target %s)\n", v.Outcome, v.Check, v.Measured, v.Target)
		if v.Note != "" {
			fmt.Fprintf(w, "               %s\n", v.Note)
		}
	}
	fmt.Fprintf(w, "scenario %s: %s\n", name, overall(vs))
}

// groupSpec is what a scenario sets when it creates a group ahead of its consumers; zero
// fields take the broker's defaults (start: FROM_NOW).
type groupSpec struct {
	start            *storage.StartPosition
	heartbeatTimeout time.Duration
	maxBackfill      int64
}

// createGroup creates a consumer group (POST /api/v1/topics/{topic}/groups).
func (a *adminAPI) createGroup(ctx context.Context, topic, group string, spec groupSpec) error {
	m := map[string]any{"group": group}
	if spec.start != nil {
		m["start"] = spec.start
	}
	if spec.heartbeatTimeout > 0 {
		m["heartbeat_timeout"] = spec.heartbeatTimeout.String()
	}
	if spec.maxBackfill != 0 {
		m["max_backfill_messages"] = spec.maxBackfill
	}
	body, _ := json.Marshal(m)
	status, resp, err := a.do(ctx, http.MethodPost, "/api/v1/topics/"+url.PathEscape(topic)+"/groups", body)
	if err != nil {
		return err
	}
	if status != http.StatusCreated && status != http.StatusOK {
		return fmt.Errorf("bench: create group %q on %q: HTTP %d: %s", group, topic, status, resp)
	}
	return nil
}

// groupState returns a group's state (ACTIVE, DEAD, ...).
func (a *adminAPI) groupState(ctx context.Context, topic, group string) (string, error) {
	var g struct {
		State string `json:"state"`
	}
	if err := a.getJSON(ctx, "/api/v1/topics/"+url.PathEscape(topic)+"/groups/"+url.PathEscape(group), &g); err != nil {
		return "", err
	}
	return g.State, nil
}

// groupBackfill returns the backfill of a group (its backfill object; zero when it has none).
func (a *adminAPI) groupBackfill(ctx context.Context, topic, group string) (groupBackfillInfo, error) {
	var g struct {
		Backfill *groupBackfillInfo `json:"backfill"`
	}
	if err := a.getJSON(ctx, "/api/v1/topics/"+url.PathEscape(topic)+"/groups/"+url.PathEscape(group), &g); err != nil || g.Backfill == nil {
		return groupBackfillInfo{}, err
	}
	return *g.Backfill, nil
}

// groupBackfillInfo is what a scenario reads of a group's backfill.
type groupBackfillInfo struct {
	State     string `json:"state"`
	Processed int64  `json:"processed"`
	Total     int64  `json:"total"`
	Skipped   int64  `json:"skipped"`
}

// topicStored returns the messages and bytes a topic retains (stats of GET /api/v1/topics/{topic}).
func (a *adminAPI) topicStored(ctx context.Context, topic string) (messages, bytes int64, err error) {
	var t struct {
		Stats *struct {
			Messages int64 `json:"messages"`
			Bytes    int64 `json:"bytes"`
		} `json:"stats"`
	}
	if err := a.getJSON(ctx, "/api/v1/topics/"+url.PathEscape(topic), &t); err != nil {
		return 0, 0, err
	}
	if t.Stats == nil {
		return 0, 0, fmt.Errorf("bench: topic %q: no stats in the answer", topic)
	}
	return t.Stats.Messages, t.Stats.Bytes, nil
}

// cleanupJob is one job of GET /api/v1/cleanup.
type cleanupJob struct {
	Job      string `json:"job"`
	Interval string `json:"interval"`
	Runs     int64  `json:"runs"`
	Removed  int64  `json:"removed"`
}

// cleanupJobs reads the broker's cleanup jobs by name (retention, subscription_lifecycle).
func (a *adminAPI) cleanupJobs(ctx context.Context) (map[string]cleanupJob, error) {
	var l struct {
		Jobs []cleanupJob `json:"jobs"`
	}
	if err := a.getJSON(ctx, "/api/v1/cleanup", &l); err != nil {
		return nil, err
	}
	out := map[string]cleanupJob{}
	for _, j := range l.Jobs {
		out[j.Job] = j
	}
	return out, nil
}

func (a *adminAPI) getJSON(ctx context.Context, path string, v any) error {
	status, resp, err := a.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("bench: GET %s: HTTP %d: %s", path, status, resp)
	}
	if err := json.Unmarshal([]byte(resp), v); err != nil {
		return fmt.Errorf("bench: GET %s: %w", path, err)
	}
	return nil
}

// scenarioTopic names a fresh topic of a scenario run.
func scenarioTopic(scenario, role string, run uint64) string {
	return fmt.Sprintf("scenario.%s.%s.%08x", strings.ReplaceAll(scenario, "-", "_"), role, uint32(run))
}
