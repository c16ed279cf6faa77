package storagetest

import (
	"errors"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
)

func bindingCases() []testCase {
	return []testCase{
		{name: "create_list_delete", fn: testBindingBasics},
		{name: "create_past_max_bindings", fn: testBindingCreateMax},
		{name: "topic_create_subscribes_atomically", fn: testBindingTopicCreate},
		{name: "overlapping_patterns", fn: testBindingOverlap},
		{name: "ordered_by_group_then_pattern", fn: testBindingOrder},
		{name: "survives_topic_delete", fn: testBindingTopicRecreate},
		{name: "topic_name_binding_ends_with_topic", fn: testBindingTopicNameDeleted},
		{name: "existing_topics_not_subscribed", fn: testBindingExistingTopics},
	}
}

func testBindingBasics(t *testing.T, x *env) {
	x.advance(time.Minute)
	b, err := x.e.BindingCreate(x.ctx, &storage.BindingCreateParams{Group: "g", Pattern: "orders.*.created", Start: fromBeginning})
	noErr(t, err, "BindingCreate")
	equal(t, b.Group, "g", "group")
	equal(t, b.Pattern, "orders.*.created", "pattern")
	isTrue(t, sameStart(b.Start, fromBeginning), "start %+v", b.Start)
	timeEqual(t, b.CreatedAt, x.now(), "CreatedAt")
	_, err = x.e.BindingCreate(x.ctx, &storage.BindingCreateParams{Group: "g", Pattern: "orders.*.created"})
	errIs(t, err, storage.ErrBindingExists, "second BindingCreate")
	for _, p := range []storage.BindingCreateParams{
		{Group: "g", Pattern: "orders.#.created"},
		{Group: "g", Pattern: ""},
		{Group: "g", Pattern: "a..b"},
		{Group: "bad group", Pattern: "orders.#"},
		{Group: "", Pattern: "orders.#"},
	} {
		_, err = x.e.BindingCreate(x.ctx, &p)
		isTrue(t, errors.Is(err, storage.ErrInvalidArgument) || errors.Is(err, names.ErrInvalidName),
			"BindingCreate(%q, %q): got %v, want an invalid-argument error", p.Group, p.Pattern, err)
	}
	list, err := x.e.BindingList(x.ctx)
	noErr(t, err, "BindingList")
	equal(t, len(list), 1, "bindings")
	equal(t, list[0].Pattern, "orders.*.created", "listed pattern")
	timeEqual(t, list[0].CreatedAt, b.CreatedAt, "listed CreatedAt")

	noErr(t, x.e.BindingDelete(x.ctx, &storage.BindingDeleteParams{Group: "g", Pattern: "orders.*.created"}), "BindingDelete")
	list, err = x.e.BindingList(x.ctx)
	noErr(t, err, "BindingList after delete")
	equal(t, len(list), 0, "bindings after delete")
	err = x.e.BindingDelete(x.ctx, &storage.BindingDeleteParams{Group: "g", Pattern: "orders.*.created"})
	errIs(t, err, storage.ErrBindingNotFound, "second BindingDelete")
	// A plain topic name is a valid pattern.
	_, err = x.e.BindingCreate(x.ctx, &storage.BindingCreateParams{Group: "g", Pattern: "orders.created"})
	noErr(t, err, "BindingCreate with a plain topic name")
}

