package cli

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/spoolmq/spool/internal/admin"
)

// Typed calls of the admin API for consumer-group operations and diagnosis (seed 000's
// ConsumerGroupAdmin). The Go client (package client) speaks the binary protocol only; these are
// the Go API of the HTTP admin routes, used by spool group and spool doctor.

// Topic returns a topic with its configuration, statistics and backpressure state.
func (c *AdminClient) Topic(ctx context.Context, topic string) (*admin.Topic, error) {
	var t admin.Topic
	if _, err := c.Call(ctx, http.MethodGet, TopicPath(topic), nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// TopicGroups lists the groups of a topic with their health and oldest unacked message.
func (c *AdminClient) TopicGroups(ctx context.Context, topic string) ([]admin.Group, error) {
	var l admin.GroupList
	if _, err := c.Call(ctx, http.MethodGet, TopicPath(topic, "groups"), nil, nil, &l); err != nil {
		return nil, err
	}
	return l.Groups, nil
}

// Group returns one group with its health ("" is the queue subscription).
func (c *AdminClient) Group(ctx context.Context, topic, group string) (*admin.Group, error) {
	var g admin.Group
	if _, err := c.Call(ctx, http.MethodGet, GroupPath(topic, group), nil, nil, &g); err != nil {
		return nil, err
	}
	return &g, nil
}

// RemoveGroup cancels a group and deletes it at once.
func (c *AdminClient) RemoveGroup(ctx context.Context, topic, group string) error {
	_, err := c.Call(ctx, http.MethodDelete, GroupPath(topic, group), nil, nil, nil)
	return err
}

// ResurrectGroup makes a DEAD group ACTIVE; backfill is refused by the server (not built).
func (c *AdminClient) ResurrectGroup(ctx context.Context, topic, group string, backfill bool) (*admin.Group, error) {
	var g admin.Group
	if _, err := c.Call(ctx, http.MethodPost, GroupPath(topic, group, "resurrect"), nil, admin.ResurrectRequest{Backfill: backfill}, &g); err != nil {
		return nil, err
	}
	return &g, nil
}

// ForceCompleteGroup completes, for a group, the messages published more than olderThan ago (at
// most limit, 0 for the server's default).
func (c *AdminClient) ForceCompleteGroup(ctx context.Context, topic, group string, olderThan time.Duration, limit int) (*admin.ForceCompleteResult, error) {
	var r admin.ForceCompleteResult
	req := admin.ForceCompleteRequest{OlderThan: admin.Duration(olderThan), Limit: limit}
	if _, err := c.Call(ctx, http.MethodPost, GroupPath(topic, group, "force-complete"), nil, req, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Cleanup returns the cleanup jobs' figures.
func (c *AdminClient) Cleanup(ctx context.Context) (*admin.CleanupList, error) {
	var l admin.CleanupList
	if _, err := c.Call(ctx, http.MethodGet, "/api/v1/cleanup", nil, nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// Ready reads /readyz: the status (and detail) when ready; when not ready (503) a status
// "not ready" with the error's message as detail, and no error.
func (c *AdminClient) Ready(ctx context.Context) (*admin.Status, error) {
	var s admin.Status
	_, err := c.Call(ctx, http.MethodGet, "/readyz", nil, nil, &s)
	var ae *APIError
	if errors.As(err, &ae) && ae.Status == http.StatusServiceUnavailable {
		return &admin.Status{Status: "not ready", Detail: ae.Code + ": " + ae.Message}, nil
	}
	if err != nil {
		return nil, err
	}
	return &s, nil
}
