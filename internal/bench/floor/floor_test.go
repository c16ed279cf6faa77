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
		fs.IntVar(&c.Batch, "batch", 1, "")
		fs.IntVar(&c.Committers, "committers", 1, "")
		fs.BoolVar(&c.StoreStdin, "store-stdin", false, "")
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
			acked := runLoad(t, newServer([]sink{sk}, fileSize, 1, gather), publishers, size, 1)
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
func runLoad(t *testing.T, s *server, publishers, size, batch int) int64 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.accept(ln)
	l, err := startLoad(ln.Addr().String(), publishers, size, batch)
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

// TestPGServerLogsWhatItAcknowledges: into PostgreSQL, with 1 and 2 committers, every
// acknowledged message is a row with its payload (requests of 3 messages), each head's offsets
// are gapless from 0, each publisher's messages are in the order sent within a head and each is
// there once, and nothing else was inserted.
func TestPGServerLogsWhatItAcknowledges(t *testing.T) {
	url := testutil.DatabaseURL(t)
	for _, committers := range []int{1, 2} {
		t.Run(fmt.Sprintf("committers=%d", committers), func(t *testing.T) {
			schema := testutil.PGSchema(t, url, "floor_")
			const size, publishers, batch = 100, 4, 3
			sinks, err := newPGSinks(url, schema, committers)
			if err != nil {
				t.Fatal(err)
			}
			sinks[0].(*pgSink).drop = false // read the rows below; PGSchema drops the schema
			s := newServer(sinks, maxFrame, batch, true)
			acked := runLoad(t, s, publishers, size, batch)
			if err := s.close(); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			rows, err := conn.Query(ctx, "SELECT head, off, payload FROM "+pgx.Identifier{schema, "log"}.Sanitize()+" ORDER BY head, off")
			if err != nil {
				t.Fatal(err)
			}
			seen := make([]map[uint64]bool, publishers)
			for i := range seen {
				seen[i] = map[uint64]bool{}
			}
			var n int64
			var head, want int64
			last := map[[2]uint64]uint64{} // (head, publisher) -> last seq + 1
			for rows.Next() {
				var h, off int64
				var p []byte
				if err := rows.Scan(&h, &off, &p); err != nil {
					t.Fatal(err)
				}
				if h != head {
					head, want = h, 0
				}
				if h < 1 || h > int64(committers) || off != want || len(p) != size {
					t.Fatalf("row %d: head %d offset %d, %d bytes; want offset %d, %d bytes", n, h, off, len(p), want, size)
				}
				want++
				id, seq := binary.BigEndian.Uint64(p), binary.BigEndian.Uint64(p[8:])
				k := [2]uint64{uint64(h), id}
				if id >= publishers || seen[id][seq] || seq < last[k] {
					t.Fatalf("head %d offset %d: publisher %d seq %d again or out of order", h, off, id, seq)
				}
				seen[id][seq], last[k] = true, seq+1
				n++
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			for id, m := range seen {
				for seq := range uint64(len(m)) {
					if !m[seq] {
						t.Fatalf("publisher %d: seq %d missing of %d", id, seq, len(m))
					}
				}
			}
			if n != acked {
				t.Fatalf("%d rows, %d acknowledged", n, acked)
			}
		})
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
	c.Committers, c.Batch = 2, 2
	var out bytes.Buffer
	if err := Run(c, &out); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`into PostgreSQL \(2 committers\): [1-9]\d* messages in `).MatchString(out.String()) {
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

// TestChildArgsStoreOffCommandLine: the store URL (its password) never reaches the child's
// command line, which every user of the machine can read; the child reads it from stdin
// (TestMeasurePG runs that path).
func TestChildArgsStoreOffCommandLine(t *testing.T) {
	c := Defaults()
	c.Store = "postgres://spool:s3cret@db.example/spool"
	args := strings.Join(ChildArgs(c, "floor.dat"), " ")
	if strings.Contains(args, "s3cret") || !strings.Contains(args, "--store-stdin") {
		t.Fatalf("child arguments %q: want --store-stdin and no URL", args)
	}
}

// TestBadConfig: bad values are refused with a message naming the setting, before anything starts.
func TestBadConfig(t *testing.T) {
	for name, bad := range map[string]func(*Config){
		"publishers": func(c *Config) { c.Publishers = 0 },
		"size":       func(c *Config) { c.Size = 8 },
		"batch":      func(c *Config) { c.Batch = 0 },
		"committers": func(c *Config) { c.Committers = 2 },
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
