package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/spoolmq/spool/protocol"
)

// Message is one message to publish.
type Message struct {
	// Key routes the message to a partition (hash(key) mod partitions) and is delivered with it;
	// may be empty.
	Key []byte
	// Headers are delivered with the message.
	Headers map[string]string
	// Payload is the message body.
	Payload []byte
	// ProducerID is the application's own id for the message. The broker drops a second message
	// with the same ProducerID on the same topic inside its de-duplication window and answers
	// with the first one's position (Position.Duplicate). It also makes retries safe: the client
	// retries a publish whose outcome is unknown (connection lost after sending, INTERNAL,
	// TIMEOUT, CLOSED) only when every message of the request has one. Empty: no de-duplication.
	ProducerID string
	// PinPartition sends the message to Partition instead of letting the broker choose.
	PinPartition bool
	Partition    int32
	// NotBefore delays delivery until that time on the broker's clock; zero: at once. It is
	// compared with the broker's clock, so a time computed on this machine's clock is off by the
	// skew between the two: to delay by a duration, set Delay instead.
	NotBefore time.Time
	// TTL drops the message undelivered once it is older than TTL; 0: never.
	TTL time.Duration
	// Delay delays delivery by that long, counted on the broker's clock from its receipt of the
	// publish (protocol version 6), like TTL; 0: at once. At most protocol.MaxDuration (rounded
	// up to milliseconds); setting both Delay and NotBefore is an error wrapping
	// protocol.ErrInvalidArgument. A broker older than version 6 cannot take a relative delay:
	// the client then sends NotBefore = this machine's clock + Delay, computed when the request
	// is written, which is off by the skew between the two clocks.
	Delay time.Duration
}

func (m *Message) wire() protocol.PublishMessage {
	p := protocol.PublishMessage{
		Partition:  protocol.PartitionAuto,
		Key:        m.Key,
		Headers:    m.Headers,
		Payload:    m.Payload,
		ProducerID: m.ProducerID,
		NotBefore:  m.NotBefore,
		TTL:        m.TTL,
		Delay:      m.Delay,
	}
	if m.PinPartition {
		p.Partition = m.Partition
	}
	return p
}

// Position is where a published message was stored.
type Position struct {
	Partition int32
	Offset    int64
	// PublishTime is the broker's clock when the message was appended.
	PublishTime time.Time
	// Duplicate reports that the message was dropped as a duplicate of an earlier one with the same
	// ProducerID; the position is the earlier message's.
	Duplicate bool
	// Partitions is the topic's partition count when the broker answered (0 if it did not know
	// it), which decides the form of MessageID.
	Partitions int
}

// MessageID returns the message id users see everywhere (BRIEF.md 2b: the text mode, the admin
// API, the CLI): the offset on a one-partition topic, "partition:offset" otherwise (and when
// Partitions is unknown). Both forms are accepted wherever the broker expects a message id
// (FromMessageID, the admin API).
func (p Position) MessageID() string {
	return protocol.WireMessageID(uint32(max(p.Partitions, 0)), p.Partition, p.Offset)
}

func positionFrom(p protocol.Position, partitions uint32) Position {
	return Position{Partition: p.Partition, Offset: p.Offset, PublishTime: p.PublishTime, Duplicate: p.Duplicate,
		Partitions: int(partitions)}
}

// Publish appends msg to topic and returns its position once the broker acknowledged it, that is
// once it is durable by the broker's durability setting (fsync by default). See PublishBatch for
// errors and retries.
func (c *Client) Publish(ctx context.Context, topic string, msg Message) (Position, error) {
	pos, err := c.PublishBatch(ctx, topic, []Message{msg})
	if err != nil {
		return Position{}, err
	}
	return pos[0], nil
}

