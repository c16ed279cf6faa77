package storagetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
)

func subscriptionCases() []testCase {
	return []testCase{
		{name: "queue_topic_has_one", fn: testSubQueue},
		{name: "pubsub_one_per_group", fn: testSubPubSub},
		{name: "create_invalid", fn: testSubCreateInvalid},
		{name: "create_past_max_subscriptions", fn: testSubCreateMax},
		{name: "start_from_now", fn: testSubFromNow},
		{name: "start_from_beginning", fn: testSubFromBeginning},
		{name: "start_from_timestamp", fn: testSubFromTimestamp},
		{name: "start_from_timestamp_partitions", fn: testSubFromTimestampPartitions},
		{name: "start_from_message_id", fn: testSubFromMessageID},
		{name: "start_from_message_id_partitions", fn: testSubFromMessageIDPartitions},
		{name: "pause_resume", fn: testSubPauseResume},
		{name: "state_transitions", fn: testSubTransitions},
		{name: "state_same_state_refused", fn: testSubSameState},
		{name: "cancel_and_recreate", fn: testSubCancelRecreate},
		{name: "ephemeral", fn: testSubEphemeral},
		{name: "delete", fn: testSubDelete},
		{name: "list", fn: testSubList},
	}
}

func testSubQueue(t *testing.T, x *env) {
	x.advance(time.Minute)
	x.createTopic("jobs", storage.TopicConfig{})
	subs := x.listSubs("jobs")
	equal(t, len(subs), 1, "subscriptions of a QUEUE topic")
	s := subs[0]
	equal(t, s.Topic, "jobs", "topic")
	equal(t, s.Group, storage.QueueGroup, "group")
	equal(t, s.State, storage.Active, "state")
	equal(t, s.Start.Kind, storage.FromBeginning, "start")
	equal(t, s.Ephemeral, false, "ephemeral")
	equal(t, s.Pattern, "", "pattern")
	timeEqual(t, s.CreatedAt, x.now(), "CreatedAt")
	isTrue(t, s.ID > 0, "subscription ID %d", s.ID)
	requireSameSub(t, x.queueSub("jobs"), s, "GetByGroup($queue)")
	requireSameSub(t, x.getSub(s.ID), s, "SubscriptionGet")
	for _, g := range []string{"workers", storage.QueueGroup} {
		_, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "jobs", Group: g, Start: fromBeginning})
		errIs(t, err, storage.ErrSubscriptionExists, "SubscriptionCreate(%q) on a QUEUE topic", g)
	}
	equal(t, len(x.listSubs("jobs")), 1, "still one subscription")
	// Everything published goes to the one subscription, each message to one member.
	x.publishN("jobs", 0, 4)
	a := x.claim(s.ID, "m1", 2)
	b := x.claim(s.ID, "m2", 10)
	requireOffsets(t, a, []int64{0, 1}, "first member")
	requireOffsets(t, b, []int64{2, 3}, "second member")
}

func testSubPubSub(t *testing.T, x *env) {
	x.createTopic("news", pubSub(1))
	x.advance(time.Second)
	a := x.subscribe("news", "a", fromBeginning)
	equal(t, a.Topic, "news", "topic")
	equal(t, a.Group, "a", "group")
	equal(t, a.State, storage.Active, "state")
	isTrue(t, sameStart(a.Start, fromBeginning), "start %+v", a.Start)
	equal(t, a.Ephemeral, false, "ephemeral")
	timeEqual(t, a.CreatedAt, x.now(), "CreatedAt")
	b := x.subscribe("news", "b", fromBeginning)
	isTrue(t, b.ID > a.ID, "IDs increase: %d then %d", a.ID, b.ID)
	_, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "news", Group: "a"})
	errIs(t, err, storage.ErrSubscriptionExists, "second subscription of group a")
	got, err := x.e.SubscriptionGetByGroup(x.ctx, "news", "b")
	noErr(t, err, "GetByGroup(b)")
	requireSameSub(t, got, b, "GetByGroup(b)")
	_, err = x.e.SubscriptionGetByGroup(x.ctx, "news", "c")
	errIs(t, err, storage.ErrSubscriptionNotFound, "GetByGroup(c)")

	x.publishN("news", 0, 3)
	da := x.claimAll(a.ID, "m1")
	requireOffsets(t, da, []int64{0, 1, 2}, "group a gets every message")
	x.ack(a.ID, "m1", RefsOf(da)...)
	db := x.claimAll(b.ID, "m1")
	requireOffsets(t, db, []int64{0, 1, 2}, "group b gets every message, whatever a did")
	requireAttempts(t, db, 1, "group b")
	x.requireStats(a.ID, wantStats{}, "a after acking")
	x.requireStats(b.ID, wantStats{pending: 3, inFlight: 3}, "b")
}

