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
// (an engine that cannot append asynchronously, PostgreSQL, runs the call on the worker, and the
// next requests queue up meanwhile). A request counts against the connection's pipelining limit
// until it is answered. Acks, nacks, extends and every other request stay on the reader, in
// order among themselves, and never wait behind a publish's fsync.
//
// One exception saves a goroutine hand-off on the most common path, a connection that publishes
// one request at a time and consumes nothing: when nothing is queued, no other frame has arrived
// and the connection has no subscription, the reader appends the Publish itself (inlinePublish),
// and writes its answer itself too when the writer is idle (binarySession.answer; the worker
// does the same for the answers of its rounds). Frames that arrive meanwhile wait in the socket
// and are handed to the worker afterwards; the order holds since nothing else of the connection
// was being appended.
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

// stopPublishes ends the publish stage after the session ended: the worker appends what is
// still queued (answered CLOSED instead when the connection was interrupted or broke) and
// returns, and the appends still in the engine are answered. Reader goroutine only.
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
			items := make([]outItem, len(batch))
			for i, r := range batch {
				items[i] = outItem{corr: r.corr, msg: protocol.ErrClosed.Errorf("the connection is closing; the publish was not processed")}
			}
			c.enqueueAll(items)
			b.answered(batch)
		default:
			b.publishRound(batch)
		}
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
// protocol.MaxBatch messages (a single larger request goes alone). The calls do not wait for
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
	for _, topic := range topics {
		reqs := byTopic[topic]
		for len(reqs) > 0 {
			n, msgs := 1, len(reqs[0].msg.Messages)
			for n < len(reqs) && msgs+len(reqs[n].msg.Messages) <= protocol.MaxBatch {
				msgs += len(reqs[n].msg.Messages)
				n++
			}
			b.appendMerged(topic, reqs[:n], msgs)
			reqs = reqs[n:]
		}
	}
}

// appendMerged appends reqs (one topic, total messages in all) with one broker call, whose
// completion answers them; see the stage's comment for the fallback on errors.
func (b *binarySession) appendMerged(topic string, reqs []pubReq, total int) {
	c := b.c
	now := c.srv.cfg.Clock.Now()
	msgs := make([]storage.AppendMessage, 0, total)
	for _, r := range reqs {
		msgs = appendMessagesTo(msgs, r.msg.Messages, now)
	}
	err := c.srv.broker.PublishAsync(c.ctx, topic, msgs, broker.PublishOptions{Priority: c.priority(topic)}, func(ps []storage.MessagePosition, err error) {
		b.answerMerged(reqs, total, ps, err)
	})
	switch {
	case err == nil:
	case len(reqs) > 1 && (errors.Is(err, storage.ErrInvalidArgument) || errors.Is(err, storage.ErrMessageTooLarge)):
		// Refused before anything was appended, for a reason one request can cause alone.
		for _, r := range reqs {
			b.appendMerged(topic, []pubReq{r}, len(r.msg.Messages))
		}
	default:
		b.answerMerged(reqs, total, nil, err)
	}
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

// appendOne appends one request with its own broker call and returns its answer.
func (b *binarySession) appendOne(r pubReq) outItem {
	c := b.c
	ps, err := c.srv.broker.PublishWith(c.ctx, r.msg.Topic, appendMessages(r.msg.Messages, c.srv.cfg.Clock.Now()), broker.PublishOptions{Prompt: r.prompt, Priority: c.priority(r.msg.Topic)})
	return b.published(r, ps, err)
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
