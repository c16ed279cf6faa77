//go:build !unix

package netwrite

import (
	"net"
	"syscall"
)

// Raw returns nil: NoWait is only implemented on unix; elsewhere every write goes through the
// connection's writer.
func Raw(net.Conn) syscall.RawConn { return nil }

// NoWait is never called (Raw returns nil); it writes nothing.
func NoWait(syscall.RawConn, []byte) (int, error) { return 0, nil }
