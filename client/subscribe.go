package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/protocol"
)

// StartPosition says where a subscription starts when a Subscribe creates it (the first member
// of a durable group, or an ephemeral subscription); it is ignored when the group's subscription
// exists. The zero value is FromNow. Create it with FromNow, FromBeginning, FromTimestamp or
// FromMessageID.
type StartPosition struct {
	kind protocol.StartKind
	t    time.Time
	id   string
}

// FromNow starts after the last message published before the subscription was created.
func FromNow() StartPosition { return StartPosition{} }

// FromBeginning starts at the first retained message.
func FromBeginning() StartPosition { return StartPosition{kind: protocol.StartFromBeginning} }

// FromTimestamp starts at the first message published at or after t on the broker's clock.
func FromTimestamp(t time.Time) StartPosition {
	return StartPosition{kind: protocol.StartFromTimestamp, t: t}
}

// FromMessageID starts at the message id "offset" or "partition:offset" (Position.MessageID).
func FromMessageID(id string) StartPosition {
	return StartPosition{kind: protocol.StartFromMessageID, id: id}
}

// String returns FROM_NOW, FROM_BEGINNING, FROM_TIMESTAMP <RFC 3339> or FROM_MESSAGE_ID <id>.
func (p StartPosition) String() string {
	switch p.kind {
	case protocol.StartFromTimestamp:
		return p.kind.String() + " " + p.t.Format(time.RFC3339Nano)
	case protocol.StartFromMessageID:
		return p.kind.String() + " " + p.id
	}
	return p.kind.String()
}

func (p StartPosition) wire() protocol.StartPosition {
	return protocol.StartPosition{Kind: p.kind, Time: p.t, MessageID: p.id}
}

// SubscribeParams say what to consume.
type SubscribeParams struct {
	// Topic is a topic name or a wildcard pattern ("orders.*.created", "orders.#"); a pattern also
	// binds topics created later. Required.
	Topic string
	// Group is the consumer group. "" means none: on a QUEUE topic the subscription shares the
	// topic's one subscription with every consumer (each message to one of them); on a PUB_SUB
	// topic it gets an ephemeral subscription of its own that lives while it is connected.
	Group string
	// MaxInFlight is the credit: the most deliveries the broker leaves unsettled with this
	// subscription at a time (running in handlers or waiting for one). Defaults to 0: twice the
	// Concurrency, so that a handler finds its next delivery waiting. More than the broker's cap
	// (server.max_credit, 65 536 by default) fails the subscribe with INVALID_ARGUMENT.
	MaxInFlight int
	// Start is where the subscription starts if this call creates it. Defaults to FromNow.
	Start StartPosition
	// Ordered joins Group as an ordered group: each partition of Topic (a topic name, not a
	// pattern, of a PUB_SUB topic) is owned by one member at a time and delivered to it in offset
	// order, at most max_in_flight_per_partition (default 1) unsettled per partition. Members
	// join and leave freely: the broker rebalances and stays subscribed for this member. A
	// delivery of a partition the member lost meanwhile cannot be settled: its Ack, Nack or
	// Extend fails with an error wrapping protocol.ErrStaleGeneration, and its new owner gets the
	// message again; the subscription itself goes on with its new partitions, nothing to redo.
	Ordered bool
	// Filter is a member filter over message headers ("region=eu", "tier in (gold,silver), !test";
	// grammar in docs/protocol.md): this subscription gets only the messages it matches, and a
	// message that no member of the group on the broker matches is completed for the group without
	// a delivery. A bad filter fails Subscribe with an error wrapping protocol.ErrInvalidArgument
	// (it says where). Not with Ordered; needs protocol version 3. Both engines take filters;
	// with several broker instances on one PostgreSQL database, "no member" means none on any
	// instance (docs/protocol.md section 8.1.1).
	Filter string
	// BatchSize, with Ordered and a BatchHandler (Client.SubscribeBatch), makes the member take
	// per-key batches of up to BatchSize messages (at most 1000) per partition, extended so that
	// the messages of one key written by one publish are never split. Needs protocol version 4.
	BatchSize int
}

// Handler processes one delivery. Unless the subscription has ManualAck, a nil return acks the
// delivery and an error nacks it (redelivered after NackDelay, or as NackWithDelay and ToDLQ
// say), except ErrUnsettled, which settles nothing. ctx is cancelled when the subscription or the client is closed and the Close's ctx ends
// before the handler returned. A panic is recovered and treated as an error.
type Handler func(ctx context.Context, d *Delivery) error

