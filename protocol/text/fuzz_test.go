package text

import (
	"bytes"
	"reflect"
	"testing"
	"testing/iotest"
)

// FuzzTextParse feeds arbitrary input to the line reader (in small chunks, as TCP delivers it)
// and every line to Parse and ParseReply: no panic, and whatever parses round-trips through
// AppendCommand / AppendReply to an equal value.
func FuzzTextParse(f *testing.F) {
	for _, s := range []string{
		"PUBLISH orders.created hello-world\n",
		"JOIN_GROUP order-processors consumer-1\nSUBSCRIBE orders.created\n",
		"JOIN_GROUP g c ORDERED BATCH 10\nJOIN_GROUP g c ORDERED\n",
		"SUBSCRIBE a.* FROM_TIMESTAMP 2025-01-31T08:00:00.5+01:00\r\nACK 1 2 3\nNACK 4\n",
		"SUBSCRIBE a FROM_MESSAGE_ID 3:17\nUNSUBSCRIBE a\nVERBOSE OFF\nAUTH t\nPING\nHELP\nQUIT",
		"SUBSCRIBE a FROM_BEGINNING FILTER region in (eu, us) AND !test\nSUBSCRIBE filter FILTER x=\"a b\"\n",
		"MESSAGE orders.created hello-world\nMESSAGE_BASE64 t YQpi\nDELIVERY 3 1:7 2 t p q\n",
		"OK 0\nERR TOPIC_NOT_FOUND topic \"x\"\nERR CODE_299\n# help\n",
		"\x00SPL\x00\x00\x00\x08",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		lr := NewLineReader(iotest.HalfReader(bytes.NewReader(data)), 256)
		for range 64 {
			line, err := lr.ReadLine()
			if err != nil {
				if len(line) != 0 {
					t.Fatal("a line with an error")
				}
				if lr.err != nil {
					return
				}
				continue
			}
			if len(line) > 256 || bytes.IndexByte(line, '\n') >= 0 {
				t.Fatalf("line %q breaks the limit or holds a newline", line)
			}
			if c, err := Parse(line); err == nil && c.Verb != VerbNone {
				out, err := AppendCommand(nil, c)
				if err != nil {
					t.Fatalf("Parse(%q) = %+v, which does not format: %v", line, c, err)
				}
				c2, err := Parse(out[:len(out)-1])
				if err != nil || !reflect.DeepEqual(c, c2) {
					t.Fatalf("round trip of %q: %+v -> %q -> %+v, %v", line, c, out, c2, err)
				}
			}
			if r, err := ParseReply(line); err == nil {
				out, err := AppendReply(nil, r)
				if err != nil {
					t.Fatalf("ParseReply(%q) = %+v, which does not format: %v", line, r, err)
				}
				r2, err := ParseReply(out[:len(out)-1])
				if err != nil || !reflect.DeepEqual(r, r2) {
					t.Fatalf("round trip of %q: %+v -> %q -> %+v, %v", line, r, out, r2, err)
				}
			}
		}
	})
}
