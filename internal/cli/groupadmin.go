package cli

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/spoolmq/spool/client/admin"
)

// The typed calls of package client/admin that spool group and spool doctor make, with the
// CLI's hint on a transport failure.

// Topic returns a topic with its configuration, statistics and backpressure state.
func (c *AdminClient) Topic(ctx context.Context, topic string) (*admin.Topic, error) {
	t, err := c.Client.Topic(ctx, topic)
	return t, c.hint(err)
}

// TopicGroups lists the groups of a topic with their health and oldest unacked message.
func (c *AdminClient) TopicGroups(ctx context.Context, topic string) ([]admin.Group, error) {
	gs, err := c.Client.TopicGroups(ctx, topic)
	return gs, c.hint(err)
}

// Group returns one group with its health ("" is the queue subscription).
func (c *AdminClient) Group(ctx context.Context, topic, group string) (*admin.Group, error) {
	g, err := c.Client.Group(ctx, topic, group)
	return g, c.hint(err)
}

// RemoveGroup cancels a group and deletes it at once.
func (c *AdminClient) RemoveGroup(ctx context.Context, topic, group string) error {
	return c.hint(c.Client.RemoveGroup(ctx, topic, group))
}

// ResurrectGroup makes a DEAD group ACTIVE, with or without the backfill of what it missed.
func (c *AdminClient) ResurrectGroup(ctx context.Context, topic, group string, backfill bool) (*admin.Group, error) {
	g, err := c.Client.ResurrectGroup(ctx, topic, group, backfill)
	return g, c.hint(err)
}

// ForceCompleteGroup completes, for a group, the messages published more than olderThan ago (at
// most limit, 0 for the server's default).
func (c *AdminClient) ForceCompleteGroup(ctx context.Context, topic, group string, olderThan time.Duration, limit int) (*admin.ForceCompleteResult, error) {
	r, err := c.Client.ForceComplete(ctx, topic, group, olderThan, limit)
	return r, c.hint(err)
}

// ForceCompleteTopic completes, for every group of topic, the messages published more than
// olderThan ago (at most limit over the groups, 0 for the server's default), with per-group
// counts (POST /api/v1/topics/{topic}/force-complete).
func (c *AdminClient) ForceCompleteTopic(ctx context.Context, topic string, olderThan time.Duration, limit int) (*admin.ForceCompleteTopicResult, error) {
	r, err := c.Client.ForceCompleteTopic(ctx, topic, olderThan, limit)
	return r, c.hint(err)
}

// Cleanup returns the cleanup jobs' figures.
func (c *AdminClient) Cleanup(ctx context.Context) (*admin.CleanupList, error) {
	l, err := c.Client.Cleanup(ctx)
	return l, c.hint(err)
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