// Subscription is a running consumer: a handle on the broker and Concurrency handler goroutines.
// It survives reconnects: after a broken connection the client subscribes again with the same
// parameters. A durable group continues where its acks left off (unless its subscription ended
// meanwhile: see Client.Subscribe); an ephemeral subscription (no Group on a PUB_SUB topic) ended
// with the connection and restarts FromNow, so messages published while disconnected are not
// delivered to it. Every method is safe for concurrent use.
type Subscription struct {
	c       *Client
	params  SubscribeParams
	cfg     subConfig
	handler Handler
	// batchHandler, when not nil, replaces handler (Client.SubscribeBatch).
	batchHandler BatchHandler
	// pattern: params.Topic is a wildcard pattern (a handle of several subscriptions).
	pattern bool
	logger  *slog.Logger
	// ctx is the handlers' context (the subscription's service context).
	ctx    context.Context
	cancel context.CancelFunc

	// subMu serializes the Subscribe and Unsubscribe round trips of this subscription.
	subMu sync.Mutex

	// mu guards the fields below; cond (on mu) wakes the handler goroutines.
	mu       sync.Mutex
	cond     *sync.Cond
	cn       *conn // connection of the current handle; nil when not subscribed
	handle   uint32
	memberID string
	joined   []protocol.SubscriptionInfo
	// credit is the MaxInFlight of the next Subscribe: the handle's credit on the broker, unless
	// a raise sent to a broker that announced no cap was refused (accepted is then lower).
	credit uint32
	// accepted is the credit the broker is known to have taken: the last Subscribe's, plus the
	// raises within the announced cap since.
	accepted uint32
	// maxCredit is the cap the broker of the last Subscribe (sent, or answered) announced; 0 if
	// it did not.
	maxCredit uint32
	started   bool // subscribed once: the supervisor resubscribes it
	queue     []*Delivery
	// pending holds the batches still arriving (batch.go).
	pending map[batchKey][]*Delivery
	closing bool  // closed or ended: no new deliveries to handlers
	err     error // why the broker ended it; nil when closed by Close
	// workersStarted is set when the handler goroutines were started (at the end of Subscribe).
	workersStarted bool

	// wideWindow: the credit is at least ackCoalesceCredit per handler goroutine, so the ack of
	// the last queued delivery may wait for others (settle). Set with credit.
	wideWindow atomic.Bool

	workersLeft     atomic.Int32
	workersDone     chan struct{}
	workersDoneOnce sync.Once
	doneOnce        sync.Once
	done            chan struct{}
}

// Subscribe starts consuming: it subscribes on the broker (waiting for a connection while the
// client reconnects, until ctx ends), then runs handler for every delivery on Concurrency
// goroutines (default 1). Settlement: see Handler and ManualAck. Acks are coalesced for about a
// millisecond (or 256 refs) into batched Ack frames; credit comes back to the broker by itself
// as deliveries are settled (docs/protocol.md section 8.3).
//
// A delivery whose connection broke while its handler ran cannot be settled any more: its Ack or
// Nack fails with ErrConnectionLost and the broker, which released its lease, redelivers it
// (with a higher Attempt). Handlers must therefore be idempotent.
//
// When the broker ends the subscription of a topic name (SubscriptionEnded: the group was
// cancelled, SUBSCRIPTION_NOT_ACTIVE; the topic deleted, TOPIC_NOT_FOUND, as when the end
// comes while reconnecting; the subscription deleted, SUBSCRIPTION_NOT_FOUND; also one the
// client did not know yet, of a topic created after the Subscribe with no delivery since) or closes
// the handle with a non-retryable code, the Subscription stops without subscribing again: Done is
// closed after its handlers returned and Err returns the reason. A pattern's Subscription goes on
// when one of its topics' subscriptions ends: it keeps the others and joins matching topics created
// later; the end is logged and reported to SubscriptionEndedHook. An end with a retryable code (the
// broker could not keep the member on a subscription it belongs to, or could not read whether the
// topic of one that ended was deleted: the storage unavailable...) is reported too, and the
// Subscription gives its handle back and subscribes again, a topic name rejoining the
// subscription that ended (below: its refusal then gives the reason), instead of keeping a handle
// without it.
//
// An end while the client reconnects ends a topic name's Subscription too. The resubscription of a
// topic name rejoins the subscription the handle was on (protocol version 5; the client knows it
// from the broker's answer, or for a topic created after the Subscribe from its first delivery):
// the broker creates nothing for it and refuses it when that subscription ended meanwhile, and the
// Subscription stops with the broker's reason: SUBSCRIPTION_NOT_ACTIVE (group cancelled),
// SUBSCRIPTION_NOT_FOUND (subscription deleted, or its topic deleted and created again) or
// TOPIC_NOT_FOUND (topic deleted). A broker of version 4 or older, a pattern, and a topic name
// whose subscription the client never learned (its topic was created after the Subscribe, with no
// delivery since) subscribe as the first time, which makes a new subscription of a cancelled group:
// when the answer names a new subscription of a durable group on a topic, a topic name's
// Subscription stops with SUBSCRIPTION_NOT_ACTIVE and gives the new handle back (the new
// subscription stays on the broker without members until it goes DEAD or is cancelled), and a
// pattern's reports the end and goes on. A resubscription the broker refuses with a non-retryable
// code stops the Subscription, a pattern's too: no handle is left to go on with. Errors: bad
// parameters wrap protocol.ErrInvalidArgument; the broker's refusal is its *protocol.Error.
func (c *Client) Subscribe(ctx context.Context, p SubscribeParams, handler Handler, opts ...SubscribeOpt) (*Subscription, error) {
	if p.BatchSize != 0 {
		return nil, fmt.Errorf("client: subscribe: %w: BatchSize needs a batch handler (SubscribeBatch)", protocol.ErrInvalidArgument)
	}
	return c.subscribe(ctx, p, handler, nil, opts)
}

