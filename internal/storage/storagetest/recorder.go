package storagetest

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// recorder is the storage.Engine the cases use: it forwards every call to the engine under test
// and feeds the delivery calls to a tracker that checks the lease and ack invariants while the case
// runs. It is not a fake: every result is the engine's own. A restart swaps the engine underneath.
type recorder struct {
	tr *tracker

	mu    sync.Mutex // guards inner
	inner storage.Engine
}

var _ storage.Engine = (*recorder)(nil)

func newRecorder(tb testing.TB, clock *FakeClock, inner storage.Engine) *recorder {
	return &recorder{inner: inner, tr: newTracker(tb.Errorf, clock)}
}

func (r *recorder) engine() storage.Engine {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inner
}

// swap replaces the engine after a restart; the previous one must be closed.
func (r *recorder) swap(e storage.Engine) {
	r.mu.Lock()
	r.inner = e
	r.mu.Unlock()
	r.tr.restarted()
}

func (r *recorder) BindingCreate(ctx context.Context, p *storage.BindingCreateParams) (*storage.Binding, error) {
	return r.engine().BindingCreate(ctx, p)
}

func (r *recorder) BindingDelete(ctx context.Context, p *storage.BindingDeleteParams) error {
	return r.engine().BindingDelete(ctx, p)
}

func (r *recorder) BindingList(ctx context.Context) ([]*storage.Binding, error) {
	return r.engine().BindingList(ctx)
}

func (r *recorder) Close() error { return r.engine().Close() }

func (r *recorder) DeliveriesAck(ctx context.Context, p *storage.DeliveriesAckParams) (*storage.DeliveriesAckResult, error) {
	r.tr.releaseBegin(p.SubscriptionID, p.Member, p.Refs, true)
	res, err := r.engine().DeliveriesAck(ctx, p)
	if err == nil && res != nil {
		r.tr.acked(p.SubscriptionID, p.Refs, res.Unknown)
	}
	return res, err
}

func (r *recorder) DeliveriesClaim(ctx context.Context, p *storage.DeliveriesClaimParams) (*storage.DeliveriesClaimResult, error) {
	start, clockStart := r.tr.begin()
	e := r.engine()
	res, err := e.DeliveriesClaim(ctx, p)
	if err == nil && res != nil {
		r.tr.claimed(p, start, clockStart, res)
		r.checkMaxDeliveries(ctx, e, res)
	}
	return res, err
}

// checkMaxDeliveries reports deliveries whose attempt exceeds the topic's max_deliveries (after the
// max_deliveries-th delivery a message goes to the DLQ, it is not delivered again).
func (r *recorder) checkMaxDeliveries(ctx context.Context, e storage.Engine, res *storage.DeliveriesClaimResult) {
	limits := map[string]int{}
	for _, d := range res.Deliveries {
		if d == nil || d.Attempt <= 1 {
			continue
		}
		limit, ok := limits[d.Topic]
		if !ok {
			tp, err := e.TopicGet(ctx, d.Topic)
			if err != nil {
				continue
			}
			limit = tp.Config.MaxDeliveries
			limits[d.Topic] = limit
		}
		if d.Attempt > limit {
			r.tr.violation("subscription %d: %s %d:%d delivered with attempt %d, above the topic's max_deliveries %d",
				d.SubscriptionID, d.Topic, d.Partition, d.Offset, d.Attempt, limit)
		}
	}
}

func (r *recorder) DeliveriesExtend(ctx context.Context, p *storage.DeliveriesExtendParams) (*storage.DeliveriesExtendResult, error) {
	res, err := r.engine().DeliveriesExtend(ctx, p)
	if err == nil && res != nil {
		r.tr.extended(p.SubscriptionID, p.Member, p.Refs, res)
	}
	return res, err
}

