package admin

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage/storagetest"
	"github.com/spoolmq/spool/internal/storage/wal"
)

// GET /api/v1/cleanup reports the cleanup jobs; when one falls behind (seed 000's health rule)
// the API says unhealthy and /readyz stays 200 with the reason in detail.
func TestCleanupJobsAPI(t *testing.T) {
	t.Parallel()
	clock := storagetest.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	eng, err := wal.Open(t.TempDir(), wal.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	b, err := broker.New(broker.Config{Engine: eng, Clock: clock, Logger: testLogger(t), RetentionInterval: time.Hour, LifecycleInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	h, err := New(Config{Broker: b, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	e := &env{t: t, b: b, eng: eng, h: h, srv: srv}
	t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		_ = b.Stop(ctx)
		_ = eng.Close()
	})

	var list CleanupList
	e.do("GET", "/api/v1/cleanup", nil).ok(200, &list)
	if !list.Healthy || len(list.Jobs) != 2 || list.Jobs[0].Job != broker.JobRetention || time.Duration(list.Jobs[0].Interval) != time.Hour {
		t.Fatalf("cleanup at start: %+v", list)
	}
	var st Status
	e.do("GET", "/readyz", nil).ok(200, &st)
	if st.Status != "ready" || st.Detail != "" {
		t.Fatalf("readyz at start: %+v", st)
	}
	clock.Advance(3*time.Hour + time.Second)
	e.do("GET", "/api/v1/cleanup", nil).ok(200, &list)
	if list.Healthy || !list.Jobs[0].Behind || !strings.Contains(list.Jobs[0].Reason, "no successful run") {
		t.Fatalf("cleanup after 3 intervals without a run: %+v", list)
	}
	e.do("GET", "/readyz", nil).ok(200, &st)
	if st.Status != "ready" || !strings.Contains(st.Detail, "cleanup job retention falls behind") {
		t.Fatalf("readyz with cleanup behind: %+v", st)
	}
}
