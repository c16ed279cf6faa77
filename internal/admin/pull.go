package admin

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/metrics"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// errPullClosed is returned by pulls after Handler.Close.
var errPullClosed = fmt.Errorf("admin: pull sessions closed: %w", broker.ErrNotRunning)

// minPullWait is the least a pull that finds nothing buffered waits: the session claims on demand,
// so even a pull with wait 0 gives the broker one claim round to deliver what is ready.
const minPullWait = 100 * time.Millisecond

// pullConfig are the settings of pull sessions.
type pullConfig struct {
	maxBatch         int
	maxInFlight      int
	idle             time.Duration
	defWait, maxWait time.Duration
	maxSessions      int
	maxGroupSessions int
}

// pulls owns the pull sessions, one per (topic, group) of the URL. See the package documentation
// ("Pull").
//
// Lock order: pulls.mu -> session.mu -> (broker) Member.mu. No lock of this file is held across an
// engine call except that session.mu is held across Member.SetMaxInFlight and Member.Info, which
// only take the member's own lock.
type pulls struct {
	b       *broker.Broker
	metrics *metrics.Metrics
	logger  *slog.Logger
	cfg     pullConfig
	// wg counts the sessions' reader goroutines.
	wg sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	sessions map[sessionKey]*session
	// opening counts, per (topic, group), the sessions being opened: room reserved (reserve), not
	// in sessions yet.
	opening map[groupKey]int
	// openHook, when set, is called by acquire with room reserved for a new session, before its
	// member is made. Nil except in tests, which pull concurrently there.
	openHook func(key sessionKey)
}

// sessionKey names a pull session: one member per (topic, group, member filter).
type sessionKey struct{ topic, group, filter string }

// groupKey is the (topic, group) of sessions.
type groupKey struct{ topic, group string }

// session is a broker member that consumes for the HTTP clients of one (topic, group). Its credit
// is 0 except while pulls wait (then it is what the member holds plus what they ask for), so it
// claims on demand. A reader goroutine moves what the member receives to buf and wakes the
// waiting pulls.
type session struct {
	p       *pulls
	key     sessionKey
	member  *broker.Member
	notify  chan struct{}
	ackWait time.Duration
	parts   int

	mu      sync.Mutex
	closed  bool
	active  int       // requests using the session (acquire/release)
	lastUse time.Time // end of the last request
	// demand is what the waiting pulls still ask for.
	demand int
	// buf holds deliveries received but not handed out yet.
	buf []*storage.Delivery
	// changed is closed (and replaced) when buf grows or the member closes.
	changed chan struct{}
	// handed maps the deliveries handed to HTTP clients to their lease deadline.
	handed map[leaseKey]time.Time
	timer  *time.Timer
}

type leaseKey struct {
	sub       int64
	partition int32
	offset    int64
}

func keyOf(d *storage.Delivery) leaseKey {
	return leaseKey{sub: d.SubscriptionID, partition: d.Partition, offset: d.Offset}
}

func newPulls(b *broker.Broker, m *metrics.Metrics, logger *slog.Logger, cfg pullConfig) *pulls {
	return &pulls{b: b, metrics: m, logger: logger, cfg: cfg, sessions: make(map[sessionKey]*session), opening: make(map[groupKey]int)}
}

// existing returns the open session of key with a request counted (release it), or nil.
func (p *pulls) existing(key sessionKey) (*session, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.existingLocked(key)
}

// maxPullSessions and maxGroupPullSessions bound the pull sessions of a handler and of one
// (topic, group): each holds a broker member (one more in its group) and a goroutine, and a client
// makes a new one per (topic, group, filter) it names.
const (
	maxPullSessions      = 1024
	maxGroupPullSessions = 64
)

