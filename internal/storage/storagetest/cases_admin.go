package storagetest

import (
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// The broker's admin force-complete (broker/groupadmin.go) is built on DeliveriesAck, with a member
// that holds no lease: these cases pin the engine behaviour it relies on.
func adminCases() []testCase {
	return []testCase{
		{name: "force_complete_fences_leases", fn: testForceCompleteFences},
	}
}

// An ack by a member without leases completes every unfinished message: leased to another member,
// waiting for redelivery, never delivered. The holder's later ack answers AlreadyDone, its nack and
// extend NotHeld; nothing is delivered again.
func testForceCompleteFences(t *testing.T, x *env) {
	q := x.queueTopic("fc", time.Minute, 0, 4)
	requireOffsets(t, x.claim(q.ID, "m1", 3), []int64{0, 1, 2}, "claimed")
	x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 2)}, Delay: time.Hour})
	x.requireStats(q.ID, wantStats{pending: 4, lag: 1, inFlight: 2, redelivering: 1}, "before")

	res := x.ack(q.ID, "$admin", ref(0, 0), ref(0, 1), ref(0, 2), ref(0, 3))
	equal(t, res.Acked, 4, "the admin's ack completes leased, waiting and undelivered messages")
	x.requireStats(q.ID, wantStats{}, "after the admin's ack")
	x.requireFloor(q.ID, 0, 4, 4, "floor after the admin's ack")

	equal(t, x.ack(q.ID, "m1", ref(0, 0)).AlreadyDone, 1, "the holder's late ack")
	nr := x.nack(storage.DeliveriesNackParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 1)}})
	requireRefs(t, nr.NotHeld, []storage.DeliveryRef{ref(0, 1)}, "the holder's nack")
	er := x.extend(storage.DeliveriesExtendParams{SubscriptionID: q.ID, Member: "m1", Refs: []storage.DeliveryRef{ref(0, 1)}, Duration: time.Minute})
	requireRefs(t, er.NotHeld, []storage.DeliveryRef{ref(0, 1)}, "the holder's extend")
	x.advance(2 * time.Hour)
	equal(t, len(x.claimAll(q.ID, "m2")), 0, "nothing delivered again")
}
