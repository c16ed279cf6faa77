package storagetest

import (
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// zombieCases: zombie_ttl force-advances the ack floors that subscriptions holding retention
// leave stuck (storage.Engine.RetentionApply).
func zombieCases() []testCase {
	return []testCase{
		{name: "zombie_ttl_advances_stuck_floors", fn: testRetentionZombie},
		{name: "zombie_ttl_restart", restart: true, fn: testRetentionZombieRestart},
	}
}

// testRetentionZombie: a subscription holding retention (ACTIVE z that leases and never acks,
// PAUSED p) whose floor retention saw unmoved for longer than zombie_ttl gives up the messages
// older than zombie_ttl, counted in Zombies by subscription; it keeps giving up what ages past
// zombie_ttl while it stays stuck, and its own progress stops it. A slow subscription whose
// floor moves is left alone even when its oldest pending message is older than zombie_ttl; a DEAD
// one holds nothing and is never listed. Nothing is removed from the log by this.
func testRetentionZombie(t *testing.T, x *env) {
	x.createTopic("zmb", storage.TopicConfig{Semantics: storage.PubSub, ZombieTTL: time.Hour,
		MessageRetention: 24 * time.Hour, MaxRetention: 48 * time.Hour})
	a := x.subscribe("zmb", "a", fromBeginning)
	z := x.subscribe("zmb", "z", fromBeginning)
	p := x.subscribe("zmb", "p", fromBeginning)
	slow := x.subscribe("zmb", "slow", fromBeginning)
	d := x.subscribe("zmb", "d", fromBeginning)
	x.setState(p.ID, storage.Paused)
	x.setState(d.ID, storage.Dead)
	// step acks everything for a and one more message for slow.
	step := func() {
		x.t.Helper()
		x.ack(a.ID, "m", RefsOf(x.claimAll(a.ID, "m"))...)
		equal(t, x.ack(slow.ID, "m", RefsOf(x.claim(slow.ID, "m", 1))...).Acked, 1, "slow acks one")
	}
	run := func(want []storage.ZombieCount, what string) {
		x.t.Helper()
		res, removed := x.retention("zmb")
		equal(t, removed, int64(0), "%s: removed (message_retention is 24h)", what)
		for i := range res.Zombies {
			isTrue(t, res.Zombies[i].Topic == "zmb", "%s: zombie %+v of another topic", what, res.Zombies[i])
		}
		deepEqual(t, res.Zombies, want, "%s: zombies", what)
	}
	floor := func(s *storage.Subscription) int64 {
		x.t.Helper()
		return partStats(t, x.stats(s.ID), 0).AckFloor
	}
	zc := func(s *storage.Subscription, n int64) storage.ZombieCount {
		return storage.ZombieCount{Topic: "zmb", Group: s.Group, SubscriptionID: s.ID, Messages: n}
	}

	x.publishN("zmb", 0, 10) // 0..9 at t0
	equal(t, len(x.claimAll(z.ID, "m")), 10, "z leases 0..9 and never acks")
	step()
	run(nil, "t0: floors first seen")
	x.advance(30 * time.Minute)
	x.publishN("zmb", 0, 10) // 10..19 at t0+30m
	step()
	run(nil, "t0+30m: stuck for 30m only")

	x.advance(30*time.Minute + time.Second)
	step()
	run([]storage.ZombieCount{zc(z, 10), zc(p, 10)}, "t0+60m1s: z and p stuck past zombie_ttl give up 0..9")
	equal(t, floor(z), int64(10), "z's floor")
	equal(t, floor(p), int64(10), "p's floor")
	equal(t, floor(slow), int64(3), "slow's floor (it moved: left alone)")
	equal(t, floor(d), int64(0), "d's floor (DEAD: not watched)")
	requireOffsets(t, x.claimAll(z.ID, "m"), span(10, 20), "z gets what it had not given up")

	x.advance(30 * time.Minute)
	step()
	run([]storage.ZombieCount{zc(z, 10), zc(p, 10)}, "t0+90m1s: still stuck, they give up 10..19 as it ages")
	equal(t, len(x.claimAll(z.ID, "m")), 0, "z has nothing left")
	x.publishN("zmb", 0, 1) // 20 at t0+90m1s
	ds := x.claimAll(z.ID, "m")
	requireOffsets(t, ds, []int64{20}, "z gets the new message")
	equal(t, x.ack(z.ID, "m", RefsOf(ds)...).Acked, 1, "z acks")

	x.advance(time.Hour + time.Second)
	x.publishN("zmb", 0, 1) // 21
	step()
	run([]storage.ZombieCount{zc(p, 1)}, "t0+151m2s: z moved by itself; p gives up 20")
	equal(t, floor(p), int64(21), "p's floor")
	x.setState(p.ID, storage.Active)
	requireOffsets(t, x.claimAll(p.ID, "m"), []int64{21}, "p resumed gets what it had not given up")
	x.setState(d.ID, storage.Active)
	requireOffsets(t, x.claimAll(d.ID, "m"), span(0, 22), "d (DEAD, then resurrected) kept its place: everything is still retained")
}

// testRetentionZombieRestart: a force-advanced floor survives a restart; what retention saw of the
// floors does not (it is in memory): after a restart a floor counts as stuck from the first run
// that sees it, so a restart postpones a force-advance, never hastens it.
func testRetentionZombieRestart(t *testing.T, x *env) {
	x.createTopic("zr", storage.TopicConfig{Semantics: storage.PubSub, ZombieTTL: time.Hour, MaxRetention: 48 * time.Hour})
	z := x.subscribe("zr", "z", fromBeginning)
	zc := func(n int64) []storage.ZombieCount {
		return []storage.ZombieCount{{Topic: "zr", Group: "z", SubscriptionID: z.ID, Messages: n}}
	}
	floor := func() int64 {
		x.t.Helper()
		return partStats(t, x.stats(z.ID), 0).AckFloor
	}
	x.publishN("zr", 0, 5)
	res, _ := x.retention("zr")
	equal(t, len(res.Zombies), 0, "first seen")
	x.advance(time.Hour + time.Second)
	x.publishN("zr", 0, 3) // 5..7
	res, _ = x.retention("zr")
	deepEqual(t, res.Zombies, zc(5), "stuck past zombie_ttl: 0..4 given up")
	equal(t, floor(), int64(5), "floor")

	x.advance(2 * time.Hour)
	x.restart()
	equal(t, floor(), int64(5), "the force-advanced floor after a restart")
	res, _ = x.retention("zr")
	equal(t, len(res.Zombies), 0, "after a restart the floor is seen afresh")
	x.advance(time.Hour)
	res, _ = x.retention("zr")
	equal(t, len(res.Zombies), 0, "exactly zombie_ttl after the restart")
	x.advance(time.Second)
	res, _ = x.retention("zr")
	deepEqual(t, res.Zombies, zc(3), "stuck past zombie_ttl since the restart: 5..7 given up")
	equal(t, floor(), int64(8), "floor")
}