// reserve takes room for a new session of key, or returns LIMIT_EXCEEDED: at most
// cfg.maxSessions sessions in all and cfg.maxGroupSessions of key's (topic, group), counting
// those being opened, so that concurrent pulls cannot open more. The caller calls unreserveLocked
// once the session is in p.sessions or failed to open.
func (p *pulls) reserve(key sessionKey) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	gk := groupKey{key.topic, key.group}
	all, group := len(p.sessions), p.opening[gk]
	for _, n := range p.opening {
		all += n
	}
	if all >= p.cfg.maxSessions {
		return protocol.ErrLimitExceeded.Errorf("%d pull sessions are open (one per topic, group and filter, closed %s after their last use): pull with fewer filters or wait",
			all, p.cfg.idle)
	}
	for k := range p.sessions {
		if k.topic == key.topic && k.group == key.group {
			group++
		}
	}
	if group >= p.cfg.maxGroupSessions {
		return protocol.ErrLimitExceeded.Errorf("%d pull sessions of group %q on topic %q are open (one per filter, closed %s after their last use): pull with fewer filters or wait",
			group, key.group, key.topic, p.cfg.idle)
	}
	p.opening[gk]++
	return nil
}

// unreserveLocked gives back the room reserve took for key. p.mu must be held.
func (p *pulls) unreserveLocked(key sessionKey) {
	gk := groupKey{key.topic, key.group}
	if p.opening[gk]--; p.opening[gk] <= 0 {
		delete(p.opening, gk)
	}
}

// existingLocked is existing with p.mu held. A session whose member closed under it (Broker.Stop)
// is dropped.
func (p *pulls) existingLocked(key sessionKey) (*session, error) {
	if p.closed {
		return nil, errPullClosed
	}
	s := p.sessions[key]
	if s == nil {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || isDone(s.member.Done()) {
		s.closeLocked()
		delete(p.sessions, key)
		return nil, nil
	}
	s.active++
	return s, nil
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// acquire returns the session of (topic, group) with a request counted, creating it (a broker
// Subscribe with credit first, the first pull's demand) if needed. start is where a group
// subscription the session creates starts.
func (p *pulls) acquire(ctx context.Context, topic, group, filter string, start storage.StartPosition, first int) (*session, error) {
	key := sessionKey{topic, group, filter}
	if s, err := p.existing(key); s != nil || err != nil {
		return s, err
	}
	if err := p.reserve(key); err != nil {
		return nil, err
	}
	reserved := true
	defer func() {
		if reserved {
			p.mu.Lock()
			p.unreserveLocked(key)
			p.mu.Unlock()
		}
	}()
	if p.openHook != nil {
		p.openHook(key)
	}
	info, err := p.b.Topic(ctx, topic)
	if err != nil {
		return nil, err
	}
	subGroup := group
	if group == storage.QueueGroup {
		if info.Topic.Config.Semantics != storage.Queue {
			return nil, invalidf("group %q names the subscription of a QUEUE topic; topic %q is %s: pull with a consumer group",
				storage.QueueGroup, topic, info.Topic.Config.Semantics)
		}
		subGroup = ""
	}
	notify := make(chan struct{}, 1)
	member, err := p.b.Subscribe(ctx, broker.SubscribeParams{
		Pattern:     topic,
		Group:       subGroup,
		MemberID:    "http-pull-" + rand.Text()[:12],
		MaxInFlight: max(first, 1),
		Start:       start,
		Notify:      notify,
		Filter:      filter,
	})
	if err != nil {
		return nil, err
	}
	s := &session{
		p: p, key: key, member: member, notify: notify, ackWait: info.Topic.Config.AckWait,
		parts: info.Topic.Config.Partitions, changed: make(chan struct{}), handed: make(map[leaseKey]time.Time),
	}
	p.mu.Lock()
	p.unreserveLocked(key)
	reserved = false
	other, err := p.existingLocked(key)
	if other == nil && err == nil {
		s.active = 1
		p.sessions[key] = s
		s.timer = time.AfterFunc(s.tickEvery(), s.tick)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			s.read()
		}()
	}
	p.mu.Unlock()
	if other != nil || err != nil {
		// Lost a race with another request, or closed meanwhile.
		s.closeMember()
		return other, err
	}
	p.logger.DebugContext(ctx, "pull session opened", slog.String("topic", topic), slog.String("group", group),
		slog.String("member", member.ID()))
	return s, nil
}

// release ends a request.
func (s *session) release() {
	s.mu.Lock()
	s.active--
	s.lastUse = time.Now()
	s.mu.Unlock()
}

// closeLocked marks the session closed, stops its timer and wakes waiting pulls. s.mu must be held;
// the caller removes it from the map and closes the member.
func (s *session) closeLocked() {
	if s.closed {
		return
	}
	s.closed = true
	if s.timer != nil {
		s.timer.Stop()
	}
	s.buf = nil
	close(s.changed)
}

// closeMember makes the session's member leave: its leases (buffered, handed out) are released.
func (s *session) closeMember() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.member.Close(ctx); err != nil {
		s.p.logger.Warn("closing pull member", slog.String("member", s.member.ID()), slog.Any("error", err))
	}
	s.p.logger.Debug("pull session closed", slog.String("topic", s.key.topic), slog.String("group", s.key.group))
}

