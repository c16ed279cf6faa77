package wlog

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestCommitterEmptyPassesKeepQueueApart: the committer can wake with nothing queued (a stale
// wake-up: gather may return on arrived while enqueue's wake-up is still pending). Such an empty
// pass must still rotate the queue and its spare: if the new queue and the spare shared an array,
// the next pass would take the queue while appends keep writing into the same array, overwriting
// requests the committer is working on (lost appends, whose callers wait for ever, and a data race
// under -race). Stale wake-ups are sent here on purpose while appenders run.
func TestCommitterEmptyPassesKeepQueueApart(t *testing.T) {
	c := NewCommitter(CommitterOptions{Sync: SyncNone})
	defer c.Close()
	l, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	stop := make(chan struct{})
	var spam sync.WaitGroup
	spam.Go(func() {
		for {
			select {
			case <-stop:
				return
			case c.wake <- struct{}{}:
			//lint:ignore SA5004 spinning is the point: wake-ups arrive as fast as they can.
			default:
			}
		}
	})
	const appenders, each = 4, 3000
	done := make(chan error, appenders)
	for g := range appenders {
		go func() {
			for i := range each {
				if _, err := c.Append(context.Background(), l, []Record{{Timestamp: int64(i), Body: []byte(fmt.Sprint(g, "-", i))}}); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range appenders {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second): // a lost append never completes
			t.Fatal("an append did not complete: the committer lost it")
		}
	}
	close(stop)
	spam.Wait()
	if got := l.NextIndex(); got != appenders*each {
		t.Fatalf("NextIndex %d, want %d", got, appenders*each)
	}
}
