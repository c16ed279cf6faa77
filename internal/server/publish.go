package server

import (
	"encoding/binary"
	"errors"
	"sync"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// The publish stage of a binary connection (docs/protocol.md section 6: "Publish requests of one
// connection to the same topic are appended in the order they were sent ... publishes to
// different topics may be processed concurrently"; "all other requests of a connection are
// processed in the order they were received").
//
// The reader does not run a Publish itself: it queues it here and goes on reading, and wakes the
// worker once it has taken the frames already received. The stage's worker goroutine takes every
// queued request at once, groups them per topic (keeping the order of each topic's requests),
// and appends each topic's requests with one broker call, so that they share one fsync; each
// request is answered with its own positions. The worker does not wait for the fsync: it hands
// the call to the engine (broker.PublishAsync), whose completion answers the call's requests,
// and takes the requests that arrived meanwhile, queued in the engine behind the previous ones
// (an engine that cannot append asynchronously would run the call on the worker; both engines
// can). A request counts against the connection's pipelining limit until it is answered. Acks,
// nacks, extends and every other request stay on the reader, in order among themselves, and
// never wait behind a publish's fsync.
//
// Throttled topics get a lane. The worker publishes with broker.PublishOptions.NoWait: a call
// its topic's throttle (backlog_policy throttle, docs/protocol.md section 8.3) would delay is
// refused before anything is counted, and the worker hands that call's requests and the
// topic's later ones to a lane of the topic, a goroutine that publishes them in order, waiting
// for the throttle. While a topic has a lane, the worker hands it every new request of the
// topic (per-topic order holds); the lane ends once its queue is empty. So a throttled publish
// delays only the later publishes of its topic on the connection: the others are appended and
// answered meanwhile (before the throttled one: answers may come in any order, section 6).
// Lanes need no bound of their own: their requests count against the connection's pipelining
// bounds until answered, like every queued publish, so there are at most that many lanes. A
// lane's throttle wait ends when the session is interrupted or ends (conn.quitCtx, closed by
// conn.finish: a session timeout, the client closing its connection): its publish is answered
// CLOSED, nothing appended (the engines' asynchronous appends take no context: one already
// queued completes).
//
// One exception saves a goroutine hand-off on the most common path, a connection that publishes
// one request at a time and consumes nothing: when nothing is queued, no other frame has arrived
// and the connection has no subscription, the reader appends the Publish itself (inlinePublish),
// and writes its answer itself too when the writer is idle (binarySession.answer; the worker
// does the same for the answers of its rounds). Frames that arrive meanwhile wait in the socket
// and are handed to the worker afterwards; the order holds since nothing else of the connection
// was being appended. The reader does not wait for a throttle either: it publishes with NoWait
// too, and a refused Publish goes to the worker, which hands it to a lane.
//
// A merged call is all or nothing; when it fails for a reason one request can cause on its own
// (INVALID_ARGUMENT, MESSAGE_TOO_LARGE: the engine validates every message before writing, so
// nothing was appended), the requests of that call are appended again one by one, so that a bad
// request fails alone and its neighbours keep their order. Any other error (topic not found,
// NO_SUBSCRIPTIONS, a storage failure, the connection's context ending) would fail each request
// the same way and is the answer of every request of the call.

// pubReq is one Publish request waiting for the publish stage.
type pubReq struct {
	corr uint32
	msg  *protocol.Publish
	// start is when the request was read (the publish latency metric counts the queueing).
	start time.Time
	// size is the request's frame body size, counted against Config.MaxPipelinedBytes.
	size int
	// prompt: an inline Publish that came within promptWithin of the connection's last write (on
	// a connection that publishes one request at a time and consumes nothing, the answer to its
	// previous Publish; broker.PublishOptions.Prompt).
	prompt bool
}

// promptWithin is how soon after its last answer a synchronous publisher's next Publish must
// come to be marked prompt: the engine then waits for it and its like after a commit round
// (wlog.Committer.gather). Over loopback on a busy 2-core machine they come back in 60-250 us;
// a producer that publishes at most every 400 us (2,500 msg/s) on a schedule is never prompt, so
// that no round waits for it (a wait in vain can last up to a millisecond in an idle process:
// the Go runtime's timers sleep in whole milliseconds).
const promptWithin = 400 * time.Microsecond

// pubStage is the publish queue of one connection and its worker's state. The worker goroutine
// is started on the first Publish, counted in the server's WaitGroup, and stopped by the reader
// (stop) when the session ends.
type pubStage struct {
	// wake (capacity 1) wakes the worker: a request was queued or the stage is stopping.
	wake chan struct{}
	// progress (capacity 1) tells the reader that the worker finished a round (queue room,
	// waitIdle).
	progress chan struct{}
	// done is closed when the worker returned.
	done chan struct{}

	// mu guards the fields below; it is a leaf (nothing is called while holding it).
	mu sync.Mutex
	// queue holds the requests not yet taken by the worker, in the order read.
	queue []pubReq
	// pending counts the requests queued or being appended, bytes their sizes.
	pending, bytes int
	// unkicked: requests were queued since the worker was last woken (kickPublishes).
	unkicked bool
	started  bool
	stopping bool
	// lanes are the topics whose publishes wait for their throttle on a goroutine of their own,
	// by topic (the stage's comment).
	lanes map[string]*pubLane
}

// pubLane is the lane of one throttled topic: its requests not yet taken by its goroutine, in
// order (guarded by pubStage.mu).
type pubLane struct {
	topic string
	queue []pubReq
}

func newPubStage() pubStage {
	return pubStage{wake: make(chan struct{}, 1), progress: make(chan struct{}, 1), done: make(chan struct{})}
}

func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// load returns the requests queued or in progress and their bytes.
func (p *pubStage) load() (pending, bytes int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pending, p.bytes
}

// queuePublish hands a Publish to the connection's publish stage, starting its worker on the
// first one. The worker is woken by kickPublishes, once the reader has taken the publishes
// already received (so that they go in one round). Reader goroutine only.
func (b *binarySession) queuePublish(corr uint32, m *protocol.Publish, size int) {
	c := b.c
	p := &c.pub
	p.mu.Lock()
	p.queue = append(p.queue, pubReq{corr: corr, msg: m, start: time.Now(), size: size})
	p.pending++
	p.bytes += size
	p.unkicked = true
	start := !p.started
	p.started = true
	p.mu.Unlock()
	if start {
		c.srv.wg.Add(1)
		go b.publishLoop()
	}
}

// kickPublishes wakes the worker if publishes were queued since the last kick. The reader calls
// it before anything that may block (a read that is not already buffered, a wait for room).
func (c *conn) kickPublishes() {
	p := &c.pub
	p.mu.Lock()
	kick := p.unkicked
	p.unkicked = false
	p.mu.Unlock()
	if kick {
		notify(p.wake)
	}
}

// inlinePublish reports whether the reader may append a Publish itself instead of handing it to
// the worker (one goroutine hand-off less on the common path of a connection with one publish at
// a time): nothing is queued or being appended (so the order holds), the next frame has not
// arrived yet (nothing waits behind the append), and the connection has no open subscription (no
// ack, nack or extend of its can wait behind the fsync).
func (b *binarySession) inlinePublish() bool {
	c := b.c
	if n, _ := c.pub.load(); n > 0 || c.br.Buffered() > 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.handles) == 0
}

