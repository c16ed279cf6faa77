package pgstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/storagetest"
	"github.com/spoolmq/spool/internal/testutil"
)

// awaitNotification waits up to 10 s for n on ch, skipping others.
func awaitNotification(t *testing.T, ch <-chan storage.Notification, n storage.Notification) {
	t.Helper()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	for {
		select {
		case got := <-ch:
			if got == n {
				return
			}
		case <-timer.C:
			t.Fatalf("no notification %+v within 10 s", n)
		}
	}
}

// recorder registers a callback that forwards notifications to a channel without blocking.
func recorder(e *Engine) (<-chan storage.Notification, func()) {
	ch := make(chan storage.Notification, 1024)
	unregister := e.NotifyRegister(func(n storage.Notification) {
		select {
		case ch <- n:
		default:
		}
	})
	return ch, unregister
}

// twoInstances opens two engines on one schema; the second polls rarely, so that what it sees
// within the test comes through LISTEN/NOTIFY.
func twoInstances(t *testing.T, poll time.Duration) (*Engine, *Engine) {
	t.Helper()
	clock := storagetest.NewFakeClock(logBase)
	cfg := testConfig(t, clock)
	e1 := logOpen(t, cfg)
	cfg.PollInterval = poll
	e2 := logOpen(t, cfg)
	return e1, e2
}

// TestNotifyAcrossInstances: topic creation and publishes on one instance wake the callbacks of
// another through NOTIFY (the poller is too slow to be the cause).
func TestNotifyAcrossInstances(t *testing.T) {
	t.Parallel()
	e1, e2 := twoInstances(t, time.Minute)
	ch, unregister := recorder(e2)
	defer unregister()
	logTopic(t, e1, "n.x", storage.TopicConfig{})
	awaitNotification(t, ch, storage.Notification{Kind: storage.NotifyTopicCreated, Topic: "n.x"})
	logPublish(t, e1, "n.x", 0, "a")
	awaitNotification(t, ch, storage.Notification{Kind: storage.NotifyMessages, Topic: "n.x"})
	// Many publishes coalesce, and the last one is always followed by a notification.
	for range 20 {
		logPublish(t, e1, "n.x", 0, "b")
	}
	awaitNotification(t, ch, storage.Notification{Kind: storage.NotifyMessages, Topic: "n.x"})
}

// TestNotifyLocalAtOnce: the publishing instance's callbacks are called before MessagesAppend
// returns; an unregistered callback is not called.
func TestNotifyLocalAtOnce(t *testing.T) {
	t.Parallel()
	e, _ := logEngine(t)
	logTopic(t, e, "n.local", storage.TopicConfig{})
	ch, unregister := recorder(e)
	gone, unregisterGone := recorder(e)
	unregisterGone()
	logPublish(t, e, "n.local", 0, "a")
	select {
	case n := <-ch:
		if n != (storage.Notification{Kind: storage.NotifyMessages, Topic: "n.local"}) {
			t.Fatalf("got %+v", n)
		}
	default:
		t.Fatal("no local notification when MessagesAppend returned")
	}
	unregister()
	select {
	case n := <-gone:
		t.Fatalf("unregistered callback called with %+v", n)
	default:
	}
}

// TestNotifyPayload: payloads round-trip (a subscription's with its id), our own are recognized,
// those of transactions before migration 0007 (instance "0") wake every instance, malformed ones
// are rejected, and so are kinds newer than this build (as instances older than
// NotifySubscription reject it) and the sequencer's wake-up (stagedPayload: instances older than
// 0007 ignore it).
func TestNotifyPayload(t *testing.T) {
	t.Parallel()
	e, _ := logEngine(t)
	for _, n := range []storage.Notification{
		{Kind: storage.NotifyTopicDeleted, Topic: "a:b.c"},
		{Kind: storage.NotifySubscription, Topic: "a:b.c", SubscriptionID: 42},
	} {
		got, self, ok := e.parsePayload(e.payload(n))
		if !ok || !self || got != n {
			t.Fatalf("own payload of %+v: %+v self %v ok %v", n, got, self, ok)
		}
	}
	got, self, ok := e.parsePayload("0:1:t")
	if !ok || self || got != (storage.Notification{Kind: storage.NotifyMessages, Topic: "t"}) {
		t.Fatalf("transactional payload: %+v self %v ok %v", got, self, ok)
	}
	for _, bad := range []string{"", "x", "0:9:t", "0:5:t:1", "0:x:t", "0", "0:4:t", "0:4:t:x", "0:4:t:0", "0:4:t:-3", stagedPayload} {
		if _, _, ok := e.parsePayload(bad); ok {
			t.Fatalf("payload %q accepted", bad)
		}
	}
}

