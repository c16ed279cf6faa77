package server

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spoolmq/spool/internal/auth"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/errmap"
	"github.com/spoolmq/spool/internal/names"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
	"github.com/spoolmq/spool/protocol/text"
)

// probeInterval is how often a half-closed text session checks that its peer is still there.
const probeInterval = 100 * time.Millisecond

// textSession serves the text mode (docs/protocol.md section 11).
type textSession struct {
	c *conn
	// lr and the fields below are the reader goroutine's.
	lr *text.LineReader
	// group and memberID are set by JOIN_GROUP (ordered with ORDERED); memberSeq numbers the
	// SUBSCRIBEs that use them.
	group, memberID string
	ordered         bool
	memberSeq       int
	// interactive is set by any command but PUBLISH and AUTH: the session is no longer closed
	// after text_publisher_idle. A command before AUTH counts too, once AUTH succeeded: until
	// then the handshake deadline applies whatever the session sent.
	interactive bool
	// authFailures counts refused AUTH commands; the session ends at maxAuthFailures.
	authFailures int
	// started is set once the first line arrived: until then the handshake timeout applies.
	started bool

	// w, line, taken (deliveries taken from a member) and timedOut (text_ack_timeout ended the
	// session) are the writer goroutine's.
	w        *bufio.Writer
	line     []byte
	taken    []*storage.Delivery
	timedOut bool

	// Guarded by c.mu.
	verbose bool
	lastTag uint64
	tags    map[uint64]tagRef
	// heldSince is when tags last became non-empty, settled when the session last acked or
	// nacked, on Config.Clock: text_ack_timeout counts from the later one (checkAckTimeout).
	heldSince, settled time.Time
}

// tagRef is what a delivery tag names.
type tagRef struct {
	h   *handle
	sub int64
	ref storage.DeliveryRef
}

func newTextSession(c *conn) *textSession {
	return &textSession{
		c:    c,
		lr:   text.NewLineReader(c.br, c.srv.cfg.MaxLineLength),
		w:    bufio.NewWriterSize(stallWriter{c}, 64<<10),
		tags: make(map[uint64]tagRef),
	}
}

// run is the reader loop: one command at a time, each answered with exactly one OK or ERR line in
// command order.
func (t *textSession) run() {
	c := t.c
	if c.authOn() && c.principal == nil {
		// A verified client certificate that names a principal authenticates the session from
		// its start (the TLS handshake is done: the first byte was read), so that PING and HELP
		// do not leave it under the handshake deadline. Without one, AUTH must come.
		if p, ok := c.srv.cfg.Auth.ByCertCN(c.certCN()); ok {
			c.principal = p
		}
	}
	for {
		if !c.waitRoom() {
			return
		}
		var deadline time.Time
		switch {
		case !t.started, c.authOn() && c.principal == nil:
			// The first line has the handshake timeout from the accept (docs/protocol.md 11.5),
			// not text_publisher_idle: a person typing the first command is not cut off after 1 s.
			// With authentication on, so has everything until the session is authenticated: a
			// client without credentials cannot hold the connection with PINGs.
			deadline = c.opened.Add(c.srv.cfg.HandshakeTimeout)
		case !t.interactive:
			deadline = time.Now().Add(c.srv.cfg.TextPublisherIdle)
		}
		if !c.setReadDeadline(deadline) {
			return
		}
		line, err := t.lr.ReadLine()
		switch {
		case err == nil:
			t.started = true
		case errors.Is(err, protocol.ErrLineTooLong):
			t.started = true
			t.reply(text.AppendErr(nil, err))
			continue
		case c.interrupted.Load():
			return
		case errors.Is(err, os.ErrDeadlineExceeded) && !t.started:
			c.srv.stats.sessionTimeouts.Add(1)
			c.logger.Debug("no first line within the handshake timeout, closing")
			t.reply(text.AppendErr(nil, protocol.ErrSessionTimeout.Errorf("no complete line within %s of connecting", c.srv.cfg.HandshakeTimeout)))
			return
		case errors.Is(err, os.ErrDeadlineExceeded) && c.authOn() && c.principal == nil:
			c.srv.stats.sessionTimeouts.Add(1)
			c.logger.Debug("not authenticated within the handshake timeout, closing")
			t.reply(text.AppendErr(nil, protocol.ErrSessionTimeout.Errorf("not authenticated within %s of connecting", c.srv.cfg.HandshakeTimeout)))
			return
		case errors.Is(err, os.ErrDeadlineExceeded):
			c.logger.Debug("publisher session idle, closing")
			return
		case errors.Is(err, io.EOF):
			c.peerClosed.Store(true)
			t.endOfInput()
			return
		default:
			c.peerClosed.Store(true)
			c.logger.Debug("read failed", slog.Any("error", err))
			return
		}
		if text.IsHTTP(line) {
			// A cross-protocol request (a web page's fetch to this port): nothing of it runs.
			c.srv.stats.closedByError.Add(1)
			c.logger.Warn("an HTTP request on the text protocol, closing the connection without running it")
			return
		}
		cmd, err := text.Parse(line)
		if err != nil {
			t.reply(text.AppendErr(nil, err))
			continue
		}
		if t.exec(cmd) {
			return
		}
	}
}

