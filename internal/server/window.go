package server

import (
	"sync/atomic"

	"github.com/spoolmq/spool/internal/storage"
)

// The per-connection bound on deliveries queued and not yet written (Config.MaxConnBufferBytes).
//
// A member's credit is what the broker may hand it at once: a claim reads up to that many
// messages into the member's channel, where they wait for the connection's writer. A client that
// does not read blocks the writer in a socket write, and the channel fills up to the credit: with
// 1 MiB messages and the largest credit, 64 GiB. So the server gives a handle's member the
// client's credit as its MaxInFlight but bounds its queue (broker.Member.SetQueueLimit: deliveries
// waiting in the channel plus those being claimed) to a window: how many deliveries of the
// largest size seen on the connection fit in max_conn_buffer_bytes (shared by the connection's
// handles). The queue limit does not grow when the client acks or leases expire, only when the
// writer takes deliveries out of the channel; so an ack batch never claims more than the window.
// When the writer takes k deliveries of a handle, the handle's limit drops to window-k in the
// same step until the flush has handed them to the socket (takeFrom, moveWindows): the channel
// plus what the writer holds stay within one window. When the socket does not take a write at once, the
// windowed members' limit is 0 until the flush is done (stallWindows); a Credit meanwhile gives
// back only the window less what the writer holds (handle.held). So at most one window per
// handle is in memory (plus the frame being written). A client whose credit fits in the window
// is not windowed at all (no extra work per flush).
//
// The size estimate starts at the server's max message size and then follows the largest
// delivery the connection was given, decaying slowly towards smaller ones (sizeEstimate); a
// delivery too large to be written (dead-lettered) does not count. It is never below
// max_conn_buffer_bytes/maxWindow: when messages larger than any recent one arrive, one window of
// them may exceed the bound once.

// maxWindow bounds the window in deliveries (the estimate of a delivery's size is at least
// max_conn_buffer_bytes / maxWindow).
const maxWindow = 1024

// sizeEstimate is the size of the largest encoded delivery a connection was given recently (0:
// none yet): it rises at once to a larger delivery and decays towards smaller ones by
// 1/sizeDecay of the difference per delivery, so a burst of large messages long ago does not
// shrink the window for ever, while a window's worth of small ones between large ones (at most
// maxWindow) leaves most of it.
type sizeEstimate struct{ v atomic.Int64 }

// sizeDecay is how slowly the estimate falls (see sizeEstimate).
const sizeDecay = maxWindow

// observe records a delivery of n bytes.
func (e *sizeEstimate) observe(n int) {
	for {
		old := e.v.Load()
		next := int64(n)
		if next < old {
			next = old - (old-next)/sizeDecay
		}
		if next == old || e.v.CompareAndSwap(old, next) {
			return
		}
	}
}

// windowLocked returns the window of one handle in deliveries when the connection has handles
// handles (at least 1). c.mu must be held.
func (c *conn) windowLocked(handles int) int {
	limit := c.srv.cfg.MaxConnBufferBytes
	est := int(c.est.v.Load())
	if est == 0 {
		est = c.srv.cfg.MaxMessageSize
	}
	est = max(est, limit/maxWindow, 1)
	return max(1, limit/est/max(handles, 1))
}

// initialCredit returns the credit a new member of the connection starts with for the client's
// credit: within the window until addHandle sets the member's queue limit and its full credit.
func (c *conn) initialCredit(credit int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return min(credit, c.windowLocked(len(c.handles)+1))
}

// subscribeCredit returns the client's credit for a Subscribe's max_in_flight (0: the broker's
// default) and the credit its member starts with (initialCredit): the default is resolved here,
// so that a member subscribed with 0 is windowed from its first claim on.
func (c *conn) subscribeCredit(maxInFlight uint32) (credit, initial int) {
	credit = int(maxInFlight)
	if credit == 0 {
		credit = c.srv.broker.DefaultMaxInFlight()
	}
	return credit, c.initialCredit(credit)
}

// applyCreditLocked gives h's member the client's credit and the queue limit the bound allows
// now (see above: the window less what the writer holds); nothing after the server said goodbye
// or the session ended. c.mu must be held.
func (c *conn) applyCreditLocked(h *handle, window int) {
	if c.draining || c.closing {
		return
	}
	limit := -1
	if h.credit > window {
		// What the writer holds (taken, not yet handed to the socket) counts: a Credit while it
		// waits for the socket used to give the member a whole window more.
		limit = max(0, window-h.held)
	}
	// The limit first: a credit raised before it would let a claim past the window.
	if limit != h.limit && h.member.SetQueueLimit(limit) == nil {
		h.limit = limit
	}
	if h.credit != h.applied && h.member.SetMaxInFlight(h.credit) == nil {
		h.applied = h.credit
	}
}

// takeFrom takes the deliveries waiting in h's member for the writer and counts them as held
// until the flush has handed them to the socket (moveWindows). A windowed member's queue limit
// drops by what was taken in the same step (Member.TakeQueued, under c.mu like every change of
// it): the member may queue only what is left of the window, and no claim woken by the take can
// fill the whole window again meanwhile (with Take and a separate SetQueueLimit one could).
func (c *conn) takeFrom(h *handle, dst []*storage.Delivery) ([]*storage.Delivery, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(dst)
	var open bool
	if h.limit > 0 && !c.draining && !c.closing {
		dst, open = h.member.TakeQueued(dst)
		h.limit = max(0, h.limit-(len(dst)-n))
	} else {
		dst, open = h.member.Take(dst)
	}
	h.held += len(dst) - n
	return dst, open
}

// moveWindows is called by the writer after a flush handed everything it took to the socket:
// the windowed handles get their whole window back.
func (c *conn) moveWindows(hs []*handle) {
	if len(hs) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.windowLocked(len(c.handles))
	for _, h := range hs {
		h.held = 0
		if h.limit >= 0 || h.credit > w || h.applied != h.credit {
			c.applyCreditLocked(h, w)
		}
	}
}

// stallWriter is the socket as the sessions' writers see it: a write the socket does not take at
// once stops the windowed handles' deliveries before it waits (stallWindows).
type stallWriter struct{ c *conn }

func (w stallWriter) Write(p []byte) (int, error) {
	return w.c.nw.WriteOrStall(p, w.c.stallWindows)
}

// stallWindows sets the queue limit of the windowed handles' members to 0 (they keep their
// leases and credit) while the writer waits for the socket; moveWindows gives the window back
// after the flush. Writer goroutine.
func (c *conn) stallWindows() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.draining || c.closing {
		return
	}
	for _, h := range c.handles {
		if h.limit > 0 && h.member.SetQueueLimit(0) == nil {
			h.limit = 0
		}
	}
}