// TestNotifyListenerReconnects: when the listener's connection is killed (as by a database
// restart), it reconnects, wakes every topic (notifications may have been missed) and receives
// notifications again.
func TestNotifyListenerReconnects(t *testing.T) {
	t.Parallel()
	e1, e2 := twoInstances(t, time.Minute)
	logTopic(t, e1, "n.re", storage.TopicConfig{})
	ch, unregister := recorder(e2)
	defer unregister()

	e2.notify.connMu.Lock()
	pid := e2.notify.listenConn.PgConn().PID()
	e2.notify.connMu.Unlock()
	must(e1.pool.Exec(t.Context(), "SELECT pg_terminate_backend($1)", pid))(t)
	awaitNotification(t, ch, storage.Notification{Kind: storage.NotifyMessages, Topic: "n.re"}) // the wake-up of every topic
	testutil.Eventually(t, 10*time.Second, "listener reconnect", func() error {
		e2.notify.connMu.Lock()
		defer e2.notify.connMu.Unlock()
		if e2.notify.reconnects == 0 || e2.notify.listenConn == nil {
			return errors.New("not reconnected yet")
		}
		return nil
	})
	logTopic(t, e1, "n.after", storage.TopicConfig{})
	awaitNotification(t, ch, storage.Notification{Kind: storage.NotifyTopicCreated, Topic: "n.after"})
	logPublish(t, e1, "n.after", 0, "a")
	awaitNotification(t, ch, storage.Notification{Kind: storage.NotifyMessages, Topic: "n.after"})
}

// TestNotifyPollerFallback: messages committed without any NOTIFY (a lost notification) are
// found by the poller, which also reports topics created meanwhile.
func TestNotifyPollerFallback(t *testing.T) {
	t.Parallel()
	e1, e2 := twoInstances(t, 20*time.Millisecond)
	logTopic(t, e1, "n.poll", storage.TopicConfig{})
	ch, unregister := recorder(e2)
	defer unregister()
	if err := e1.ensureBucket(t.Context(), logBase); err != nil {
		t.Fatal(err)
	}
	// A publish that sends no notification: offsets and a row written by hand, as a lost NOTIFY
	// would leave them.
	must(e1.pool.Exec(t.Context(), e1.sql(`WITH p AS (
			UPDATE spool.partitions SET next_offset = next_offset + 1, last_published_at = $2, low_published_at = $2
			WHERE topic_id = (SELECT id FROM spool.topics WHERE name = 'n.poll') RETURNING topic_id, partition, next_offset - 1 AS o)
		INSERT INTO spool.messages (topic_id, partition, "offset", published_at, payload, size)
		SELECT topic_id, partition, o, $2, $1, 1 FROM p`), []byte("x"), logBase))(t)
	awaitNotification(t, ch, storage.Notification{Kind: storage.NotifyMessages, Topic: "n.poll"})
	ms := must(e2.MessagesRead(t.Context(), &storage.MessagesReadParams{Topic: "n.poll"}))(t)
	if len(ms) != 1 {
		t.Fatalf("read %d messages", len(ms))
	}
}