// subscribe is Subscribe with a handler or a batch handler.
func (c *Client) subscribe(ctx context.Context, p SubscribeParams, handler Handler, batchHandler BatchHandler, opts []SubscribeOpt) (*Subscription, error) {
	cfg, err := newSubConfig(opts)
	if err != nil {
		return nil, err
	}
	switch {
	case handler == nil && batchHandler == nil:
		return nil, fmt.Errorf("client: subscribe: %w: nil handler", protocol.ErrInvalidArgument)
	case p.Topic == "":
		return nil, fmt.Errorf("client: subscribe: %w: empty topic", protocol.ErrInvalidArgument)
	case p.MaxInFlight < 0 || p.MaxInFlight > math.MaxUint32:
		return nil, fmt.Errorf("client: subscribe: %w: MaxInFlight %d out of range", protocol.ErrInvalidArgument, p.MaxInFlight)
	}
	credit := uint32(p.MaxInFlight)
	if credit == 0 {
		credit = uint32(min(2*cfg.concurrency, 65536))
	}
	s := &Subscription{
		c:            c,
		params:       p,
		cfg:          cfg,
		handler:      handler,
		batchHandler: batchHandler,
		pattern:      names.IsPattern(p.Topic),
		logger:       c.logger.With(slog.String("topic", p.Topic), slog.String("group", p.Group)),
		credit:       credit,
		workersDone:  make(chan struct{}),
		done:         make(chan struct{}),
	}
	s.cond = sync.NewCond(&s.mu)
	s.setWideWindow()
	s.ctx, s.cancel = context.WithCancel(context.Background())
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		s.cancel()
		return nil, ErrClientClosed
	}
	c.subs[s] = struct{}{}
	c.mu.Unlock()

	wrap := func(err error) error { return fmt.Errorf("client: subscribe to %q: %w", p.Topic, err) }
	for attempt := 0; ; attempt++ {
		cn, err := c.waitConn(ctx)
		if err == nil {
			if err = s.subscribeOn(ctx, cn, false); err == nil {
				break
			}
		}
		lost := errors.Is(err, ErrConnectionLost)
		if ctx.Err() != nil || !(lost || protocol.IsRetryable(err)) {
			s.abort()
			return nil, wrap(err)
		}
		if !lost {
			if err := sleepCtx(ctx, c.backoff(attempt)); err != nil {
				s.abort()
				return nil, wrap(err)
			}
		}
	}
	// Start the handlers, unless Close (or the broker) ended the subscription meanwhile: Close does
	// not wait for handlers that were never started.
	s.mu.Lock()
	if s.closing {
		err := s.err
		s.mu.Unlock()
		s.abort()
		if err == nil {
			err = ErrSubscriptionClosed
		}
		return nil, wrap(err)
	}
	s.workersStarted = true
	s.workersLeft.Store(int32(cfg.concurrency))
	for range cfg.concurrency {
		go s.work()
	}
	s.mu.Unlock()
	return s, nil
}

// abort undoes a Subscribe that failed: no handler goroutine was started, so a concurrent Close
// (Client.Close) must not wait for any.
func (s *Subscription) abort() {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.c.removeSub(s)
	s.workersDoneOnce.Do(func() { close(s.workersDone) })
	s.finish()
}

func (c *Client) removeSub(s *Subscription) {
	c.mu.Lock()
	delete(c.subs, s)
	c.mu.Unlock()
}

// Topic returns the topic name or pattern of the subscription.
func (s *Subscription) Topic() string { return s.params.Topic }

// Group returns the consumer group, "" if none.
func (s *Subscription) Group() string { return s.params.Group }

// MemberID returns the member id the broker gave the current (or last) handle.
func (s *Subscription) MemberID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.memberID
}

