package cli

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Bytes formats a byte count for humans: "512 B", "1.5 KiB", "20.0 MiB" (binary units, one decimal).
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// Duration formats a duration for humans in a form ParseDuration reads back: whole days from two
// days up as "7d", else Go's form without zero trailing units ("1h30m" instead of "1h30m0s", "2m" instead of
// "2m0s").
func Duration(d time.Duration) string {
	const day = 24 * time.Hour
	if d >= 2*day && d%day == 0 {
		return strconv.FormatInt(int64(d/day), 10) + "d"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// ParseDuration parses a Go duration ("30s", "1h30m", "250ms") optionally preceded by a number of
// days ("7d", "1d12h"). The error names the accepted forms.
func ParseDuration(s string) (time.Duration, error) {
	bad := fmt.Errorf("invalid duration %q: want a number with a unit such as 250ms, 30s, 5m, 24h or 7d", s)
	days, rest := int64(0), s
	if i := strings.IndexByte(s, 'd'); i >= 0 {
		n, err := strconv.ParseInt(s[:i], 10, 64)
		if err != nil || n < 0 || n > int64(1<<63-1)/int64(24*time.Hour) {
			return 0, bad
		}
		days, rest = n, s[i+1:]
		if rest == "" {
			return time.Duration(days) * 24 * time.Hour, nil
		}
		if strings.HasPrefix(rest, "-") || strings.HasPrefix(rest, "+") {
			return 0, bad
		}
	}
	d, err := time.ParseDuration(rest)
	if err != nil {
		return 0, bad
	}
	total := time.Duration(days)*24*time.Hour + d
	if days > 0 && total < d { // overflow
		return 0, bad
	}
	return total, nil
}

// DurationValue is a flag.Value for a duration read by ParseDuration (days allowed) and printed by
// Duration. Not safe for concurrent use.
type DurationValue struct {
	D time.Duration
}

// String returns the duration as Duration prints it.
func (v *DurationValue) String() string {
	if v == nil {
		return ""
	}
	return Duration(v.D)
}

// Set parses s with ParseDuration.
func (v *DurationValue) Set(s string) error {
	d, err := ParseDuration(s)
	if err != nil {
		return err
	}
	v.D = d
	return nil
}

// Time formats a time for humans as RFC 3339 to the second in loc (the form spool sub --from
// reads back); the zero time is "-".
func Time(t time.Time, loc *time.Location) string {
	if t.IsZero() {
		return "-"
	}
	return t.In(loc).Format(time.RFC3339)
}

// Text returns a payload, key or header value for one line of human output: as is when it is
// valid UTF-8 without control characters, else Go-quoted ("line1\nline2", "\xff\x00").
func Text(b []byte) string {
	return Cell(string(b))
}

// Truncate shortens s to at most n characters (runes), ending a shortened string with "…".
func Truncate(s string, n int) string {
	if n < 1 {
		return ""
	}
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// TextOrBase64 returns b as text when it is valid UTF-8, else base64-encoded (standard encoding):
// the convention of the admin API's messages (payload or payload_base64). Exactly one result is
// non-nil.
func TextOrBase64(b []byte) (text, b64 *string) {
	if utf8.Valid(b) {
		s := string(b)
		return &s, nil
	}
	s := base64.StdEncoding.EncodeToString(b)
	return nil, &s
}

// JSONLines writes values as JSON, one per line, without HTML escaping. Safe for concurrent use:
// lines are never interleaved.
type JSONLines struct {
	mu  sync.Mutex
	enc *json.Encoder
}

// NewJSONLines returns a JSONLines writing to w.
func NewJSONLines(w io.Writer) *JSONLines {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return &JSONLines{enc: enc}
}

// Write writes v as one line.
func (j *JSONLines) Write(v any) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.enc.Encode(v); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}