// TestDeliveryChangesNotifyOtherInstances: a release, a nack, a DLQ replay and a resume on one
// instance give messages back to a subscription, and wake the callbacks of another instance
// through NOTIFY, whose members could claim them (the poller is too slow to be the cause). Each
// change has a topic of its own: once the notification of a topic's publish arrived, nothing but
// the change can notify that topic again.
func TestDeliveryChangesNotifyOtherInstances(t *testing.T) {
	t.Parallel()
	e1, e2 := twoInstances(t, time.Minute)
	ctx := t.Context()
	ch, unregister := recorder(e2)
	defer unregister()
	// setup creates topic with a group holding one claimed message and returns the subscription
	// and the claimed delivery, once the publish's notification reached e2.
	setup := func(topic string) (int64, []storage.DeliveryRef) {
		t.Helper()
		logTopic(t, e1, topic, storage.TopicConfig{Semantics: storage.PubSub})
		s := logSub(t, e1, topic, "g")
		logPublish(t, e1, topic, 0, "a")
		awaitNotification(t, ch, storage.Notification{Kind: storage.NotifyMessages, Topic: topic})
		res := must(e1.DeliveriesClaim(ctx, &storage.DeliveriesClaimParams{SubscriptionID: s.ID, Member: "m", Max: 1}))(t)
		if len(res.Deliveries) != 1 {
			t.Fatalf("%s: claim: %d deliveries, want 1", topic, len(res.Deliveries))
		}
		return s.ID, []storage.DeliveryRef{res.Deliveries[0].Ref()}
	}

	id, _ := setup("n.release")
	if res := must(e1.DeliveriesRelease(ctx, &storage.DeliveriesReleaseParams{SubscriptionID: id, Member: "m"}))(t); res.Released != 1 {
		t.Fatalf("release: %+v", *res)
	}
	awaitNotification(t, ch, storage.Notification{Kind: storage.NotifyMessages, Topic: "n.release"})

	id, refs := setup("n.nack")
	if res := must(e1.DeliveriesNack(ctx, &storage.DeliveriesNackParams{SubscriptionID: id, Member: "m", Refs: refs}))(t); res.Nacked != 1 {
		t.Fatalf("nack: %+v", *res)
	}
	awaitNotification(t, ch, storage.Notification{Kind: storage.NotifyMessages, Topic: "n.nack"})

	id, refs = setup("n.replay")
	if res := must(e1.DeliveriesNack(ctx, &storage.DeliveriesNackParams{SubscriptionID: id, Member: "m", Refs: refs, ToDLQ: true}))(t); res.DeadLettered != 1 {
		t.Fatalf("nack to the DLQ: %+v", *res)
	}
	if n := must(e1.DLQReplay(ctx, &storage.DLQReplayParams{SubscriptionID: id}))(t); n != 1 {
		t.Fatalf("replayed %d", n)
	}
	awaitNotification(t, ch, storage.Notification{Kind: storage.NotifyMessages, Topic: "n.replay"})

	id, _ = setup("n.resume")
	must(e1.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: id, State: storage.Paused}))(t)
	// Each state change is told to the other instances with its subscription
	// (storage.NotifySubscription), so that their owners reread it at once.
	changed := storage.Notification{Kind: storage.NotifySubscription, Topic: "n.resume", SubscriptionID: id}
	awaitNotification(t, ch, changed)
	must(e1.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: id, State: storage.Active}))(t)
	awaitNotification(t, ch, storage.Notification{Kind: storage.NotifyMessages, Topic: "n.resume"})
	must(e1.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: id, State: storage.Cancelled}))(t)
	awaitNotification(t, ch, changed)
}