func testSubCreateInvalid(t *testing.T, x *env) {
	x.createTopic("inv", pubSub(1))
	for _, g := range []string{"", "a b", "a/b", string(make([]byte, 256))} {
		_, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "inv", Group: g})
		isTrue(t, errors.Is(err, storage.ErrInvalidArgument) || errors.Is(err, names.ErrInvalidName),
			"SubscriptionCreate with group %q: got %v, want an invalid-argument error", g, err)
	}
	_, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "inv", Group: "g",
		Start: storage.StartPosition{Kind: "FROM_NOWHERE"}})
	errIs(t, err, storage.ErrInvalidArgument, "unknown start kind")
	equal(t, len(x.listSubs("inv")), 0, "nothing created")
}

func testSubFromNow(t *testing.T, x *env) {
	x.createTopic("now", pubSub(1))
	x.publishN("now", 0, 3)
	s := x.subscribe("now", "g", storage.StartPosition{})
	isTrue(t, s.Start.Kind == "" || s.Start.Kind == storage.FromNow, "start of a zero StartPosition: %q", s.Start.Kind)
	x.requireFloor(s.ID, 0, 3, 3, "FROM_NOW starts after the last message")
	x.requireStats(s.ID, wantStats{}, "FROM_NOW before new messages")
	x.publishN("now", 0, 2)
	requireOffsets(t, x.claimAll(s.ID, "m1"), []int64{3, 4}, "FROM_NOW gets only later messages")

	x.createTopic("now.parts", pubSub(2))
	x.publish("now.parts", toPartition(0, "a"), toPartition(0, "b"), toPartition(1, "c"))
	s2 := x.subscribe("now.parts", "g", storage.StartPosition{Kind: storage.FromNow})
	x.requireFloor(s2.ID, 0, 2, 2, "FROM_NOW partition 0")
	x.requireFloor(s2.ID, 1, 1, 1, "FROM_NOW partition 1")
	x.publish("now.parts", toPartition(1, "d"))
	ds := x.claimAll(s2.ID, "m1")
	requireRefs(t, RefsOf(ds), []storage.DeliveryRef{ref(1, 1)}, "FROM_NOW over partitions")
}

func testSubFromBeginning(t *testing.T, x *env) {
	x.createTopic("beg", pubSub(2))
	x.publish("beg", toPartition(0, "a"), toPartition(1, "b"), toPartition(0, "c"))
	s := x.subscribe("beg", "g", fromBeginning)
	x.requireStats(s.ID, wantStats{pending: 3, lag: 3}, "FROM_BEGINNING")
	x.publish("beg", toPartition(1, "d"))
	ds := x.claimAll(s.ID, "m1")
	requireRefs(t, RefsOf(ds), []storage.DeliveryRef{ref(0, 0), ref(0, 1), ref(1, 0), ref(1, 1)}, "FROM_BEGINNING deliveries")
}