// endOfInput handles the client's end of input (docs/protocol.md section 11.5). Without a
// subscription the session ends. With one it keeps delivering until the connection breaks: nc -N
// and ncat half-close after their input and keep printing. A peer that is gone altogether (nc
// killed) cannot be told from a half-close by reading, so the session writes one information line
// (which a gone peer answers with a reset) and then probes the socket with empty writes, which
// fail once the reset arrived: a killed nc releases its leases at once. Over TLS the probe writes
// to the TCP connection under it: a tls.Conn sends nothing for an empty write and never fails it,
// and zero bytes on the raw connection leave the TLS stream as it is.
func (t *textSession) endOfInput() {
	c := t.c
	c.mu.Lock()
	n := len(c.handles)
	c.mu.Unlock()
	if n == 0 {
		return
	}
	probe := c.nc
	if tc, ok := probe.(*tls.Conn); ok {
		probe = tc.NetConn()
	}
	t.reply(text.AppendInfo(nil, "end of input: deliveries continue until the connection closes"))
	tick := time.NewTicker(probeInterval)
	defer tick.Stop()
	for {
		select {
		case <-c.quit:
			return
		case <-tick.C:
		}
		if _, err := probe.Write(nil); err != nil {
			c.logger.Debug("peer gone after end of input", slog.Any("error", err))
			return
		}
	}
}

// reply queues one line.
func (t *textSession) reply(line []byte) {
	t.c.enqueue(outItem{line: line})
}

func (t *textSession) ok(format string, args ...any) {
	t.reply(text.AppendOK(nil, fmt.Sprintf(format, args...)))
}

// fail replies ERR for err (mapped by errmap.ErrorFrom); unexpected errors and storage failures
// are logged with every detail.
func (t *textSession) fail(err error) {
	e := errmap.ErrorFrom(err)
	if logged(e) {
		t.c.logger.Warn("command failed", slog.String("code", e.Name), slog.Any("error", err))
	}
	t.reply(text.AppendErr(nil, e))
}

// maxAuthFailures is how many refused AUTH commands a text session gets before it is closed (no
// unbounded guessing on one connection).
const maxAuthFailures = 3

