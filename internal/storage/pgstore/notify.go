package pgstore

import (
	"context"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/storage"
)

// notifyState is the wake-up machinery: local callbacks, the set of notifications waiting for
// the notifier goroutine, and the listener connection (for tests).
type notifyState struct {
	mu     sync.Mutex
	nextID int
	// fns is copied on write, so that callbacks run without a lock held (one may unregister).
	fns atomic.Pointer[[]callback]

	// pending holds the notifications to send to other instances, coalesced per kind and topic;
	// wake signals the notifier goroutine (capacity 1).
	pendingMu sync.Mutex
	pending   map[storage.Notification]struct{}
	wake      chan struct{}

	// alone is set while no other instance is registered in spool.instances (read at Open and
	// at every heartbeat: sawInstances) and none was heard from since (heardPeer): the notifier
	// then sends nothing, since nobody listens, and keeps what it did not send in dropped (under
	// pendingMu, with when) until the instance is no longer alone, when what it dropped in the
	// last droppedWindow is sent after all (a newcomer LISTENs before the others know of it).
	// peerHeard counts what the listener heard from other instances, so that a heartbeat's read
	// that raced a newcomer's hello does not set alone.
	alone     atomic.Bool
	peerHeard atomic.Uint64
	dropped   map[storage.Notification]time.Time
	pruned    time.Time // when keepDropped last forgot old ones

	// listenConn is the listener's current connection (nil between reconnects); guarded by
	// connMu. Tests close it to simulate a lost connection.
	connMu     sync.Mutex
	listenConn *pgx.Conn
	// reconnects counts the listener's successful reconnections (tests).
	reconnects int
}

// Notification payloads are "<instance hex>:<kind>:<topic>", and for storage.NotifySubscription
// "<instance hex>:<kind>:<topic>:<subscription id>"; the channel is
// the schema name. An instance older than NotifySubscription rejects its kind in parsePayload as
// malformed and ignores it: its brokers find the change at their periodic reread of the
// subscription, as before the kind existed.

// NotifyRegister registers fn to be called after messages were appended to a topic, a topic was
// created or deleted, or a subscription's state or group changed, by this engine (at once, from the goroutine that made the change) or by
// another instance (from the listener or poller goroutine). fn must not block. Notifications may
// be coalesced and spurious. Safe for concurrent use; the returned function unregisters fn.
func (e *Engine) NotifyRegister(fn func(storage.Notification)) func() {
	ns := &e.notify
	ns.mu.Lock()
	defer ns.mu.Unlock()
	id := ns.nextID
	ns.nextID++
	var fns []callback
	if old := ns.fns.Load(); old != nil {
		fns = append(fns, *old...)
	}
	fns = append(fns, callback{id: id, fn: fn})
	ns.fns.Store(&fns)
	return func() {
		ns.mu.Lock()
		defer ns.mu.Unlock()
		old := ns.fns.Load()
		if old == nil {
			return
		}
		fns := make([]callback, 0, len(*old))
		for _, c := range *old {
			if c.id != id {
				fns = append(fns, c)
			}
		}
		ns.fns.Store(&fns)
	}
}

// callback is a registered NotifyRegister function.
type callback struct {
	id int
	fn func(storage.Notification)
}

// callLocal calls every registered callback with n.
func (e *Engine) callLocal(n storage.Notification) {
	fns := e.notify.fns.Load()
	if fns == nil {
		return
	}
	for _, c := range *fns {
		c.fn(n)
	}
}

// announce tells NotifyRegister callbacks of this instance (at once) and other instances (through
// NOTIFY, coalesced per topic and Config.NotifyDelay, sent by the notifier goroutine from its own
// connection) about n. Call it after the transaction that made n true committed. Never blocks.
func (e *Engine) announce(n storage.Notification) {
	e.callLocal(n)
	e.announceToOthers(n)
}

// announceToOthers sends n to the other instances only (NOTIFY, coalesced by the notifier
// goroutine). It is for changes of delivery state that make messages claimable (a release or a
// nack by a member of this instance, a DLQ replay, a resume): this instance's broker wakes its
// own dispatchers, but a member connected to another instance would otherwise only learn of
// them at its dispatcher's next poll.
func (e *Engine) announceToOthers(n storage.Notification) {
	ns := &e.notify
	ns.pendingMu.Lock()
	if ns.pending == nil {
		ns.pending = map[storage.Notification]struct{}{}
	}
	ns.pending[n] = struct{}{}
	ns.pendingMu.Unlock()
	if ns.wake != nil {
		select {
		case ns.wake <- struct{}{}:
		default:
		}
	}
}

