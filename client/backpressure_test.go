package client

import (
	"context"
	"errors"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

type publishHook func(PublishEvent)

func (f publishHook) OnPublish(e PublishEvent) { f(e) }

// A topic at its backlog bound refuses a publish with RATE_LIMITED and a retry-after: Publish
// does not fail, it waits and retries until the slow consumer drained the backlog, and the
// message is then stored once and delivered.
func TestPublishRetriesWhileBackpressureRefuses(t *testing.T) {
	t.Parallel()
	b := startBroker(t, nil)
	b.createTopic("bp", storage.TopicConfig{MaxBacklogMessages: 1})
	refused := make(chan protocol.Error, 16)
	c := b.dial(t, Hooks(publishHook(func(e PublishEvent) {
		var pe *protocol.Error
		if errors.As(e.Err, &pe) && pe.Code == protocol.CodeRateLimited {
			select {
			case refused <- *pe:
			default: // the test needs the first ones only
			}
		}
	})))
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := c.Publish(ctx, "bp", Message{Payload: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	if err := b.broker.RefreshBackpressure(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Publish(ctx, "bp", Message{Payload: []byte("b")})
		done <- err
	}()
	pe := recv(t, refused, "a RATE_LIMITED answer")
	if pe.RetryAfter <= 0 {
		t.Fatalf("refusal without retry_after: %+v", pe)
	}

	got := make(chan string, 4)
	if _, err := c.Subscribe(ctx, SubscribeParams{Topic: "bp"}, func(_ context.Context, d *Delivery) error {
		got <- string(d.Payload)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if p := recv(t, got, "the held message"); p != "a" {
		t.Fatalf("got %q, want a", p)
	}
	// Once the ack is in, the backlog is 0: the next refresh releases the topic.
	checkFor(t, waitTimeout, func() error {
		if err := b.broker.RefreshBackpressure(ctx); err != nil {
			return err
		}
		if bp, _ := b.broker.TopicBackpressure("bp"); bp.State != "normal" {
			return errors.New(bp.State)
		}
		return nil
	})
	if err := recv(t, done, "the retried publish"); err != nil {
		t.Fatalf("publish refused then released: %v", err)
	}
	if p := recv(t, got, "the retried message"); p != "b" {
		t.Fatalf("got %q, want b", p)
	}
}
