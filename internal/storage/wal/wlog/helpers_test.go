package wlog_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

// logSink routes a log's slog output to t.Log and keeps the messages for assertions.
type logSink struct {
	t  testing.TB
	mu sync.Mutex
	// msgs holds "LEVEL message" of every record.
	msgs []string
}

func (s *logSink) Enabled(context.Context, slog.Level) bool { return true }
func (s *logSink) WithAttrs([]slog.Attr) slog.Handler       { return s }
func (s *logSink) WithGroup(string) slog.Handler            { return s }
func (s *logSink) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	s.mu.Lock()
	s.msgs = append(s.msgs, r.Level.String()+" "+r.Message)
	s.mu.Unlock()
	if os.Getenv("SPOOL_DEBUG") != "" || r.Level >= slog.LevelWarn {
		s.t.Log(b.String())
	}
	return nil
}

// has reports whether a record with that level and message was logged.
func (s *logSink) has(level slog.Level, msg string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.msgs {
		if m == level.String()+" "+msg {
			return true
		}
	}
	return false
}

func newSink(t testing.TB) (*logSink, *slog.Logger) {
	s := &logSink{t: t}
	return s, slog.New(s)
}

// fixedClock is a clock that always returns the same time.
type fixedClock time.Time

func (c fixedClock) Now() time.Time { return time.Time(c) }

func newCommitter(t testing.TB, opts wlog.CommitterOptions) *wlog.Committer {
	t.Helper()
	c := wlog.NewCommitter(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func openLog(t testing.TB, dir string, opts wlog.Options) *wlog.Log {
	t.Helper()
	l, err := wlog.Open(dir, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// body returns a deterministic body for record i: 10 to 70 bytes, none of them zero, so that
// zeroing any of its bytes changes it.
func body(i int64) []byte {
	n := 10 + int(i*7%61)
	b := make([]byte, n)
	for k := range b {
		b[k] = byte(1 + (int(i)*31+k*17)%255)
	}
	return b
}

// ts returns the timestamp of record i.
func ts(i int64) int64 { return 1_000_000 + i*10 }

func rec(i int64) wlog.Record { return wlog.Record{Timestamp: ts(i), Body: body(i)} }

// appendRange appends records [from, to) one Append call each and checks their indexes.
func appendRange(t testing.TB, c *wlog.Committer, l *wlog.Log, from, to int64) {
	t.Helper()
	for i := from; i < to; i++ {
		first, err := c.Append(context.Background(), l, []wlog.Record{rec(i)})
		if err != nil {
			t.Fatalf("Append(%d): %v", i, err)
		}
		if first != i {
			t.Fatalf("Append(%d) got index %d", i, first)
		}
	}
}

// checkRecords reads [from, to) and compares them with rec(i).
func checkRecords(t testing.TB, l *wlog.Log, from, to int64) {
	t.Helper()
	if l.NextIndex() != to {
		t.Fatalf("NextIndex = %d, want %d", l.NextIndex(), to)
	}
	i := from
	for i < to {
		recs, err := l.Read(i, 7, 0)
		if err != nil {
			t.Fatalf("Read(%d): %v", i, err)
		}
		if len(recs) == 0 {
			t.Fatalf("Read(%d) returned nothing before NextIndex %d", i, to)
		}
		for _, r := range recs {
			want := rec(i)
			if r.Timestamp != want.Timestamp || !bytes.Equal(r.Body, want.Body) {
				t.Fatalf("record %d = {%d %x}, want {%d %x}", i, r.Timestamp, r.Body, want.Timestamp, want.Body)
			}
			i++
		}
	}
}

// copyDir copies the regular files of src into a new directory.
func copyDir(t testing.TB, src string) string {
	t.Helper()
	dst := t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		in, err := os.Open(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out, err := os.Create(filepath.Join(dst, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(out, in); err != nil {
			t.Fatal(err)
		}
		in.Close()
		if err := out.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}