// subscriptionChanged announces that subscription id of topic changed state or group
// (storage.NotifySubscription), once the transaction that changed it committed: to this
// instance's callbacks at once and to the other instances through the notifier (coalesced per
// subscription, none while this instance is alone), one per change.
func (e *Engine) subscriptionChanged(topic string, id int64) {
	e.announce(storage.Notification{Kind: storage.NotifySubscription, Topic: topic, SubscriptionID: id})
}

// helloKind is the kind of the notification an instance sends once it LISTENs (startNotify), so
// that an instance that was alone notifies again at once rather than at its next heartbeat.
// parsePayload rejects it as malformed, so older instances ignore it.
const helloKind = "hello"

// droppedWindow is how far back the notifications an instance did not send while alone are sent
// once it is not: a newcomer's LISTEN comes a few milliseconds before its hello reaches the
// others, or up to a heartbeat (InstanceHeartbeat) before they read its row.
func (e *Engine) droppedWindow() time.Duration {
	return max(10*time.Second, 2*e.cfg.InstanceHeartbeat)
}

// sawInstances records what a read of spool.instances found: whether others than this instance
// are registered. heard is peerHeard as it was before the read.
func (e *Engine) sawInstances(others bool, heard uint64) {
	ns := &e.notify
	if !others {
		ns.alone.Store(true)
		if ns.peerHeard.Load() == heard {
			return
		}
		// heardPeer ran during the read
	}
	if ns.alone.Swap(false) {
		e.resendDropped()
	}
}

// heardPeer records a notification of another instance.
func (e *Engine) heardPeer() {
	e.notify.peerHeard.Add(1)
	if e.notify.alone.Swap(false) {
		e.resendDropped()
	}
}

// resendDropped queues for the notifier what it did not send while the instance was alone, in
// the last droppedWindow.
func (e *Engine) resendDropped() {
	ns := &e.notify
	since := time.Now().Add(-e.droppedWindow())
	ns.pendingMu.Lock()
	for n, at := range ns.dropped {
		if at.After(since) {
			if ns.pending == nil {
				ns.pending = map[storage.Notification]struct{}{}
			}
			ns.pending[n] = struct{}{}
		}
	}
	ns.dropped = nil
	ns.pendingMu.Unlock()
	if ns.wake != nil {
		select {
		case ns.wake <- struct{}{}:
		default:
		}
	}
}

// channel is the LISTEN/NOTIFY channel of the schema.
func (e *Engine) channel() string { return e.schema }

// payload encodes a notification of this instance for NOTIFY.
func (e *Engine) payload(n storage.Notification) string {
	return formatPayload(e.instanceHex, n)
}

// formatPayload encodes a notification sent by instance (hex).
func formatPayload(instance string, n storage.Notification) string {
	s := instance + ":" + strconv.Itoa(int(n.Kind)) + ":" + n.Topic
	if n.Kind == storage.NotifySubscription {
		s += ":" + strconv.FormatInt(n.SubscriptionID, 10)
	}
	return s
}

// parsePayload decodes a NOTIFY payload; ok is false for a malformed one. self reports our own.
func (e *Engine) parsePayload(s string) (n storage.Notification, self, ok bool) {
	inst, rest, found := strings.Cut(s, ":")
	if !found {
		return n, false, false
	}
	kind, topic, found := strings.Cut(rest, ":")
	if !found {
		return n, false, false
	}
	k, err := strconv.Atoi(kind)
	// Kinds newer than this build are malformed to it, and ignored (see the payload format).
	if err != nil || k < int(storage.NotifyMessages) || k > int(storage.NotifySubscription) {
		return n, false, false
	}
	n = storage.Notification{Kind: storage.NotificationKind(k), Topic: topic}
	if n.Kind == storage.NotifySubscription {
		i := strings.LastIndexByte(topic, ':')
		if i < 0 {
			return storage.Notification{}, false, false
		}
		sub, err := strconv.ParseInt(topic[i+1:], 10, 64)
		if err != nil || sub <= 0 {
			return storage.Notification{}, false, false
		}
		n.Topic, n.SubscriptionID = topic[:i], sub
	}
	return n, inst == e.instanceHex, true
}

// fromPeer reports whether a payload was sent by another broker instance (not by this one, nor
// by an application's transaction), and whether it is that instance's hello.
func (e *Engine) fromPeer(payload string) (peer, hello bool) {
	inst, rest, found := strings.Cut(payload, ":")
	if !found || inst == "0" || inst == e.instanceHex {
		return false, false
	}
	return true, rest == helloKind
}