// PublishBatch appends msgs to topic as one all-or-nothing request (one Publish frame, at most
// protocol.MaxBatch messages, within the max frame size) and returns their positions in order.
// An empty batch returns nil, nil.
//
// Publishing is at-least-once. While the client is reconnecting, PublishBatch waits for the
// connection until ctx ends. It retries by itself, with backoff, until ctx ends:
//   - requests that never left the client before the connection broke;
//   - OVERLOADED, RATE_LIMITED, STORAGE_UNAVAILABLE and STORAGE_FULL, which mean nothing was
//     appended (waiting at least the broker's retry_after hint);
//   - requests whose outcome is unknown (the connection broke after sending; INTERNAL, TIMEOUT,
//     CLOSED) only when every message has a ProducerID, so that the broker drops the duplicate if
//     the first attempt was in fact stored.
//
// Otherwise the error is returned: a *protocol.Error from the broker (errors.Is with the protocol
// sentinels), an error wrapping ErrConnectionLost when the outcome is unknown (the batch may have
// been stored), ErrClientClosed, or ctx's error (the outcome is then unknown too). Bad input
// (more than MaxBatch messages, invalid header UTF-8, a frame over the max frame size) returns an
// error wrapping protocol.ErrInvalidArgument or protocol.ErrFrameTooLarge.
func (c *Client) PublishBatch(ctx context.Context, topic string, msgs []Message) ([]Position, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	if len(msgs) > protocol.MaxBatch {
		return nil, fmt.Errorf("client: publish to %q: %w: %d messages, at most %d per batch", topic, protocol.ErrInvalidArgument, len(msgs), protocol.MaxBatch)
	}
	req := &protocol.Publish{Topic: topic, Messages: make([]protocol.PublishMessage, len(msgs))}
	idempotent := true
	bytes := 0
	for i := range msgs {
		req.Messages[i] = msgs[i].wire()
		idempotent = idempotent && msgs[i].ProducerID != ""
		bytes += len(msgs[i].Payload)
	}
	wrap := func(err error) error { return fmt.Errorf("client: publish to %q: %w", topic, err) }
	for attempt := 0; ; attempt++ {
		cn, err := c.waitConn(ctx)
		if err != nil {
			return nil, wrap(err)
		}
		start := time.Now()
		cl, err := cn.start(ctx, req, nil, true, false)
		unsent := err != nil
		if err == nil {
			_, err = cn.wait(ctx, cl)
			if err == nil || cl.state.Load() == callDone {
				unsent = cl.unsent
			}
		}
		c.publishHook(topic, len(msgs), bytes, time.Since(start), err)
		if err == nil {
			ok, isOK := cl.resp.(*protocol.PublishOK)
			if !isOK || len(ok.Positions) != len(msgs) {
				return nil, wrap(fmt.Errorf("%w: unexpected answer %T to a publish of %d messages", protocol.ErrMalformedFrame, cl.resp, len(msgs)))
			}
			pos := make([]Position, len(ok.Positions))
			for i, p := range ok.Positions {
				pos[i] = positionFrom(p, ok.Partitions)
			}
			return pos, nil
		}
		if ctx.Err() != nil {
			return nil, wrap(err)
		}
		retry, after := retryPublish(err, unsent, idempotent)
		if !retry {
			return nil, wrap(err)
		}
		c.logger.Debug("publish retry", slog.String("topic", topic), slog.Int("attempt", attempt+1), slog.Any("error", err))
		if unsent && errors.Is(err, ErrConnectionLost) {
			continue // waitConn waits for the reconnect
		}
		if err := sleepCtx(ctx, max(after, c.backoff(attempt))); err != nil {
			return nil, wrap(err)
		}
	}
}

// retryPublish decides whether a failed publish may be sent again, and after how long at least.
// unsent: the frame never left the client; idempotent: every message has a ProducerID.
func retryPublish(err error, unsent, idempotent bool) (bool, time.Duration) {
	var pe *protocol.Error
	switch {
	case errors.Is(err, ErrClientClosed):
		return false, 0
	case errors.Is(err, ErrConnectionLost):
		return unsent || idempotent, 0
	case errors.As(err, &pe) && pe.Retryable:
		switch pe.Code {
		case protocol.CodeOverloaded, protocol.CodeRateLimited, protocol.CodeStorageUnavailable, protocol.CodeStorageFull:
			return true, pe.RetryAfter // nothing was appended
		}
		return idempotent, pe.RetryAfter // INTERNAL, TIMEOUT, CLOSED, newer codes: outcome unknown
	}
	return false, 0
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Client) publishHook(topic string, n, bytes int, took time.Duration, err error) {
	if len(c.hooks.publish) == 0 {
		return
	}
	ev := PublishEvent{Topic: topic, Messages: n, Bytes: bytes, Took: took, Err: err}
	for _, h := range c.hooks.publish {
		h.OnPublish(ev)
	}
}

