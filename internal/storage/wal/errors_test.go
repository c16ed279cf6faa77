package wal

import (
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

// TestErrorCases covers the input errors the conformance suite does not: each fails with the
// sentinel and changes nothing.
func TestErrorCases(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.createTopic("q", storage.TopicConfig{Partitions: 2})
	h.createTopic("f", storage.TopicConfig{Semantics: storage.PubSub})
	q := h.queueSub("q")
	h.publishN("q", 4)
	cancelled := h.subscribe("f", "gone", storage.StartPosition{})
	_, err := h.e.SubscriptionUpdate(h.ctx, &storage.SubscriptionUpdateParams{ID: cancelled.ID, State: storage.Cancelled})
	h.must(err, "cancel")
	ctx, e := h.ctx, h.e
	before := project(e)
	cases := []struct {
		name   string
		target error
		call   func() error
	}{
		{"claim without member", storage.ErrInvalidArgument, func() error {
			_, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID, Max: 1})
			return err
		}},
		{"claim with a negative lease", storage.ErrInvalidArgument, func() error {
			_, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m", Max: 1, LeaseDuration: -1})
			return err
		}},
		{"claim of an unknown partition", storage.ErrInvalidArgument, func() error {
			_, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m", Max: 1, Partitions: []int32{2}})
			return err
		}},
		{"nack with a negative delay", storage.ErrInvalidArgument, func() error {
			_, err := e.DeliveriesNack(ctx, &storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m", Delay: -1})
			return err
		}},
		{"nack on a cancelled subscription", storage.ErrSubscriptionNotActive, func() error {
			_, err := e.DeliveriesNack(ctx, &storage.DeliveriesNackParams{SubscriptionID: cancelled.ID, Member: "m"})
			return err
		}},
		{"extend with a negative duration", storage.ErrInvalidArgument, func() error {
			_, err := e.DeliveriesExtend(ctx, &storage.DeliveriesExtendParams{SubscriptionID: q.ID, Member: "m", Duration: -1})
			return err
		}},
		{"extend on an unknown subscription", storage.ErrSubscriptionNotFound, func() error {
			_, err := e.DeliveriesExtend(ctx, &storage.DeliveriesExtendParams{SubscriptionID: 999, Member: "m"})
			return err
		}},
		{"release without member", storage.ErrInvalidArgument, func() error {
			_, err := e.DeliveriesRelease(ctx, &storage.DeliveriesReleaseParams{SubscriptionID: q.ID})
			return err
		}},
		{"release on a cancelled subscription", storage.ErrSubscriptionNotActive, func() error {
			_, err := e.DeliveriesRelease(ctx, &storage.DeliveriesReleaseParams{SubscriptionID: cancelled.ID, Member: "m"})
			return err
		}},
		{"DLQ replay on a cancelled subscription", storage.ErrSubscriptionNotActive, func() error {
			_, err := e.DLQReplay(ctx, &storage.DLQReplayParams{SubscriptionID: cancelled.ID})
			return err
		}},
		{"DLQ purge on an unknown subscription", storage.ErrSubscriptionNotFound, func() error {
			_, err := e.DLQPurge(ctx, &storage.DLQPurgeParams{SubscriptionID: 999})
			return err
		}},
		{"DLQ list with a negative limit", storage.ErrInvalidArgument, func() error {
			_, err := e.DLQList(ctx, &storage.DLQListParams{SubscriptionID: q.ID, Limit: -1})
			return err
		}},
		{"empty append", storage.ErrInvalidArgument, func() error {
			_, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "q"})
			return err
		}},
		{"append to an invalid name", storage.ErrInvalidArgument, func() error {
			_, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "a..b", Messages: []storage.AppendMessage{{Partition: -1}}})
			return err
		}},
		{"append to partition -2", storage.ErrInvalidArgument, func() error {
			_, err := e.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: "q", Messages: []storage.AppendMessage{{Partition: -1}, {Partition: -2}}})
			return err
		}},
		{"read at a negative offset", storage.ErrInvalidArgument, func() error {
			_, err := e.MessagesRead(ctx, &storage.MessagesReadParams{Topic: "q", Offset: -1})
			return err
		}},
		{"read of an unknown partition", storage.ErrInvalidArgument, func() error {
			_, err := e.MessagesRead(ctx, &storage.MessagesReadParams{Topic: "q", Partition: 2})
			return err
		}},
		{"durable PUB_SUB subscription without group", storage.ErrInvalidArgument, func() error {
			_, err := e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "f"})
			return err
		}},
		{"queue group on a PUB_SUB topic", storage.ErrInvalidArgument, func() error {
			_, err := e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "f", Group: storage.QueueGroup})
			return err
		}},
		{"invalid group", storage.ErrInvalidArgument, func() error {
			_, err := e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "f", Group: "a b"})
			return err
		}},
		{"FROM_MESSAGE_ID of an unknown partition", storage.ErrInvalidArgument, func() error {
			_, err := e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "f", Group: "g",
				Start: storage.StartPosition{Kind: storage.FromMessageID, Partition: 3}})
			return err
		}},
		{"unknown subscription state", storage.ErrInvalidArgument, func() error {
			_, err := e.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: q.ID, State: "SLEEPING"})
			return err
		}},
		{"binding with an invalid pattern", storage.ErrInvalidArgument, func() error {
			_, err := e.BindingCreate(ctx, &storage.BindingCreateParams{Group: "g", Pattern: "a.#.b"})
			return err
		}},
		{"QUEUE to PUB_SUB onto an invalid group", storage.ErrInvalidArgument, func() error {
			_, err := e.TopicUpdate(ctx, &storage.TopicUpdateParams{Name: "q", Config: storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2},
				QueueToGroup: "not valid"})
			return err
		}},
		{"nil params", storage.ErrInvalidArgument, func() error {
			_, err := e.DeliveriesAck(ctx, nil)
			return err
		}},
	}
	for _, c := range cases {
		errIs(t, c.call(), c.target, c.name)
	}
	diffProjection(t, before, project(e))

	// PUB_SUB to QUEUE with a live ephemeral subscription is refused.
	_, err = e.SubscriptionCreate(ctx, &storage.SubscriptionCreateParams{Topic: "f", Ephemeral: true})
	h.must(err, "ephemeral")
	_, err = e.TopicUpdate(ctx, &storage.TopicUpdateParams{Name: "f", Config: storage.TopicConfig{}})
	errIs(t, err, storage.ErrTopicHasSubscriptions, "PUB_SUB to QUEUE with an ephemeral subscription")
}