// TestNotifyNothingWhileAlone: an instance with no other registered sends no NOTIFY (nobody
// listens; each was a transaction with its WAL flush); a newcomer's hello makes it notify again
// at once (its heartbeat is a minute away here), including what it left unsent just before; the
// others' leaving makes it quiet again at its next heartbeat.
func TestNotifyNothingWhileAlone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg := testConfig(t, storagetest.NewFakeClock(logBase))
	cfg.InstanceHeartbeat = time.Minute
	e := logOpen(t, cfg)
	if !e.notify.alone.Load() {
		t.Fatal("the only instance is not alone")
	}
	listener := must(pgx.Connect(ctx, testURL(t)))(t)
	t.Cleanup(func() { _ = listener.Close(context.Background()) })
	must(listener.Exec(ctx, "LISTEN "+pgx.Identifier{e.channel()}.Sanitize()))(t)
	logTopic(t, e, "alone", storage.TopicConfig{})
	logPublish(t, e, "alone", 0, "a")
	published := storage.Notification{Kind: storage.NotifyMessages, Topic: "alone"}
	queue := must(e.SubscriptionGetByGroup(ctx, "alone", storage.QueueGroup))(t)
	must(e.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: queue.ID, State: storage.Paused}))(t)
	paused := storage.Notification{Kind: storage.NotifySubscription, Topic: "alone", SubscriptionID: queue.ID}
	testutil.Eventually(t, 10*time.Second, "the notifier passed the publish and the pause by", func() error {
		e.notify.pendingMu.Lock()
		defer e.notify.pendingMu.Unlock()
		for _, n := range []storage.Notification{published, paused} {
			if _, ok := e.notify.dropped[n]; !ok {
				return errors.New("not yet")
			}
		}
		return nil
	})
	must(e.pool.Exec(ctx, "SELECT pg_notify($1, 'sentinel')", e.channel()))(t)
	if n := must(listener.WaitForNotification(ctx))(t); n.Payload != "sentinel" {
		t.Fatalf("an instance alone notified %q", n.Payload)
	}

	// A newcomer: the first instance hears its hello and sends what it dropped.
	cfg2 := cfg
	cfg2.PollInterval = time.Minute
	e2 := must(Open(ctx, cfg2))(t)
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = e2.Close()
		}
	})
	if e2.notify.alone.Load() {
		t.Fatal("the second instance thinks it is alone")
	}
	awaitPayload := func(want string) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		for {
			n, err := listener.WaitForNotification(wctx)
			if err != nil {
				t.Fatalf("waiting for notification %q: %v", want, err)
			}
			if n.Payload == want {
				return
			}
		}
	}
	awaitPayload(e.payload(published))
	if e.notify.alone.Load() {
		t.Fatal("alone after the newcomer's hello")
	}
	logPublish(t, e, "alone", 0, "b")
	awaitPayload(e.payload(published))

	// The newcomer leaves; the next heartbeat finds nobody else.
	closed = true
	must(0, e2.Close())(t)
	heard := e.notify.peerHeard.Load()
	var inserted, others bool
	must(0, e.pool.QueryRow(ctx, e.sql(heartbeatSQL), e.instanceUUID(), e.startedAt, logBase).Scan(&inserted, &others))(t)
	if others {
		t.Fatal("the heartbeat counts an instance that closed")
	}
	e.sawInstances(others, heard)
	if !e.notify.alone.Load() {
		t.Fatal("not alone once the other closed")
	}
	// A read that raced a notification of another instance does not make it alone.
	e.sawInstances(false, heard-1)
	if e.notify.alone.Load() {
		t.Fatal("alone after a read that raced a peer's notification")
	}
}

// TestNotifyDroppedBounded: an instance alone keeps at most maxDropped unsent notifications (one
// per kind and topic); the rest fall back to the newcomer's poller.
func TestNotifyDroppedBounded(t *testing.T) {
	t.Parallel()
	e := &Engine{}
	pending := map[storage.Notification]struct{}{}
	for i := range maxDropped + 10 {
		pending[storage.Notification{Kind: storage.NotifyMessages, Topic: fmt.Sprintf("t%d", i)}] = struct{}{}
	}
	e.notify.pendingMu.Lock()
	e.keepDropped(pending)
	e.keepDropped(pending)
	n := len(e.notify.dropped)
	e.notify.pendingMu.Unlock()
	if n != maxDropped {
		t.Fatalf("%d notifications kept, want the bound %d", n, maxDropped)
	}
}