// exec runs one command. It reports true when the session ends (QUIT).
func (t *textSession) exec(cmd text.Command) bool {
	switch cmd.Verb {
	case text.VerbNone:
		return false
	case text.VerbPublish, text.VerbAuth:
	default:
		// Also before AUTH (PING or HELP to start a session typed by hand): run keeps the
		// handshake deadline of a session without credentials whatever it sent.
		t.interactive = true
	}
	switch cmd.Verb {
	case text.VerbAuth, text.VerbPing, text.VerbHelp, text.VerbQuit:
	default:
		// Without AUTH, a verified client certificate may name the principal; else the
		// command is refused (in text mode NOT_AUTHENTICATED leaves the session open).
		if t.c.authOn() && t.c.principal == nil {
			if e := t.c.authenticate(""); e != nil {
				t.reply(text.AppendErr(nil, e))
				return false
			}
		}
	}
	switch cmd.Verb {
	case text.VerbPublish:
		t.publish(cmd)
	case text.VerbJoinGroup:
		t.joinGroup(cmd)
	case text.VerbSubscribe:
		t.subscribe(cmd)
	case text.VerbAck:
		t.ack(cmd)
	case text.VerbNack:
		t.nack(cmd)
	case text.VerbUnsubscribe:
		t.unsubscribe(cmd)
	case text.VerbVerbose:
		t.c.mu.Lock()
		t.verbose = cmd.On
		t.c.mu.Unlock()
		if cmd.On {
			t.ok("verbose on")
		} else {
			t.ok("verbose off")
		}
	case text.VerbAuth:
		if !t.c.authOn() {
			t.ok("authentication is not required by this server")
			break
		}
		if e := t.c.authenticate(cmd.Token); e != nil {
			t.reply(text.AppendErr(nil, e)) // the session stays: AUTH may be sent again, a few times
			if t.authFailures++; t.authFailures >= maxAuthFailures {
				return true
			}
			break
		}
		t.ok("authenticated as %s", t.c.principal.Name)
	case text.VerbPing:
		t.ok("PONG")
	case text.VerbHelp:
		var b []byte
		for _, l := range text.HelpLines {
			b = text.AppendInfo(b, l)
		}
		t.reply(text.AppendOK(b, ""))
	case text.VerbQuit:
		released := t.closeHandles(func(*handle) bool { return true })
		t.ok("BYE (%d deliveries released)", released)
		return true
	default:
		t.reply(text.AppendErr(nil, protocol.ErrUnknownCommand.Errorf("%s", cmd.Verb)))
	}
	return false
}

func (t *textSession) publish(cmd text.Command) {
	c := t.c
	start := time.Now()
	if e := c.authorize(auth.Publish, cmd.Topic, ""); e != nil {
		c.observePublish(cmd.Topic, 1, start, e)
		t.fail(e)
		return
	}
	ps, err := c.srv.broker.PublishWith(c.ctx, cmd.Topic, []storage.AppendMessage{{Partition: storage.PartitionAuto, Payload: cmd.Payload}},
		broker.PublishOptions{Priority: c.priority(cmd.Topic)})
	c.observePublish(cmd.Topic, 1, start, err)
	if err != nil {
		t.fail(err)
		return
	}
	p := ps[0]
	t.ok("%s", protocol.FormatMessageID(c.srv.partitionCount(c.ctx, cmd.Topic, p.Partition), p.Partition, p.Offset))
}

func (t *textSession) joinGroup(cmd text.Command) {
	if err := names.ValidateGroup(cmd.Group); err != nil {
		t.fail(fmt.Errorf("%w: %w", storage.ErrInvalidArgument, err))
		return
	}
	if err := names.ValidateGroup(cmd.Member); err != nil {
		t.fail(fmt.Errorf("%w: consumer id: %w", storage.ErrInvalidArgument, err))
		return
	}
	t.group, t.memberID, t.memberSeq, t.ordered = cmd.Group, cmd.Member, 0, cmd.Ordered
	if cmd.Ordered {
		t.ok("group %s consumer %s ordered", cmd.Group, cmd.Member)
		return
	}
	t.ok("group %s consumer %s", cmd.Group, cmd.Member)
}

