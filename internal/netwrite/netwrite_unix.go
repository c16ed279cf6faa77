//go:build unix

package netwrite

import (
	"errors"
	"net"
	"os"
	"syscall"
)

// Raw returns the raw connection of nc for noWait, or nil when nc has none (TLS, a net.Pipe).
func Raw(nc net.Conn) syscall.RawConn {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// noWait writes as much of b as the socket takes without waiting (every socket of package net is
// non-blocking): n < len(b) with a nil error means the send buffer is full, and the rest must be
// written by a writer that may wait. A write deadline that passed (the writer moves it only when
// it runs) writes nothing and is not an error: the writer sets a new one before it writes the
// rest. Safe for concurrent use as far as the socket is; callers serialize their writes.
func noWait(rc syscall.RawConn, b []byte) (n int, err error) {
	cerr := rc.Write(func(fd uintptr) bool {
		for n < len(b) {
			m, e := syscall.Write(int(fd), b[n:])
			if m > 0 {
				n += m
			}
			switch {
			case e == nil && m > 0:
			case errors.Is(e, syscall.EINTR):
			case e == nil, errors.Is(e, syscall.EAGAIN):
				return true // full (or wrote nothing without an error): the rest is the writer's
			default:
				err = e
				return true
			}
		}
		return true
	})
	if err == nil && cerr != nil && !errors.Is(cerr, os.ErrDeadlineExceeded) {
		err = cerr
	}
	return n, err
}
