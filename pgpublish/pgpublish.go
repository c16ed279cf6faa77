// Package pgpublish publishes Spool messages inside an application's own PostgreSQL transaction
// (the transactional outbox), for brokers running on the PostgreSQL engine (spool serve --store
// postgres://...). A message published with it exists if and only if the transaction commits;
// broker instances sequence it right after the commit (an instance whose sequencer is awake
// looks every few milliseconds; otherwise the transaction notifies them).
//
//	tx, _ := pool.Begin(ctx)
//	// ... the application's own writes ...
//	pos, err := pgpublish.PublishTx(ctx, tx, "orders.created", pgpublish.Message{Key: []byte("42"), Payload: body})
//	// ...
//	err = tx.Commit(ctx)
//
// It calls the SQL function <schema>.publish that the broker's migrations install (any language
// can call it too): partitions are chosen as the broker does (FNV-1a of the key). The message is
// staged inside the transaction, without an offset and without a lock that other publishers wait
// for; once the transaction commits, a broker instance sequences it into the topic's log, gapless,
// in staging order among committed messages (a transaction that commits before another one
// publishes gets the lower offset; messages of one transaction keep their order), and wakes the
// consumers (a few milliseconds later; at most the poll
// interval if notifications are lost). A long transaction holds up nobody. The offset is not known
// to the application: Position.Offset is -1.
//
// PublishTx publishes in the broker's default schema (spool), PublishSchema in another one
// (postgres.schema); Publish is PublishTx's earlier name.
package pgpublish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// DefaultSchema is the PostgreSQL schema of the broker's tables unless configured otherwise
// (postgres.schema).
const DefaultSchema = "spool"

// Errors, matched with errors.Is. The PostgreSQL error is wrapped too.
var (
	// ErrTopicNotFound: the topic does not exist (SQLSTATE P0002).
	ErrTopicNotFound = errors.New("pgpublish: topic not found")
	// ErrMessageTooLarge: key, headers and payload exceed the topic's max_message_bytes (54000).
	ErrMessageTooLarge = errors.New("pgpublish: message too large")
	// ErrInvalidArgument: a bad partition, headers, topic or producer id (over 1024 bytes) (22023).
	ErrInvalidArgument = errors.New("pgpublish: invalid argument")
	// ErrNoSubscriptions: a PUB_SUB topic that blocks writes has no active subscription (55000).
	ErrNoSubscriptions = errors.New("pgpublish: topic has no active subscription and blocks writes")
)

// Message is one message to publish.
type Message struct {
	// Key picks the partition (the same as the broker's) when Partition is nil.
	Key     []byte
	Headers map[string]string
	Payload []byte
	// Partition, when set, is the target partition.
	Partition *int32
	// ProducerID is the producer's own id of the message (at most 1024 bytes): a message whose
	// ProducerID the topic saw within its dedup_window (published by the broker or by this
	// package) is not stored; its Position is the earlier message's, with Duplicate set.
	ProducerID string
	// NotBefore delays delivery; ExpiresAt drops the message undelivered after it (zero: unset).
	NotBefore time.Time
	ExpiresAt time.Time
}

// Position is where a published message goes.
type Position struct {
	Partition int32
	// Offset and PublishedAt are assigned when the broker sequences the message after the commit:
	// Offset is -1 and PublishedAt zero here, except for a Duplicate of a message already
	// sequenced.
	Offset      int64
	PublishedAt time.Time
	// Duplicate: the message was not stored; the position is that of the earlier message with the
	// same ProducerID.
	Duplicate bool
}

// PublishTx publishes msgs to topic inside tx, in one round trip, in schema DefaultSchema: they
// exist if and only if tx commits. On error tx is aborted, as after any failed statement (use a
// savepoint to keep it usable).
func PublishTx(ctx context.Context, tx pgx.Tx, topic string, msgs ...Message) ([]Position, error) {
	return PublishSchema(ctx, tx, DefaultSchema, topic, msgs...)
}

// Publish is PublishTx, under the name it had first.
func Publish(ctx context.Context, tx pgx.Tx, topic string, msgs ...Message) ([]Position, error) {
	return PublishTx(ctx, tx, topic, msgs...)
}

// PublishSchema is PublishTx for a broker whose tables are in schema.
func PublishSchema(ctx context.Context, tx pgx.Tx, schema, topic string, msgs ...Message) ([]Position, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	fn := pgx.Identifier{schema, "publish"}.Sanitize()
	q := "SELECT partition, \"offset\", published_at, duplicate FROM " + fn + "($1, $2, $3, $4, $5, $6, $7, $8)"
	b := &pgx.Batch{}
	for i := range msgs {
		m := &msgs[i]
		var headers []byte
		if len(m.Headers) > 0 {
			var err error
			if headers, err = json.Marshal(m.Headers); err != nil {
				return nil, fmt.Errorf("%w: message %d: headers: %v", ErrInvalidArgument, i, err)
			}
		}
		var producerID *string
		if m.ProducerID != "" {
			producerID = &m.ProducerID
		}
		payload := m.Payload
		if payload == nil {
			payload = []byte{}
		}
		b.Queue(q, topic, payload, m.Key, headers, m.Partition, producerID, optTime(m.NotBefore), optTime(m.ExpiresAt))
	}
	br := tx.SendBatch(ctx, b)
	out := make([]Position, len(msgs))
	for i := range msgs {
		p := &out[i]
		var off *int64
		var at pgtype.Timestamptz
		if err := br.QueryRow().Scan(&p.Partition, &off, &at, &p.Duplicate); err != nil {
			_ = br.Close()
			return nil, fmt.Errorf("pgpublish: publish to %q, message %d: %w", topic, i, classify(err))
		}
		p.Offset = -1
		if off != nil {
			p.Offset = *off
		}
		if at.Valid {
			p.PublishedAt = at.Time.UTC()
		}
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("pgpublish: publish to %q: %w", topic, classify(err))
	}
	return out, nil
}

func optTime(t time.Time) pgtype.Timestamptz {
	return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()}
}

// classify adds the sentinel of the SQLSTATE that spool.publish raises.
func classify(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case "P0002":
		return fmt.Errorf("%w: %w", ErrTopicNotFound, err)
	case "54000":
		return fmt.Errorf("%w: %w", ErrMessageTooLarge, err)
	case "22023":
		return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	case "55000":
		return fmt.Errorf("%w: %w", ErrNoSubscriptions, err)
	}
	return err
}