// read moves the member's deliveries to buf until the member closes. A subscription ending under
// the member (cancelled, topic deleted) ends the session: a later pull subscribes again.
func (s *session) read() {
	for {
		select {
		case <-s.notify:
		case <-s.member.Done():
			s.mu.Lock()
			s.closeLocked()
			s.mu.Unlock()
			return
		}
		ended := len(s.member.TakeEnded()) > 0
		s.mu.Lock()
		if !s.closed {
			n := len(s.buf)
			s.buf, _ = s.member.Take(s.buf)
			if len(s.buf) > n {
				close(s.changed)
				s.changed = make(chan struct{})
			}
		}
		s.mu.Unlock()
		if ended {
			s.end()
		}
	}
}

// end closes the session now (its subscription ended), unless already closed.
func (s *session) end() {
	p := s.p
	p.mu.Lock()
	s.mu.Lock()
	wasClosed := s.closed
	s.closeLocked()
	if p.sessions[s.key] == s {
		delete(p.sessions, s.key)
	}
	s.mu.Unlock()
	p.mu.Unlock()
	if !wasClosed {
		s.closeMember()
	}
}

// applyCreditLocked sets the member's credit: 0 when no pull waits, or when what the waiting pulls
// ask for is already received (in buf or in the member's channel); else what the member holds
// plus what is still missing, at most Config.PullMaxInFlight. With credit 0 the member claims
// nothing more and keeps its leases. s.mu must be held.
func (s *session) applyCreditLocked() {
	target := 0
	if want := s.demand - len(s.buf) - s.member.Waiting(); want > 0 {
		target = min(s.member.InFlight()+want, s.p.cfg.maxInFlight)
	}
	if err := s.member.SetMaxInFlight(target); err != nil && !errors.Is(err, broker.ErrMemberClosed) {
		s.p.logger.Warn("setting pull member credit", slog.String("member", s.member.ID()), slog.Any("error", err))
	}
}

// takeLocked removes up to n usable deliveries from buf, in order and at most maxResponseBytes of
// messages (at least one); expired ones are dropped (the engine redelivers them). s.mu must be
// held.
func (s *session) takeLocked(n int, now time.Time) []*storage.Delivery {
	var got []*storage.Delivery
	rest := s.buf[:0]
	bytes, full := 0, false
	for _, d := range s.buf {
		switch {
		case !d.LeaseDeadline.After(now):
		case !full && len(got) < n && (len(got) == 0 || bytes+d.Size() <= maxResponseBytes):
			got = append(got, d)
			bytes += d.Size()
		default:
			full = true // the rest waits for the next pull, in order
			rest = append(rest, d)
		}
	}
	clear(s.buf[len(rest):])
	s.buf = rest
	return got
}