// nextFrameBuffered reports whether the next frame is entirely in the read buffer (reading it
// cannot block).
func (b *binarySession) nextFrameBuffered() bool {
	br := b.c.br
	if br.Buffered() < protocol.HeaderSize {
		return false
	}
	hdr, err := br.Peek(4)
	if err != nil {
		return false
	}
	return br.Buffered() >= 4+int(binary.BigEndian.Uint32(hdr))
}

// waitPublishes blocks the reader until every queued publish was answered (Goodbye: nothing may
// follow GoodbyeOK). It reports false when the connection is ending.
func (c *conn) waitPublishes() bool {
	c.kickPublishes()
	for {
		if n, _ := c.pub.load(); n == 0 {
			return true
		}
		select {
		case <-c.pub.progress:
		case <-c.quit:
			return false
		}
	}
}

// stopPublishes ends the publish stage after the session ended (quit is closed, conn.finish):
// the worker and the lanes answer what is still queued CLOSED and return, and the appends still
// in the engine are answered. Reader goroutine only.
func (c *conn) stopPublishes() {
	p := &c.pub
	p.mu.Lock()
	p.stopping = true
	started := p.started
	p.mu.Unlock()
	if !started {
		return
	}
	notify(p.wake)
	<-p.done
	// The engine completes every append it queued, also when it closes.
	for {
		if n, _ := p.load(); n == 0 {
			return
		}
		<-p.progress
	}
}

