package floor

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolmq/spool/internal/testutil"
)

// TestMain lets the test binary be the server child of measure: Config.Child is the test binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "--serve" {
		fs := flag.NewFlagSet("child", flag.ExitOnError)
		c := Defaults()
		file := fs.String("serve", "", "")
		fs.Int64Var(&c.FileSize, "file-size", 0, "")
		fs.BoolVar(&c.Gather, "gather", true, "")
		fs.StringVar(&c.Store, "store", "", "")
		fs.StringVar(&c.Schema, "schema", "", "")
		fs.Parse(os.Args[1:])
		if err := Serve(c, *file); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	os.Exit(m.Run())
}

// testConfig is a short measurement run by the test binary.
func testConfig(t *testing.T) Config {
	c := Defaults()
	c.Publishers, c.Duration, c.Warmup, c.FileSize, c.Dir = 3, 300*time.Millisecond, 50*time.Millisecond, 16<<20, t.TempDir()
	c.Child = []string{os.Args[0]}
	return c
}

// TestServerWritesWhatItAcknowledges: every acknowledged message is in the file, at the offset
// its answer gave, each publisher's in the order sent, and nothing else was written.
func TestServerWritesWhatItAcknowledges(t *testing.T) {
	for _, gather := range []bool{true, false} {
		t.Run("gather="+strconv.FormatBool(gather), func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "floor.dat")
			const fileSize, size, publishers = 32 << 20, 100, 4
			sk, err := newFileSink(file, fileSize)
			if err != nil {
				t.Fatal(err)
			}
			acked := runLoad(t, newServer(sk, fileSize, gather), publishers, size)
			if acked*(4+size) > fileSize {
				t.Fatalf("%d messages wrapped the file; make it larger", acked)
			}
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			next := make([]uint64, publishers)
			var frames int64
			for off := 0; off+4 <= len(data); off += 4 + size {
				n := binary.BigEndian.Uint32(data[off:])
				if n == 0 {
					if !bytes.Equal(data[off:], make([]byte, len(data)-off)) {
						t.Fatalf("bytes after the last frame at %d", off)
					}
					break
				}
				if n != size {
					t.Fatalf("frame at %d: length %d, want %d", off, n, size)
				}
				id := binary.BigEndian.Uint64(data[off+4:])
				seq := binary.BigEndian.Uint64(data[off+12:])
				if id >= publishers || seq != next[id] {
					t.Fatalf("frame at %d: publisher %d seq %d, want seq %d", off, id, seq, next[min(id, publishers-1)])
				}
				next[id]++
				frames++
			}
			if frames != acked {
				t.Fatalf("%d frames in the file, %d acknowledged", frames, acked)
			}
		})
	}
}

// runLoad runs publishers against s until at least 100 messages are acknowledged, stops them,
// closes s and returns how many were acknowledged.
func runLoad(t *testing.T, s *server, publishers, size int) int64 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.accept(ln)
	l, err := startLoad(ln.Addr().String(), publishers, size)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "100 messages acknowledged", func() error {
		if n := l.count(); n < 100 {
			return fmt.Errorf("%d acknowledged", n)
		}
		return nil
	})
	if err := l.stop(); err != nil {
		t.Fatal(err)
	}
	ln.Close()
	acked := l.count()
	if acked == 0 {
		t.Fatal("nothing acknowledged")
	}
	return acked
}

// TestPGServerLogsWhatItAcknowledges: into PostgreSQL, every acknowledged message is a row with
// its payload, offsets are gapless from 0, each publisher's messages are in the order sent, and
// nothing else was inserted.
func TestPGServerLogsWhatItAcknowledges(t *testing.T) {
	url := testutil.DatabaseURL(t)
	schema := testutil.PGSchema(t, url, "floor_")
	const size, publishers = 100, 4
	sk, err := newPGSink(url, schema)
	if err != nil {
		t.Fatal(err)
	}
	sk.keep = true // read the rows below; PGSchema drops the schema
	s := newServer(sk, maxFrame, true)
	acked := runLoad(t, s, publishers, size)
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT off, payload FROM "+pgx.Identifier{schema, "log"}.Sanitize()+" ORDER BY off")
	if err != nil {
		t.Fatal(err)
	}
	next := make([]uint64, publishers)
	var n int64
	for rows.Next() {
		var off int64
		var p []byte
		if err := rows.Scan(&off, &p); err != nil {
			t.Fatal(err)
		}
		if off != n || len(p) != size {
			t.Fatalf("row %d: offset %d, %d bytes; want offset %d, %d bytes", n, off, len(p), n, size)
		}
		id, seq := binary.BigEndian.Uint64(p), binary.BigEndian.Uint64(p[8:])
		if id >= publishers || seq != next[id] {
			t.Fatalf("offset %d: publisher %d seq %d, want seq %d", off, id, seq, next[min(id, publishers-1)])
		}
		next[id]++
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != acked {
		t.Fatalf("%d rows, %d acknowledged", n, acked)
	}
}

// TestMeasure runs the whole tool: server child, publishers, figures.
func TestMeasure(t *testing.T) {
	var out bytes.Buffer
	if err := Run(testConfig(t), &out); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(\d+) messages in .*, (\d+) msg/s\ncpu per message: server ([\d.]+) us, publishers ([\d.]+) us\n$`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("output:\n%s", out.String())
	}
	if n, _ := strconv.Atoi(m[1]); n == 0 {
		t.Fatalf("no messages: %s", out.String())
	}
	if srv, _ := strconv.ParseFloat(m[3], 64); srv <= 0 {
		t.Fatalf("server cpu not measured: %s", out.String())
	}
}

// TestMeasurePG runs the whole tool into PostgreSQL; the run drops its schema.
func TestMeasurePG(t *testing.T) {
	c := testConfig(t)
	c.Store = testutil.DatabaseURL(t)
	c.Schema = testutil.PGSchema(t, c.Store, "floor_")
	var out bytes.Buffer
	if err := Run(c, &out); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`into PostgreSQL: [1-9]\d* messages in `).MatchString(out.String()) {
		t.Fatalf("output:\n%s", out.String())
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.Store)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var left bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", c.Schema).Scan(&left); err != nil || left {
		t.Fatalf("schema %s left after the run (%v)", c.Schema, err)
	}
}

// TestBadConfig: bad values are refused with a message naming the setting, before anything starts.
func TestBadConfig(t *testing.T) {
	for name, bad := range map[string]func(*Config){
		"publishers": func(c *Config) { c.Publishers = 0 },
		"size":       func(c *Config) { c.Size = 8 },
		"duration":   func(c *Config) { c.Duration = 0 },
		"file-size":  func(c *Config) { c.FileSize = 1000 },
		"schema":     func(c *Config) { c.Store, c.Schema = "postgres://x", "" },
	} {
		c := testConfig(t)
		bad(&c)
		err := Run(c, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v, want an error naming it", name, err)
		}
	}
}