// pull hands out up to n deliveries: what is buffered, else what the member receives within wait
// (at least minPullWait). Leases with less than half of ack_wait left are extended to a full
// ack_wait first.
func (s *session) pull(ctx context.Context, n int, wait time.Duration) ([]*storage.Delivery, error) {
	s.mu.Lock()
	got := s.takeLocked(n, time.Now())
	if len(got) > 0 {
		s.mu.Unlock()
		return s.handOut(ctx, got), nil
	}
	s.demand += n
	s.applyCreditLocked()
	timer := time.NewTimer(max(wait, minPullWait))
	defer timer.Stop()
	var err error
	for len(got) == 0 && err == nil && !s.closed {
		changed := s.changed
		s.mu.Unlock()
		select {
		case <-changed:
		case <-timer.C:
			err = errTimedOut
		case <-ctx.Done():
			err = ctx.Err()
		}
		s.mu.Lock()
		got = s.takeLocked(n, time.Now())
	}
	closed := s.closed
	s.demand -= n
	if !closed {
		s.applyCreditLocked()
	}
	s.mu.Unlock()
	switch {
	case ctx.Err() != nil:
		s.putBack(got)
		return nil, ctx.Err()
	case len(got) == 0 && closed:
		return nil, broker.ErrMemberClosed
	}
	return s.handOut(ctx, got), nil
}

var errTimedOut = errors.New("pull wait elapsed")

// handOut extends the leases that need it, records the deliveries as handed out and counts them.
func (s *session) handOut(ctx context.Context, got []*storage.Delivery) []*storage.Delivery {
	now := time.Now()
	var due, out []*storage.Delivery
	for _, d := range got {
		if d.LeaseDeadline.Sub(now) < s.ackWait/2 {
			due = append(due, d)
		} else {
			out = append(out, d)
		}
	}
	if len(due) > 0 {
		out = append(out, s.extend(ctx, due)...)
	}
	s.mu.Lock()
	for _, d := range out {
		s.handed[keyOf(d)] = d.LeaseDeadline
	}
	s.mu.Unlock()
	var sub int64
	var group string // the metrics group label of sub (broker.Member.SubscriptionGroup)
	for _, d := range out {
		if d.SubscriptionID != sub {
			sub, group = d.SubscriptionID, s.member.SubscriptionGroup(d.SubscriptionID)
		}
		s.p.metrics.ObserveDelivery(d.Topic, group, d.Attempt, d.PublishedAt)
	}
	return out
}

// putBack returns deliveries a pull took but could not hand out to buf.
func (s *session) putBack(ds []*storage.Delivery) {
	if len(ds) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.buf = append(ds, s.buf...)
	}
}

// extend pushes the leases of ds to a full ack_wait from now and returns copies with the new
// deadline; deliveries whose lease the member no longer holds are left out. On other errors the
// deliveries are kept with their old deadlines.
func (s *session) extend(ctx context.Context, ds []*storage.Delivery) []*storage.Delivery {
	bySub := make(map[int64][]*storage.Delivery)
	for _, d := range ds {
		bySub[d.SubscriptionID] = append(bySub[d.SubscriptionID], d)
	}
	out := make([]*storage.Delivery, 0, len(ds))
	for sub, list := range bySub {
		refs := make([]storage.DeliveryRef, len(list))
		for i, d := range list {
			refs[i] = d.Ref()
		}
		res, err := s.member.ExtendBatch(ctx, sub, refs, 0)
		if err != nil {
			s.p.logger.WarnContext(ctx, "extending pull leases failed", slog.String("topic", s.key.topic),
				slog.String("group", s.key.group), slog.Any("error", err))
			out = append(out, list...)
			continue
		}
		notHeld := refSet(res.NotHeld)
		for _, d := range list {
			if !notHeld[d.Ref()] {
				c := *d
				c.LeaseDeadline = res.Deadline
				out = append(out, &c)
			}
		}
	}
	return out
}

// tickEvery is the period of the session's housekeeping: often enough to extend buffered leases
// before they expire and to notice idleness.
func (s *session) tickEvery() time.Duration {
	return min(max(s.ackWait/4, 50*time.Millisecond), s.p.cfg.idle)
}

