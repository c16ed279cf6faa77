package server

import (
	"sync/atomic"
)

// The per-connection bound on deliveries queued and not yet written (Config.MaxConnBufferBytes).
//
// A member's credit is what the broker may hand it at once: a claim reads up to that many
// messages into the member's channel, where they wait for the connection's writer. A client that
// does not read blocks the writer in a socket write, and the channel fills up to the credit: with
// 1 MiB messages and the largest credit, 64 GiB. So the server does not pass the client's credit
// to the broker as it is: it gives a handle's member at most
//
//	(deliveries the member holds that were written) + window
//
// where window is how many deliveries of the largest size seen on the connection fit in
// max_conn_buffer_bytes (shared by the connection's handles). Each flush of the writer moves the
// window on by what it wrote. When the socket does not take a write at once, the windowed members
// get no credit at all until the flush is done (stallWindows): leases that expire while the writer
// waits give credit back, which a stalled connection must not use. So at most one window waits in
// the channels (plus the frame being written). A client whose credit times the size fits in the
// bound is not windowed at all (no extra work per flush).
//
// The size estimate starts at the server's max message size and then follows the largest
// delivery the connection was given, never below max_conn_buffer_bytes/maxWindow: when messages
// larger than any before arrive, one window of them may exceed the bound once.

// maxWindow bounds the window in deliveries (the estimate of a delivery's size is at least
// max_conn_buffer_bytes / maxWindow).
const maxWindow = 1024

// sizeEstimate is the largest encoded delivery a connection was given (0: none yet).
type sizeEstimate struct{ v atomic.Int64 }

// observe records a delivery of n bytes.
func (e *sizeEstimate) observe(n int) {
	for {
		old := e.v.Load()
		if int64(n) <= old || e.v.CompareAndSwap(old, int64(n)) {
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
// credit.
func (c *conn) initialCredit(credit int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return min(credit, c.windowLocked(len(c.handles)+1))
}

// applyCreditLocked gives h's member the credit the bound allows now (see above); nothing after
// the server said goodbye or the session ended. c.mu must be held.
func (c *conn) applyCreditLocked(h *handle, window int) {
	if c.draining || c.closing {
		return
	}
	want := h.credit
	if want > window {
		unwritten := len(h.member.Deliveries())
		written := max(0, h.member.Info().InFlight-unwritten)
		want = min(want, written+window)
	}
	if want != h.applied && h.member.SetMaxInFlight(want) == nil {
		h.applied = want
	}
}

// moveWindows is called by the writer after a flush handed everything it took to the socket:
// the windowed handles get credit for what was written.
func (c *conn) moveWindows(hs []*handle) {
	if len(hs) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.windowLocked(len(c.handles))
	for _, h := range hs {
		if h.credit > w || h.applied != h.credit {
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

// stallWindows takes the credit of the windowed handles' members (they keep their leases) while
// the writer waits for the socket; moveWindows gives it back after the flush. Writer goroutine.
func (c *conn) stallWindows() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.draining || c.closing {
		return
	}
	w := c.windowLocked(len(c.handles))
	for _, h := range c.handles {
		if h.credit > w && h.applied != 0 && h.member.SetMaxInFlight(0) == nil {
			h.applied = 0
		}
	}
}