// startNotify starts the notifier, the listener (its first LISTEN is done before returning, so
// that notifications sent after Open are seen), the poller and the maintenance goroutine.
func (e *Engine) startNotify(ctx context.Context) error {
	e.notify.wake = make(chan struct{}, 1)
	conn, err := e.listen(ctx)
	if err != nil {
		return err
	}
	marks, err := e.pollMarks()
	if err != nil {
		_ = conn.Close(ctx)
		return err
	}
	// Instances that were alone learn of this one now, not at their next heartbeat.
	if _, err := e.pool.Exec(ctx, "SELECT pg_notify($1, $2)", e.channel(), e.instanceHex+":"+helloKind); err != nil {
		e.log.Warn("pgstore: could not announce this instance to the others (they notify it from their next heartbeat on)", "err", err)
	}
	e.wg.Add(5)
	go e.notifierLoop()
	go e.listenLoop(conn)
	go e.pollLoop(marks)
	go e.maintenanceLoop()
	go e.sequencerLoop()
	e.wakeSequencer() // messages staged while no instance ran
	// Wake the notifier for announcements made before it started.
	select {
	case e.notify.wake <- struct{}{}:
	default:
	}
	return nil
}

// notifierLoop sends the pending notifications, one NOTIFY per kind and topic per NotifyDelay,
// all in one statement; none while this instance is alone (a NOTIFY transaction per NotifyDelay
// was ~18% of a single instance's commits in a 16-group fan-out, each with its WAL flush).
func (e *Engine) notifierLoop() {
	defer e.wg.Done()
	ns := &e.notify
	for {
		select {
		case <-e.bgCtx.Done():
			return
		case <-ns.wake:
		}
		if e.cfg.NotifyDelay > 0 {
			t := time.NewTimer(e.cfg.NotifyDelay)
			select {
			case <-e.bgCtx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		ns.pendingMu.Lock()
		pending := ns.pending
		ns.pending = nil
		if ns.alone.Load() {
			e.keepDropped(pending)
			pending = nil // nobody to send it to
		}
		ns.pendingMu.Unlock()
		if len(pending) == 0 {
			continue
		}
		payloads := make([]string, 0, len(pending))
		for n := range pending {
			payloads = append(payloads, e.payload(n))
		}
		ctx, cancel := context.WithTimeout(e.bgCtx, 10*time.Second)
		_, err := e.pool.Exec(ctx, "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p", e.channel(), payloads)
		cancel()
		if err != nil && e.bgCtx.Err() == nil {
			// Other instances find the messages with their poller.
			e.log.Warn("pgstore: notify failed", "err", err, "notifications", len(payloads))
		}
	}
}

// keepDropped remembers the notifications pending that the notifier did not send (the instance
// was alone), for resendDropped. Called with pendingMu held. The map holds a notification per
// kind and topic at most; at maxDropped, those older than droppedWindow go (at most once per
// droppedWindow), and while it stays full the rest are not kept: a newcomer's poller finds
// those topics within its poll_interval.
func (e *Engine) keepDropped(pending map[storage.Notification]struct{}) {
	ns := &e.notify
	if len(pending) == 0 {
		return
	}
	now := time.Now()
	if ns.dropped == nil {
		ns.dropped = map[storage.Notification]time.Time{}
	}
	if len(ns.dropped) >= maxDropped && now.Sub(ns.pruned) > e.droppedWindow() {
		ns.pruned = now
		since := now.Add(-e.droppedWindow())
		maps.DeleteFunc(ns.dropped, func(_ storage.Notification, at time.Time) bool { return !at.After(since) })
	}
	for n := range pending {
		if _, ok := ns.dropped[n]; ok || len(ns.dropped) < maxDropped {
			ns.dropped[n] = now
		}
	}
}

// maxDropped bounds notifyState.dropped (keepDropped).
const maxDropped = 16384

// listen opens the listener's dedicated connection (not from the pool) and LISTENs.
func (e *Engine) listen(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, e.cfg.URL)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{e.channel()}.Sanitize()); err != nil {
		_ = conn.Close(context.Background())
		return nil, err
	}
	e.notify.connMu.Lock()
	e.notify.listenConn = conn
	e.notify.connMu.Unlock()
	return conn, nil
}