func (r *recorder) DeliveriesNack(ctx context.Context, p *storage.DeliveriesNackParams) (*storage.DeliveriesNackResult, error) {
	r.tr.releaseBegin(p.SubscriptionID, p.Member, p.Refs, false)
	res, err := r.engine().DeliveriesNack(ctx, p)
	if err == nil && res != nil && p.GiveBack != "" {
		r.tr.givenBack(p.SubscriptionID, p.Member, p.Refs, res.NotHeld)
	}
	return res, err
}

func (r *recorder) DeliveriesRelease(ctx context.Context, p *storage.DeliveriesReleaseParams) (*storage.DeliveriesReleaseResult, error) {
	r.tr.releaseMember(p.SubscriptionID, p.Member)
	return r.engine().DeliveriesRelease(ctx, p)
}

func (r *recorder) DLQList(ctx context.Context, p *storage.DLQListParams) ([]*storage.DLQEntry, error) {
	return r.engine().DLQList(ctx, p)
}

func (r *recorder) DLQPurge(ctx context.Context, p *storage.DLQPurgeParams) (int, error) {
	return r.engine().DLQPurge(ctx, p)
}

func (r *recorder) DLQRecovered(ctx context.Context) ([]storage.DeadLetterCount, error) {
	return r.engine().DLQRecovered(ctx)
}

// DLQReplay lists the entries it is about to replay so that the tracker knows which messages may
// be delivered again (with a fresh attempt count) although they were acked or dead-lettered.
func (r *recorder) DLQReplay(ctx context.Context, p *storage.DLQReplayParams) (int, error) {
	e := r.engine()
	want := map[int64]bool{}
	for _, id := range p.IDs {
		want[id] = true
	}
	var refs []storage.DeliveryRef
	var after int64
	for {
		page, err := e.DLQList(ctx, &storage.DLQListParams{SubscriptionID: p.SubscriptionID, AfterID: after, Limit: 100})
		if err != nil || len(page) == 0 {
			break
		}
		for _, en := range page {
			if len(want) == 0 || want[en.ID] {
				refs = append(refs, storage.DeliveryRef{Partition: en.Message.Partition, Offset: en.Message.Offset})
			}
		}
		after = page[len(page)-1].ID
	}
	n, err := e.DLQReplay(ctx, p)
	if err == nil {
		r.tr.replayed(p.SubscriptionID, refs)
	}
	return n, err
}

func (r *recorder) MessagesAppend(ctx context.Context, p *storage.MessagesAppendParams) (*storage.MessagesAppendResult, error) {
	return r.engine().MessagesAppend(ctx, p)
}

func (r *recorder) MessagesRead(ctx context.Context, p *storage.MessagesReadParams) ([]*storage.Message, error) {
	return r.engine().MessagesRead(ctx, p)
}

func (r *recorder) NotifyRegister(fn func(storage.Notification)) (unregister func()) {
	return r.engine().NotifyRegister(fn)
}

func (r *recorder) RetentionApply(ctx context.Context) (*storage.RetentionResult, error) {
	return r.engine().RetentionApply(ctx)
}

func (r *recorder) SubscriptionCreate(ctx context.Context, p *storage.SubscriptionCreateParams) (*storage.Subscription, error) {
	return r.engine().SubscriptionCreate(ctx, p)
}

func (r *recorder) SubscriptionDelete(ctx context.Context, id int64) error {
	return r.engine().SubscriptionDelete(ctx, id)
}

func (r *recorder) SubscriptionGet(ctx context.Context, id int64) (*storage.Subscription, error) {
	return r.engine().SubscriptionGet(ctx, id)
}

func (r *recorder) SubscriptionGetByGroup(ctx context.Context, topic, group string) (*storage.Subscription, error) {
	return r.engine().SubscriptionGetByGroup(ctx, topic, group)
}

func (r *recorder) SubscriptionList(ctx context.Context, p *storage.SubscriptionListParams) ([]*storage.Subscription, error) {
	return r.engine().SubscriptionList(ctx, p)
}