// asyncOp is one PublishAsync message on its way.
type asyncOp struct {
	topic     string
	msg       protocol.PublishMessage
	cb        func(Position, error)
	deadline  time.Time
	notBefore time.Time
	attempts  int
	lastErr   error
	// solo: send this op in a request of its own (after its batch failed with an error that may be
	// caused by one message only).
	solo bool
	pos  Position
	err  error
}

// asyncState is the PublishAsync machinery: the window, the queue of ops to send (the publisher
// loop's input), the count of outstanding ops (for Flush) and the queue of completed ops (the
// callback loop's input).
type asyncState struct {
	sem chan struct{}

	mu     sync.Mutex
	queue  []*asyncOp
	closed bool // the publisher loop stopped: ops fail at once
	wake   chan struct{}

	fmu      sync.Mutex
	inflight int
	idle     chan struct{} // closed when inflight drops to 0

	cbmu   sync.Mutex
	cbq    []*asyncOp
	cbStop bool
	cbWake chan struct{}
}

func (a *asyncState) init(window int) {
	a.sem = make(chan struct{}, window)
	a.wake = make(chan struct{}, 1)
	a.cbWake = make(chan struct{}, 1)
	a.idle = make(chan struct{})
	close(a.idle)
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// PublishAsync queues msg for topic and returns at once; cb (may be nil) is called with the
// position or the error when the broker answered. Errors and retries are those of PublishBatch,
// with the retries bounded by AsyncPublishTimeout instead of a ctx (the error then wraps
// context.DeadlineExceeded and the last failure).
//
// At most MaxAsyncInFlight publishes (default 1024) are outstanding: when the window is full,
// PublishAsync blocks until a callback returned. Messages queued while the previous requests are
// on their way are coalesced into one Publish request per topic (up to protocol.MaxBatch messages
// and the max frame size), so PublishAsync is the fast way to publish many messages. A message of
// a coalesced request that fails with INVALID_ARGUMENT or MESSAGE_TOO_LARGE is retried alone, so
// that one bad message does not fail its neighbours (nothing of a failed request was stored).
//
// Order: messages to one topic are stored in PublishAsync order while no retry happens; a retried
// message may be stored after later ones.
//
// Callbacks run one at a time, in completion order, on one goroutine of the client: they must not
// block for long, and must not call PublishAsync or Flush when the window may be full (that would
// wait for the callback goroutine itself, a deadlock). When the client is closed, cb is called
// with ErrClientClosed on the calling goroutine before PublishAsync returns.
func (c *Client) PublishAsync(topic string, msg Message, cb func(Position, error)) {
	op := &asyncOp{topic: topic, msg: msg.wire(), cb: cb}
	select {
	case c.pub.sem <- struct{}{}:
	case <-c.closing:
		op.runCallback(c.logger, Position{}, fmt.Errorf("client: publish to %q: %w", topic, ErrClientClosed))
		return
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		<-c.pub.sem
		op.runCallback(c.logger, Position{}, fmt.Errorf("client: publish to %q: %w", topic, ErrClientClosed))
		return
	}
	c.pub.fmu.Lock()
	if c.pub.inflight == 0 {
		c.pub.idle = make(chan struct{})
	}
	c.pub.inflight++
	c.pub.fmu.Unlock()
	op.deadline = time.Now().Add(c.cfg.asyncPublishTimeout)
	c.pub.mu.Lock()
	if c.pub.closed {
		c.pub.mu.Unlock()
		c.finishAsync(op, Position{}, fmt.Errorf("client: publish to %q: %w", topic, ErrClientClosed))
		return
	}
	c.pub.queue = append(c.pub.queue, op)
	c.pub.mu.Unlock()
	signal(c.pub.wake)
}

// Flush waits until every PublishAsync call made before it has completed (its callback
// returned), or ctx ends. Publishes made concurrently with Flush may extend the wait.
func (c *Client) Flush(ctx context.Context) error {
	if err := c.flush(ctx); err != nil {
		return fmt.Errorf("client: flush: %w", err)
	}
	return nil
}

func (c *Client) flush(ctx context.Context) error {
	c.pub.fmu.Lock()
	idle := c.pub.idle
	c.pub.fmu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// finishAsync completes op: its callback is queued for the callback loop.
func (c *Client) finishAsync(op *asyncOp, pos Position, err error) {
	op.pos, op.err = pos, err
	c.pub.cbmu.Lock()
	c.pub.cbq = append(c.pub.cbq, op)
	c.pub.cbmu.Unlock()
	signal(c.pub.cbWake)
}

func (op *asyncOp) runCallback(logger *slog.Logger, pos Position, err error) {
	if op.cb == nil {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			logger.Error("panic in a PublishAsync callback", slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
		}
	}()
	op.cb(pos, err)
}

// callbackLoop runs the callbacks of completed async publishes, then frees their window slots.
func (c *Client) callbackLoop() {
	defer c.cbWG.Done()
	for {
		c.pub.cbmu.Lock()
		batch := c.pub.cbq
		c.pub.cbq = nil
		stop := c.pub.cbStop
		c.pub.cbmu.Unlock()
		for _, op := range batch {
			op.runCallback(c.logger, op.pos, op.err)
			<-c.pub.sem
			c.pub.fmu.Lock()
			c.pub.inflight--
			if c.pub.inflight == 0 {
				close(c.pub.idle)
			}
			c.pub.fmu.Unlock()
		}
		if len(batch) > 0 {
			continue
		}
		if stop {
			return
		}
		<-c.pub.cbWake
	}
}

// stopCallbacks makes the callback loop return once its queue is empty.
func (a *asyncState) stopCallbacks() {
	a.cbmu.Lock()
	a.cbStop = true
	a.cbmu.Unlock()
	signal(a.cbWake)
}

// requeue puts ops back at the front of the queue (retries go first), or fails them when the
// publisher loop has stopped.
func (c *Client) requeue(ops []*asyncOp) {
	c.pub.mu.Lock()
	if c.pub.closed {
		c.pub.mu.Unlock()
		for _, op := range ops {
			c.finishAsync(op, Position{}, op.closedErr())
		}
		return
	}
	c.pub.queue = append(slices.Clip(ops), c.pub.queue...)
	c.pub.mu.Unlock()
	signal(c.pub.wake)
}

// takeReady removes from the queue the ops that may be sent now and fails those past their
// deadline. next is the earliest time something in the queue changes (a backoff ends, a deadline
// passes); zero when the queue is empty.
func (c *Client) takeReady(now time.Time) (ready []*asyncOp, next time.Time) {
	var expired []*asyncOp
	c.pub.mu.Lock()
	keep := c.pub.queue[:0]
	for _, op := range c.pub.queue {
		switch {
		case !now.Before(op.deadline):
			expired = append(expired, op)
		case now.Before(op.notBefore):
			keep = append(keep, op)
			next = earliest(next, op.notBefore)
			next = earliest(next, op.deadline)
		default:
			ready = append(ready, op)
		}
	}
	clear(c.pub.queue[len(keep):])
	c.pub.queue = keep
	c.pub.mu.Unlock()
	for _, op := range expired {
		err := fmt.Errorf("client: publish to %q: %w after %d attempts", op.topic, context.DeadlineExceeded, op.attempts)
		if op.lastErr != nil {
			err = fmt.Errorf("client: publish to %q: %w after %d attempts (last error: %w)", op.topic, context.DeadlineExceeded, op.attempts, op.lastErr)
		}
		c.finishAsync(op, Position{}, err)
	}
	return ready, next
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

// publishLoop sends the async publishes: it takes every op ready to go, coalesces them into one
// Publish request per topic, and hands the requests to the current connection. While it is busy,
// new ops accumulate, so the batches grow with the load (and stay at one message when idle).
func (c *Client) publishLoop() {
	defer c.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		ready, next := c.takeReady(time.Now())
		if len(ready) > 0 {
			cn := c.current()
			if cn == nil {
				c.requeue(ready)
				c.mu.Lock()
				ch, cur := c.connCh, c.liveLocked()
				c.mu.Unlock()
				if cur == nil {
					deadline := ready[0].deadline
					for _, op := range ready {
						deadline = earliest(deadline, op.deadline)
					}
					timer.Reset(time.Until(deadline))
					select {
					case <-ch:
					case <-timer.C:
					case <-c.closing:
						c.stopPublishing()
						return
					}
				}
				continue
			}
			c.sendAsync(cn, ready)
			continue
		}
		if !next.IsZero() {
			timer.Reset(time.Until(next))
		}
		select {
		case <-c.pub.wake:
		case <-timer.C:
		case <-c.closing:
			c.stopPublishing()
			return
		}
	}
}

// stopPublishing fails every queued op; ops completing later fail at once (requeue).
func (c *Client) stopPublishing() {
	c.pub.mu.Lock()
	c.pub.closed = true
	ops := c.pub.queue
	c.pub.queue = nil
	c.pub.mu.Unlock()
	for _, op := range ops {
		c.finishAsync(op, Position{}, op.closedErr())
	}
}

// closedErr is the error of an op failed by Close: ErrClientClosed, with the broker's last answer
// when the op was being retried (a STORAGE_UNAVAILABLE the user must see, not only "closed").
func (op *asyncOp) closedErr() error {
	if op.lastErr != nil {
		return fmt.Errorf("client: publish to %q: %w after %d attempts (last error: %w)", op.topic, ErrClientClosed, op.attempts, op.lastErr)
	}
	return fmt.Errorf("client: publish to %q: %w", op.topic, ErrClientClosed)
}

// sendAsync coalesces ops into Publish requests, one per topic (in order), within MaxBatch and the
// max frame size, and sends them on cn.
func (c *Client) sendAsync(cn *conn, ops []*asyncOp) {
	var order []string
	byTopic := make(map[string][]*asyncOp)
	for _, op := range ops {
		if op.solo {
			c.sendAsyncBatch(cn, []*asyncOp{op})
			continue
		}
		if _, ok := byTopic[op.topic]; !ok {
			order = append(order, op.topic)
		}
		byTopic[op.topic] = append(byTopic[op.topic], op)
	}
	for _, topic := range order {
		batch := byTopic[topic]
		overhead := protocol.HeaderSize + 4 + len(topic) + 4
		start, size := 0, overhead
		for i, op := range batch {
			n := op.msg.EncodedLen()
			if i > start && (i-start >= protocol.MaxBatch || size+n > cn.sendMax) {
				c.sendAsyncBatch(cn, batch[start:i])
				start, size = i, overhead
			}
			size += n
		}
		c.sendAsyncBatch(cn, batch[start:])
	}
}

// sendAsyncBatch sends one Publish request for ops (all of one topic).
func (c *Client) sendAsyncBatch(cn *conn, ops []*asyncOp) {
	req := &protocol.Publish{Topic: ops[0].topic, Messages: make([]protocol.PublishMessage, len(ops))}
	for i, op := range ops {
		req.Messages[i] = op.msg
	}
	start := time.Now()
	// won is false only when start itself failed and reports the failure below: the hook must not
	// handle the ops a second time.
	_, err := cn.start(c.rootCtx, req, func(cl *call, won bool) {
		if won {
			c.asyncDone(ops, cl.resp, cl.err, cl.unsent, start)
		}
	}, false, false)
	if err != nil {
		c.asyncDone(ops, nil, err, true, start)
	}
}

// asyncDone handles the answer to one async Publish request (on the reader goroutine, the
// teardown, or the publisher loop when the request could not be sent).
func (c *Client) asyncDone(ops []*asyncOp, resp protocol.ServerMessage, err error, unsent bool, start time.Time) {
	topic := ops[0].topic
	if len(c.hooks.publish) > 0 {
		bytes := 0
		for _, op := range ops {
			bytes += len(op.msg.Payload)
		}
		c.publishHook(topic, len(ops), bytes, time.Since(start), err)
	}
	if err == nil {
		ok, isOK := resp.(*protocol.PublishOK)
		if !isOK || len(ok.Positions) != len(ops) {
			err = fmt.Errorf("%w: unexpected answer %T to a publish of %d messages", protocol.ErrMalformedFrame, resp, len(ops))
		} else {
			for i, op := range ops {
				c.finishAsync(op, positionFrom(ok.Positions[i], ok.Partitions), nil)
			}
			return
		}
	}
	idempotent := true
	for _, op := range ops {
		idempotent = idempotent && op.msg.ProducerID != ""
	}
	if retry, after := retryPublish(err, unsent, idempotent); retry {
		now := time.Now()
		for _, op := range ops {
			op.lastErr = err
			if !(unsent && errors.Is(err, ErrConnectionLost)) {
				op.notBefore = now.Add(max(after, c.backoff(op.attempts)))
			}
			op.attempts++
		}
		c.requeue(ops)
		return
	}
	if len(ops) > 1 && (errors.Is(err, protocol.ErrMessageTooLarge) || errors.Is(err, protocol.ErrInvalidArgument) || errors.Is(err, protocol.ErrFrameTooLarge)) {
		for _, op := range ops {
			op.solo = true
		}
		c.requeue(ops)
		return
	}
	for _, op := range ops {
		c.finishAsync(op, Position{}, op.failedErr(err))
	}
}

// failedErr is the error of an op whose attempt failed for good with err, with the answer to the
// attempt before when it was being retried (the connection closing under a retry must not hide
// the STORAGE_UNAVAILABLE that made it retry).
func (op *asyncOp) failedErr(err error) error {
	if op.lastErr != nil && op.lastErr != err {
		return fmt.Errorf("client: publish to %q: %w (attempt %d; the attempt before: %w)", op.topic, err, op.attempts+1, op.lastErr)
	}
	return fmt.Errorf("client: publish to %q: %w", op.topic, err)
}

// delayAsNotBefore returns m for a broker of protocol version v: unchanged from version 6 on, or
// when no message has a Delay; otherwise a copy whose delayed messages carry NotBefore = now +
// Delay instead (an older broker has no relative delay: the best it can get is this machine's
// clock). A message with both, or with a Delay the wire cannot carry, is refused as a version-6
// broker and the encoder refuse it: m comes back with an error wrapping
// protocol.ErrInvalidArgument.
func delayAsNotBefore(m *protocol.Publish, v uint16, now time.Time) (*protocol.Publish, error) {
	if v >= protocol.Version6 || !slices.ContainsFunc(m.Messages, func(p protocol.PublishMessage) bool { return p.Delay != 0 }) {
		return m, nil
	}
	out := &protocol.Publish{Topic: m.Topic, Messages: slices.Clone(m.Messages)}
	for i := range out.Messages {
		p := &out.Messages[i]
		switch {
		case p.Delay == 0:
			continue
		case p.Delay < 0 || p.Delay > protocol.MaxDuration:
			return m, fmt.Errorf("%w: message %d: delay %s is outside 0 to %s", protocol.ErrInvalidArgument, i, p.Delay, protocol.MaxDuration)
		case !p.NotBefore.IsZero():
			return m, fmt.Errorf("%w: message %d has both NotBefore and Delay, set one of them", protocol.ErrInvalidArgument, i)
		}
		p.NotBefore, p.Delay = now.Add(p.Delay), 0
	}
	return out, nil
}