func testBindingTopicCreate(t *testing.T, x *env) {
	_, err := x.e.BindingCreate(x.ctx, &storage.BindingCreateParams{Group: "g", Pattern: "orders.*.created", Start: storage.StartPosition{}})
	noErr(t, err, "BindingCreate")

	x.createTopic("orders.eu.created", pubSub(1))
	// Published right after the topic exists: the binding's subscription must already take it.
	x.publish("orders.eu.created", msg("first"))
	s, err := x.e.SubscriptionGetByGroup(x.ctx, "orders.eu.created", "g")
	noErr(t, err, "subscription created by the binding")
	equal(t, s.Pattern, "orders.*.created", "pattern of the subscription")
	equal(t, s.State, storage.Active, "state")
	equal(t, s.Ephemeral, false, "ephemeral")
	ds := x.claimAll(s.ID, "m1")
	requireOffsets(t, ds, []int64{0}, "the first message reaches the binding's subscription")
	equal(t, string(ds[0].Payload), "first", "payload")
	_, err = x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "orders.eu.created", Group: "g"})
	errIs(t, err, storage.ErrSubscriptionExists, "SubscriptionCreate for the bound group")

	x.createTopic("orders.eu.shipped", pubSub(1))
	equal(t, len(x.listSubs("orders.eu.shipped")), 0, "a topic that does not match gets no subscription")
	x.createTopic("orders.eu.x.created", pubSub(1))
	equal(t, len(x.listSubs("orders.eu.x.created")), 0, "'*' matches one segment only")

	x.createTopic("orders.us.created", storage.TopicConfig{})
	subs := x.listSubs("orders.us.created")
	equal(t, len(subs), 1, "a matching QUEUE topic keeps its one shared subscription")
	equal(t, subs[0].Group, storage.QueueGroup, "group of the QUEUE topic's subscription")

	noErr(t, x.e.BindingDelete(x.ctx, &storage.BindingDeleteParams{Group: "g", Pattern: "orders.*.created"}), "BindingDelete")
	_, err = x.e.SubscriptionGetByGroup(x.ctx, "orders.eu.created", "g")
	noErr(t, err, "the subscription stays after BindingDelete")
	x.createTopic("orders.de.created", pubSub(1))
	equal(t, len(x.listSubs("orders.de.created")), 0, "no subscription after BindingDelete")
}

func testBindingOverlap(t *testing.T, x *env) {
	for _, b := range []storage.BindingCreateParams{
		{Group: "g", Pattern: "orders.#"},
		{Group: "g", Pattern: "orders.*.created"},
		{Group: "h", Pattern: "#"},
	} {
		_, err := x.e.BindingCreate(x.ctx, &b)
		noErr(t, err, "BindingCreate(%q, %q)", b.Group, b.Pattern)
	}
	x.createTopic("orders.eu.created", pubSub(2))
	subs := x.listSubs("orders.eu.created")
	equal(t, len(subs), 2, "one subscription per group, however many of its patterns match")
	groups := map[string]string{}
	for _, s := range subs {
		groups[s.Group] = s.Pattern
	}
	isTrue(t, groups["g"] == "orders.#" || groups["g"] == "orders.*.created", "pattern of g's subscription: %q", groups["g"])
	equal(t, groups["h"], "#", "pattern of h's subscription")
	x.publish("orders.eu.created", toPartition(1, "x"))
	for _, s := range subs {
		requireRefs(t, RefsOf(x.claimAll(s.ID, "m1")), []storage.DeliveryRef{ref(1, 0)}, "group %s", s.Group)
	}
}

func testBindingOrder(t *testing.T, x *env) {
	for _, b := range []storage.BindingCreateParams{
		{Group: "b", Pattern: "x.#"},
		{Group: "a", Pattern: "y.#"},
		{Group: "a", Pattern: "x.#"},
		{Group: "B", Pattern: "z"},
	} {
		_, err := x.e.BindingCreate(x.ctx, &b)
		noErr(t, err, "BindingCreate(%q, %q)", b.Group, b.Pattern)
	}
	list, err := x.e.BindingList(x.ctx)
	noErr(t, err, "BindingList")
	var got []string
	for _, b := range list {
		got = append(got, b.Group+" "+b.Pattern)
	}
	deepEqual(t, got, []string{"B z", "a x.#", "a y.#", "b x.#"}, "BindingList ordered by group then pattern (byte-wise)")
}

func testBindingTopicRecreate(t *testing.T, x *env) {
	_, err := x.e.BindingCreate(x.ctx, &storage.BindingCreateParams{Group: "g", Pattern: "logs.#"})
	noErr(t, err, "BindingCreate")
	x.createTopic("logs.app", pubSub(1))
	first, err := x.e.SubscriptionGetByGroup(x.ctx, "logs.app", "g")
	noErr(t, err, "first subscription")
	noErr(t, x.e.TopicDelete(x.ctx, &storage.TopicDeleteParams{Name: "logs.app", Force: true}), "TopicDelete")
	list, err := x.e.BindingList(x.ctx)
	noErr(t, err, "BindingList")
	equal(t, len(list), 1, "bindings survive topic deletion")
	x.createTopic("logs.app", pubSub(1))
	second, err := x.e.SubscriptionGetByGroup(x.ctx, "logs.app", "g")
	noErr(t, err, "subscription of the recreated topic")
	isTrue(t, second.ID > first.ID, "a new subscription: %d after %d", second.ID, first.ID)
}