// publishLoop is the worker goroutine of the publish stage.
func (b *binarySession) publishLoop() {
	c := b.c
	p := &c.pub
	defer c.srv.wg.Done()
	defer close(p.done)
	for {
		p.mu.Lock()
		batch := p.queue
		p.queue = nil
		stopping := p.stopping
		p.mu.Unlock()
		if len(batch) == 0 {
			if stopping {
				return
			}
			<-p.wake
			continue
		}
		select {
		case <-c.quit:
			b.refuseClosed(batch)
		default:
			b.publishRound(batch)
		}
	}
}

// refuseClosed answers reqs CLOSED (the session was interrupted; nothing was appended).
func (b *binarySession) refuseClosed(reqs []pubReq) {
	items := make([]outItem, len(reqs))
	for i, r := range reqs {
		items[i] = outItem{corr: r.corr, msg: protocol.ErrClosed.Errorf("the connection is closing; the publish was not processed")}
	}
	b.c.enqueueAll(items)
	b.answered(reqs)
}

// laneLoop is the goroutine of a throttled topic's lane: it publishes the lane's requests in
// order, waiting for the topic's throttle, and ends (removing the lane) once none is left.
func (b *binarySession) laneLoop(l *pubLane) {
	c := b.c
	p := &c.pub
	defer c.srv.wg.Done()
	for {
		p.mu.Lock()
		reqs := l.queue
		l.queue = nil
		if len(reqs) == 0 {
			delete(p.lanes, l.topic)
		}
		p.mu.Unlock()
		if len(reqs) == 0 {
			return
		}
		select {
		case <-c.quit:
			b.refuseClosed(reqs)
		default:
			b.appendTopic(l.topic, reqs, true)
		}
	}
}

// toLane hands reqs (one topic, in order) to the topic's lane, starting it if the topic has
// none. Worker goroutine only (the only one that starts lanes).
func (b *binarySession) toLane(topic string, reqs []pubReq) {
	c := b.c
	p := &c.pub
	p.mu.Lock()
	l := p.lanes[topic]
	start := l == nil
	if start {
		if p.lanes == nil {
			p.lanes = make(map[string]*pubLane)
		}
		l = &pubLane{topic: topic}
		p.lanes[topic] = l
	}
	l.queue = append(l.queue, reqs...)
	p.mu.Unlock()
	if start {
		c.srv.wg.Add(1)
		go b.laneLoop(l)
	}
}

// answered takes reqs off the stage's load once they were answered.
func (b *binarySession) answered(reqs []pubReq) {
	p := &b.c.pub
	size := 0
	for _, r := range reqs {
		size += r.size
	}
	p.mu.Lock()
	p.pending -= len(reqs)
	p.bytes -= size
	p.mu.Unlock()
	notify(p.progress)
}

// publishRound appends the requests of one round: per topic, in order, in calls of at most
// protocol.MaxBatch messages (a single larger request goes alone); the requests of a topic
// with a lane go to its lane, as do those its throttle would delay. The calls do not wait for
// their appends (broker.PublishAsync): the engine's completion of each call sends its answers
// (answer: written to the socket at once when the writer is idle, else queued for it), so that
// the worker takes the requests that arrive meanwhile at once, and the engine commits them
// right after (on a connection that many goroutines publish through synchronously, the next
// round no longer waits for the worker to wake up).
func (b *binarySession) publishRound(batch []pubReq) {
	var topics []string
	byTopic := make(map[string][]pubReq, 1)
	for _, r := range batch {
		if _, ok := byTopic[r.msg.Topic]; !ok {
			topics = append(topics, r.msg.Topic)
		}
		byTopic[r.msg.Topic] = append(byTopic[r.msg.Topic], r)
	}
	p := &b.c.pub
	for _, topic := range topics {
		reqs := byTopic[topic]
		p.mu.Lock()
		l := p.lanes[topic]
		if l != nil {
			l.queue = append(l.queue, reqs...)
		}
		p.mu.Unlock()
		if l == nil {
			b.appendTopic(topic, reqs, false)
		}
	}
}

