package broker

import (
	"context"
	"errors"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
)

// TestModeConflictLeavesDeadGroupDead: group g's subscription is DEAD; a member asking for the
// other mode (shared on an ordered group, ordered on a shared one) is refused with
// storage.ErrModeConflict and changes nothing: the subscription stays DEAD, with its mode, and
// is not backfilled. A member asking for g's mode then resurrects it. On the embedded engine and
// on PostgreSQL.
func TestModeConflictLeavesDeadGroupDead(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name          string
		group, member storage.SubscriptionMode
	}{
		{"shared member on an ordered group", storage.ModeOrdered, storage.ModeShared},
		{"ordered member on a shared group", storage.ModeShared, storage.ModeOrdered},
	} {
		t.Run("wal/"+c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, nil)
			testModeConflictLeavesDeadGroupDead(t, e.b, e.engine, c.group, c.member)
		})
		t.Run("postgres/"+c.name, func(t *testing.T) {
			t.Parallel()
			url := testutil.DatabaseURL(t)
			in := startPGInstance(t, url, testutil.PGSchema(t, url, "t_bmodedead_"), newFakeClock())
			testModeConflictLeavesDeadGroupDead(t, in.b, in.eng, c.group, c.member)
		})
	}
}

func testModeConflictLeavesDeadGroupDead(t *testing.T, b *Broker, eng storage.Engine, groupMode, memberMode storage.SubscriptionMode) {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := b.CreateTopic(ctx, "t", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	sub, err := b.CreateGroup(ctx, CreateGroupParams{Topic: "t", Group: "g", Ordered: groupMode == storage.ModeOrdered})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: sub.ID, State: storage.Dead}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Publish(ctx, "t", []storage.AppendMessage{{Partition: 0, Payload: []byte("missed")}}); err != nil {
		t.Fatal(err)
	}

	m, err := b.Subscribe(ctx, SubscribeParams{Pattern: "t", Group: "g", Mode: memberMode})
	if !errors.Is(err, storage.ErrModeConflict) {
		t.Fatalf("Subscribe of a %s member on DEAD %s group g: %v, %v; want ErrModeConflict", modeName(memberMode), modeName(groupMode), m, err)
	}
	got, err := eng.SubscriptionGet(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != storage.Dead || got.Mode != groupMode || got.Backfill != nil {
		t.Fatalf("after the refused Subscribe g is %s, mode %s, backfill %+v; want DEAD, %s, none", got.State, modeName(got.Mode), got.Backfill, modeName(groupMode))
	}
	if g, err := b.Group(ctx, "t", "g"); err != nil || len(g.Members) != 0 {
		t.Fatalf("group g %+v, %v: want it without members", g, err)
	}

	if _, err := b.Subscribe(ctx, SubscribeParams{Pattern: "t", Group: "g", Mode: groupMode}); err != nil {
		t.Fatalf("Subscribe of a %s member: %v", modeName(groupMode), err)
	}
	if got, err := eng.SubscriptionGet(ctx, sub.ID); err != nil || got.State != storage.Active {
		t.Fatalf("after a %s member subscribed g is %+v, %v; want ACTIVE", modeName(groupMode), got, err)
	}
}
