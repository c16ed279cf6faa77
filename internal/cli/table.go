package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"
)

// Table is rows of cells printed as aligned columns under a header line, for humans. Cells are
// sanitized by Cell: a cell with a tab, a newline or another control character is printed
// Go-quoted, so that it cannot break the columns. An empty cell is printed as "-". Create it with
// NewTable; not safe for concurrent use.
type Table struct {
	header []string
	rows   [][]string
}

// NewTable returns a table with these column titles.
func NewTable(header ...string) *Table {
	return &Table{header: header}
}

// Row appends a row. Missing cells are empty; cells beyond the header's width are kept as extra
// columns.
func (t *Table) Row(cells ...string) {
	t.rows = append(t.rows, cells)
}

// Len returns the number of rows.
func (t *Table) Len() int { return len(t.rows) }

// Write prints the header and the rows, columns separated by at least two spaces, lines without
// trailing blanks.
func (t *Table) Write(w io.Writer) error {
	width := len(t.header)
	for _, r := range t.rows {
		width = max(width, len(r))
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', tabwriter.DiscardEmptyColumns)
	line := func(cells []string) {
		var b strings.Builder
		for i := range width {
			if i > 0 {
				b.WriteByte('\t')
			}
			c := ""
			if i < len(cells) {
				c = cells[i]
			}
			if c == "" {
				c = "-"
			}
			b.WriteString(Cell(c))
		}
		b.WriteByte('\n')
		_, _ = io.WriteString(tw, b.String()) // the error is reported by Flush
	}
	if len(t.header) > 0 {
		line(t.header)
	}
	for _, r := range t.rows {
		line(r)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

// Fields is a block of "name:  value" lines with the values aligned, for one object (topic
// describe, group describe). Create it with &Fields{}; not safe for concurrent use.
type Fields struct {
	rows [][2]string
}

// Add appends a line. An empty value is printed as "-".
func (f *Fields) Add(name, value string) {
	f.rows = append(f.rows, [2]string{name, value})
}

// Write prints the lines.
func (f *Fields) Write(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	for _, r := range f.rows {
		v := r[1]
		if v == "" {
			v = "-"
		}
		_, _ = io.WriteString(tw, Cell(r[0])+":\t"+Cell(v)+"\n") // the error is reported by Flush
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write fields: %w", err)
	}
	return nil
}

// Cell returns s as it may appear in one cell or on one line: s itself when it has no control
// character (tab, newline, escape, ...), else Go-quoted ("a\tb"), which also escapes invalid UTF-8.
func Cell(s string) string {
	if strings.ContainsFunc(s, unicode.IsControl) || !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	return s
}