func (t *textSession) subscribe(cmd text.Command) {
	c := t.c
	start, err := startPosition(cmd.Start)
	if err != nil {
		t.fail(err)
		return
	}
	mode := storage.ModeShared
	if t.ordered {
		mode = storage.ModeOrdered
	}
	memberID := t.memberID
	if memberID != "" && t.memberSeq > 0 {
		// A second SUBSCRIBE after one JOIN_GROUP is a second member of the group.
		memberID = fmt.Sprintf("%s-%d", t.memberID, t.memberSeq+1)
	}
	if e := c.authorize(auth.Consume, cmd.Topic, t.group); e != nil {
		t.fail(e)
		return
	}
	if e := c.handleRoom(); e != nil {
		t.fail(e)
		return
	}
	member, err := c.srv.broker.Subscribe(c.ctx, broker.SubscribeParams{
		Allow:         c.consumeFilter(t.group),
		Pattern:       cmd.Topic,
		Group:         t.group,
		MemberID:      memberID,
		Principal:     c.principalName(),
		MaxInFlight:   c.initialCredit(c.srv.cfg.TextMaxInFlight),
		LeaseDuration: c.srv.cfg.TextAckWait,
		Start:         start,
		Notify:        c.wake,
		Mode:          mode,
		Filter:        cmd.Filter,
	})
	if err != nil {
		t.fail(err)
		return
	}
	if t.memberID != "" {
		t.memberSeq++
	}
	msg := "subscribed " + cmd.Topic
	if t.group != "" {
		msg += " group " + t.group + " consumer " + member.ClientID()
	}
	c.addHandle(cmd.Topic, member, c.srv.cfg.TextMaxInFlight, func(uint32) outItem {
		return outItem{line: text.AppendOK(nil, msg)}
	})
}

// lookupTags resolves delivery tags. A tag never issued is an error (nothing is done); a tag
// already acked, nacked or released counts as done.
func (t *textSession) lookupTags(tags []uint64) (found []uint64, refs []tagRef, done int, err error) {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, tag := range tags {
		if tag == 0 || tag > t.lastTag {
			return nil, nil, 0, protocol.ErrInvalidArgument.Errorf("unknown delivery tag %d (the last delivery of this session has tag %d)", tag, t.lastTag)
		}
		r, ok := t.tags[tag]
		if !ok {
			done++
			continue
		}
		found = append(found, tag)
		refs = append(refs, r)
	}
	return found, refs, done, nil
}

// forgetTags removes settled tags.
func (t *textSession) forgetTags(tags []uint64) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.settled = t.c.srv.cfg.Clock.Now()
	for _, tag := range tags {
		delete(t.tags, tag)
	}
}

// ack runs ACK. As a binary Ack, it settles each subscription's tags on their own (settle.go,
// docs/protocol.md section 11.2): a gone subscription's tags count as already done, and any
// other failure is answered with ERR once every subscription was tried (a storage failure at
// once: the subscriptions after it are not tried); the tags of a subscription that failed or was
// not tried stay held, so that the same ACK may be sent again.
func (t *textSession) ack(cmd text.Command) {
	c := t.c
	tags, refs, done, err := t.lookupTags(cmd.Tags)
	if err != nil {
		t.fail(err)
		return
	}
	acked := 0
	var failed error
	var settled []uint64
	for _, g := range groupTagRefs(tags, refs) {
		r, err := c.ackGroup(refGroup{sub: g.sub, refs: g.refs}, g.h.member.ID())
		if r != nil {
			c.observeAck(g.sub, r.Acked)
			acked += r.Acked
			done += r.AlreadyDone + len(r.Unknown)
		}
		if err != nil {
			failed = settleFailure(failed, err)
			if storageFailed(err) {
				break
			}
			continue
		}
		settled = append(settled, g.tags...)
	}
	t.forgetTags(settled)
	switch {
	case failed != nil:
		t.fail(failed)
	case done > 0:
		t.ok("%d acked, %d already done", acked, done)
	default:
		t.ok("%d acked", acked)
	}
}

// nack runs NACK, each subscription's tags on their own as for ACK: a gone subscription's tags
// are not held.
func (t *textSession) nack(cmd text.Command) {
	c := t.c
	tags, refs, notHeld, err := t.lookupTags(cmd.Tags)
	if err != nil {
		t.fail(err)
		return
	}
	nacked, dead := 0, 0
	var failed error
	var settled []uint64
	for _, g := range groupTagRefs(tags, refs) {
		// Only the tag's handle holds its lease.
		n, d, nh, err := c.nackGroup([]*handle{g.h}, refGroup{sub: g.sub, refs: g.refs}, broker.NackOptions{})
		nacked += n
		dead += d
		if err != nil {
			failed = settleFailure(failed, err)
			if storageFailed(err) {
				break
			}
			continue
		}
		notHeld += len(nh)
		settled = append(settled, g.tags...)
	}
	t.forgetTags(settled)
	if failed != nil {
		t.fail(failed)
		return
	}
	msg := fmt.Sprintf("%d nacked", nacked)
	if dead > 0 {
		msg += fmt.Sprintf(", %d dead-lettered", dead)
	}
	if notHeld > 0 {
		msg += fmt.Sprintf(", %d not held", notHeld)
	}
	t.ok("%s", msg)
}

