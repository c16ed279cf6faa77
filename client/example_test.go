package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/spoolmq/spool/client"
	"github.com/spoolmq/spool/protocol"
)

// These examples need a running broker (`spool serve`, port 9092), so they have no Output
// comment: they are compiled, not run.

// Publish one message and wait until the broker stored it durably.
func ExampleClient_Publish() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, "localhost:9092", client.ClientName("checkout"))
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Close(context.Background()) }()

	pos, err := c.Publish(ctx, "orders.created", client.Message{
		Key:     []byte("customer-42"),
		Headers: map[string]string{"content-type": "application/json"},
		Payload: []byte(`{"order":1001}`),
		// With a producer id, a publish whose answer was lost is retried safely: the broker drops
		// the duplicate.
		ProducerID: "order-1001",
	})
	switch {
	case errors.Is(err, protocol.ErrTopicNotFound):
		log.Fatal("the topic does not exist and auto-creation is off")
	case err != nil:
		log.Fatalf("publish failed (retryable: %v): %v", client.IsRetryable(err), err)
	}
	fmt.Println("stored as", pos.MessageID())
}

// Publish many messages without waiting for each: the client coalesces them into batches.
func ExampleClient_PublishAsync() {
	ctx := context.Background()
	c, err := client.Dial(ctx, "localhost:9092", client.MaxAsyncInFlight(4096))
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Close(ctx) }()

	for i := range 10_000 {
		c.PublishAsync("metrics.cpu", client.Message{Payload: fmt.Appendf(nil, "sample %d", i)}, func(_ client.Position, err error) {
			if err != nil {
				log.Printf("sample %d lost: %v", i, err)
			}
		})
	}
	if err := c.Flush(ctx); err != nil { // every callback has run
		log.Fatal(err)
	}
}

// Consume a topic as a member of a durable group with four handler goroutines: a nil error acks
// the message, an error nacks it (redelivered after a second), ToDLQ dead-letters it.
func ExampleClient_Subscribe() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	c, err := client.Dial(ctx, "localhost:9092", client.Logger(slog.Default()))
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Close(closeCtx) // waits for running handlers, flushes acks, says goodbye
	}()

	sub, err := c.Subscribe(ctx, client.SubscribeParams{
		Topic: "orders.*",
		Group: "billing",
		Start: client.FromBeginning(), // only used when the group's subscription is created
	}, func(ctx context.Context, d *client.Delivery) error {
		if len(d.Payload) == 0 {
			return client.ToDLQ(errors.New("empty order"))
		}
		if d.Attempt > 1 {
			log.Printf("redelivery %d of %s", d.Attempt, d.MessageID())
		}
		return charge(ctx, d.Payload)
	}, client.Concurrency(4), client.NackDelay(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-sub.Done(): // the broker ended the subscription (an administrator cancelled the group)
		log.Print(sub.Err())
	}
}

// Fan-out: on a PUB_SUB topic every consumer group receives every message, and inside a group each
// message goes to one member. Here two services each run a group; running more copies of a
// service adds members to its group, which share its messages.
func Example_fanOutToGroups() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, "localhost:9092")
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Close(context.Background()) }()

	// The topic must be PUB_SUB (spool topic create payments --semantics pub_sub); an auto-created
	// topic is a QUEUE, where all groups share one subscription.
	for _, group := range []string{"ledger", "notifications"} {
		_, err := c.Subscribe(ctx, client.SubscribeParams{Topic: "payments", Group: group},
			func(_ context.Context, d *client.Delivery) error {
				fmt.Printf("%s got %s\n", group, d.Payload)
				return nil
			})
		if err != nil {
			log.Fatal(err)
		}
	}
	if _, err := c.Publish(ctx, "payments", client.Message{Payload: []byte("paid 1001")}); err != nil {
		log.Fatal(err)
	}
	// Both "ledger got paid 1001" and "notifications got paid 1001" are printed.
	<-ctx.Done()
}

// Long work: extend the lease while working, and settle by hand.
func ExampleDelivery_Extend() {
	ctx := context.Background()
	c, err := client.Dial(ctx, "localhost:9092")
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Close(ctx) }()

	_, err = c.Subscribe(ctx, client.SubscribeParams{Topic: "videos.uploaded", Group: "transcoder"},
		func(ctx context.Context, d *client.Delivery) error {
			tick := time.NewTicker(10 * time.Second)
			defer tick.Stop()
			done := make(chan error, 1)
			go func() { done <- transcode(ctx, d.Payload) }()
			for {
				select {
				case err := <-done:
					if err != nil {
						return d.Nack(ctx, err)
					}
					return d.Ack(ctx)
				case <-tick.C:
					if _, err := d.Extend(ctx, 30*time.Second); err != nil {
						return err // the lease is lost: another member may already have the message
					}
				}
			}
		}, client.ManualAck())
	if err != nil {
		log.Fatal(err)
	}
}

func charge(context.Context, []byte) error    { return nil }
func transcode(context.Context, []byte) error { return nil }