// Done is closed when the subscription has stopped: after Close, or after the broker ended it and
// its handlers returned.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Err returns why the broker ended the subscription (a *protocol.Error), or nil while it runs and
// after a Close.
func (s *Subscription) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// AddCredit raises the subscription's MaxInFlight by n (a Credit frame; no protocol version
// lowers it). The raised value is kept for resubscriptions.
//
// A raise past the broker's cap (server.max_credit, announced at the handshake) fails with an
// error wrapping protocol.ErrInvalidArgument and changes nothing. A broker that announces no cap
// (an older one) answers a refused Credit only with an Error the client logs; the client then
// learns of the refusal at the next resubscription, which drops the raises that broker refused
// and subscribes with the credit it last accepted. After a reconnect to a broker with a lower cap,
// the credit is lowered to that cap; while a resubscription waits for its answer, raises are
// checked against the cap of the broker it went to. Otherwise AddCredit returns nil, also while
// reconnecting (the next Subscribe carries the new credit; a resubscription already on its way
// gets it in a Credit once answered), or ErrSubscriptionClosed. ctx is unused but reserved.
func (s *Subscription) AddCredit(_ context.Context, n uint32) error {
	if n == 0 {
		return nil
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return ErrSubscriptionClosed
	}
	total := uint64(s.credit) + uint64(n)
	if total > math.MaxUint32 {
		s.mu.Unlock()
		return fmt.Errorf("client: add credit: %w: %d + %d overflows", protocol.ErrInvalidArgument, s.credit, n)
	}
	if s.maxCredit != 0 && total > uint64(s.maxCredit) {
		credit, limit := s.credit, s.maxCredit
		s.mu.Unlock()
		return fmt.Errorf("client: add credit: %w: credit %d + %d exceeds the broker's cap %d", protocol.ErrInvalidArgument, credit, n, limit)
	}
	s.credit += n
	if s.maxCredit != 0 {
		s.accepted = s.credit
	}
	s.setWideWindow()
	cn, h := s.cn, s.handle
	s.mu.Unlock()
	if cn == nil {
		return nil // the next Subscribe carries the new credit
	}
	if err := cn.sendCredit(h, n); err != nil && !errors.Is(err, ErrConnectionLost) {
		return fmt.Errorf("client: add credit: %w", err)
	}
	return nil
}

// needsSubscribe reports whether the supervisor must subscribe s on cn.
func (s *Subscription) needsSubscribe(cn *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started && !s.closing && s.cn != cn
}

// subscribeOn subscribes s on cn unless it is already subscribed there. resub: a resubscription
// after a reconnect (an ephemeral subscription then starts FromNow).
func (s *Subscription) subscribeOn(ctx context.Context, cn *conn, resub bool) error {
	s.subMu.Lock()
	defer s.subMu.Unlock()
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return ErrSubscriptionClosed
	}
	if s.cn == cn && s.handle != 0 {
		s.mu.Unlock()
		return nil
	}
	if resub && cn.maxCredit != 0 && s.credit > cn.maxCredit {
		// A broker with a lower cap than the last one: it would refuse the subscription.
		s.logger.Warn("credit lowered to the broker's cap", slog.Uint64("credit", uint64(s.credit)), slog.Uint64("max_credit", uint64(cn.maxCredit)))
		s.credit = cn.maxCredit
		s.setWideWindow()
	}
	// AddCredit checks raises made while the Subscribe is on its way against this broker's cap:
	// attach sends them to it.
	s.maxCredit = cn.maxCredit
	credit := s.credit
	s.mu.Unlock()
	err := s.subscribeWith(ctx, cn, resub, credit)
	if resub && err != nil && errors.Is(err, protocol.ErrInvalidArgument) && s.dropUnconfirmedCredit(credit) {
		// A broker that announced no cap refused raises sent with Credit: subscribe with the
		// credit it accepted.
		s.mu.Lock()
		credit = s.credit
		s.mu.Unlock()
		err = s.subscribeWith(ctx, cn, resub, credit)
	}
	return err
}

// dropUnconfirmedCredit lowers the credit to what the broker last accepted when a Subscribe with
// credit (raised since) was refused; false when there was nothing to lower.
func (s *Subscription) dropUnconfirmedCredit(credit uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing || s.accepted == 0 || s.credit != credit || credit <= s.accepted {
		return false
	}
	s.logger.Warn("credit raise refused by the broker, dropped", slog.Uint64("credit", uint64(credit)), slog.Uint64("accepted", uint64(s.accepted)))
	s.credit = s.accepted
	s.setWideWindow()
	return true
}

// subscribeWith sends the Subscribe of s on cn with credit and waits for its answer. s.subMu
// must be held.
func (s *Subscription) subscribeWith(ctx context.Context, cn *conn, resub bool, credit uint32) error {
	start := s.params.Start
	if resub && s.params.Group == "" {
		start = FromNow()
	}
	mode := protocol.GroupShared
	if s.params.Ordered {
		mode = protocol.GroupOrdered
	}
	req := &protocol.Subscribe{
		Mode:          mode,
		Topic:         s.params.Topic,
		Group:         s.params.Group,
		MemberID:      s.cfg.memberID,
		MaxInFlight:   credit,
		LeaseDuration: s.cfg.leaseDuration,
		Start:         start.wire(),
		Filter:        s.params.Filter,
		BatchSize:     uint32(s.params.BatchSize),
	}
	if resub {
		req.Rejoin = s.rejoinID(cn)
	}
	// The handle is attached on the reader goroutine, before the next frame (possibly its first
	// delivery) is read. If the waiter gave up or the subscription closed meanwhile, the handle is
	// given back at once; so is a topic name's whose subscription was replaced (attach).
	var replaced []replacedSub // written by hook before cl.done is closed
	hook := func(cl *call, won bool) {
		ok, isOK := cl.resp.(*protocol.SubscribeOK)
		if !isOK {
			return
		}
		if won {
			var attached bool
			var raise uint32
			if attached, raise, replaced = s.attach(cn, ok, credit, resub && req.Rejoin == 0); attached {
				cn.registerHandle(ok.Handle, s)
				if raise > 0 {
					_ = cn.sendCredit(ok.Handle, raise)
				}
				return
			}
		}
		cn.startNoWait(&protocol.Unsubscribe{Handle: ok.Handle}, false)
	}
	cl, err := cn.start(ctx, req, hook, true, false)
	if err != nil {
		return err
	}
	if _, err := cn.wait(ctx, cl); err != nil {
		if req.Rejoin != 0 {
			s.rejoinRefused(err)
		}
		return err
	}
	if err := s.replacedEnded(replaced); err != nil {
		return err
	}
	s.logger.Debug("subscribed", slog.Bool("resubscribe", resub), slog.String("member_id", s.MemberID()))
	return nil
}