func (r *recorder) SubscriptionStats(ctx context.Context, id int64) (*storage.SubscriptionStats, error) {
	return r.engine().SubscriptionStats(ctx, id)
}

func (r *recorder) SubscriptionUpdate(ctx context.Context, p *storage.SubscriptionUpdateParams) (*storage.Subscription, error) {
	return r.engine().SubscriptionUpdate(ctx, p)
}

func (r *recorder) SubscriptionBackfill(ctx context.Context, p *storage.SubscriptionBackfillParams) (*storage.SubscriptionBackfillResult, error) {
	return r.engine().SubscriptionBackfill(ctx, p)
}

func (r *recorder) SubscriptionConfigure(ctx context.Context, p *storage.SubscriptionConfigureParams) (*storage.Subscription, error) {
	return r.engine().SubscriptionConfigure(ctx, p)
}

func (r *recorder) SubscriptionsHeartbeat(ctx context.Context, p *storage.SubscriptionsHeartbeatParams) (*storage.SubscriptionsHeartbeatResult, error) {
	return r.engine().SubscriptionsHeartbeat(ctx, p)
}

func (r *recorder) SubscriptionMembersRenew(ctx context.Context, p *storage.SubscriptionMembersRenewParams) (*storage.SubscriptionMembersRenewResult, error) {
	return r.engine().SubscriptionMembersRenew(ctx, p)
}

func (r *recorder) SubscriptionsMaintain(ctx context.Context, p *storage.SubscriptionsMaintainParams) (*storage.SubscriptionsMaintainResult, error) {
	return r.engine().SubscriptionsMaintain(ctx, p)
}

func (r *recorder) TopicCreate(ctx context.Context, p *storage.TopicCreateParams) (*storage.Topic, error) {
	return r.engine().TopicCreate(ctx, p)
}

func (r *recorder) TopicDelete(ctx context.Context, p *storage.TopicDeleteParams) error {
	return r.engine().TopicDelete(ctx, p)
}

func (r *recorder) TopicGet(ctx context.Context, name string) (*storage.Topic, error) {
	return r.engine().TopicGet(ctx, name)
}

func (r *recorder) TopicList(ctx context.Context) ([]*storage.Topic, error) {
	return r.engine().TopicList(ctx)
}

func (r *recorder) TopicStats(ctx context.Context, name string) (*storage.TopicStats, error) {
	return r.engine().TopicStats(ctx, name)
}

func (r *recorder) TopicUpdate(ctx context.Context, p *storage.TopicUpdateParams) (*storage.Topic, error) {
	return r.engine().TopicUpdate(ctx, p)
}

// tracker checks "one lease at a time", "acked is never delivered again" and the attempt numbers
// of every delivery the recorder sees.
//
// Concurrent calls finish in any order, so the tracker orders events by sequence numbers taken
// under its mutex: a claim takes one before it calls the engine (start) and one when it records
// the result (end). An earlier lease conflicts with a claim only if it was recorded before the claim
// started (so the engine handed it out before), its deadline, as extended by extends that returned
// before the claim started, is after the clock read when the claim returned (the clock only moves
// forward in cases that run concurrently, so the engine's time was earlier), and no ack, nack or
// release that could have ended it had started before the claim returned. Every such conflict is a
// real violation; concurrent interleavings the tracker cannot order are not judged.
type tracker struct {
	// errorf reports a violation (testing.TB.Errorf in the suite).
	errorf func(format string, args ...any)
	clock  *FakeClock

	mu    sync.Mutex
	seq   int64
	epoch int // restarts so far; a restart may drop leases, so older leases do not conflict
	msgs  map[msgKey]*msgTrack
	// undeliveredAcks marks subscriptions where a never-delivered message was acked: their Lag
	// (high water minus cursor) may then count done messages.
	undeliveredAcks map[int64]bool
	violations      int
}

type msgKey struct {
	sub       int64
	partition int32
	offset    int64
}

