package text

// HelpLines is the text of the HELP reply: the server sends each line with AppendInfo, then
// AppendOK. Keep it in sync with docs/protocol.md section 11.
var HelpLines = []string{
	"Spool text mode. Commands (keywords are case-insensitive, one command per line):",
	"  PUBLISH <topic> <payload...>      publish the rest of the line; replies OK <message-id>",
	"  JOIN_GROUP <group> <consumer-id> [ORDERED]",
	"                                    use this group and member id for the following SUBSCRIBE;",
	"                                    ORDERED: each partition to one member, in offset order",
	"  SUBSCRIBE <topic-or-pattern> [FROM_NOW|FROM_BEGINNING|FROM_TIMESTAMP <rfc3339>|FROM_MESSAGE_ID <id>]",
	"            [FILTER <expression>]   deliveries arrive as MESSAGE <topic> <payload>; FILTER (rest of",
	"                                    the line) takes only matching messages: region=eu, tier in (a,b)",
	"  ACK <tag>...                      complete deliveries; the n-th delivery of the session has tag n",
	"  NACK <tag>...                     give deliveries back for redelivery",
	"  UNSUBSCRIBE [<topic-or-pattern>]  leave one subscription, or all of them",
	"  VERBOSE [ON|OFF]                  deliveries as DELIVERY <tag> <message-id> <attempt> <topic> <payload>",
	"  AUTH <token>                      authenticate (when the server requires it)",
	"  PING                              replies OK PONG",
	"  HELP                              this text",
	"  QUIT                              close the session (unacknowledged deliveries are redelivered)",
	"Replies: OK [text] | ERR <CODE_NAME> <message>. Payloads that are not printable UTF-8 arrive",
	"as MESSAGE_BASE64 / DELIVERY_BASE64. Deliveries stay leased to this session until ACK, NACK,",
	"UNSUBSCRIBE, QUIT or disconnect. Specification: docs/protocol.md.",
}