func testSubFromTimestamp(t *testing.T, x *env) {
	x.createTopic("ts", pubSub(1))
	t0 := x.now()
	x.publish("ts", msg("m0"))
	t1 := x.advance(10 * time.Second)
	x.publish("ts", msg("m1"))
	t2 := x.advance(10 * time.Second)
	x.publish("ts", msg("m2"))
	cases := []struct {
		group string
		at    time.Time
		want  []int64
	}{
		{"at-t1", t1, []int64{1, 2}},
		{"after-t1", t1.Add(time.Millisecond), []int64{2}},
		{"before-all", t0.Add(-time.Hour), []int64{0, 1, 2}},
		{"at-t0", t0, []int64{0, 1, 2}},
		{"future", t2.Add(time.Second), nil},
	}
	for _, c := range cases {
		s := x.subscribe("ts", c.group, storage.StartPosition{Kind: storage.FromTimestamp, Time: c.at})
		equal(t, s.Start.Kind, storage.FromTimestamp, "start kind of %s", c.group)
		timeEqual(t, s.Start.Time, c.at, "start time of %s", c.group)
		requireOffsets(t, x.claimAll(s.ID, "m1"), c.want, "FROM_TIMESTAMP %s", c.group)
	}
	x.publish("ts", msg("m3"))
	s, err := x.e.SubscriptionGetByGroup(x.ctx, "ts", "future")
	noErr(t, err, "GetByGroup(future)")
	requireOffsets(t, x.claimAll(s.ID, "m1"), []int64{3}, "a start in the future gets later messages")
}

func testSubFromTimestampPartitions(t *testing.T, x *env) {
	x.createTopic("tsp", pubSub(2))
	x.publish("tsp", toPartition(0, "p0-0"))
	t1 := x.advance(10 * time.Second)
	x.publish("tsp", toPartition(1, "p1-0"), toPartition(0, "p0-1"))
	x.advance(10 * time.Second)
	x.publish("tsp", toPartition(1, "p1-1"))
	s := x.subscribe("tsp", "g", storage.StartPosition{Kind: storage.FromTimestamp, Time: t1})
	x.requireFloor(s.ID, 0, 1, 1, "partition 0 starts at its first message at or after the time")
	x.requireFloor(s.ID, 1, 0, 0, "partition 1 starts at its first message at or after the time")
	requireRefs(t, RefsOf(x.claimAll(s.ID, "m1")), []storage.DeliveryRef{ref(0, 1), ref(1, 0), ref(1, 1)}, "FROM_TIMESTAMP over partitions")
}

func testSubFromMessageID(t *testing.T, x *env) {
	x.createTopic("mid", pubSub(1))
	x.publishN("mid", 0, 5)
	s := x.subscribe("mid", "from-2", storage.StartPosition{Kind: storage.FromMessageID, Offset: 2})
	requireOffsets(t, x.claimAll(s.ID, "m1"), []int64{2, 3, 4}, "FROM_MESSAGE_ID 2")
	s = x.subscribe("mid", "from-0", storage.StartPosition{Kind: storage.FromMessageID, Offset: 0})
	requireOffsets(t, x.claimAll(s.ID, "m1"), []int64{0, 1, 2, 3, 4}, "FROM_MESSAGE_ID 0")
	hw := x.subscribe("mid", "from-hw", storage.StartPosition{Kind: storage.FromMessageID, Offset: 5})
	equal(t, len(x.claimAll(hw.ID, "m1")), 0, "FROM_MESSAGE_ID at the high water")
	_, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "mid", Group: "above",
		Start: storage.StartPosition{Kind: storage.FromMessageID, Offset: 6}})
	errIs(t, err, storage.ErrOffsetOutOfRange, "FROM_MESSAGE_ID above the high water")
	_, err = x.e.SubscriptionGetByGroup(x.ctx, "mid", "above")
	errIs(t, err, storage.ErrSubscriptionNotFound, "nothing created by the refused create")
	_, err = x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "mid", Group: "nopart",
		Start: storage.StartPosition{Kind: storage.FromMessageID, Partition: 3, Offset: 0}})
	errIsAny(t, err, "FROM_MESSAGE_ID in a partition that does not exist", storage.ErrInvalidArgument, storage.ErrOffsetOutOfRange)
	x.publishN("mid", 0, 1)
	requireOffsets(t, x.claimAll(hw.ID, "m1"), []int64{5}, "FROM_MESSAGE_ID at the high water gets later messages")
}

