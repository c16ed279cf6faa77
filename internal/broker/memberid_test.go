package broker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
)

// subscribeAs subscribes member id of principal to ordered group g of topic on b.
func subscribeAs(ctx context.Context, b *Broker, principal, topic, id string) (*Member, error) {
	return b.Subscribe(ctx, SubscribeParams{Pattern: topic, Group: "g", MemberID: id, Principal: principal,
		Mode: storage.ModeOrdered, Start: storage.StartPosition{Kind: storage.FromBeginning}})
}

// TestMemberIDsScopedByPrincipal: on one broker, alice's and bob's members that both choose the
// id w join one ordered group side by side: each sees w, the group knows them as w@alice and
// w@bob and gives each a partition. alice choosing w again is refused as before (her w is live),
// a member without a principal (no authentication) keeps the bare id, and bob leaving moves only
// his partition.
func TestMemberIDsScopedByPrincipal(t *testing.T) {
	e := orderedEnv(t)
	e.createTopic("o", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2, AckWait: time.Hour})
	alice, err := subscribeAs(e.ctx(), e.b, "alice", "o", "w")
	if err != nil {
		t.Fatal(err)
	}
	bob, err := subscribeAs(e.ctx(), e.b, "bob", "o", "w")
	if err != nil {
		t.Fatalf("bob's member w: %v, want it beside alice's", err)
	}
	for _, m := range []*Member{alice, bob} {
		if m.ClientID() != "w" {
			t.Errorf("member %s: client id %q, want w", m.ID(), m.ClientID())
		}
	}
	if alice.ID() != "w@alice" || bob.ID() != "w@bob" {
		t.Fatalf("member keys %q, %q, want w@alice, w@bob", alice.ID(), bob.ID())
	}
	a := e.waitAssignment("o", "g", "w@alice", "w@bob")
	if len(a.Members["w@alice"]) != 1 || len(a.Members["w@bob"]) != 1 {
		t.Fatalf("assignment %v, want a partition each", a.Members)
	}
	e.publishTo("o", "x", 2, 2)
	for _, m := range []*Member{alice, bob} {
		d := recv(t, m, 1)[0]
		if a.Owner(d.Partition) != m.ID() {
			t.Errorf("member %s got partition %d, owned by %q", m.ID(), d.Partition, a.Owner(d.Partition))
		}
		ack(t, m, d)
	}

	if _, err := subscribeAs(e.ctx(), e.b, "alice", "o", "w"); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("alice's second member w: %v, want ErrInvalidArgument", err)
	}
	anon, err := subscribeAs(e.ctx(), e.b, "", "o", "w")
	if err != nil {
		t.Fatal(err)
	}
	if anon.ID() != "w" || anon.ClientID() != "w" {
		t.Fatalf("member without a principal: key %q, client id %q, want w", anon.ID(), anon.ClientID())
	}
	e.waitAssignment("o", "g", "w@alice", "w@bob", "w")
	if err := bob.Close(e.ctx()); err != nil {
		t.Fatal(err)
	}
	e.waitAssignment("o", "g", "w@alice", "w")
}

// TestMemberKey: keys of different principals, or of a principal and none, never meet; names
// that are not group names, and keys that would be too long, are hashed; no key holds ':' (the
// give-back tags).
func TestMemberKey(t *testing.T) {
	long := strings.Repeat("x", storage.MaxGroupNameLen)
	cases := []struct{ principal, id, want string }{
		{"", "w", "w"},
		{"alice", "w", "w@alice"},
		{"team.a", "w-1", "w-1@team.a"},
	}
	for _, c := range cases {
		if got := memberKey(c.principal, c.id); got != c.want {
			t.Errorf("memberKey(%q, %q) = %q, want %q", c.principal, c.id, got, c.want)
		}
	}
	seen := make(map[string][2]string)
	for _, p := range []string{"", "alice", "bob", "w@alice", "a b", "give-back:x", "~x", "..", long, "ce", "e"} {
		for _, id := range []string{"w", "w-ali", "w-al", "x", long} {
			k := memberKey(p, id)
			if len(k) == 0 || len(k) > storage.MaxGroupNameLen || strings.Contains(k, ":") {
				t.Errorf("memberKey(%q, %q) = %q: %d bytes or a ':'", p, id, k, len(k))
			}
			if p != "" && !strings.HasSuffix(k, "@"+p) && (!strings.HasPrefix(k, "~") || len(k) != 41) {
				t.Errorf("memberKey(%q, %q) = %q: neither readable nor hashed", p, id, k)
			}
			if prev, ok := seen[k]; ok {
				t.Errorf("memberKey(%q, %q) = memberKey(%q, %q) = %q", p, id, prev[0], prev[1], k)
			}
			seen[k] = [2]string{p, id}
		}
	}
}

