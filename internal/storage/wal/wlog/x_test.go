package wlog_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

func BenchmarkXSync10(b *testing.B) {
	var rounds, synced, tookSum atomic.Int64
	c := wlog.NewCommitter(wlog.CommitterOptions{OnSync: func(took time.Duration, records, _ int) { rounds.Add(1); synced.Add(int64(records)); tookSum.Add(int64(took)) }})
	defer c.Close()
	l, _ := wlog.Open(b.TempDir(), wlog.Options{})
	defer l.Close()
	body := make([]byte, 1024)
	var taken atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			recs := []wlog.Record{{Body: body}}
			for taken.Add(1) <= int64(b.N) {
				c.Append(context.Background(), l, recs)
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "records/s")
	b.ReportMetric(float64(synced.Load())/float64(rounds.Load()), "records/round"); b.ReportMetric(float64(tookSum.Load())/float64(rounds.Load())/1e3, "us/round"); b.ReportMetric(float64(rounds.Load())/time.Since(start).Seconds(), "rounds/s")
}
