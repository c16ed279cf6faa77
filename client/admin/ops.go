package admin

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Typed calls of the admin API for topics, consumer groups and cleanup (seed 000's
// ConsumerGroupAdmin). Each needs the admin permission on the topic when the broker has auth on
// (MessageCompletion: consume or admin).

// TopicsParams select a page of Client.Topics.
type TopicsParams struct {
	// Pattern, when set, keeps the topics matching this name or wildcard pattern.
	Pattern string
	// Limit is the page size, 1 to 1000; 0 means the server's default (100).
	Limit int
	// Offset is the number of matching topics to skip.
	Offset int
}

// Topics returns a page of topics with their statistics; TopicList.Total counts all that match.
func (c *Client) Topics(ctx context.Context, p TopicsParams) (*TopicList, error) {
	q := url.Values{}
	if p.Pattern != "" {
		q.Set("pattern", p.Pattern)
	}
	if p.Limit > 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	if p.Offset > 0 {
		q.Set("offset", strconv.Itoa(p.Offset))
	}
	var l TopicList
	if _, err := c.Call(ctx, http.MethodGet, "/api/v1/topics", q, nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// CreateTopic creates a topic; zero fields of cfg take the defaults. TOPIC_EXISTS when it exists.
func (c *Client) CreateTopic(ctx context.Context, name string, cfg TopicConfig) (*Topic, error) {
	var t Topic
	if _, err := c.Call(ctx, http.MethodPost, "/api/v1/topics", nil, CreateTopicRequest{Name: name, TopicConfig: cfg}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// DeleteTopic deletes a topic with its messages and subscriptions. It is refused with
// TOPIC_HAS_SUBSCRIPTIONS while live durable groups exist, unless force, which cancels them.
func (c *Client) DeleteTopic(ctx context.Context, name string, force bool) error {
	var q url.Values
	if force {
		q = url.Values{"force": {"true"}}
	}
	_, err := c.Call(ctx, http.MethodDelete, TopicPath(name), q, nil, nil)
	return err
}

// Topic returns a topic with its configuration, statistics and backpressure state.
func (c *Client) Topic(ctx context.Context, topic string) (*Topic, error) {
	var t Topic
	if _, err := c.Call(ctx, http.MethodGet, TopicPath(topic), nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// ListGroupsParams select a page of Client.ListGroups.
type ListGroupsParams struct {
	// Topic and Group, when set, keep that topic's or that group's subscriptions.
	Topic, Group string
	// State, when set, keeps the groups in that state (ACTIVE, PAUSED, DEAD or CANCELLED).
	State SubscriptionState
	// Limit is the page size, 1 to 1000; 0 means the server's default (100).
	Limit int
	// AfterID starts after this subscription ID: GroupList.NextAfterID of the previous page.
	AfterID int64
}

// ListGroups returns a page of groups over all topics, ordered by subscription ID, with their
// health (but not their oldest unacked message). The next page is at GroupList.NextAfterID,
// nil on the last page.
func (c *Client) ListGroups(ctx context.Context, p ListGroupsParams) (*GroupList, error) {
	q := url.Values{}
	for k, v := range map[string]string{"topic": p.Topic, "group": p.Group, "state": string(p.State)} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if p.Limit > 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	if p.AfterID > 0 {
		q.Set("after_id", strconv.FormatInt(p.AfterID, 10))
	}
	var l GroupList
	if _, err := c.Call(ctx, http.MethodGet, "/api/v1/groups", q, nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// TopicGroups lists the groups of a topic with their health and oldest unacked message, all of
// them (it reads the pages of 1000 one after the other).
func (c *Client) TopicGroups(ctx context.Context, topic string) ([]Group, error) {
	var all []Group
	q := url.Values{}
	for {
		var l GroupList
		if _, err := c.Call(ctx, http.MethodGet, TopicPath(topic, "groups"), q, nil, &l); err != nil {
			return nil, err
		}
		all = append(all, l.Groups...)
		if l.NextAfterID == nil {
			return all, nil
		}
		q.Set("after_id", strconv.FormatInt(*l.NextAfterID, 10))
	}
}

// Group returns one group with its health ("" is the queue subscription).
func (c *Client) Group(ctx context.Context, topic, group string) (*Group, error) {
	return c.groupCall(ctx, http.MethodGet, GroupPath(topic, group), nil)
}

// CreateGroup creates a consumer group on a PUB_SUB topic ahead of its consumers (req.Group names
// it): messages from its start on are kept for it. SUBSCRIPTION_EXISTS when it exists.
func (c *Client) CreateGroup(ctx context.Context, topic string, req CreateGroupRequest) (*Group, error) {
	return c.groupCall(ctx, http.MethodPost, TopicPath(topic, "groups"), req)
}

// UpdateGroup changes a group's start position (only while it has delivered nothing, else
// INVALID_TRANSITION) or heartbeat timeout.
func (c *Client) UpdateGroup(ctx context.Context, topic, group string, req UpdateGroupRequest) (*Group, error) {
	return c.groupCall(ctx, http.MethodPut, GroupPath(topic, group, "config"), req)
}

// RemoveGroup cancels a group and deletes it at once.
func (c *Client) RemoveGroup(ctx context.Context, topic, group string) error {
	_, err := c.Call(ctx, http.MethodDelete, GroupPath(topic, group), nil, nil, nil)
	return err
}

// ResurrectGroup makes a DEAD group ACTIVE (INVALID_TRANSITION in any other state). backfill:
// the group gets what it missed while DEAD, bounded to its newest max_backfill_messages; else
// it gives that up and continues at the log end.
func (c *Client) ResurrectGroup(ctx context.Context, topic, group string, backfill bool) (*Group, error) {
	return c.groupCall(ctx, http.MethodPost, GroupPath(topic, group, "resurrect"), ResurrectRequest{Backfill: backfill})
}

// RebalanceGroup reassigns an ordered group's partitions now (after req.Strategy becomes its
// strategy, when set) and returns the group with its new generation and assignment;
// INVALID_ARGUMENT for a shared group.
func (c *Client) RebalanceGroup(ctx context.Context, topic, group string, req RebalanceRequest) (*Group, error) {
	return c.groupCall(ctx, http.MethodPost, GroupPath(topic, group, "rebalance"), req)
}

// ForceComplete completes, for a group, the messages published more than olderThan ago (at
// most limit, 0 for the server's default); ForceCompleteResult.Truncated says to call again.
func (c *Client) ForceComplete(ctx context.Context, topic, group string, olderThan time.Duration, limit int) (*ForceCompleteResult, error) {
	var r ForceCompleteResult
	req := ForceCompleteRequest{OlderThan: Duration(olderThan), Limit: limit}
	if _, err := c.Call(ctx, http.MethodPost, GroupPath(topic, group, "force-complete"), nil, req, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// ForceCompleteTopic completes, for every group of topic (not CANCELLED ones; ORDERED ones are
// skipped with the reason), the messages published more than olderThan ago, at most limit over
// the groups (0 for the server's default), with per-group counts.
func (c *Client) ForceCompleteTopic(ctx context.Context, topic string, olderThan time.Duration, limit int) (*ForceCompleteTopicResult, error) {
	var r ForceCompleteTopicResult
	req := ForceCompleteRequest{OlderThan: Duration(olderThan), Limit: limit}
	if _, err := c.Call(ctx, http.MethodPost, TopicPath(topic, "force-complete"), nil, req, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Backfill returns a group's backfill: state, processed, total, rate, ETA.
func (c *Client) Backfill(ctx context.Context, topic, group string) (*BackfillInfo, error) {
	return c.backfillCall(ctx, http.MethodGet, GroupPath(topic, group, "backfill"), nil)
}

// CancelBackfill stops a group's backfill: the rest of the range is held back until
// ResumeBackfill, or given up at once with skip.
func (c *Client) CancelBackfill(ctx context.Context, topic, group string, skip bool) (*BackfillInfo, error) {
	return c.backfillCall(ctx, http.MethodPost, GroupPath(topic, group, "backfill", "cancel"), BackfillActionRequest{Skip: skip})
}

// ResumeBackfill resumes a CANCELLED or FAILED backfill where it stopped.
func (c *Client) ResumeBackfill(ctx context.Context, topic, group string) (*BackfillInfo, error) {
	return c.backfillCall(ctx, http.MethodPost, GroupPath(topic, group, "backfill", "resume"), nil)
}

// Cleanup returns the cleanup jobs' figures.
func (c *Client) Cleanup(ctx context.Context) (*CleanupList, error) {
	var l CleanupList
	if _, err := c.Call(ctx, http.MethodGet, "/api/v1/cleanup", nil, nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// MessageCompletion returns the completion record of a message of a refcount topic; id is the
// message id ("offset" or "partition:offset").
func (c *Client) MessageCompletion(ctx context.Context, topic, id string) (*MessageCompletion, error) {
	var mc MessageCompletion
	if _, err := c.Call(ctx, http.MethodGet, TopicPath(topic, "messages", id, "completion"), nil, nil, &mc); err != nil {
		return nil, err
	}
	return &mc, nil
}

func (c *Client) groupCall(ctx context.Context, method, path string, in any) (*Group, error) {
	var g Group
	if _, err := c.Call(ctx, method, path, nil, in, &g); err != nil {
		return nil, err
	}
	return &g, nil
}

func (c *Client) backfillCall(ctx context.Context, method, path string, in any) (*BackfillInfo, error) {
	var b BackfillInfo
	if _, err := c.Call(ctx, method, path, nil, in, &b); err != nil {
		return nil, err
	}
	return &b, nil
}
