// Package netwrite writes to a socket without waiting: the shortcut the server and the client
// take when the goroutine that has a frame ready writes it itself instead of handing it to the
// connection's writer goroutine (one goroutine hand-off less per request). What the socket does
// not take at once is kept for the writer, which writes it before anything else and may wait.
// Writer holds that state for one connection, with the time of its last write (heartbeats).
//
// Only sockets of package net on unix have a raw connection for it; elsewhere (TLS, net.Pipe,
// other systems) Raw returns nil and every write goes through the writer.
package netwrite