func (k msgKey) String() string {
	return fmt.Sprintf("subscription %d message %d:%d", k.sub, k.partition, k.offset)
}

type msgTrack struct {
	recs    []*leaseRec
	ackDone int64 // sequence number when an ack that completed it returned; 0 if none
	gen     int   // DLQ replays so far: each restarts the attempt count
}

type leaseRec struct {
	member   string
	attempt  int
	gen      int
	epoch    int
	start    int64 // claim's sequence numbers
	end      int64
	deadline time.Time
	exts     []leaseExt
	released int64 // sequence number when an ack/nack/release touching it started; 0 if none
}

type leaseExt struct {
	end      int64
	deadline time.Time
}

// deadlineAt is the earliest lease deadline the engine may have had when a claim that started at
// sequence number start ran. An extend sets the deadline to now + Duration, which may be earlier
// than the current one: the last extend that returned before the claim started sets it, and any
// extend that returned later may have been applied before the claim too.
func (r *leaseRec) deadlineAt(start int64) time.Time {
	d := r.deadline
	for _, e := range r.exts {
		if e.end < start {
			d = e.deadline // exts are in completion order
		}
	}
	for _, e := range r.exts {
		if e.end > start && e.deadline.Before(d) {
			d = e.deadline
		}
	}
	return d
}

func newTracker(errorf func(format string, args ...any), clock *FakeClock) *tracker {
	return &tracker{errorf: errorf, clock: clock, msgs: map[msgKey]*msgTrack{}, undeliveredAcks: map[int64]bool{}}
}

// maxReported bounds the violations reported in detail: a broken engine can break an invariant
// on every call, and the suite must still fail quickly and in bounded memory.
const maxReported = 20

func (tr *tracker) violation(format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.violationLocked(format, args...)
}

// violationLocked is violation with tr.mu held.
func (tr *tracker) violationLocked(format string, args ...any) {
	tr.violations++
	switch {
	case tr.violations <= maxReported:
		tr.errorf("invariant violated: "+format, args...)
	case tr.violations == maxReported+1:
		tr.errorf("invariant violated: more than %d violations; the rest are not shown", maxReported)
	}
}

func (tr *tracker) msg(k msgKey) *msgTrack {
	mt := tr.msgs[k]
	if mt == nil {
		mt = &msgTrack{}
		tr.msgs[k] = mt
	}
	return mt
}

func (tr *tracker) begin() (int64, time.Time) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.seq++
	return tr.seq, tr.clock.Now()
}

func (tr *tracker) restarted() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.seq++
	tr.epoch++
}