// rejoinID returns the subscription a resubscription of s on cn rejoins (protocol.Subscribe.Rejoin):
// that of a topic name's handle, known from its last SubscribeOK or its deliveries, when cn speaks
// protocol version 5. The broker then creates nothing for it: a group cancelled or a topic deleted
// while the client was away refuses the resubscription with SUBSCRIPTION_NOT_ACTIVE,
// SUBSCRIPTION_NOT_FOUND or TOPIC_NOT_FOUND, with which resubscribeAll ends s. 0 (older broker, a
// pattern, or no subscription known yet: a topic created after the Subscribe, none delivered
// since) keeps the Subscribe that may create, and attach's comparison of the answer.
func (s *Subscription) rejoinID(cn *conn) int64 {
	if s.pattern || cn.hello.Version < protocol.Version5 {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.joined) != 1 {
		return 0
	}
	return s.joined[0].SubscriptionID
}

// rejoinRefused reports a rejoining resubscription that the broker refused because the subscription
// ended while the client was away (group cancelled, subscription or topic deleted) to
// SubscriptionEndedHook, as an end pushed while connected is; resubscribeAll then ends s with err.
func (s *Subscription) rejoinRefused(err error) {
	if !errors.Is(err, protocol.ErrSubscriptionNotActive) && !errors.Is(err, protocol.ErrSubscriptionNotFound) &&
		!errors.Is(err, protocol.ErrTopicNotFound) {
		return
	}
	ev := SubscriptionEndedEvent{Topic: s.params.Topic, Pattern: s.params.Topic, Group: s.params.Group, Err: err}
	for _, h := range s.c.hooks.ended {
		h.OnSubscriptionEnded(ev)
	}
}

// replacedSub is a subscription of a durable group that a resubscription found replaced: the
// broker answered with a new subscription of the group on the same topic.
type replacedSub struct {
	topic    string
	from, to int64
}

// attach records the handle of a successful Subscribe with credit; false when the subscription
// closed. raise is what AddCredit added while the Subscribe was on its way, for the caller to send
// to the new handle. On a resubscription of a durable group (resub) it returns the subscriptions
// the answer replaced: they ended while the client was away (group cancelled, topic deleted and
// created again) and the broker took the Subscribe as that of a new group. A topic-name handle is
// then not attached (false): its Subscription ends with its subscription, as it does when the end
// comes while connected (ended); a pattern's handle goes on with the new one. A resubscription that
// rejoined (rejoinID) passes resub false: the broker joined only a subscription that had not ended
// (a different id then means a semantics change moved the group, as it moves connected members).
func (s *Subscription) attach(cn *conn, ok *protocol.SubscribeOK, credit uint32, resub bool) (attached bool, raise uint32, replaced []replacedSub) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false, 0, nil
	}
	if resub && s.params.Group != "" {
		// An ephemeral subscription (no group) is new at every resubscription by design.
		for _, now := range ok.Subscriptions {
			for _, was := range s.joined {
				if was.Topic == now.Topic && was.SubscriptionID != now.SubscriptionID {
					replaced = append(replaced, replacedSub{topic: now.Topic, from: was.SubscriptionID, to: now.SubscriptionID})
				}
			}
		}
		if len(replaced) > 0 && !s.pattern {
			return false, 0, replaced
		}
	}
	s.cn, s.handle, s.memberID, s.joined, s.started = cn, ok.Handle, ok.MemberID, ok.Subscriptions, true
	s.maxCredit = cn.maxCredit
	s.accepted = credit
	// Raises made since credit was read did not reach this handle (AddCredit sent them to none,
	// or to the one it replaces): the caller sends them to it. They are within cn's cap
	// (subscribeOn lowered the credit to it, AddCredit checked them against it). From now on
	// AddCredit sends its raises to this handle itself.
	if s.credit > credit {
		raise = s.credit - credit
		if s.maxCredit != 0 {
			s.accepted = s.credit
		}
	}
	return true, raise, replaced
}