// testBindingTopicNameDeleted: a binding on a plain topic name (what a durable group's Subscribe of
// a topic that does not exist yet registers) goes with the topic's deletion, atomically with it: a
// topic created later under that name gets no subscription for the group, which nobody asked
// for (it would hold retention without members until DEAD). Wildcard bindings matching the
// name, another topic's plain binding, and the plain binding of a name whose delete fails stay;
// so does the effect after a restart.
func testBindingTopicNameDeleted(t *testing.T, x *env) {
	for _, b := range []storage.BindingCreateParams{
		{Group: "g", Pattern: "logs.app"},
		{Group: "h", Pattern: "logs.app"},
		{Group: "w", Pattern: "logs.*"},
		{Group: "g", Pattern: "logs.db"},
	} {
		_, err := x.e.BindingCreate(x.ctx, &b)
		noErr(t, err, "BindingCreate(%q, %q)", b.Group, b.Pattern)
	}
	x.createTopic("logs.app", pubSub(1))
	equal(t, len(x.listSubs("logs.app")), 3, "subscriptions the bindings made")
	// Refused (a live subscription, no force): nothing changes, the bindings included.
	err := x.e.TopicDelete(x.ctx, &storage.TopicDeleteParams{Name: "logs.app"})
	errIs(t, err, storage.ErrTopicHasSubscriptions, "TopicDelete without force")
	bindingPatterns := func(what string) []string {
		t.Helper()
		list, err := x.e.BindingList(x.ctx)
		noErr(t, err, "BindingList %s", what)
		var out []string
		for _, b := range list {
			out = append(out, b.Group+" "+b.Pattern)
		}
		return out
	}
	equal(t, len(bindingPatterns("after a refused delete")), 4, "bindings after a refused delete")

	noErr(t, x.e.TopicDelete(x.ctx, &storage.TopicDeleteParams{Name: "logs.app", Force: true}), "TopicDelete")
	want := []string{"g logs.db", "w logs.*"}
	got := bindingPatterns("after the delete")
	equal(t, len(got), len(want), "bindings after the delete: %q", got)
	for i := range want {
		equal(t, got[i], want[i], "binding %d after the delete", i)
	}
	if x.caps.Restart {
		x.restart()
		got = bindingPatterns("after a restart")
		equal(t, len(got), len(want), "bindings after a restart: %q", got)
	}

	x.createTopic("logs.app", pubSub(1))
	subs := x.listSubs("logs.app")
	equal(t, len(subs), 1, "subscriptions of the topic created again")
	equal(t, subs[0].Group, "w", "the wildcard binding's group")
	_, err = x.e.SubscriptionGetByGroup(x.ctx, "logs.app", "g")
	errIs(t, err, storage.ErrSubscriptionNotFound, "group g on the topic created again")
}

// testBindingExistingTopics: BindingCreate does not subscribe topics that already exist (the broker
// does that with SubscriptionCreate and the binding's start position).
func testBindingExistingTopics(t *testing.T, x *env) {
	x.createTopic("metrics.cpu", pubSub(1))
	_, err := x.e.BindingCreate(x.ctx, &storage.BindingCreateParams{Group: "g", Pattern: "metrics.*"})
	noErr(t, err, "BindingCreate")
	equal(t, len(x.listSubs("metrics.cpu")), 0, "an existing topic gets no subscription from BindingCreate")
	x.createTopic("metrics.mem", pubSub(1))
	equal(t, len(x.listSubs("metrics.mem")), 1, "a topic created afterwards does")
}

// Past MaxBindings a creation fails with ErrLimitExceeded and creates nothing (a binding that
// exists is still ErrBindingExists); once one is deleted there is room again.
func testBindingCreateMax(t *testing.T, x *env) {
	create := func(group string) error {
		_, err := x.e.BindingCreate(x.ctx, &storage.BindingCreateParams{Group: group, Pattern: "mb.*", MaxBindings: 2})
		return err
	}
	noErr(t, create("a"), "first binding")
	noErr(t, create("b"), "second binding")
	errIs(t, create("c"), storage.ErrLimitExceeded, "BindingCreate past MaxBindings")
	errIs(t, create("a"), storage.ErrBindingExists, "BindingCreate of one that exists, at the bound")
	bs, err := x.e.BindingList(x.ctx)
	noErr(t, err, "BindingList")
	equal(t, len(bs), 2, "bindings")
	noErr(t, x.e.BindingDelete(x.ctx, &storage.BindingDeleteParams{Group: "a", Pattern: "mb.*"}), "BindingDelete")
	noErr(t, create("c"), "BindingCreate after a delete")
}