func testSubFromMessageIDPartitions(t *testing.T, x *env) {
	x.createTopic("midp", pubSub(2))
	// p0 at +0, +10, +20 s; p1 at +5, +15, +25 s.
	for i := range 3 {
		x.publish("midp", toPartition(0, fmt.Sprintf("p0-%d", i)))
		x.advance(5 * time.Second)
		x.publish("midp", toPartition(1, fmt.Sprintf("p1-%d", i)))
		x.advance(5 * time.Second)
	}
	// From p0:1 (published at +10 s): p0 from 1, p1 from its first message at or after +10 s (p1:1).
	s := x.subscribe("midp", "a", storage.StartPosition{Kind: storage.FromMessageID, Partition: 0, Offset: 1})
	requireRefs(t, RefsOf(x.claimAll(s.ID, "m1")), []storage.DeliveryRef{ref(0, 1), ref(0, 2), ref(1, 1), ref(1, 2)}, "from 0:1")
	// From p1:1 (published at +15 s): p1 from 1, p0 from p0:2 (+20 s).
	s = x.subscribe("midp", "b", storage.StartPosition{Kind: storage.FromMessageID, Partition: 1, Offset: 1})
	requireRefs(t, RefsOf(x.claimAll(s.ID, "m1")), []storage.DeliveryRef{ref(0, 2), ref(1, 1), ref(1, 2)}, "from 1:1")
	_, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "midp", Group: "c",
		Start: storage.StartPosition{Kind: storage.FromMessageID, Partition: 1, Offset: 4}})
	errIs(t, err, storage.ErrOffsetOutOfRange, "FROM_MESSAGE_ID 1:4 above partition 1's high water")
}

func testSubPauseResume(t *testing.T, x *env) {
	x.createTopic("pr", pubSub(1))
	s := x.subscribe("pr", "g", fromBeginning)
	x.publishN("pr", 0, 2)
	requireOffsets(t, x.claim(s.ID, "m1", 1), []int64{0}, "claim before pause")
	x.advance(time.Second)
	p := x.setState(s.ID, storage.Paused)
	timeEqual(t, p.UpdatedAt, x.now(), "UpdatedAt after pause")
	timeEqual(t, p.CreatedAt, s.CreatedAt, "CreatedAt kept")
	equal(t, x.getSub(s.ID).State, storage.Paused, "SubscriptionGet after pause")
	_, err := x.e.DeliveriesClaim(x.ctx, &storage.DeliveriesClaimParams{SubscriptionID: s.ID, Member: "m1", Max: 1})
	errIs(t, err, storage.ErrSubscriptionNotActive, "claim on a PAUSED subscription")
	equal(t, x.ack(s.ID, "m1", ref(0, 0)).Acked, 1, "a member finishing work acks while PAUSED")
	x.requireStats(s.ID, wantStats{pending: 1, lag: 1}, "PAUSED subscription stats")
	x.setState(s.ID, storage.Active)
	requireOffsets(t, x.claimAll(s.ID, "m1"), []int64{1}, "claim after resume")
}