// replacedEnded reports the subscriptions a resubscription found replaced (attach) as ended by the
// broker: to SubscriptionEndedHook and the log. For a topic name it returns the end's reason, a
// non-retryable SUBSCRIPTION_NOT_ACTIVE, with which resubscribeAll ends the Subscription; a
// pattern's Subscription goes on.
func (s *Subscription) replacedEnded(replaced []replacedSub) error {
	var last error
	for _, r := range replaced {
		err := protocol.ErrSubscriptionNotActive.Errorf("subscription %d of group %q on topic %q ended while the client was reconnecting; the broker took the resubscription for a new group (subscription %d)",
			r.from, s.params.Group, r.topic, r.to)
		ev := SubscriptionEndedEvent{Topic: r.topic, Pattern: s.params.Topic, Group: s.params.Group, Err: err}
		for _, h := range s.c.hooks.ended {
			h.OnSubscriptionEnded(ev)
		}
		if s.pattern {
			s.logger.Warn("subscription ended while reconnecting; the pattern goes on with its new one", slog.String("ended_topic", r.topic),
				slog.Int64("subscription", r.to), slog.Any("reason", err))
		}
		last = err
	}
	if s.pattern {
		return nil
	}
	return last
}

// push queues a delivery for the handlers (on the reader goroutine). Deliveries of a handle that
// is no longer current are dropped: the broker released (or releases) their leases.
func (s *Subscription) push(cn *conn, pd *protocol.Delivery) {
	s.mu.Lock()
	if s.closing || s.cn != cn || s.handle != pd.Handle {
		s.mu.Unlock()
		return
	}
	if !s.pattern && (len(s.joined) != 1 || s.joined[0].SubscriptionID != pd.SubscriptionID) {
		// A topic created after the Subscribe was joined without a SubscribeOK naming it, and a
		// semantics change moves the handle without a push: the deliveries say which
		// subscription the handle is on, and a resubscription rejoins that one (rejoinID).
		s.joined = []protocol.SubscriptionInfo{{SubscriptionID: pd.SubscriptionID, Topic: pd.Topic}}
	}
	d := newDelivery(s, cn, pd)
	if s.batchHandler != nil {
		// A batch goes to one handler call once all of it arrived (batch.go); a delivery
		// without batch fields is a batch of its own.
		if d = s.collectLocked(d, pd); d == nil {
			s.mu.Unlock()
			return
		}
	}
	s.queue = append(s.queue, d)
	s.mu.Unlock()
	s.cond.Signal()
}

// dropQueuedLocked forgets the queued deliveries of cn (all when cn is nil). s.mu must be held.
func (s *Subscription) dropQueuedLocked(cn *conn) {
	keep := s.queue[:0]
	for _, d := range s.queue {
		if cn != nil && d.cn != cn {
			keep = append(keep, d)
		}
	}
	clear(s.queue[len(keep):])
	s.queue = keep
	for k, ds := range s.pending {
		if cn == nil || ds[0].cn == cn {
			delete(s.pending, k)
		}
	}
}

// connLost detaches s from a connection that broke; the supervisor resubscribes it.
func (s *Subscription) connLost(cn *conn) {
	s.mu.Lock()
	if s.cn == cn {
		s.cn, s.handle = nil, 0
	}
	s.dropQueuedLocked(cn)
	s.mu.Unlock()
}

// ended handles a SubscriptionEnded push.
func (s *Subscription) ended(cn *conn, m *protocol.SubscriptionEnded) {
	err := m.Err()
	ev := SubscriptionEndedEvent{Topic: m.Topic, Pattern: s.params.Topic, Group: s.params.Group, HandleClosed: m.SubscriptionID == 0, Err: err}
	for _, h := range s.c.hooks.ended {
		h.OnSubscriptionEnded(ev)
	}
	if m.SubscriptionID != 0 {
		switch act, h := s.joinedEnded(cn, m); act {
		case endStop:
			// The handle's only subscription ended for good (group cancelled, topic deleted): the
			// Subscription ends with it. Subscribing again would create a new subscription, which
			// is not what the caller's group was.
			s.logger.Error("subscription ended by the broker", slog.String("ended_topic", m.Topic), slog.Any("reason", err))
			s.end(err)
		case endResubscribe:
			// The broker keeps the handle open without the subscription: give it back (its leases
			// are released) and subscribe again, as after a retryable close of the handle.
			cn.unregisterHandle(h)
			cn.startNoWait(&protocol.Unsubscribe{Handle: h}, true)
			s.logger.Warn("subscription ended by the broker with a retryable code; resubscribing", slog.String("ended_topic", m.Topic),
				slog.Any("reason", err))
			s.c.requestResubscribe()
		default:
			s.logger.Warn("subscription ended by the broker; the handle stays open", slog.String("ended_topic", m.Topic), slog.Any("reason", err))
		}
		return
	}
	s.mu.Lock()
	if s.cn == cn && s.handle == m.Handle {
		s.cn, s.handle = nil, 0
		s.dropQueuedLocked(cn)
	}
	s.mu.Unlock()
	if protocol.IsRetryable(err) {
		s.logger.Warn("handle closed by the broker; resubscribing", slog.Any("reason", err))
		s.c.requestResubscribe()
		return
	}
	s.logger.Error("subscription ended by the broker", slog.Any("reason", err))
	s.end(err)
}

// endAction is what the end of one of a handle's subscriptions does to the Subscription
// (joinedEnded).
type endAction int

