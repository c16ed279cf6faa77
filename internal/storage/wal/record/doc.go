// Package record encodes the body of a message record: what the embedded engine stores, for each
// message, in a record of a partition log (package wlog). The log index is the message offset and
// the frame timestamp is PublishedAt, so neither is in the body; nor are the topic and partition,
// which the log's directory names.
//
// # Layout (version 1)
//
// Lengths and counts are unsigned varints (encoding/binary Uvarint); seconds are signed (zigzag)
// varints. Fields in this order, nothing after the last:
//
//	+------+-------+-----------------+-----------------------+
//	| type | flags | key len | key   | producer len | prod.  |
//	+------+-------+-----------------+-----------------------+
//	  0x01   u8
//	+------------------------------------+-------------------------------------+
//	| not_before: sec varint, ns uvarint | expires_at: sec varint, ns uvarint  |   only if flagged
//	+------------------------------------+-------------------------------------+
//	+---------------+---------------------------------------------+------------------------+
//	| header count  | count x (name len, name, value len, value)  | payload len | payload  |
//	+---------------+---------------------------------------------+------------------------+
//
// type is 0x01 (message record, version 1). flags bit 0: not_before is present; bit 1: expires_at
// is present; bit 2: the message is Linked (storage.Message.Linked: a batch must not end after
// it; no field; records written before batches existed never have it); other bits are 0. A zero time.Time is absent. Times are unix seconds and nanoseconds
// (0 to 999,999,999), so any time.Time round-trips (as UTC). Header names are sorted and unique
// (byte order), so a message has exactly one encoding. The constants are part of the on-disk
// format; never change them: add a new type byte.
//
// # Decoding
//
// DecodeMessage never panics and never allocates more than the input bounds: every length is
// checked against what remains before anything is allocated. It accepts only the one encoding
// AppendMessage makes (minimal varints, sorted unique headers, no trailing bytes); anything else
// returns an error wrapping storage.ErrCorrupt. Key and Payload alias the input
// (no copy; capacity is capped so appending to them does not clobber the input); ProducerID and
// headers are copied into strings. Empty key and payload decode as nil, no headers as a nil map.
package record
