//go:build !unix

package netwrite

import (
	"net"
	"syscall"
)

// Raw returns nil: noWait is only implemented on unix; elsewhere every write goes through the
// connection's writer.
func Raw(net.Conn) syscall.RawConn { return nil }

// noWait is never called (Raw returns nil); it writes nothing.
func noWait(syscall.RawConn, []byte) (int, error) { return 0, nil }
