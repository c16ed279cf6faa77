// Package text parses and formats Spool's line-based text mode, the debugging protocol served on
// the binary protocol's port (9092) so that the seed-002 milestone commands work verbatim with nc:
//
//	echo "PUBLISH orders.created hello-world" | nc localhost 9092
//	echo "SUBSCRIBE orders.created" | nc localhost 9092      -> MESSAGE orders.created hello-world
//	echo -e "JOIN_GROUP order-processors consumer-1\nSUBSCRIBE orders.created" | nc localhost 9092
//
// A server tells the modes apart by the connection's first byte (protocol.IsBinary): binary
// connections start with a zero byte, which no command does. The grammar, the replies and the
// session semantics (deliveries stay leased to the session until ACK, NACK, UNSUBSCRIBE, QUIT or
// disconnect: there is no auto-ack) are specified in docs/protocol.md section 11; this package is
// the codec only:
//
//   - LineReader reads lines with a length limit (DefaultMaxLineLength) that holds without
//     buffering an oversize line;
//   - Parse turns a line into a Command, AppendCommand does the reverse (for clients and tests);
//   - AppendOK, AppendErr, AppendInfo, AppendMessage and AppendDelivery format the server's lines,
//     ParseReply parses them.
//
// Errors are *protocol.Error values of the one error table (UNKNOWN_COMMAND, INVALID_ARGUMENT,
// LINE_TOO_LONG, ...), so a server replies "ERR <CODE_NAME> <message>" with AppendErr.
//
// Everything here is a plain function or value, safe for concurrent use, except LineReader,
// which belongs to one connection's reading goroutine.
package text
