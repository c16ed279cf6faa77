package filter

import (
	"errors"
	"strings"
	"testing"
)

func TestMatch(t *testing.T) {
	eu := map[string]string{"region": "eu", "tier": "gold", "empty": ""}
	us := map[string]string{"region": "us", "tier": "silver", "test": "1"}
	cases := []struct {
		filter string
		eu, us bool
	}{
		{"", true, true},
		{"   ", true, true},
		{"region=eu", true, false},
		{"region = eu", true, false},
		{"region!=eu", false, true},
		{"missing!=x", true, true},
		{"missing=x", false, false},
		{"region in (eu,ap)", true, false},
		{"region in ( us , ap )", false, true},
		{"missing in (x)", false, false},
		{"test exists", false, true},
		{"empty exists", true, false},
		{"empty=\"\"", true, false},
		{"!test", true, false},
		{"! test", true, false},
		{"region=eu, tier=gold", true, false},
		{"region=eu AND tier=silver", false, false},
		{"region in (eu,us) and !test", true, false},
		{`tier="gold"`, true, false},
		{`tier="go\"ld"`, false, false},
		{"in=x", false, false},      // a header may be called "in"
		{"region=EU", false, false}, // values are case-sensitive
		{"tier in (gold), !x", true, false},
	}
	for _, c := range cases {
		f, err := Parse(c.filter)
		if err != nil {
			t.Fatalf("Parse(%q): %v", c.filter, err)
		}
		if got := f.Match(eu); got != c.eu {
			t.Errorf("%q on eu = %v, want %v", c.filter, got, c.eu)
		}
		if got := f.Match(us); got != c.us {
			t.Errorf("%q on us = %v, want %v", c.filter, got, c.us)
		}
	}
}

func TestQuotedValue(t *testing.T) {
	f, err := Parse(`name="a b, c\\\"d"`)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Match(map[string]string{"name": `a b, c\"d`}) {
		t.Fatalf("quoted value did not match: %+v", f.terms)
	}
	if f.String() != `name="a b, c\\\"d"` {
		t.Fatalf("String = %q", f.String())
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		filter string
		pos    int
		msg    string
	}{
		{"region", 6, "expected =, !=, in or exists"},
		{"region=", 7, "expected a value, found the end"},
		{"=eu", 0, "expected a header name"},
		{"region=eu,", 10, "expected a term after the conjunction"},
		{"region=eu tier=gold", 10, "expected \",\" or AND"},
		{"region in eu", 10, "expected ( after in"},
		{"region in (eu", 13, "expected , or )"},
		{"region in (eu;", 13, "expected , or )"},
		{"region in ()", 11, "expected a value"},
		{`region="eu`, 7, "unterminated quoted value"},
		{`region="e\u"`, 9, "only \\\" and \\\\ are escapes"},
		{"region=e u", 9, "expected \",\" or AND"},
		{"region==eu", 7, "expected a value"},
		{"!", 1, "expected a header name, found the end"},
		{"region=eu AND", 13, "expected a term after the conjunction"},
		{"region=é", 7, "expected a value"},
		{strings.Repeat("a", MaxLen+1), MaxLen, "at most 1024"},
		{strings.Repeat("a exists,", MaxTerms) + "b exists", 9 * MaxTerms, "more than 32 terms"},
		{"a in (" + strings.Repeat("x,", MaxValues) + "y)", 6 + 2*MaxValues, "more than 64 values"},
	}
	for _, c := range cases {
		_, err := Parse(c.filter)
		var fe *Error
		if !errors.As(err, &fe) {
			t.Errorf("Parse(%.40q) = %v, want an *Error", c.filter, err)
			continue
		}
		if fe.Pos != c.pos || !strings.Contains(fe.Msg, c.msg) {
			t.Errorf("Parse(%.40q) = pos %d %q, want pos %d containing %q", c.filter, fe.Pos, fe.Msg, c.pos, c.msg)
		}
	}
}

func TestNilMatchesAll(t *testing.T) {
	var f *Filter
	if !f.Match(nil) || f.String() != "" {
		t.Fatal("nil filter must match everything")
	}
}

func TestMatchDoesNotAllocate(t *testing.T) {
	f, err := Parse("region in (eu,us), tier=gold, !test, x!=y, tier exists")
	if err != nil {
		t.Fatal(err)
	}
	h := map[string]string{"region": "us", "tier": "gold"}
	if n := testing.AllocsPerRun(100, func() { f.Match(h) }); n != 0 {
		t.Fatalf("Match allocates %v times", n)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"region=eu", "region!=eu", "region in (eu,us)", "a exists", "!a", "a=b, c=d AND e exists",
		`a="q\"uoted"`, "a in (", "=", "!", "a=b,", strings.Repeat("a exists,", 40),
	} {
		f.Add(s, "eu")
	}
	f.Fuzz(func(t *testing.T, text, value string) {
		flt, err := Parse(text)
		if err != nil {
			var fe *Error
			if !errors.As(err, &fe) || fe.Pos < 0 || fe.Pos > len(text) {
				t.Fatalf("Parse(%q): bad error %v", text, err)
			}
			return
		}
		// Match must not panic; a parsed filter's text parses again to the same terms.
		flt.Match(map[string]string{"region": value, "a": value})
		again, err := Parse(flt.String())
		if err != nil || again.len() != flt.len() {
			t.Fatalf("%q parsed, its String %q does not parse the same: %v", text, flt.String(), err)
		}
	})
}