const (
	endKeep        endAction = iota // the handle goes on with its other topics
	endStop                         // the Subscription ends with the reason
	endResubscribe                  // the handle is given back and subscribed again
)

// joinedEnded forgets the subscription m ended and says what becomes of the handle. A topic-name
// handle is on at most one subscription, its topic's, and without it delivers nothing more: the
// end of any subscription of the handle is the end of that one, whether or not the client knew
// its id (a topic created after the Subscribe is joined without a SubscribeOK naming the
// subscription, which the client learns from the first delivery only; a semantics change moves
// the handle to another subscription without a push). A non-retryable end stops it (endStop). A
// pattern's handle goes on after one (endKeep): it keeps its other topics and joins matching
// topics created later (a deleted topic created again, with the group's binding).
//
// A retryable end (the member could not stay on the subscription it belongs to: the storage
// unavailable...) says that subscribing again may get the subscription back. The handle would
// otherwise stay open without it, receiving nothing more from that topic: it is detached, to be
// given back (h) and subscribed again (endResubscribe), a topic name's rejoining the subscription
// that ended, so that the broker creates nothing should it have been cancelled meanwhile. (The
// current broker closes such a handle right after the end: its close then finds the handle gone
// and is ignored.)
func (s *Subscription) joinedEnded(cn *conn, m *protocol.SubscriptionEnded) (act endAction, h uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing || s.cn != cn || s.handle != m.Handle {
		return endKeep, 0
	}
	s.joined = slices.DeleteFunc(s.joined, func(j protocol.SubscriptionInfo) bool { return j.SubscriptionID == m.SubscriptionID })
	switch {
	case !protocol.IsRetryable(m.Err()):
		if s.pattern {
			return endKeep, 0
		}
		return endStop, 0
	case !s.pattern && cn.hello.Version >= protocol.Version5:
		// The resubscription rejoins it (rejoinID). An older broker cannot take a rejoin, and the
		// comparison of its answer (attach) would take a different subscription for the end of
		// this one: that one was told already.
		s.joined = []protocol.SubscriptionInfo{{SubscriptionID: m.SubscriptionID, Topic: m.Topic}}
	}
	h = s.handle
	s.cn, s.handle = nil, 0
	s.dropQueuedLocked(cn)
	return endResubscribe, h
}

// end stops s because of err (the broker ended it, or a resubscription failed for good): the
// handlers take no new deliveries, and Done is closed when they returned.
func (s *Subscription) end(err error) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return
	}
	s.closing = true
	s.err = err
	cn, h := s.cn, s.handle
	s.cn, s.handle = nil, 0
	s.dropQueuedLocked(nil)
	s.mu.Unlock()
	s.cond.Broadcast()
	s.c.removeSub(s)
	if cn != nil && h != 0 {
		cn.unregisterHandle(h)
		cn.startNoWait(&protocol.Unsubscribe{Handle: h}, true)
	}
	// Done is closed by the last handler goroutine to return, or by Subscribe's abort when they
	// were never started.
}

// finish closes Done once.
func (s *Subscription) finish() {
	s.doneOnce.Do(func() {
		s.cancel()
		close(s.done)
	})
}

// Close stops the subscription: its handlers take no new deliveries; Close waits for the running
// ones to return (until ctx ends; then their ctx is cancelled and Close stops waiting), sends
// their acks, and unsubscribes: the broker releases the leases of deliveries that were still
// queued and gives them to other members at once. A durable group's subscription stays on the
// broker (leaving is not cancelling); an ephemeral one ends. Close is idempotent; it returns nil
// for a subscription the broker had already ended (see Err).
func (s *Subscription) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		select {
		case <-s.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.closing = true
	started := s.workersStarted
	s.mu.Unlock()
	s.cond.Broadcast()

	var err error
	if started {
		select {
		case <-s.workersDone:
		case <-ctx.Done():
			s.cancel()
			err = fmt.Errorf("client: close subscription %q: handlers still running: %w", s.params.Topic, ctx.Err())
		}
	}
	// No subMu here: a resubscription in flight sees closing when its answer comes and gives the
	// new handle back itself.
	s.mu.Lock()
	cn, h := s.cn, s.handle
	s.cn, s.handle = nil, 0
	s.dropQueuedLocked(nil)
	s.mu.Unlock()
	if cn != nil && h != 0 {
		if ctx.Err() == nil {
			_, uerr := cn.roundTrip(ctx, &protocol.Unsubscribe{Handle: h}, true)
			if uerr != nil && !errors.Is(uerr, ErrConnectionLost) && !errors.Is(uerr, protocol.ErrUnknownHandle) && err == nil {
				err = fmt.Errorf("client: unsubscribe %q: %w", s.params.Topic, uerr)
			}
		} else {
			cn.startNoWait(&protocol.Unsubscribe{Handle: h}, true)
		}
		cn.unregisterHandle(h)
	}
	s.c.removeSub(s)
	s.finish()
	return err
}