func (tr *tracker) claimed(p *storage.DeliveriesClaimParams, start int64, clockStart time.Time, res *storage.DeliveriesClaimResult) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.seq++
	end := tr.seq
	now := tr.clock.Now()
	if p.BatchSize > 0 {
		// Max bounds where batches start (one per partition), not their length.
		checkBatches(p, res.Deliveries, tr.violationLocked)
	} else if len(res.Deliveries) > p.Max {
		tr.violationLocked("claim with Max %d returned %d deliveries", p.Max, len(res.Deliveries))
	}
	var allowed map[int32]bool
	if p.Partitions != nil {
		allowed = map[int32]bool{}
		for _, part := range p.Partitions {
			allowed[part] = true
		}
	}
	seen := map[storage.DeliveryRef]bool{}
	for _, d := range res.Deliveries {
		if d == nil {
			tr.violationLocked("claim returned a nil delivery")
			continue
		}
		k := msgKey{p.SubscriptionID, d.Partition, d.Offset}
		switch {
		case d.SubscriptionID != p.SubscriptionID:
			tr.violationLocked("%s: delivery names subscription %d", k, d.SubscriptionID)
		case d.Member != p.Member:
			tr.violationLocked("%s: claimed by %q, delivery names member %q", k, p.Member, d.Member)
		case d.Attempt < 1:
			tr.violationLocked("%s: attempt %d < 1", k, d.Attempt)
		case !d.LeaseDeadline.After(clockStart):
			tr.violationLocked("%s: lease deadline %s is not after the claim's time %s", k, fmtTime(d.LeaseDeadline), fmtTime(clockStart))
		case allowed != nil && !allowed[d.Partition]:
			tr.violationLocked("%s: claim limited to partitions %v returned partition %d", k, p.Partitions, d.Partition)
		case seen[d.Ref()]:
			tr.violationLocked("%s: returned twice by one claim", k)
		}
		seen[d.Ref()] = true
		mt := tr.msg(k)
		if mt.ackDone != 0 && mt.ackDone < start {
			tr.violationLocked("%s: delivered to %q (attempt %d) after an ack completed it", k, d.Member, d.Attempt)
		}
		attemptBad, leaseBad := false, false // one report of each kind per delivery
		for _, r := range mt.recs {
			if r.end > start {
				continue // concurrent with this claim: no order known
			}
			if !attemptBad && r.gen == mt.gen && d.Attempt <= r.attempt {
				attemptBad = true
				tr.violationLocked("%s: delivered to %q with attempt %d after an earlier delivery to %q with attempt %d",
					k, d.Member, d.Attempt, r.member, r.attempt)
			}
			if !leaseBad && r.epoch == tr.epoch && (r.released == 0 || r.released > end) {
				if dl := r.deadlineAt(start); dl.After(now) {
					leaseBad = true
					tr.violationLocked("%s leased twice: to %q (attempt %d) at %s while the lease of %q (attempt %d) runs until %s and was not acked, nacked or released",
						k, d.Member, d.Attempt, fmtTime(now), r.member, r.attempt, fmtTime(dl))
				}
			}
		}
		mt.recs = append(mt.recs, &leaseRec{
			member: d.Member, attempt: d.Attempt, gen: mt.gen, epoch: tr.epoch,
			start: start, end: end, deadline: d.LeaseDeadline,
		})
	}
}

// releaseBegin marks the leases an ack (any member: anyMember) or a nack (only member's) may end.
func (tr *tracker) releaseBegin(sub int64, member string, refs []storage.DeliveryRef, anyMember bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.seq++
	for _, ref := range refs {
		mt := tr.msgs[msgKey{sub, ref.Partition, ref.Offset}]
		if mt == nil || len(mt.recs) == 0 {
			if anyMember {
				tr.undeliveredAcks[sub] = true
			}
			continue
		}
		for _, r := range mt.recs {
			if (anyMember || r.member == member) && r.released == 0 {
				r.released = tr.seq
			}
		}
	}
}

// releaseMember marks every lease of member on sub as possibly ended (DeliveriesRelease).
func (tr *tracker) releaseMember(sub int64, member string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.seq++
	for k, mt := range tr.msgs {
		if k.sub != sub {
			continue
		}
		for _, r := range mt.recs {
			if r.member == member && r.released == 0 {
				r.released = tr.seq
			}
		}
	}
}

// givenBack forgets member's last delivery of each ref it gave back (DeliveriesNackParams.GiveBack:
// as if that delivery had not been made, so the next one has the same attempt number).
func (tr *tracker) givenBack(sub int64, member string, refs, notHeld []storage.DeliveryRef) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.seq++
	for _, ref := range refs {
		mt := tr.msgs[msgKey{sub, ref.Partition, ref.Offset}]
		if mt == nil || slices.Contains(notHeld, ref) {
			continue
		}
		for i := len(mt.recs) - 1; i >= 0; i-- {
			if r := mt.recs[i]; r.member == member && r.epoch == tr.epoch && r.gen == mt.gen {
				mt.recs = slices.Delete(mt.recs, i, i+1)
				break
			}
		}
	}
}

