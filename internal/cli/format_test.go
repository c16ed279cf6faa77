package cli

import (
	"bytes"
	"encoding/base64"
	"testing"
	"time"
)

func TestBytes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{0, "0 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {1536, "1.5 KiB"}, {1 << 20, "1.0 MiB"},
		{20<<20 + 1, "20.0 MiB"}, {5 << 30, "5.0 GiB"}, {3 << 40, "3.0 TiB"}, {-5, "-5 B"},
	} {
		if got := Bytes(tc.n); got != tc.want {
			t.Errorf("Bytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestDurationRoundTrips(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"}, {250 * time.Millisecond, "250ms"}, {30 * time.Second, "30s"}, {2 * time.Minute, "2m"},
		{90 * time.Minute, "1h30m"}, {time.Hour, "1h"}, {24 * time.Hour, "24h"}, {36 * time.Hour, "36h"},
		{7 * 24 * time.Hour, "7d"}, {30 * 24 * time.Hour, "30d"}, {61 * time.Second, "1m1s"},
	} {
		got := Duration(tc.d)
		if got != tc.want {
			t.Errorf("Duration(%v) = %q, want %q", tc.d, got, tc.want)
		}
		back, err := ParseDuration(got)
		if err != nil || back != tc.d {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", got, back, err, tc.d)
		}
	}
}

func TestParseDuration(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"7d", 7 * 24 * time.Hour}, {"1d12h", 36 * time.Hour}, {"0d", 0}, {"30s", 30 * time.Second},
		{"1h30m", 90 * time.Minute}, {"1.5h", 90 * time.Minute},
	} {
		got, err := ParseDuration(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "d", "7", "1.5d", "-1d", "1d-5h", "1dx", "abc", "99999999999999d"} {
		if got, err := ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) = %v, want an error", in, got)
		}
	}
	var v DurationValue
	if err := v.Set("2d"); err != nil || v.D != 48*time.Hour || v.String() != "2d" {
		t.Fatalf("DurationValue: Set(2d) = %v, D = %v, String = %q", err, v.D, v.String())
	}
	if err := v.Set("soon"); err == nil {
		t.Fatal("DurationValue.Set(soon): want an error")
	}
}

func TestTime(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 1, 2, 15, 4, 5, 999, time.UTC)
	if got := Time(at, time.UTC); got != "2025-01-02T15:04:05Z" {
		t.Errorf("Time = %q", got)
	}
	loc := time.FixedZone("X", 3600)
	if got := Time(at, loc); got != "2025-01-02T16:04:05+01:00" {
		t.Errorf("Time in +01:00 = %q", got)
	}
	if got := Time(time.Time{}, time.UTC); got != "-" {
		t.Errorf("Time(zero) = %q, want -", got)
	}
}

func TestTextAndTruncate(t *testing.T) {
	t.Parallel()
	if got := Text([]byte(`{"id":1}`)); got != `{"id":1}` {
		t.Errorf("Text(json) = %s", got)
	}
	if got := Text([]byte("a\nb")); got != `"a\nb"` {
		t.Errorf("Text(two lines) = %s", got)
	}
	if got := Text([]byte{0xff, 0x00}); got != `"\xff\x00"` {
		t.Errorf("Text(binary) = %s", got)
	}
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"}, {"exactly", 7, "exactly"}, {"too long here", 5, "too …"}, {"äöüäöü", 3, "äö…"}, {"x", 0, ""},
	} {
		if got := Truncate(tc.in, tc.n); got != tc.want {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestTextOrBase64(t *testing.T) {
	t.Parallel()
	text, b64 := TextOrBase64([]byte("héllo"))
	if text == nil || *text != "héllo" || b64 != nil {
		t.Errorf("TextOrBase64(utf8) = %v, %v", text, b64)
	}
	text, b64 = TextOrBase64([]byte{0xff, 0xfe})
	if text != nil || b64 == nil || *b64 != base64.StdEncoding.EncodeToString([]byte{0xff, 0xfe}) {
		t.Errorf("TextOrBase64(binary) = %v, %v", text, b64)
	}
	text, b64 = TextOrBase64(nil)
	if text == nil || *text != "" || b64 != nil {
		t.Errorf("TextOrBase64(nil) = %v, %v", text, b64)
	}
}

func TestJSONLines(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	j := NewJSONLines(&b)
	if err := j.Write(map[string]any{"payload": "<a&b>", "n": 1}); err != nil {
		t.Fatal(err)
	}
	if err := j.Write([]int{1, 2}); err != nil {
		t.Fatal(err)
	}
	want := `{"n":1,"payload":"<a&b>"}` + "\n[1,2]\n"
	if b.String() != want {
		t.Fatalf("JSONLines wrote %q, want %q", b.String(), want)
	}
	if err := j.Write(func() {}); err == nil {
		t.Fatal("JSONLines.Write(func): want an error")
	}
}