// tagGroup is the tags of one handle and subscription, with their refs.
type tagGroup struct {
	h    *handle
	sub  int64
	tags []uint64
	refs []storage.DeliveryRef
}

// groupTagRefs groups the tags and their refs (in the same order) by handle and subscription,
// keeping the order of first appearance.
func groupTagRefs(tags []uint64, refs []tagRef) []tagGroup {
	var out []tagGroup
	for j, r := range refs {
		i := 0
		for ; i < len(out); i++ {
			if out[i].h == r.h && out[i].sub == r.sub {
				break
			}
		}
		if i == len(out) {
			out = append(out, tagGroup{h: r.h, sub: r.sub})
		}
		out[i].tags = append(out[i].tags, tags[j])
		out[i].refs = append(out[i].refs, r.ref)
	}
	return out
}

func (t *textSession) unsubscribe(cmd text.Command) {
	if cmd.Topic != "" {
		t.c.mu.Lock()
		found := false
		for _, h := range t.c.handles {
			found = found || h.pattern == cmd.Topic
		}
		t.c.mu.Unlock()
		if !found {
			t.fail(protocol.ErrUnknownHandle.Errorf("not subscribed to %q", cmd.Topic))
			return
		}
	}
	n := 0
	released := t.closeHandles(func(h *handle) bool {
		if cmd.Topic == "" || h.pattern == cmd.Topic {
			n++
			return true
		}
		return false
	})
	t.ok("unsubscribed %d, %d deliveries released", n, released)
}

// closeHandles closes the handles drop selects: their members leave (their unacknowledged
// deliveries are released for redelivery) and their tags are forgotten. It returns how many leases
// were released.
func (t *textSession) closeHandles(drop func(*handle) bool) int {
	c := t.c
	hs := c.removeHandles(drop)
	c.mu.Lock()
	for tag, r := range t.tags {
		for _, h := range hs {
			if r.h == h {
				delete(t.tags, tag)
			}
		}
	}
	c.mu.Unlock()
	released := 0
	for _, h := range hs {
		n, err := h.member.Leave(c.ctx)
		if err != nil {
			c.logger.Warn("member leave failed", slog.String("member", h.member.ID()), slog.Any("error", err))
		}
		released += n
	}
	return released
}

// forgetSubscription drops the tags of h's deliveries of subscription sub (0: of all its
// subscriptions) when it ended under the session: their leases are gone, and held tags would keep
// text_ack_timeout running for deliveries the session no longer holds.
func (t *textSession) forgetSubscription(h *handle, sub int64) {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for tag, r := range t.tags {
		if r.h == h && (sub == 0 || r.sub == sub) {
			delete(t.tags, tag)
		}
	}
}

// goodbye is the server's shutdown notice: "ERR CLOSED", then the session ends (its deliveries
// are released when its members leave).
func (t *textSession) goodbye() {
	t.reply(text.AppendErr(nil, protocol.ErrClosed.Errorf("server shutting down")))
	t.c.interrupt()
}

// heartbeatInterval is how often the writer checks text_ack_timeout while the session has
// subscriptions (text sessions have no heartbeats).
func (t *textSession) heartbeatInterval() time.Duration {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.handles) == 0 {
		return 0
	}
	return max(c.srv.cfg.TextAckTimeout/8, time.Millisecond)
}