func testSubTransitions(t *testing.T, x *env) {
	x.createTopic("fsm", pubSub(1))
	states := []storage.SubscriptionState{storage.Active, storage.Paused, storage.Dead, storage.Cancelled, storage.Deleted}
	// Every pair of the five states; DELETED is final (reached through CANCELLED), so an update
	// of a DELETED subscription is refused as a transition, like any other that seed 000 forbids.
	for _, from := range states {
		for _, to := range append(states, "BOGUS") {
			if to == from {
				continue // state_same_state
			}
			group := fmt.Sprintf("%s-to-%s", from, to)
			s := x.subscribe("fsm", group, storage.StartPosition{})
			switch from {
			case storage.Active:
			case storage.Deleted:
				x.setState(s.ID, storage.Cancelled)
				x.setState(s.ID, storage.Deleted)
			default:
				x.setState(s.ID, from)
			}
			got, err := x.e.SubscriptionUpdate(x.ctx, &storage.SubscriptionUpdateParams{ID: s.ID, State: to})
			switch {
			case to == "BOGUS":
				errIsAny(t, err, group, storage.ErrInvalidArgument, storage.ErrInvalidTransition)
			case storage.CanTransition(from, to):
				noErr(t, err, "%s", group)
				equal(t, got.State, to, "%s: state", group)
			default:
				errIs(t, err, storage.ErrInvalidTransition, "%s", group)
			}
			if err != nil {
				equal(t, x.subState(s.ID), from, "%s: state after the refused update", group)
			}
		}
	}
	_, err := x.e.SubscriptionUpdate(x.ctx, &storage.SubscriptionUpdateParams{ID: 1 << 40, State: storage.Paused})
	errIs(t, err, storage.ErrSubscriptionNotFound, "update of an unknown subscription")

	// DEAD and CANCELLED subscriptions cannot claim; a CANCELLED one cannot ack.
	x.publishN("fsm", 0, 1)
	dead := x.subscribe("fsm", "dead", fromBeginning)
	x.setState(dead.ID, storage.Dead)
	_, err = x.e.DeliveriesClaim(x.ctx, &storage.DeliveriesClaimParams{SubscriptionID: dead.ID, Member: "m", Max: 1})
	errIs(t, err, storage.ErrSubscriptionNotActive, "claim on a DEAD subscription")
	x.setState(dead.ID, storage.Active)
	requireOffsets(t, x.claimAll(dead.ID, "m"), []int64{0}, "a resurrected subscription delivers")
	gone := x.subscribe("fsm", "gone", fromBeginning)
	x.claim(gone.ID, "m", 1)
	x.setState(gone.ID, storage.Cancelled)
	_, err = x.e.DeliveriesClaim(x.ctx, &storage.DeliveriesClaimParams{SubscriptionID: gone.ID, Member: "m", Max: 1})
	errIs(t, err, storage.ErrSubscriptionNotActive, "claim on a CANCELLED subscription")
	_, err = x.e.DeliveriesAck(x.ctx, &storage.DeliveriesAckParams{SubscriptionID: gone.ID, Member: "m", Refs: []storage.DeliveryRef{ref(0, 0)}})
	errIs(t, err, storage.ErrSubscriptionNotActive, "ack on a CANCELLED subscription")

	// DELETED subscriptions are skipped by GetByGroup and listed only with IncludeDeleted.
	x.setState(gone.ID, storage.Deleted)
	_, err = x.e.SubscriptionGetByGroup(x.ctx, "fsm", "gone")
	errIs(t, err, storage.ErrSubscriptionNotFound, "GetByGroup of a DELETED subscription")
	for _, s := range x.listSubs("fsm") {
		isTrue(t, s.ID != gone.ID, "SubscriptionList lists DELETED subscription %d", gone.ID)
	}
	all, err := x.e.SubscriptionList(x.ctx, &storage.SubscriptionListParams{Topic: "fsm", IncludeDeleted: true})
	noErr(t, err, "SubscriptionList IncludeDeleted")
	found := false
	for _, s := range all {
		if s.ID == gone.ID {
			found = true
			equal(t, s.State, storage.Deleted, "state of the DELETED subscription")
		}
	}
	isTrue(t, found, "SubscriptionList with IncludeDeleted does not list DELETED subscription %d", gone.ID)
}

// testSubSameState: storage.CanTransition allows no transition from a state to itself, and
// SubscriptionUpdate follows CanTransition, so pausing a PAUSED subscription is
// ErrInvalidTransition (an idempotent no-op would need CanTransition to say so).
func testSubSameState(t *testing.T, x *env) {
	x.createTopic("same", pubSub(1))
	for _, st := range []storage.SubscriptionState{storage.Active, storage.Paused, storage.Dead, storage.Cancelled} {
		isTrue(t, !storage.CanTransition(st, st), "CanTransition(%s, %s)", st, st)
		s := x.subscribe("same", "g-"+string(st), storage.StartPosition{})
		if st != storage.Active {
			x.setState(s.ID, st)
		}
		_, err := x.e.SubscriptionUpdate(x.ctx, &storage.SubscriptionUpdateParams{ID: s.ID, State: st})
		errIs(t, err, storage.ErrInvalidTransition, "%s to %s", st, st)
	}
}

