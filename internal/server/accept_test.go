package server

import (
	"context"
	"log/slog"
	"testing"

	"github.com/spoolmq/spool/internal/testutil"
)

// TestAcceptBacksOffWhenOutOfFiles: accepts that fail with EMFILE (issue 16: at ulimit -n 256 the
// server logged "accept4: too many open files" in a loop) are each followed by a pause of 5 ms
// doubling to 1 s, not retried at once; the streak logs one WARN and one INFO when it ends, and the
// connection that waited in the backlog is then served.
func TestAcceptBacksOffWhenOutOfFiles(t *testing.T) {
	t.Parallel()
	base := newEnv(t, nil, nil)
	ab := testutil.NewAcceptBackoff(t, 12)
	srv, err := New(Config{Logger: slog.New(slog.NewTextHandler(ab.Logs, nil)), Name: "emfile"}, base.b)
	if err != nil {
		t.Fatal(err)
	}
	srv.pause = ab.Pause
	if err := srv.Start(context.Background(), ab.Listener); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := srv.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	e := &env{t: t, engine: base.engine, b: base.b, srv: srv, addr: ab.Addr()}
	c := e.dial(nil) // served once the streak is over
	c.publish("accept.after", "x")
	ab.Check(t)
}
