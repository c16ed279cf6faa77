package bench

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// adminTimeout bounds one HTTP admin call.
const adminTimeout = 30 * time.Second

// TopicInfo says which topic a run used and how it got it.
type TopicInfo struct {
	Name string `json:"name"`
	// Semantics is PUB_SUB or QUEUE ("" when unknown: an existing topic, or auto-created).
	Semantics  string `json:"semantics"`
	Partitions int    `json:"partitions,omitempty"`
	// MessageRetention and MaxRetention are the overrides a run gave the topic it created ("":
	// the broker's default), as Go durations.
	MessageRetention string `json:"message_retention,omitempty"`
	MaxRetention     string `json:"max_retention,omitempty"`
	// Completion is the completion_tracking a run gave the topic it created ("": the broker's).
	Completion string `json:"completion_tracking,omitempty"`
	// Created: the run created the topic; Deleted: and deleted it afterwards.
	Created bool `json:"created"`
	Deleted bool `json:"deleted"`
}

// adminAPI is a minimal client of the broker's HTTP admin API.
type adminAPI struct {
	base  string
	hc    *http.Client
	token string
}

func newAdmin(base string, tlsCfg *tls.Config, token string) *adminAPI {
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	hc := &http.Client{Timeout: adminTimeout}
	if tlsCfg != nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = tlsCfg
		hc.Transport = tr
	}
	return &adminAPI{base: strings.TrimRight(base, "/"), hc: hc, token: token}
}

// topicSpec is what a run asks of the topic it creates.
type topicSpec struct {
	semantics                      string
	partitions                     int
	messageRetention, maxRetention time.Duration // 0: the broker's default
	maxBacklogMessages             int64
	backlogPolicy                  string
	completion                     string // "": the broker's default
}

// body returns the JSON body of POST /api/v1/topics (the admin API's field names).
func (s topicSpec) body(name string) []byte {
	m := map[string]any{"name": name, "semantics": s.semantics, "partitions": s.partitions}
	if s.messageRetention > 0 {
		m["message_retention"] = s.messageRetention.String()
	}
	if s.maxRetention > 0 {
		m["max_retention"] = s.maxRetention.String()
	}
	if s.maxBacklogMessages > 0 {
		m["max_backlog_messages"] = s.maxBacklogMessages
	}
	if s.backlogPolicy != "" {
		m["backlog_policy"] = s.backlogPolicy
	}
	if s.completion != "" {
		m["completion_tracking"] = s.completion
	}
	b, _ := json.Marshal(m)
	return b
}

// createTopic creates a topic; exists reports that a topic of that name existed already (HTTP
// 409), which is not an error.
func (a *adminAPI) createTopic(ctx context.Context, name string, spec topicSpec) (exists bool, err error) {
	status, resp, err := a.do(ctx, http.MethodPost, "/api/v1/topics", spec.body(name))
	switch {
	case err != nil:
		return false, err
	case status == http.StatusCreated:
		return false, nil
	case status == http.StatusConflict && strings.Contains(resp, "TOPIC_EXISTS"):
		return true, nil
	}
	return false, fmt.Errorf("bench: create topic %q: HTTP %d: %s", name, status, resp)
}

// Backpressure is what the broker says of a bounded topic's backpressure at the end of a run.
type Backpressure struct {
	MaxBacklogMessages int64  `json:"max_backlog_messages"`
	Policy             string `json:"policy"`
	State              string `json:"state"`
	BacklogMessages    int64  `json:"backlog_messages"`
	// Throttled and Rejected count the publishes the broker delayed and refused (RATE_LIMITED;
	// the client retried them after the retry-after hint).
	Throttled int64 `json:"throttled"`
	Rejected  int64 `json:"rejected"`
}

// topicBackpressure reads a topic's backpressure (nil when it has no backlog bound).
func (a *adminAPI) topicBackpressure(ctx context.Context, name string) (*Backpressure, error) {
	status, resp, err := a.do(ctx, http.MethodGet, "/api/v1/topics/"+url.PathEscape(name), nil)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("bench: get topic %q: HTTP %d: %s", name, status, resp)
	}
	var t struct {
		Backpressure *Backpressure `json:"backpressure"`
	}
	if err := json.Unmarshal([]byte(resp), &t); err != nil {
		return nil, fmt.Errorf("bench: get topic %q: %w", name, err)
	}
	return t.Backpressure, nil
}

// groupBacklogs returns what the broker still holds for each group of a topic, by group name:
// its pending messages (never delivered, leased or waiting for redelivery) plus its
// dead-lettered ones.
func (a *adminAPI) groupBacklogs(ctx context.Context, name string) (map[string]int64, error) {
	status, resp, err := a.do(ctx, http.MethodGet, "/api/v1/topics/"+url.PathEscape(name)+"/groups", nil)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("bench: list groups of %q: HTTP %d: %s", name, status, resp)
	}
	var l struct {
		Groups []struct {
			Group        string `json:"group"`
			Pending      int64  `json:"pending"`
			DeadLettered int64  `json:"dead_lettered"`
		} `json:"groups"`
	}
	if err := json.Unmarshal([]byte(resp), &l); err != nil {
		return nil, fmt.Errorf("bench: list groups of %q: %w", name, err)
	}
	out := make(map[string]int64, len(l.Groups))
	for _, g := range l.Groups {
		out[g.Group] = g.Pending + g.DeadLettered
	}
	return out, nil
}

// topicSemantics returns the semantics and partitions of an existing topic.
func (a *adminAPI) topicSemantics(ctx context.Context, name string) (semantics string, partitions int, err error) {
	status, resp, err := a.do(ctx, http.MethodGet, "/api/v1/topics/"+url.PathEscape(name), nil)
	if err != nil {
		return "", 0, err
	}
	if status != http.StatusOK {
		return "", 0, fmt.Errorf("bench: get topic %q: HTTP %d: %s", name, status, resp)
	}
	var t struct {
		Config struct {
			Semantics  string `json:"semantics"`
			Partitions int    `json:"partitions"`
		} `json:"config"`
	}
	if err := json.Unmarshal([]byte(resp), &t); err != nil {
		return "", 0, fmt.Errorf("bench: get topic %q: %w", name, err)
	}
	return t.Config.Semantics, t.Config.Partitions, nil
}

// deleteTopic deletes a topic with its messages, cancelling its groups.
func (a *adminAPI) deleteTopic(ctx context.Context, name string) error {
	status, resp, err := a.do(ctx, http.MethodDelete, "/api/v1/topics/"+url.PathEscape(name)+"?force=true", nil)
	if err != nil {
		return err
	}
	if status != http.StatusNoContent {
		return fmt.Errorf("bench: delete topic %q: HTTP %d: %s", name, status, resp)
	}
	return nil
}

func (a *adminAPI) do(ctx context.Context, method, path string, body []byte) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, bytes.NewReader(body))
	if err != nil {
		return 0, "", fmt.Errorf("bench: admin API: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("bench: admin API (give --http, or --no-admin to let the first publish create a QUEUE topic): %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, strings.TrimSpace(string(b)), nil
}