// next returns the next delivery for a handler, and whether the queue is empty after it; nil when
// the subscription is closing.
func (s *Subscription) next() (*Delivery, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for !s.closing && len(s.queue) == 0 {
		s.cond.Wait()
	}
	if s.closing {
		return nil, false
	}
	d := s.queue[0]
	s.queue[0] = nil
	s.queue = s.queue[1:]
	return d, len(s.queue) == 0
}

// work is one handler goroutine.
func (s *Subscription) work() {
	defer func() {
		if s.workersLeft.Add(-1) == 0 {
			s.workersDoneOnce.Do(func() { close(s.workersDone) })
			s.mu.Lock()
			ended := s.err != nil
			s.mu.Unlock()
			if ended {
				s.finish()
			}
		}
	}()
	for {
		d, last := s.next()
		if d == nil {
			return
		}
		if !d.cn.enterHandler() {
			continue // the broker is closing this connection and releases the delivery
		}
		start := time.Now()
		var err error
		if d.batch != nil {
			err = s.runBatchHandler(d.batch)
		} else {
			err = s.runHandler(d)
		}
		took := time.Since(start)
		var settleErr error
		switch {
		case d.batch != nil && !errors.Is(err, ErrUnsettled):
			settleErr = s.settleBatch(d.batch, err)
		case s.cfg.manualAck:
			if err != nil {
				s.logger.Debug("handler error (manual ack)", slog.Int64("offset", d.Offset), slog.Any("error", err))
			}
		case errors.Is(err, ErrUnsettled):
			// Left to its lease or to the Subscription's close (released, not nacked).
		default:
			settleErr = s.settle(d, err, last)
		}
		d.cn.leaveHandler()
		if err != nil && !errors.Is(err, ErrUnsettled) {
			s.logger.Debug("handler error, nacked", slog.String("message_topic", d.Topic), slog.Int64("offset", d.Offset),
				slog.Int("attempt", d.Attempt), slog.Any("error", err))
		}
		if settleErr != nil {
			s.logger.Debug("settle failed", slog.Int64("offset", d.Offset), slog.Any("error", settleErr))
		}
		if len(s.c.hooks.handle) > 0 {
			ev := HandleEvent{Topic: d.Topic, Group: s.params.Group, Attempt: d.Attempt, Took: took, Err: err, SettleErr: settleErr}
			for _, h := range s.c.hooks.handle {
				h.OnHandle(ev)
			}
		}
	}
}

// runHandler calls the handler, turning a panic into an error.
func (s *Subscription) runHandler(d *Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.logger.Error("panic in a handler", slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			err = fmt.Errorf("client: handler panic: %v", r)
		}
	}()
	return s.handler(s.ctx, d)
}

// ackCoalesceCredit is the credit per handler goroutine from which the ack of a subscription's
// last queued delivery waits for others (ackDelay) instead of leaving at once: in a millisecond
// a handler settles far fewer deliveries than that (one per 16 us), so the window does not run
// dry while acks wait, and a consumer that receives one delivery at a time sends an Ack frame
// per millisecond, not per delivery (at 2,000 deliveries/s, half the frames, and half the
// engine calls on the broker).
const ackCoalesceCredit = 64

// setWideWindow updates wideWindow from the credit. s.mu held, or s not shared yet.
func (s *Subscription) setWideWindow() {
	s.wideWindow.Store(uint64(s.credit) >= ackCoalesceCredit*uint64(max(s.cfg.concurrency, 1)))
}

// settle acks (err == nil) or nacks d after its handler returned, unless the handler settled it
// itself. Acks are queued for coalescing; one is sent at once when no other delivery is waiting
// (last) and the window is narrow (wideWindow: the broker may be waiting for this ack's credit to
// deliver more). Nacks are sent at once. Neither waits for the broker's answer.
func (s *Subscription) settle(d *Delivery, err error, last bool) error {
	if !d.settled.CompareAndSwap(false, true) {
		return nil
	}
	if d.cn.isDead() {
		return d.cn.lostErr()
	}
	if err == nil {
		d.cn.ack(d.ref, nil, last && !s.wideWindow.Load())
		return nil
	}
	req := s.nackRequest(d, err)
	_, serr := d.cn.start(s.c.rootCtx, req, func(cl *call, _ bool) {
		if cl.err != nil {
			s.logger.Debug("nack failed", slog.Int64("offset", d.Offset), slog.Any("error", cl.err))
		}
	}, false, false)
	return serr
}

// nackRequest builds the Nack of d for the handler error err.
func (s *Subscription) nackRequest(d *Delivery, err error) *protocol.Nack {
	req := &protocol.Nack{Delay: s.cfg.nackDelay, Refs: []protocol.Ref{d.ref}}
	if err != nil {
		req.Reason = truncate(err.Error(), 1024)
	}
	var ne *nackError
	if errors.As(err, &ne) {
		req.ToDLQ = ne.toDLQ
		if ne.hasDelay {
			req.Delay = min(max(ne.delay, 0), protocol.MaxDuration)
		}
		req.Reason = truncate(ne.err.Error(), 1024)
	}
	return req
}

// truncate makes s valid UTF-8 (the wire requires it) and cuts it to at most n bytes without
// splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}