func (tr *tracker) acked(sub int64, refs, unknown []storage.DeliveryRef) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.seq++
	skip := map[storage.DeliveryRef]bool{}
	for _, u := range unknown {
		skip[u] = true
	}
	for _, ref := range refs {
		if skip[ref] {
			continue
		}
		mt := tr.msg(msgKey{sub, ref.Partition, ref.Offset})
		if mt.ackDone == 0 {
			mt.ackDone = tr.seq
		}
	}
}

func (tr *tracker) extended(sub int64, member string, refs []storage.DeliveryRef, res *storage.DeliveriesExtendResult) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.seq++
	notHeld := map[storage.DeliveryRef]bool{}
	for _, n := range res.NotHeld {
		notHeld[n] = true
	}
	for _, ref := range refs {
		if notHeld[ref] {
			continue
		}
		mt := tr.msgs[msgKey{sub, ref.Partition, ref.Offset}]
		if mt == nil {
			continue
		}
		for i := len(mt.recs) - 1; i >= 0; i-- {
			if r := mt.recs[i]; r.member == member && r.epoch == tr.epoch {
				r.exts = append(r.exts, leaseExt{end: tr.seq, deadline: res.Deadline})
				break
			}
		}
	}
}

func (tr *tracker) replayed(sub int64, refs []storage.DeliveryRef) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.seq++
	for _, ref := range refs {
		mt := tr.msg(msgKey{sub, ref.Partition, ref.Offset})
		mt.gen++
		mt.ackDone = 0
	}
}

// liveLeases counts, per subscription, the leases the tracker knows to be held at now: the latest
// delivery of a message, in this epoch, unexpired, never acked, nacked or released. The engine must
// count each of them in InFlight.
func (tr *tracker) liveLeases(now time.Time) map[int64]int64 {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := map[int64]int64{}
	for k, mt := range tr.msgs {
		if len(mt.recs) == 0 || mt.ackDone != 0 {
			continue
		}
		last := mt.recs[0]
		for _, r := range mt.recs[1:] {
			if r.end > last.end {
				last = r
			}
		}
		if last.epoch == tr.epoch && last.released == 0 && last.gen == mt.gen && last.deadlineAt(tr.seq+1).After(now) {
			out[k.sub]++
		}
	}
	return out
}

// checkAttemptSequences verifies the attempt numbers of each message's deliveries once the case is
// over (concurrent claims may be recorded out of order, so this is not judged online): per DLQ
// replay generation they start at 1, are distinct, and increase by exactly one inside an epoch
// (strictly across a restart).
func (tr *tracker) checkAttemptSequences() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	keys := make([]msgKey, 0, len(tr.msgs))
	for k := range tr.msgs {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.sub != b.sub {
			return a.sub < b.sub
		}
		if a.partition != b.partition {
			return a.partition < b.partition
		}
		return a.offset < b.offset
	})
	for _, k := range keys {
		byGen := map[int][]*leaseRec{}
		for _, r := range tr.msgs[k].recs {
			byGen[r.gen] = append(byGen[r.gen], r)
		}
		for gen, recs := range byGen {
			sort.Slice(recs, func(i, j int) bool { return recs[i].attempt < recs[j].attempt })
			if recs[0].attempt != 1 {
				tr.violationLocked("%s: first delivery (replay generation %d) has attempt %d, want 1", k, gen, recs[0].attempt)
			}
			for i := 1; i < len(recs); i++ {
				prev, cur := recs[i-1], recs[i]
				switch {
				case cur.attempt == prev.attempt:
					tr.violationLocked("%s: two deliveries with attempt %d (to %q and %q)", k, cur.attempt, prev.member, cur.member)
				case cur.epoch == prev.epoch && cur.attempt != prev.attempt+1:
					tr.violationLocked("%s: attempt %d followed by attempt %d without a restart", k, prev.attempt, cur.attempt)
				case cur.epoch < prev.epoch:
					tr.violationLocked("%s: attempt %d (before a restart) after attempt %d", k, cur.attempt, prev.attempt)
				}
			}
		}
	}
}
