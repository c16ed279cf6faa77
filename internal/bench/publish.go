package bench

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolmq/spool/client"
)

// runPublish is publish mode: Publishers goroutines publish as fast as they can, synchronously
// (each waits for its acknowledgement before the next request) or with PublishAsync (bounded by
// each client's window), for Warmup + Duration or until Count messages. Only acknowledgements
// received in the measured time (after the warm-up) count.
func (r *runner) runPublish(ctx context.Context, res *Result) error {
	cfg := r.cfg
	clients, err := r.dialPublishers(ctx)
	if err != nil {
		return err
	}
	payload := make([]byte, cfg.Size) // read-only, shared by every message
	for i := range payload {
		payload[i] = byte('a' + i%26)
	}
	start := time.Now()
	measureFrom := start.Add(cfg.Warmup)
	end := measureFrom.Add(cfg.Duration)
	if cfg.Count > 0 {
		end = time.Time{} // until Count messages
	}
	r.windowStart(measureFrom)
	var (
		remaining atomic.Int64 // messages left to send (Count mode)
		acked     atomic.Int64 // acknowledged in the measured time
		lastAck   atomic.Int64 // unix nanos of the last acknowledgement (Count mode)
		errs      errorLog
		lat       = newLockedHistogram()
	)
	remaining.Store(cfg.Count)
	// take reserves the next n messages; false when the run is over.
	take := func(n int) bool {
		if cfg.Count > 0 {
			return remaining.Add(-int64(n)) > -int64(n)
		}
		return time.Now().Before(end) && ctx.Err() == nil
	}
	// done records n messages acknowledged at now after took.
	done := func(n int, now time.Time, took time.Duration) {
		if now.Before(measureFrom) || (!end.IsZero() && now.After(end)) {
			return
		}
		acked.Add(int64(n))
		lat.record(took)
		for {
			prev := lastAck.Load()
			if now.UnixNano() <= prev || lastAck.CompareAndSwap(prev, now.UnixNano()) {
				break
			}
		}
	}
	var wg sync.WaitGroup
	for p := range cfg.Publishers {
		c := clients[p%len(clients)]
		wg.Go(func() {
			if cfg.Async {
				publishAsync(c, r.topic.Name, payload, take, done, &errs)
				return
			}
			publishSync(ctx, c, r.topic.Name, payload, cfg.Batch, take, done, &errs)
		})
	}
	wg.Wait()
	for _, c := range clients {
		if err := c.Flush(ctx); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	r.windowEnd()
	window := cfg.Duration
	if cfg.Count > 0 {
		last := time.Unix(0, lastAck.Load())
		if last.Before(measureFrom) || lastAck.Load() == 0 {
			window = 0
		} else {
			window = last.Sub(measureFrom)
		}
	}
	n, first := errs.get()
	pr := PublishResult{Messages: acked.Load(), Errors: n, FirstError: first, Latency: percentilesOf(lat.snapshot())}
	if window > 0 {
		pr.Rate = float64(pr.Messages) / window.Seconds()
		pr.MBps = pr.Rate * float64(cfg.Size) / 1e6
	}
	res.Publish = pr
	return nil
}

// publishSync publishes batches of batch messages, each waiting for its acknowledgement.
func publishSync(ctx context.Context, c *client.Client, topic string, payload []byte, batch int,
	take func(int) bool, done func(int, time.Time, time.Duration), errs *errorLog) {
	msgs := make([]client.Message, batch)
	for i := range msgs {
		msgs[i] = client.Message{Payload: payload}
	}
	for take(batch) {
		t0 := time.Now()
		var err error
		if batch == 1 {
			_, err = c.Publish(ctx, topic, msgs[0])
		} else {
			_, err = c.PublishBatch(ctx, topic, msgs)
		}
		now := time.Now()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			errs.add(err)
			continue
		}
		done(batch, now, now.Sub(t0))
	}
}

// publishAsync publishes with PublishAsync; the client's window bounds the messages in flight.
func publishAsync(c *client.Client, topic string, payload []byte,
	take func(int) bool, done func(int, time.Time, time.Duration), errs *errorLog) {
	msg := client.Message{Payload: payload}
	for take(1) {
		t0 := time.Now()
		c.PublishAsync(topic, msg, func(_ client.Position, err error) {
			if err != nil {
				errs.add(err)
				return
			}
			now := time.Now()
			done(1, now, now.Sub(t0))
		})
	}
}