// tick is the session's housekeeping: it forgets expired handed-out leases, closes the session
// when it is idle (no request for Config.PullIdleTimeout) and no handed-out lease is live, and
// otherwise extends the buffered leases that passed half their time, so that a message waiting in
// the session for a pull does not expire (which would cost it a delivery attempt).
func (s *session) tick() {
	p := s.p
	now := time.Now()
	p.mu.Lock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		p.mu.Unlock()
		return
	}
	for k, deadline := range s.handed {
		if !deadline.After(now) {
			delete(s.handed, k)
		}
	}
	if s.active == 0 && now.Sub(s.lastUse) >= p.cfg.idle && len(s.handed) == 0 {
		s.closeLocked()
		if p.sessions[s.key] == s {
			delete(p.sessions, s.key)
		}
		s.mu.Unlock()
		p.mu.Unlock()
		s.closeMember()
		return
	}
	p.mu.Unlock()
	var due []*storage.Delivery
	for _, d := range s.buf {
		if d.LeaseDeadline.Sub(now) < s.ackWait/2 {
			due = append(due, d)
		}
	}
	s.active++ // keeps the session open while extending without the lock
	s.mu.Unlock()

	if len(due) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		kept := s.extend(ctx, due)
		cancel()
		s.mu.Lock()
		s.replaceBufLocked(due, kept)
		s.mu.Unlock()
	}
	s.mu.Lock()
	s.active--
	if !s.closed {
		s.timer.Reset(s.tickEvery())
	}
	s.mu.Unlock()
}

// replaceBufLocked replaces the deliveries of old still in buf by their extended versions in kept;
// those missing from kept (no longer held) are dropped. s.mu must be held.
func (s *session) replaceBufLocked(old, kept []*storage.Delivery) {
	keptBy := make(map[leaseKey]*storage.Delivery, len(kept))
	for _, d := range kept {
		keptBy[keyOf(d)] = d
	}
	oldSet := make(map[leaseKey]bool, len(old))
	for _, d := range old {
		oldSet[keyOf(d)] = true
	}
	buf := s.buf[:0]
	for _, d := range s.buf {
		k := keyOf(d)
		if !oldSet[k] {
			buf = append(buf, d)
		} else if nd := keptBy[k]; nd != nil {
			buf = append(buf, nd)
		}
	}
	clear(s.buf[len(buf):])
	s.buf = buf
}

// forget drops refs from the handed-out leases.
func (s *session) forget(sub int64, refs []storage.DeliveryRef) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range refs {
		delete(s.handed, leaseKey{sub: sub, partition: r.Partition, offset: r.Offset})
	}
}

// setDeadline records the extended deadline of handed-out leases.
func (s *session) setDeadline(sub int64, refs []storage.DeliveryRef, deadline time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range refs {
		k := leaseKey{sub: sub, partition: r.Partition, offset: r.Offset}
		if _, ok := s.handed[k]; ok {
			s.handed[k] = deadline
		}
	}
}

// subscription returns the subscription the session's member is attached to.
func (s *session) subscription() (int64, bool) {
	atts := s.member.Subscriptions()
	if len(atts) != 1 {
		return 0, false
	}
	return atts[0].SubscriptionID, true
}

// close ends every session (Handler.Close) and waits for their readers.
func (p *pulls) close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	var all []*session
	for k, s := range p.sessions {
		s.mu.Lock()
		s.closeLocked()
		s.mu.Unlock()
		all = append(all, s)
		delete(p.sessions, k)
	}
	p.mu.Unlock()
	var errs []error
	for _, s := range all {
		if err := s.member.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	done := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("admin: waiting for pull sessions: %w", context.Cause(ctx)))
	}
	return errors.Join(errs...)
}

// closeTopic ends the idle sessions of a deleted topic (busy ones end when their member is told
// the subscription ended).
func (p *pulls) closeTopic(topic string) {
	p.mu.Lock()
	var all []*session
	for k, s := range p.sessions {
		if k.topic != topic {
			continue
		}
		s.mu.Lock()
		if s.active == 0 {
			s.closeLocked()
			all = append(all, s)
			delete(p.sessions, k)
		}
		s.mu.Unlock()
	}
	p.mu.Unlock()
	for _, s := range all {
		s.closeMember()
	}
}