// appendTopic appends reqs (one topic, in order) in calls of at most protocol.MaxBatch messages.
// A lane waits for the topic's throttle (wait); the worker does not: the call the throttle would
// delay and the requests after it go to the topic's lane.
func (b *binarySession) appendTopic(topic string, reqs []pubReq, wait bool) {
	for len(reqs) > 0 {
		n, msgs := 1, len(reqs[0].msg.Messages)
		for n < len(reqs) && msgs+len(reqs[n].msg.Messages) <= protocol.MaxBatch {
			msgs += len(reqs[n].msg.Messages)
			n++
		}
		if done := b.appendMerged(topic, reqs[:n], msgs, wait); done < n {
			b.toLane(topic, reqs[done:])
			return
		}
		reqs = reqs[n:]
	}
}

// appendMerged appends reqs (one topic, total messages in all) with one broker call, whose
// completion answers them; see the stage's comment for the fallback on errors. It returns how
// many of reqs it handled: fewer when, without wait, the topic's throttle would delay the rest
// (nothing of them was counted or appended).
func (b *binarySession) appendMerged(topic string, reqs []pubReq, total int, wait bool) int {
	c := b.c
	now := c.srv.cfg.Clock.Now()
	msgs := make([]storage.AppendMessage, 0, total)
	for _, r := range reqs {
		msgs = appendMessagesTo(msgs, r.msg.Messages, now)
	}
	ctx := c.ctx
	if wait {
		ctx = c.quitCtx // an interrupted session ends the throttle wait
	}
	opts := broker.PublishOptions{Priority: c.priority(topic), NoWait: !wait}
	err := c.srv.broker.PublishAsync(ctx, topic, msgs, opts, func(ps []storage.MessagePosition, err error) {
		b.answerMerged(reqs, total, ps, err)
	})
	switch {
	case err == nil:
	case errors.Is(err, broker.ErrWouldThrottle):
		return 0
	case len(reqs) > 1 && (errors.Is(err, storage.ErrInvalidArgument) || errors.Is(err, storage.ErrMessageTooLarge)):
		// Refused before anything was appended, for a reason one request can cause alone.
		for i, r := range reqs {
			if b.appendMerged(topic, reqs[i:i+1], len(r.msg.Messages), wait) == 0 {
				return i
			}
		}
	default:
		b.answerMerged(reqs, total, nil, err)
	}
	return len(reqs)
}

// answerMerged answers the requests of one broker call (total messages in all) with their
// positions or err, and takes them off the stage's load.
func (b *binarySession) answerMerged(reqs []pubReq, total int, ps []storage.MessagePosition, err error) {
	if err == nil && len(ps) != total {
		err = errors.New("server: the engine returned a position count that does not match the batch")
	}
	out := make([]outItem, 0, len(reqs))
	off := 0
	for _, r := range reqs {
		n := len(r.msg.Messages)
		if err != nil {
			out = append(out, b.published(r, nil, err))
			continue
		}
		out = append(out, b.published(r, ps[off:off+n], nil))
		off += n
	}
	b.answer(out...)
	b.answered(reqs)
}

// appendOne appends one request with its own broker call and returns its answer; false when the
// topic's throttle would delay it (nothing was counted or appended: the reader must not wait,
// the request goes to the publish stage instead).
func (b *binarySession) appendOne(r pubReq) (outItem, bool) {
	c := b.c
	opts := broker.PublishOptions{Prompt: r.prompt, Priority: c.priority(r.msg.Topic), NoWait: true}
	ps, err := c.srv.broker.PublishWith(c.ctx, r.msg.Topic, appendMessages(r.msg.Messages, c.srv.cfg.Clock.Now()), opts)
	if errors.Is(err, broker.ErrWouldThrottle) {
		return outItem{}, false
	}
	return b.published(r, ps, err), true
}

// published counts the outcome of r's append and returns its answer.
func (b *binarySession) published(r pubReq, ps []storage.MessagePosition, err error) outItem {
	b.c.observePublish(r.msg.Topic, len(r.msg.Messages), r.start, err)
	if err != nil {
		return outItem{corr: r.corr, msg: b.errorFrame(err)}
	}
	var top int32
	for _, p := range ps {
		top = max(top, p.Partition)
	}
	parts := b.c.srv.partitionCount(b.c.ctx, r.msg.Topic, top)
	return outItem{corr: r.corr, msg: &protocol.PublishOK{Partitions: uint32(parts), Positions: positions(ps)}}
}
