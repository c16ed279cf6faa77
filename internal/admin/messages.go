package admin

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage"
)

// maxPublishBatch bounds the messages of one HTTP publish.
const maxPublishBatch = 10000

// PublishMessage is one message to publish. The payload is payload (text) or payload_base64
// (bytes), at most one of them (neither: empty payload); the key likewise.
type PublishMessage struct {
	// Partition is the target partition; absent: hash of the key, or any partition without one.
	Partition     *int32            `json:"partition,omitempty"`
	Key           *string           `json:"key,omitempty"`
	KeyBase64     *string           `json:"key_base64,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	Payload       *string           `json:"payload,omitempty"`
	PayloadBase64 *string           `json:"payload_base64,omitempty"`
	// ProducerID is the producer's own message id, for de-duplication: a message whose producer
	// id the topic saw within its dedup_window is not stored again (PublishedMessage.Duplicate).
	ProducerID string `json:"producer_id,omitempty"`
	// Delay holds the message back from delivery for that long (broker clock).
	Delay Duration `json:"delay,omitempty"`
	// TTL drops the message undelivered after that long (broker clock).
	TTL Duration `json:"ttl,omitempty"`
}

// PublishRequest is the JSON body of POST /api/v1/topics/{topic}/messages: either
// {"messages": [...]} or one message object.
type PublishRequest struct {
	Messages publishList `json:"messages,omitempty"`
	PublishMessage
}

// publishList decodes a batch element by element and stops past maxPublishBatch, so that a body
// of millions of tiny elements is refused before it is decoded into as many structs.
type publishList []PublishMessage

func (l *publishList) UnmarshalJSON(data []byte) error {
	if string(bytes.TrimSpace(data)) == "null" {
		*l = nil
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if t, err := dec.Token(); err != nil || t != json.Delim('[') {
		return fmt.Errorf("messages must be an array")
	}
	list := publishList{}
	for dec.More() {
		if len(list) == maxPublishBatch {
			return invalidf("at most %d messages per request, got more", maxPublishBatch)
		}
		var m PublishMessage
		if err := dec.Decode(&m); err != nil {
			return fmt.Errorf("messages[%d]: %w", len(list), err)
		}
		list = append(list, m)
	}
	*l = list
	return nil
}

// PublishedMessage is the position of one published message.
type PublishedMessage struct {
	ID          string    `json:"id"`
	Partition   int32     `json:"partition"`
	Offset      int64     `json:"offset"`
	PublishedAt time.Time `json:"published_at"`
	// Duplicate: not stored, an earlier message had the same producer_id; the position is its.
	Duplicate bool `json:"duplicate,omitempty"`
}

// PublishResult is the response of a publish: the positions in the order of the request.
type PublishResult struct {
	Messages []PublishedMessage `json:"messages"`
}

func (m *PublishMessage) empty() bool {
	return m.Partition == nil && m.Key == nil && m.KeyBase64 == nil && m.Headers == nil && m.Payload == nil &&
		m.PayloadBase64 == nil && m.ProducerID == "" && m.Delay == 0 && m.TTL == 0
}

func (m *PublishMessage) append(i int, now time.Time) (storage.AppendMessage, error) {
	am := storage.AppendMessage{Partition: storage.PartitionAuto, Headers: m.Headers, ProducerID: m.ProducerID}
	if m.Partition != nil {
		if *m.Partition < 0 {
			return am, invalidf("message %d: partition must not be negative, got %d", i, *m.Partition)
		}
		am.Partition = *m.Partition
	}
	var err error
	if am.Key, err = textOrBytes(i, "key", m.Key, m.KeyBase64); err != nil {
		return am, err
	}
	if am.Payload, err = textOrBytes(i, "payload", m.Payload, m.PayloadBase64); err != nil {
		return am, err
	}
	if am.Payload == nil {
		am.Payload = []byte{}
	}
	if m.Delay < 0 || m.TTL < 0 {
		return am, invalidf("message %d: delay and ttl must not be negative", i)
	}
	if m.Delay > 0 {
		am.NotBefore = now.Add(time.Duration(m.Delay))
	}
	if m.TTL > 0 {
		am.ExpiresAt = now.Add(time.Duration(m.TTL))
	}
	return am, nil
}

func textOrBytes(i int, field string, text, b64 *string) ([]byte, error) {
	switch {
	case text != nil && b64 != nil:
		return nil, invalidf("message %d: give %s or %s_base64, not both", i, field, field)
	case text != nil:
		return []byte(*text), nil
	case b64 != nil:
		b, err := base64.StdEncoding.DecodeString(*b64)
		if err != nil {
			return nil, invalidf("message %d: %s_base64 is not valid base64: %v", i, field, err)
		}
		return b, nil
	}
	return nil, nil
}

// publish serves POST /api/v1/topics/{topic}/messages. A JSON body (Content-Type application/json
// or none) is a PublishRequest; any other content type publishes the raw body as the payload of
// one message, with the query parameters key and partition (curl --data-binary @file).
func (h *Handler) publish(w http.ResponseWriter, r *http.Request) error {
	topic := r.PathValue("topic")
	now := time.Now()
	var msgs []storage.AppendMessage
	if ct := r.Header.Get("Content-Type"); ct == "" || isJSON(ct) {
		var req PublishRequest
		if err := decodeJSON(r, &req, false); err != nil {
			return err
		}
		list := req.Messages
		switch {
		case len(list) > 0 && !req.PublishMessage.empty():
			return invalidf("give messages or the fields of one message, not both")
		case req.Messages != nil && len(list) == 0:
			return invalidf("messages is empty: give at least one message")
		case len(list) == 0 && req.PublishMessage.empty():
			return invalidf("no message in the body: give payload (or payload_base64) or messages")
		case len(list) == 0:
			list = []PublishMessage{req.PublishMessage}
		case len(list) > maxPublishBatch:
			return invalidf("at most %d messages per request, got %d", maxPublishBatch, len(list))
		}
		for i := range list {
			am, err := list[i].append(i, now)
			if err != nil {
				return err
			}
			msgs = append(msgs, am)
		}
	} else {
		payload, err := readBody(r)
		if err != nil {
			return err
		}
		am := storage.AppendMessage{Partition: storage.PartitionAuto, Payload: payload}
		q := r.URL.Query()
		if q.Has("key") {
			am.Key = []byte(q.Get("key"))
		}
		if s := q.Get("partition"); s != "" {
			p, err := strconv.ParseInt(s, 10, 32)
			if err != nil || p < 0 {
				return invalidf("query parameter partition must be a non-negative integer, got %q", s)
			}
			am.Partition = int32(p)
		}
		msgs = []storage.AppendMessage{am}
	}

	start := time.Now()
	pos, err := h.b.PublishWith(r.Context(), topic, msgs, broker.PublishOptions{Priority: h.priority(r, topic)})
	if err != nil {
		return err // counted in spool_publish_errors_total by Handler.wrap
	}
	h.metrics.ObservePublish(topic, len(msgs), time.Since(start))
	parts := 0
	if len(pos) > 0 {
		// The partition count only matters for the id format; one lookup per request.
		parts = h.partitions(r.Context(), topic)
	}
	out := PublishResult{Messages: make([]PublishedMessage, len(pos))}
	for i, p := range pos {
		out.Messages[i] = PublishedMessage{
			ID: storage.MessageID(parts, p.Partition, p.Offset), Partition: p.Partition, Offset: p.Offset, PublishedAt: p.PublishedAt,
			Duplicate: p.Duplicate,
		}
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}