func testSubCancelRecreate(t *testing.T, x *env) {
	x.createTopic("again", pubSub(1))
	x.publishN("again", 0, 2)
	old := x.subscribe("again", "g", fromBeginning)
	x.claim(old.ID, "m1", 1)
	x.setState(old.ID, storage.Cancelled)
	got, err := x.e.SubscriptionGetByGroup(x.ctx, "again", "g")
	noErr(t, err, "GetByGroup after cancel")
	equal(t, got.ID, old.ID, "GetByGroup returns the cancelled subscription while it is the newest")
	equal(t, got.State, storage.Cancelled, "its state")
	_, err = x.e.SubscriptionUpdate(x.ctx, &storage.SubscriptionUpdateParams{ID: old.ID, State: storage.Active})
	errIs(t, err, storage.ErrInvalidTransition, "CANCELLED is terminal")

	fresh := x.subscribe("again", "g", storage.StartPosition{Kind: storage.FromMessageID, Offset: 1})
	isTrue(t, fresh.ID > old.ID, "the new subscription has a new ID: %d after %d", fresh.ID, old.ID)
	got, err = x.e.SubscriptionGetByGroup(x.ctx, "again", "g")
	noErr(t, err, "GetByGroup after recreate")
	equal(t, got.ID, fresh.ID, "GetByGroup returns the newest subscription")
	equal(t, got.State, storage.Active, "state of the new subscription")
	subs := x.listSubs("again")
	equal(t, len(subs), 2, "both subscriptions listed")
	equal(t, subs[0].ID, old.ID, "ordered by ID")
	equal(t, subs[1].ID, fresh.ID, "ordered by ID")
	ds := x.claimAll(fresh.ID, "m1")
	requireOffsets(t, ds, []int64{1}, "the new subscription starts at its own start position")
	requireAttempts(t, ds, 1, "the new subscription shares no delivery state")
}

func testSubEphemeral(t *testing.T, x *env) {
	x.createTopic("eph", pubSub(1))
	s, err := x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "eph", Group: "eph-1", Ephemeral: true})
	noErr(t, err, "ephemeral SubscriptionCreate")
	equal(t, s.Ephemeral, true, "Ephemeral")
	equal(t, s.State, storage.Active, "state")
	equal(t, x.getSub(s.ID).Ephemeral, true, "SubscriptionGet Ephemeral")
	subs := x.listSubs("eph")
	equal(t, len(subs), 1, "listed")
	x.publishN("eph", 0, 2)
	ds := x.claimAll(s.ID, "member-1")
	requireOffsets(t, ds, []int64{0, 1}, "deliveries")
	noErr(t, x.e.SubscriptionDelete(x.ctx, s.ID), "SubscriptionDelete when the member leaves")
	equal(t, len(x.listSubs("eph")), 0, "gone after delete")
	_, err = x.e.SubscriptionGet(x.ctx, s.ID)
	errIs(t, err, storage.ErrSubscriptionNotFound, "SubscriptionGet after delete")
}

func testSubDelete(t *testing.T, x *env) {
	x.createTopic("sd", pubSub(1))
	x.publishN("sd", 0, 3)
	s := x.subscribe("sd", "g", fromBeginning)
	other := x.subscribe("sd", "other", fromBeginning)
	ds := x.claim(s.ID, "m1", 2)
	requireOffsets(t, ds, []int64{0, 1}, "claimed")
	x.nack(storage.DeliveriesNackParams{SubscriptionID: s.ID, Member: "m1", Refs: []storage.DeliveryRef{ds[0].Ref()}, ToDLQ: true})
	noErr(t, x.e.SubscriptionDelete(x.ctx, s.ID), "SubscriptionDelete")
	_, err := x.e.SubscriptionGet(x.ctx, s.ID)
	errIs(t, err, storage.ErrSubscriptionNotFound, "SubscriptionGet after delete")
	_, err = x.e.SubscriptionGetByGroup(x.ctx, "sd", "g")
	errIs(t, err, storage.ErrSubscriptionNotFound, "GetByGroup after delete")
	_, err = x.e.SubscriptionStats(x.ctx, s.ID)
	errIs(t, err, storage.ErrSubscriptionNotFound, "SubscriptionStats after delete")
	_, err = x.e.DeliveriesClaim(x.ctx, &storage.DeliveriesClaimParams{SubscriptionID: s.ID, Member: "m1", Max: 1})
	errIsAny(t, err, "claim after delete", storage.ErrSubscriptionNotFound, storage.ErrSubscriptionNotActive)
	_, err = x.e.DeliveriesAck(x.ctx, &storage.DeliveriesAckParams{SubscriptionID: s.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 1)}})
	errIsAny(t, err, "ack after delete", storage.ErrSubscriptionNotFound, storage.ErrSubscriptionNotActive)
	entries, err := x.e.DLQList(x.ctx, &storage.DLQListParams{SubscriptionID: s.ID})
	if err == nil {
		equal(t, len(entries), 0, "DLQ entries of a deleted subscription")
	} else {
		errIs(t, err, storage.ErrSubscriptionNotFound, "DLQList after delete")
	}
	err = x.e.SubscriptionDelete(x.ctx, s.ID)
	errIs(t, err, storage.ErrSubscriptionNotFound, "second SubscriptionDelete")
	subs := x.listSubs("sd")
	equal(t, len(subs), 1, "the other subscription stays")
	equal(t, subs[0].ID, other.ID, "the other subscription stays")
	requireOffsets(t, x.claimAll(other.ID, "m1"), []int64{0, 1, 2}, "the other group is untouched")

	again := x.subscribe("sd", "g", fromBeginning)
	isTrue(t, again.ID > other.ID, "new ID %d", again.ID)
	ds = x.claimAll(again.ID, "m1")
	requireOffsets(t, ds, []int64{0, 1, 2}, "a group subscribing again after delete starts fresh")
	requireAttempts(t, ds, 1, "fresh attempts")
	equal(t, len(x.dlq(again.ID)), 0, "fresh DLQ")
}

