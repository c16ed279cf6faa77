package admin

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
)

// MessageList is a page of a partition's retained messages, read without consuming them.
type MessageList struct {
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Messages  []Message `json:"messages"`
	// NextOffset is the from of the next page: after the last message, or where this page would
	// have started when it is empty.
	NextOffset int64 `json:"next_offset"`
}

// maxResponseBytes bounds the messages of one read, DLQ list or pull response by their size (key,
// headers and payload: storage.Message.Size), as one log read of the embedded engine is bounded: a
// page ends before the message that would pass it, but holds at least one, and says where the
// next starts (next_offset, next_after_id; what a pull leaves stays leased for the next pull). So
// limit=1000 of 8 MiB messages answers about 4 MiB of messages (its JSON, with base64 or escapes,
// up to a few times that), not 8 GB.
const maxResponseBytes = 4 << 20

// fitBytes returns how many of n messages, the size of message i being size(i), fit in
// maxResponseBytes taken in order: at least one when n > 0.
func fitBytes(n int, size func(i int) int) int {
	used := 0
	for i := range n {
		s := size(i)
		if i > 0 && used+s > maxResponseBytes {
			return i
		}
		used += s
	}
	return n
}

// readStart is where a read starts: an offset of a partition, or a time.
type readStart struct {
	partition    int32
	hasPartition bool
	offset       int64
	at           time.Time
}

// parseReadStart reads the partition and from query parameters. from is an offset ("42"), a
// message id ("3:42": partition 3, offset 42) or an RFC 3339 time ("2026-11-26T10:00:00Z": the
// first message published at or after it); absent, the first retained message.
func parseReadStart(r *http.Request) (readStart, error) {
	var rs readStart
	q := r.URL.Query()
	if s := q.Get("partition"); s != "" {
		p, err := strconv.ParseInt(s, 10, 32)
		if err != nil || p < 0 {
			return rs, invalidf("query parameter partition must be a non-negative integer, got %q", s)
		}
		rs.partition, rs.hasPartition = int32(p), true
	}
	from := q.Get("from")
	switch {
	case from == "":
	case strings.Contains(from, "T"):
		t, err := time.Parse(time.RFC3339Nano, from)
		if err != nil {
			return rs, invalidf("query parameter from: %q is not an RFC 3339 time (2026-11-26T10:00:00Z)", from)
		}
		rs.at = t
	default:
		p, off, err := storage.ParseMessageID(from)
		if err != nil || off < 0 {
			return rs, invalidf("query parameter from must be an offset, a message id (partition:offset) or an RFC 3339 time, got %q", from)
		}
		if strings.Contains(from, ":") {
			if rs.hasPartition && p != rs.partition {
				return rs, invalidf("from %q names partition %d, but partition is %d", from, p, rs.partition)
			}
			rs.partition = p
		}
		rs.offset = off
	}
	return rs, nil
}

// readMessages serves GET /api/v1/topics/{topic}/messages: retained messages of one partition
// from an offset, a message id or a time, without changing any delivery state.
func (h *Handler) readMessages(w http.ResponseWriter, r *http.Request) error {
	topic := r.PathValue("topic")
	rs, err := parseReadStart(r)
	if err != nil {
		return err
	}
	limit, err := queryInt(r, "limit", broker.DefaultReadLimit, broker.MaxReadLimit)
	if err != nil {
		return err
	}
	start := rs.offset
	if !rs.at.IsZero() {
		// An empty page from a time started at the partition's end (the broker does not return
		// the offset the time resolved to). The end is read before the page: one read after it
		// could pass a message published in between, which belongs on the next page. Errors are
		// the read's to report.
		if info, err := h.b.Topic(r.Context(), topic); err == nil && int(rs.partition) < len(info.Stats.Partitions) {
			start = info.Stats.Partitions[rs.partition].HighWater
		}
	}
	msgs, err := h.b.ReadMessages(r.Context(), broker.ReadParams{Topic: topic, Partition: rs.partition, Offset: rs.offset,
		Time: rs.at, Limit: int(limit)})
	if err != nil {
		return err
	}
	msgs = msgs[:fitBytes(len(msgs), func(i int) int { return msgs[i].Size() })]
	parts := h.partitions(r.Context(), topic)
	out := MessageList{Topic: topic, Partition: rs.partition, Messages: make([]Message, 0, len(msgs)), NextOffset: start}
	for _, m := range msgs {
		out.Messages = append(out.Messages, messageJSON(m, parts))
	}
	if len(msgs) > 0 {
		out.NextOffset = msgs[len(msgs)-1].Offset + 1
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
