package cli

import (
	"bytes"
	"testing"
)

func TestTableAlignsColumns(t *testing.T) {
	t.Parallel()
	tab := NewTable("NAME", "SEMANTICS", "SIZE")
	tab.Row("orders.created", "PUB_SUB", "1.5 KiB")
	tab.Row("jobs", "QUEUE", "0 B")
	var b bytes.Buffer
	if err := tab.Write(&b); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"NAME            SEMANTICS  SIZE\n" +
		"orders.created  PUB_SUB    1.5 KiB\n" +
		"jobs            QUEUE      0 B\n"
	if b.String() != want {
		t.Fatalf("table:\n%s\nwant:\n%s", b.String(), want)
	}
	if tab.Len() != 2 {
		t.Fatalf("Len = %d, want 2", tab.Len())
	}
}

func TestTableSanitizesAndFillsCells(t *testing.T) {
	t.Parallel()
	tab := NewTable("ID", "LAST-ERROR", "AT")
	tab.Row("1", "line1\nline2\tend", "x")
	tab.Row("2")                 // missing cells
	tab.Row("3", "ok", "y", "z") // an extra column
	var b bytes.Buffer
	if err := tab.Write(&b); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"ID  LAST-ERROR           AT  -\n" +
		`1   "line1\nline2\tend"  x   -` + "\n" +
		"2   -                    -   -\n" +
		"3   ok                   y   z\n"
	if b.String() != want {
		t.Fatalf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestFields(t *testing.T) {
	t.Parallel()
	f := &Fields{}
	f.Add("Name", "orders")
	f.Add("Max deliveries", "5")
	f.Add("Pattern", "")
	var b bytes.Buffer
	if err := f.Write(&b); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"Name:            orders\n" +
		"Max deliveries:  5\n" +
		"Pattern:         -\n"
	if b.String() != want {
		t.Fatalf("fields:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestCell(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"plain text", "plain text"},
		{"ünïcödé ✓", "ünïcödé ✓"},
		{"", ""},
		{"a\tb", `"a\tb"`},
		{"new\nline", `"new\nline"`},
		{"esc\x1b[31m", `"esc\x1b[31m"`},
		{"bad\xffutf8", `"bad\xffutf8"`},
	} {
		if got := Cell(tc.in); got != tc.want {
			t.Errorf("Cell(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