// checkAckTimeout ends a session that holds deliveries and has acked or nacked none for
// text_ack_timeout: a forgotten `nc` must not keep a group's messages from its other consumers
// for text_ack_wait (24 h). Like RabbitMQ's consumer_timeout, the session is closed with an error
// and its leases go back to the group at once (without counting a delivery attempt); a session
// that acks or nacks anything in time keeps going. It reports the error line, or nil.
func (t *textSession) checkAckTimeout(now time.Time) []byte {
	c := t.c
	c.mu.Lock()
	held := len(t.tags)
	since := t.heldSince
	if t.settled.After(since) {
		since = t.settled
	}
	c.mu.Unlock()
	limit := c.srv.cfg.TextAckTimeout
	if held == 0 || now.Sub(since) < limit {
		return nil
	}
	c.logger.Info("text session acked nothing within text_ack_timeout, closing it",
		slog.Int("held", held), slog.Duration("text_ack_timeout", limit))
	return text.AppendErr(nil, protocol.ErrSessionTimeout.Errorf("no ACK or NACK within %s while holding %d deliveries: closing, they go back to the group", limit, held))
}

// flush is the writer's work: reply lines in order, then for each open handle the subscriptions
// that ended (as information lines) and its deliveries, each with the next delivery tag. It first
// applies text_ack_timeout (checkAckTimeout): at every flush, not only when the check timer fired,
// which a session writing more often than the timer's interval would postpone for ever.
func (t *textSession) flush(final, _ bool) (bool, error) {
	c := t.c
	if !final && !t.timedOut {
		if line := t.checkAckTimeout(c.srv.cfg.Clock.Now()); line != nil {
			t.timedOut = true
			// The reader ends the session (finish: the members leave, their leases are
			// released) and the final flush writes the line.
			c.enqueue(outItem{line: line})
			c.interrupt()
			return false, nil
		}
	}
	out, hs := c.take(final)
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.srv.cfg.SessionTimeout))
	wrote := false
	for _, it := range out {
		if _, err := t.w.Write(it.line); err != nil {
			return wrote, err
		}
		wrote = true
	}
	c.mu.Lock()
	verbose := t.verbose
	c.mu.Unlock()
	for _, h := range hs {
		for _, e := range h.member.TakeEnded() {
			t.forgetSubscription(h, e.SubscriptionID)
			t.line = text.AppendInfo(t.line[:0], fmt.Sprintf("subscription %d on %s ended: %s", e.SubscriptionID, e.Topic, oneLine(errmap.ErrorFrom(e.Err).Error())))
			if _, err := t.w.Write(t.line); err != nil {
				return wrote, err
			}
			wrote = true
		}
		ds, open := c.takeFrom(h, t.taken[:0])
		t.taken = ds[:0]
		if !open {
			if c.handleClosedByBroker(h) {
				t.forgetSubscription(h, 0)
				t.line = text.AppendInfo(t.line[:0], "subscription "+h.pattern+" closed by the server")
				if _, err := t.w.Write(t.line); err != nil {
					return wrote, err
				}
				wrote = true
			}
			continue
		}
		batch := deliveredBatch{obs: c.srv.cfg.Metrics.Deliveries()}
		for i, d := range ds {
			ds[i] = nil // the buffer is reused: keep no delivery alive
			c.delivered(&batch, h, d)
			c.mu.Lock()
			if len(t.tags) == 0 {
				t.heldSince = c.srv.cfg.Clock.Now()
			}
			t.lastTag++
			tag := t.lastTag
			t.tags[tag] = tagRef{h: h, sub: d.SubscriptionID, ref: d.Ref()}
			c.mu.Unlock()
			if verbose {
				id := protocol.FormatMessageID(c.srv.partitionCount(c.ctx, d.Topic, d.Partition), d.Partition, d.Offset)
				t.line = text.AppendDelivery(t.line[:0], text.Delivery{Tag: tag, MessageID: id, Attempt: uint32(max(d.Attempt, 0)), Topic: d.Topic, Payload: d.Payload})
			} else {
				t.line = text.AppendMessage(t.line[:0], d.Topic, d.Payload)
			}
			c.est.observe(len(t.line))
			if _, err := t.w.Write(t.line); err != nil {
				return wrote, err
			}
			wrote = true
		}
	}
	if cap(t.line) > 64<<10 {
		t.line = nil
	}
	if err := t.w.Flush(); err != nil {
		return wrote, err
	}
	c.moveWindows(hs)
	return wrote, nil
}

// oneLine replaces line breaks, which would break the line framing.
func oneLine(s string) string {
	return strings.NewReplacer("\r", " ", "\n", " ").Replace(s)
}
