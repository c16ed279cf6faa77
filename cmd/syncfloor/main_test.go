package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/testutil"
)

// TestMain lets the test binary be the server child of measure (os.Executable is the test binary).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "-serve" {
		main()
		return
	}
	os.Exit(m.Run())
}

// TestServerWritesWhatItAcknowledges: every acknowledged message is in the file, at the offset
// its answer gave, each publisher's in the order sent, and nothing else was written.
func TestServerWritesWhatItAcknowledges(t *testing.T) {
	for _, gather := range []bool{true, false} {
		t.Run("gather="+strconv.FormatBool(gather), func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "floor.dat")
			const fileSize, size, publishers = 32 << 20, 100, 4
			s, err := newServer(file, fileSize, gather)
			if err != nil {
				t.Fatal(err)
			}
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
			if err := s.close(); err != nil {
				t.Fatal(err)
			}
			acked := l.count()
			if acked == 0 {
				t.Fatal("nothing acknowledged")
			}
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

// TestMeasure runs the whole tool: server child, publishers, figures.
func TestMeasure(t *testing.T) {
	var out bytes.Buffer
	err := run([]string{"-publishers", "3", "-duration", "300ms", "-warmup", "50ms", "-file-size", "16777216", "-dir", t.TempDir()}, &out)
	if err != nil {
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

// TestBadFlags: bad values are refused with a message naming the flag, before anything starts.
func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-publishers", "0"},
		{"-size", "8"},
		{"-duration", "0s"},
		{"-file-size", "1000"},
	} {
		err := run(args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(args[0], "-")) {
			t.Errorf("%v: %v, want an error naming the flag", args, err)
		}
	}
}
