package pgstore

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

// readAll reads every message of a partition.
func readAll(t *testing.T, e *Engine, topic string, part int32) []*storage.Message {
	t.Helper()
	var out []*storage.Message
	for off := int64(0); ; {
		ms := must(e.MessagesRead(t.Context(), &storage.MessagesReadParams{Topic: topic, Partition: part, Offset: off, Limit: 500}))(t)
		if len(ms) == 0 {
			return out
		}
		out = append(out, ms...)
		off = ms[len(ms)-1].Offset + 1
	}
}

// payloads lists the payloads of ms, and fails unless their offsets run from 0 without a gap and
// their publish times never decrease.
func payloads(t *testing.T, ms []*storage.Message) []string {
	t.Helper()
	var out []string
	for i, m := range ms {
		if m.Offset != int64(i) {
			t.Fatalf("message %d has offset %d", i, m.Offset)
		}
		if i > 0 && m.PublishedAt.Before(ms[i-1].PublishedAt) {
			t.Fatalf("offset %d published at %v, before offset %d's %v", m.Offset, m.PublishedAt, i-1, ms[i-1].PublishedAt)
		}
		out = append(out, string(m.Payload))
	}
	return out
}

// TestAppendGuessesOffsets: once an instance appended to a partition, its next appends there
// insert their rows at the offsets that follow before they take the partition's row; the
// partition holds every message once, gapless, in order.
func TestAppendGuessesOffsets(t *testing.T) {
	t.Parallel()
	e, clock := logEngine(t)
	const topic = "guess.one"
	logTopic(t, e, topic, storage.TopicConfig{Partitions: 2})
	var want []string
	for i := range 5 {
		p := fmt.Sprintf("m%d", i)
		pos := logPublish(t, e, topic, 0, p, p+"b")
		if pos[0].Offset != int64(2*i) || pos[1].Offset != int64(2*i+1) {
			t.Fatalf("append %d at %+v", i, pos)
		}
		want = append(want, p, p+"b")
		clock.Advance(time.Millisecond)
	}
	if g, m := e.appendGuesses.Load(), e.appendMisses.Load(); g != 4 || m != 0 {
		t.Fatalf("%d transactions guessed (%d wrong), want 4 (0)", g, m)
	}
	if got := payloads(t, readAll(t, e, topic, 0)); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("partition 0 holds %v, want %v", got, want)
	}
}

// TestAppendGuessMissed: another instance appends to the partition between two appends of the
// first: the first's guess is wrong, nothing of it is written, and it takes the row first at
// once (and for predictMissPause); every message is stored once, gapless.
func TestAppendGuessMissed(t *testing.T) {
	t.Parallel()
	es := openEngines(t, 2)
	a, b := es[0], es[1]
	const topic = "guess.two"
	logTopic(t, a, topic, storage.TopicConfig{Partitions: 1})
	logPublish(t, a, topic, 0, "a0")
	logPublish(t, b, topic, 0, "b1")
	if pos := logPublish(t, a, topic, 0, "a2"); pos[0].Offset != 2 {
		t.Fatalf("a2 at %+v, want offset 2", pos[0])
	}
	if g, m := a.appendGuesses.Load(), a.appendMisses.Load(); g != 1 || m != 1 {
		t.Fatalf("a: %d transactions guessed, %d wrong; want 1, 1", g, m)
	}
	logPublish(t, a, topic, 0, "a3") // not guessed: the partition missed lately
	if g := a.appendGuesses.Load(); g != 1 {
		t.Fatalf("a guessed %d transactions, want 1", g)
	}
	if got := payloads(t, readAll(t, b, topic, 0)); fmt.Sprint(got) != "[a0 b1 a2 a3]" {
		t.Fatalf("partition holds %v, want [a0 b1 a2 a3]", got)
	}
}

// TestAppendGuessLaterPublishTime: the partition's last publish time moved past the instance's
// clock (another instance's clock is ahead) while its next offset did not: the guess is refused,
// and the message gets that later time, so that publish times never decrease in a partition.
func TestAppendGuessLaterPublishTime(t *testing.T) {
	t.Parallel()
	e, _ := logEngine(t)
	const topic = "guess.time"
	logTopic(t, e, topic, storage.TopicConfig{Partitions: 1})
	first := logPublish(t, e, topic, 0, "x0")[0]
	ahead := first.PublishedAt.Add(time.Minute)
	must(e.pool.Exec(t.Context(), e.sql(`UPDATE spool.partitions SET last_published_at = $2
		WHERE partition = 0 AND topic_id = (SELECT id FROM spool.topics WHERE name = $1)`), topic, ahead))(t)
	pos := logPublish(t, e, topic, 0, "x1")[0]
	if pos.Offset != 1 || !pos.PublishedAt.Equal(ahead) {
		t.Fatalf("x1 at %+v, want offset 1 published at %v", pos, ahead)
	}
	if m := e.appendMisses.Load(); m != 1 {
		t.Fatalf("%d guesses wrong, want 1", m)
	}
	payloads(t, readAll(t, e, topic, 0))
}

// TestAppendGuessTopicGone: the topic an instance guessed for was deleted by another instance:
// the append fails as for an unknown topic and none of its rows stay (they were inserted before
// the partition's row was found gone).
func TestAppendGuessTopicGone(t *testing.T) {
	t.Parallel()
	es := openEngines(t, 2)
	a, b := es[0], es[1]
	ctx := t.Context()
	const topic = "guess.gone"
	logTopic(t, a, topic, storage.TopicConfig{Partitions: 1})
	logPublish(t, a, topic, 0, "g0")
	var id int64
	must(0, a.pool.QueryRow(ctx, a.sql("SELECT id FROM spool.topics WHERE name = $1"), topic).Scan(&id))(t)
	if err := b.TopicDelete(ctx, &storage.TopicDeleteParams{Name: topic, Force: true}); err != nil {
		t.Fatal(err)
	}
	_, err := a.MessagesAppend(ctx, &storage.MessagesAppendParams{Topic: topic, Messages: []storage.AppendMessage{msg(0, "late", "")}})
	if !errors.Is(err, storage.ErrTopicNotFound) {
		t.Fatalf("append to a deleted topic: %v, want not found", err)
	}
	if g := a.appendGuesses.Load(); g != 1 {
		t.Fatalf("a guessed %d transactions, want 1 (the append to the deleted topic)", g)
	}
	var late int
	must(0, a.pool.QueryRow(ctx, a.sql("SELECT count(*) FROM spool.messages WHERE topic_id = $1 AND payload = 'late'"), id).Scan(&late))(t)
	if late != 0 {
		t.Fatalf("%d rows of the failed append stored", late)
	}
}
