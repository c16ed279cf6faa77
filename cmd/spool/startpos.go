package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spoolmq/spool/client"
	"github.com/spoolmq/spool/internal/storage"
)

// --from of spool sub and of spool group create/update: one syntax, one parser (parseFrom).
// Besides the short forms it takes the start positions by their seed names (seed 000's
// CatchUpStrategy, seed 004's StartPosition.FROM_*), in any case; a value follows '=' (':' would
// run into the colons of a time and of a message id).

// fromForms names the accepted forms of --from, for flag help and errors.
const fromForms = "beginning, now, an RFC 3339 time (2025-01-02T15:04:05Z), a message id (42, 1:42), " +
	"or FROM_BEGINNING, FROM_NOW, FROM_TIMESTAMP=<RFC 3339 time>, FROM_MESSAGE_ID=<id> (any case)"

// startSpec is a parsed --from.
type startSpec struct {
	kind storage.StartKind
	t    time.Time
	// partition and offset (FromMessageID), and id as given.
	partition int32
	offset    int64
	id        string
}

// parseFrom reads --from: "" and now are FROM_NOW, beginning FROM_BEGINNING, an RFC 3339 time
// FROM_TIMESTAMP, a message id (offset or partition:offset) FROM_MESSAGE_ID; the seed names
// FROM_NOW, FROM_BEGINNING, FROM_TIMESTAMP=<time> and FROM_MESSAGE_ID=<id> too, in any case.
func parseFrom(s string) (startSpec, error) {
	name, value, hasValue := strings.Cut(s, "=")
	switch kind := storage.StartKind(strings.ToUpper(strings.TrimSpace(name))); kind {
	case storage.FromNow, storage.FromBeginning:
		if hasValue {
			return startSpec{}, fmt.Errorf("--from %q: %s takes no value; want %s", s, kind, fromForms)
		}
		return startSpec{kind: kind}, nil
	case storage.FromTimestamp:
		t, err := time.Parse(time.RFC3339Nano, value)
		if !hasValue || err != nil {
			return startSpec{}, fmt.Errorf("--from %q: want FROM_TIMESTAMP=<RFC 3339 time>, e.g. FROM_TIMESTAMP=2025-01-02T15:04:05Z", s)
		}
		return startSpec{kind: kind, t: t}, nil
	case storage.FromMessageID:
		if !hasValue {
			return startSpec{}, fmt.Errorf("--from %q: want FROM_MESSAGE_ID=<id>, e.g. FROM_MESSAGE_ID=42 or FROM_MESSAGE_ID=1:42", s)
		}
		return messageIDStart(s, value)
	}
	switch strings.ToLower(s) {
	case "", "now":
		return startSpec{kind: storage.FromNow}, nil
	case "beginning":
		return startSpec{kind: storage.FromBeginning}, nil
	}
	if messageIDPattern.MatchString(s) {
		return messageIDStart(s, s)
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return startSpec{kind: storage.FromTimestamp, t: t}, nil
	}
	return startSpec{}, fmt.Errorf("--from %q: want %s", s, fromForms)
}

func messageIDStart(s, id string) (startSpec, error) {
	p, o, err := storage.ParseMessageID(id)
	if err != nil {
		return startSpec{}, fmt.Errorf("--from %q: %w", s, err)
	}
	return startSpec{kind: storage.FromMessageID, partition: p, offset: o, id: id}, nil
}

// parseStart reads spool sub's --from into the client's start position.
func parseStart(s string) (client.StartPosition, error) {
	sp, err := parseFrom(s)
	if err != nil {
		return client.StartPosition{}, err
	}
	switch sp.kind {
	case storage.FromBeginning:
		return client.FromBeginning(), nil
	case storage.FromTimestamp:
		return client.FromTimestamp(sp.t), nil
	case storage.FromMessageID:
		return client.FromMessageID(sp.id), nil
	}
	return client.FromNow(), nil
}

// parseGroupStart reads --from of group create and update into the API's start position.
func parseGroupStart(s string) (storage.StartPosition, error) {
	sp, err := parseFrom(s)
	if err != nil {
		return storage.StartPosition{}, err
	}
	return storage.StartPosition{Kind: sp.kind, Time: sp.t, Partition: sp.partition, Offset: sp.offset}, nil
}