func testSubList(t *testing.T, x *env) {
	x.createTopic("l.a", pubSub(1))
	x.createTopic("l.b", storage.TopicConfig{})
	a1 := x.subscribe("l.a", "g1", storage.StartPosition{})
	q := x.queueSub("l.b")
	a2 := x.subscribe("l.a", "g2", storage.StartPosition{})
	all, err := x.e.SubscriptionList(x.ctx, &storage.SubscriptionListParams{})
	noErr(t, err, "SubscriptionList")
	var ids []int64
	for _, s := range all {
		ids = append(ids, s.ID)
	}
	deepEqual(t, ids, []int64{q.ID, a1.ID, a2.ID}, "all subscriptions ordered by ID (the queue subscription was created with its topic)")
	la := x.listSubs("l.a")
	equal(t, len(la), 2, "subscriptions of l.a")
	equal(t, la[0].ID, a1.ID, "first of l.a")
	equal(t, la[1].ID, a2.ID, "second of l.a")
}

// Past MaxSubscriptions the creation of a durable subscription fails with ErrLimitExceeded and
// creates nothing, concurrent creations included; ephemeral subscriptions are not counted; once a
// subscription is deleted there is room again.
func testSubCreateMax(t *testing.T, x *env) {
	x.createTopic("ms", pubSub(1))
	create := func(group string, max int) (*storage.Subscription, error) {
		return x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "ms", Group: group, MaxSubscriptions: max})
	}
	first, err := create("g1", 2)
	noErr(t, err, "first group")
	_, err = create("g2", 2)
	noErr(t, err, "second group")
	_, err = create("g3", 2)
	errIs(t, err, storage.ErrLimitExceeded, "SubscriptionCreate past MaxSubscriptions")
	_, err = x.e.SubscriptionCreate(x.ctx, &storage.SubscriptionCreateParams{Topic: "ms", Ephemeral: true, MaxSubscriptions: 2})
	noErr(t, err, "an ephemeral subscription at the bound")
	created := createConcurrently(t, 4, "concurrent SubscriptionCreate", func(i int) error {
		_, err := create("r"+string(rune('0'+i)), 4)
		return err
	})
	equal(t, created, 2, "concurrent creations up to MaxSubscriptions 4 with 2 groups")
	durable := 0
	for _, s := range x.listSubs("ms") {
		if !s.Ephemeral {
			durable++
		}
	}
	equal(t, durable, 4, "durable subscriptions")
	noErr(t, x.e.SubscriptionDelete(x.ctx, first.ID), "SubscriptionDelete")
	_, err = create("g3", 4)
	noErr(t, err, "SubscriptionCreate after a delete")
}
