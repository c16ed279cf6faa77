package storagetest

import (
	"testing"

	"github.com/spoolmq/spool/internal/storage"
)

func paramsCases() []testCase {
	return []testCase{
		{name: "nil_params_refused", fn: testNilParams},
		{name: "bad_params_refused", fn: testBadParams},
	}
}

// paramCall is one engine call expected to be refused with ErrInvalidArgument.
type paramCall struct {
	what string
	call func(e storage.Engine) error
}

// refusedUnchanged requires every call to fail with ErrInvalidArgument and the engine's topics
// and subscriptions to stay as they were (storage.*Params.Check: bad input changes nothing).
func refusedUnchanged(t *testing.T, x *env, calls []paramCall) {
	t.Helper()
	e := x.rec.engine() // raw: the recorder reads the params
	before := snapshotTopicsSubs(t, x)
	for _, c := range calls {
		errIs(t, c.call(e), storage.ErrInvalidArgument, "%s", c.what)
	}
	equal(t, snapshotTopicsSubs(t, x), before, "topics and subscriptions after refused calls")
}

// snapshotTopicsSubs describes the topics and subscriptions of the engine.
func snapshotTopicsSubs(t *testing.T, x *env) string {
	t.Helper()
	topics, err := x.rec.engine().TopicList(x.ctx)
	noErr(t, err, "TopicList")
	subs, err := x.rec.engine().SubscriptionList(x.ctx, &storage.SubscriptionListParams{IncludeDeleted: true})
	noErr(t, err, "SubscriptionList")
	out := ""
	for _, tp := range topics {
		out += tp.Name + " "
	}
	for _, s := range subs {
		out += string(s.State) + " "
	}
	return out
}

// testNilParams: every method taking parameters refuses nil ones with ErrInvalidArgument (one
// check above both engines: the Check methods of package storage).
func testNilParams(t *testing.T, x *env) {
	x.createTopic("p.nil", storage.TopicConfig{})
	ctx := x.ctx
	refusedUnchanged(t, x, []paramCall{
		{"BindingCreate", func(e storage.Engine) error { _, err := e.BindingCreate(ctx, nil); return err }},
		{"BindingDelete", func(e storage.Engine) error { return e.BindingDelete(ctx, nil) }},
		{"DeliveriesAck", func(e storage.Engine) error { _, err := e.DeliveriesAck(ctx, nil); return err }},
		{"DeliveriesClaim", func(e storage.Engine) error { _, err := e.DeliveriesClaim(ctx, nil); return err }},
		{"DeliveriesExtend", func(e storage.Engine) error { _, err := e.DeliveriesExtend(ctx, nil); return err }},
		{"DeliveriesNack", func(e storage.Engine) error { _, err := e.DeliveriesNack(ctx, nil); return err }},
		{"DeliveriesRelease", func(e storage.Engine) error { _, err := e.DeliveriesRelease(ctx, nil); return err }},
		{"DLQList", func(e storage.Engine) error { _, err := e.DLQList(ctx, nil); return err }},
		{"DLQPurge", func(e storage.Engine) error { _, err := e.DLQPurge(ctx, nil); return err }},
		{"DLQReplay", func(e storage.Engine) error { _, err := e.DLQReplay(ctx, nil); return err }},
		{"SubscriptionCreate", func(e storage.Engine) error { _, err := e.SubscriptionCreate(ctx, nil); return err }},
		{"SubscriptionUpdate", func(e storage.Engine) error { _, err := e.SubscriptionUpdate(ctx, nil); return err }},
		{"TopicCreate", func(e storage.Engine) error { _, err := e.TopicCreate(ctx, nil); return err }},
		{"TopicDelete", func(e storage.Engine) error { return e.TopicDelete(ctx, nil) }},
		{"TopicUpdate", func(e storage.Engine) error { _, err := e.TopicUpdate(ctx, nil); return err }},
	})
}

// testBadParams: fields that are wrong whatever the state are refused the same way by every
// engine, before it looks at the subscription (which does not need to exist).
func testBadParams(t *testing.T, x *env) {
	q := x.queueSub(x.createTopic("p.bad", storage.TopicConfig{}).Name)
	ctx := x.ctx
	const unknown = 1 << 40 // no such subscription: the parameters are refused first
	refusedUnchanged(t, x, []paramCall{
		{"claim with max 0", func(e storage.Engine) error {
			_, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: unknown, Member: "m"})
			return err
		}},
		{"claim without a member", func(e storage.Engine) error {
			_, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: unknown, Max: 1})
			return err
		}},
		{"claim with a negative lease", func(e storage.Engine) error {
			_, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: unknown, Member: "m", Max: 1, LeaseDuration: -1})
			return err
		}},
		{"claim of a partition out of range", func(e storage.Engine) error {
			_, err := e.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: q.ID, Member: "m", Max: 1, Partitions: []int32{1}})
			return err
		}},
		{"extend by a negative duration", func(e storage.Engine) error {
			_, err := e.DeliveriesExtend(ctx, &storage.DeliveriesExtendParams{SubscriptionID: unknown, Member: "m", Duration: -1})
			return err
		}},
		{"nack with a negative delay", func(e storage.Engine) error {
			_, err := e.DeliveriesNack(ctx, &storage.DeliveriesNackParams{SubscriptionID: unknown, Member: "m", Delay: -1})
			return err
		}},
		{"release without a member", func(e storage.Engine) error {
			_, err := e.DeliveriesRelease(ctx, &storage.DeliveriesReleaseParams{SubscriptionID: unknown})
			return err
		}},
		{"DLQ list with a negative limit", func(e storage.Engine) error {
			_, err := e.DLQList(ctx, &storage.DLQListParams{SubscriptionID: unknown, Limit: -1})
			return err
		}},
		{"unknown subscription state", func(e storage.Engine) error {
			_, err := e.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: unknown, State: "SLEEPING"})
			return err
		}},
		{"binding with an invalid group", func(e storage.Engine) error {
			_, err := e.BindingCreate(ctx, &storage.BindingCreateParams{Group: "not valid", Pattern: "a.*"})
			return err
		}},
		{"topic delete of an invalid name", func(e storage.Engine) error {
			return e.TopicDelete(ctx, &storage.TopicDeleteParams{Name: "no spaces allowed"})
		}},
	})
}