// listenLoop receives notifications of other instances and calls the callbacks. When the
// connection fails (database restart, network), it reconnects with backoff, LISTENs again and
// wakes every topic, since notifications sent meanwhile are lost.
func (e *Engine) listenLoop(conn *pgx.Conn) {
	defer e.wg.Done()
	defer func() {
		e.notify.connMu.Lock()
		e.notify.listenConn = nil
		e.notify.connMu.Unlock()
		if conn != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(ctx)
			cancel()
		}
	}()
	backoff := 50 * time.Millisecond
	for {
		if conn == nil {
			t := time.NewTimer(backoff)
			select {
			case <-e.bgCtx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, 5*time.Second)
			ctx, cancel := context.WithTimeout(e.bgCtx, 10*time.Second)
			c, err := e.listen(ctx)
			cancel()
			if err != nil {
				if e.bgCtx.Err() == nil {
					e.log.Warn("pgstore: listener reconnect failed", "err", err, "retry_in", backoff)
				}
				continue
			}
			conn = c
			backoff = 50 * time.Millisecond
			e.notify.connMu.Lock()
			e.notify.reconnects++
			e.notify.connMu.Unlock()
			e.log.Info("pgstore: listener reconnected")
			e.wakeAll()
			e.wakeSequencer()
		}
		n, err := conn.WaitForNotification(e.bgCtx)
		if err != nil {
			if e.bgCtx.Err() != nil {
				return
			}
			e.log.Warn("pgstore: listener connection lost", "err", err)
			e.notify.connMu.Lock()
			e.notify.listenConn = nil
			e.notify.connMu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(ctx)
			cancel()
			conn = nil
			continue
		}
		if n.Payload == stagedPayload {
			e.wakeSequencer()
			continue
		}
		if peer, hello := e.fromPeer(n.Payload); peer && (hello || e.notify.alone.Load()) {
			e.heardPeer()
			if hello {
				continue
			}
		}
		note, self, ok := e.parsePayload(n.Payload)
		if !ok {
			e.log.Debug("pgstore: ignoring malformed notification", "payload", n.Payload)
			continue
		}
		if !self {
			e.callLocal(note)
		}
	}
}

// wakeAll calls the callbacks with NotifyMessages for every topic.
func (e *Engine) wakeAll() {
	ctx, cancel := context.WithTimeout(e.bgCtx, 10*time.Second)
	defer cancel()
	rows, err := e.pool.Query(ctx, e.sql("SELECT name FROM spool.topics ORDER BY name"))
	if err != nil {
		e.log.Warn("pgstore: wake all topics", "err", err)
		return
	}
	topics, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.log.Warn("pgstore: wake all topics", "err", err)
		return
	}
	for _, t := range topics {
		e.callLocal(storage.Notification{Kind: storage.NotifyMessages, Topic: t})
	}
}

// topicMark is what the poller remembers of a topic.
type topicMark struct {
	name string
	sum  int64
}

// pollLoop compares every topic's high-water marks every PollInterval and wakes the topics that
// changed (and reports topics created and deleted meanwhile): the fallback when a NOTIFY is lost.
func (e *Engine) pollLoop(last map[int64]topicMark) {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-e.bgCtx.Done():
			return
		case <-t.C:
		}
		cur, err := e.pollMarks()
		if err != nil {
			if e.bgCtx.Err() == nil {
				e.log.Debug("pgstore: poll", "err", err)
			}
			continue
		}
		for id, m := range cur {
			old, ok := last[id]
			switch {
			case !ok:
				e.callLocal(storage.Notification{Kind: storage.NotifyTopicCreated, Topic: m.name})
				if m.sum > 0 {
					e.callLocal(storage.Notification{Kind: storage.NotifyMessages, Topic: m.name})
				}
			case old.sum != m.sum:
				e.callLocal(storage.Notification{Kind: storage.NotifyMessages, Topic: m.name})
			}
		}
		for id, m := range last {
			if _, ok := cur[id]; !ok {
				e.callLocal(storage.Notification{Kind: storage.NotifyTopicDeleted, Topic: m.name})
			}
		}
		last = cur
	}
}

func (e *Engine) pollMarks() (map[int64]topicMark, error) {
	ctx, cancel := context.WithTimeout(e.bgCtx, max(e.cfg.PollInterval, 5*time.Second))
	defer cancel()
	rows, err := e.pool.Query(ctx, e.sql(`SELECT t.id, t.name, coalesce(sum(p.next_offset), 0)::bigint
		FROM spool.topics t LEFT JOIN spool.partitions p ON p.topic_id = t.id GROUP BY t.id`))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cur := map[int64]topicMark{}
	for rows.Next() {
		var id int64
		var m topicMark
		if err := rows.Scan(&id, &m.name, &m.sum); err != nil {
			return nil, err
		}
		cur[id] = m
	}
	return cur, rows.Err()
}