// TestMemberIDsScopedAcrossInstances: two broker instances on one engine (SharedEngine: the
// embedded engine shared in process, and two pgstore engines on one PostgreSQL schema), alice's
// member w on the first and bob's member w on the second, in one ordered group. They are two
// members: the assignment gives each its partition and each gets only its own (with one
// namespace bob's w was alice's w: both claimed both partitions). When bob leaves, alice's
// member stays and takes his partition.
func TestMemberIDsScopedAcrossInstances(t *testing.T) {
	t.Run("wal", func(t *testing.T) {
		e := newEnv(t, func(c *Config) { c.RebalanceDelay, c.SharedEngine = -1, true })
		b2, err := New(Config{Engine: e.engine, Clock: e.clock, Logger: testLogger(t), RetentionInterval: -1, PollInterval: time.Hour,
			RebalanceDelay: -1, SharedEngine: true, LifecycleInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if err := b2.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := b2.Stop(context.Background()); err != nil {
				t.Errorf("second broker Stop: %v", err)
			}
		})
		testMemberIDsAcross(t, e.b, b2)
	})
	t.Run("pgstore", func(t *testing.T) {
		url := testutil.DatabaseURL(t)
		schema := testutil.PGSchema(t, url, "t_bmemberid_")
		clock := newFakeClock()
		fast := func(c *Config) { c.RebalanceDelay = -1 }
		a := startPGInstance(t, url, schema, clock, fast)
		b := startPGInstance(t, url, schema, clock, fast)
		testMemberIDsAcross(t, a.b, b.b)
	})
}

func testMemberIDsAcross(t *testing.T, b1, b2 *Broker) {
	e1 := &env{t: t, b: b1}
	ctx := e1.ctx()
	e1.createTopic("o", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2, AckWait: time.Hour})
	alice, err := subscribeAs(ctx, b1, "alice", "o", "w")
	if err != nil {
		t.Fatal(err)
	}
	e1.waitAssignment("o", "g", alice.ID())
	bob, err := subscribeAs(ctx, b2, "bob", "o", "w")
	if err != nil {
		t.Fatal(err)
	}
	if alice.ClientID() != "w" || bob.ClientID() != "w" {
		t.Fatalf("client ids %q, %q, want w", alice.ClientID(), bob.ClientID())
	}
	// Two members, whatever their keys: with one namespace bob's w would be alice's.
	a := e1.waitAssignment("o", "g", alice.ID(), bob.ID())
	if len(a.Members[alice.ID()]) != 1 || len(a.Members[bob.ID()]) != 1 {
		t.Fatalf("assignment %v, want a partition each", a.Members)
	}
	e1.publishTo("o", "x", 4, 2)
	for _, m := range []*Member{alice, bob} {
		for range 2 {
			d := recv(t, m, 1)[0]
			if own := a.Members[m.ID()][0]; d.Partition != own {
				t.Errorf("member %s (partition %d) got %s of partition %d", m.ID(), own, d.Payload, d.Partition)
			}
			ack(t, m, d)
		}
	}
	if err := bob.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if a := e1.waitAssignment("o", "g", alice.ID()); len(a.Members[alice.ID()]) != 2 {
		t.Fatalf("%s owns %v after bob left, want both partitions", alice.ID(), a.Members[alice.ID()])
	}
}
