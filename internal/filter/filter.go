// Package filter parses and evaluates member filters: small expressions over a message's headers
// that a consumer gives when it subscribes ("region=eu", "tier in (gold,silver), !test").
//
// Grammar (whitespace between tokens is ignored):
//
//	filter := term { ("," | "AND") term }        conjunction: every term must hold
//	term   := key "=" value                        the header exists and equals value
//	        | key "!=" value                       the header is absent or differs from value
//	        | key "in" "(" value { "," value } ")" the header exists and equals one of the values
//	        | key "exists"                         the header exists (any value, also empty)
//	        | "!" key                              the header is absent
//	key    := one or more of A-Z a-z 0-9 _ - . / :
//	value  := one or more of A-Z a-z 0-9 _ - . / : @ + *   or a "double-quoted" string with \" and \\
//
// Header names and values compare exactly (case-sensitive, no wildcards: "*" is an ordinary
// character). "AND", "in" and "exists" are keywords only where the grammar expects them (a header
// may be called "in"). An empty filter matches every message.
//
// A filter is parsed once into a Filter (a list of compiled terms) and then evaluated per message
// without allocating. Bad input gets an *Error with the byte position of the problem. Filters are
// bounded (MaxLen bytes, MaxTerms terms, MaxValues values per "in" list) so a client cannot make
// the broker spend unbounded memory or time per message.
package filter

import (
	"fmt"
	"strings"
)

// Bounds of a filter.
const (
	// MaxLen is the longest filter text in bytes.
	MaxLen = 1024
	// MaxTerms is the most terms of one filter.
	MaxTerms = 32
	// MaxValues is the most values of one "in" list.
	MaxValues = 64
)

// Error is a filter that does not parse: Pos is the byte offset of the problem in the text.
type Error struct {
	Pos int
	Msg string
}

func (e *Error) Error() string { return fmt.Sprintf("filter: at byte %d: %s", e.Pos, e.Msg) }

// op is what a term checks.
type op uint8

const (
	opEq op = iota + 1
	opNe
	opIn
	opExists
	opAbsent
)

// term is one compiled condition on one header.
type term struct {
	key    string
	op     op
	values []string // opEq and opNe: one; opIn: the list
}

// Filter is a parsed filter. The zero value and nil match every message. It is immutable and safe
// for concurrent use.
type Filter struct {
	text  string
	terms []term
}

// Parse compiles a filter. An empty (or all blank) text gives nil, which matches everything.
func Parse(text string) (*Filter, error) {
	if len(text) > MaxLen {
		return nil, &Error{Pos: MaxLen, Msg: fmt.Sprintf("filter is %d bytes long, at most %d", len(text), MaxLen)}
	}
	p := &parser{s: text}
	p.skip()
	if p.i == len(p.s) {
		return nil, nil
	}
	f := &Filter{text: strings.TrimSpace(text)}
	for {
		if len(f.terms) == MaxTerms {
			return nil, p.errf("more than %d terms", MaxTerms)
		}
		t, err := p.term()
		if err != nil {
			return nil, err
		}
		f.terms = append(f.terms, t)
		p.skip()
		if p.i == len(p.s) {
			return f, nil
		}
		switch {
		case p.s[p.i] == ',':
			p.i++
		case p.keyword("AND"):
		default:
			return nil, p.errf("expected \",\" or AND between terms, found %q", p.rest())
		}
		p.skip()
		if p.i == len(p.s) {
			return nil, p.errf("expected a term after the conjunction")
		}
	}
}

// String returns the filter's text (trimmed), "" for nil.
func (f *Filter) String() string {
	if f == nil {
		return ""
	}
	return f.text
}

// Match reports whether headers satisfy every term. A nil filter matches everything.
func (f *Filter) Match(headers map[string]string) bool {
	if f == nil {
		return true
	}
	for i := range f.terms {
		t := &f.terms[i]
		v, ok := headers[t.key]
		switch t.op {
		case opEq:
			if !ok || v != t.values[0] {
				return false
			}
		case opNe:
			if ok && v == t.values[0] {
				return false
			}
		case opIn:
			found := false
			if ok {
				for _, w := range t.values {
					if v == w {
						found = true
						break
					}
				}
			}
			if !found {
				return false
			}
		case opExists:
			if !ok {
				return false
			}
		case opAbsent:
			if ok {
				return false
			}
		}
	}
	return true
}

// parser is a cursor over the filter text.
type parser struct {
	s string
	i int
}

func (p *parser) errf(format string, args ...any) error {
	return &Error{Pos: p.i, Msg: fmt.Sprintf(format, args...)}
}

// rest returns what is left, shortened for messages.
func (p *parser) rest() string {
	r := p.s[p.i:]
	if len(r) > 16 {
		r = r[:16] + "..."
	}
	return r
}

func (p *parser) skip() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func isKeyByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '_' || c == '-' || c == '.' || c == '/' || c == ':'
}

func isValueByte(c byte) bool { return isKeyByte(c) || c == '@' || c == '+' || c == '*' }

// keyword consumes word (case-insensitive) when it stands alone at the cursor (followed by a byte
// that cannot continue a key) and reports whether it did.
func (p *parser) keyword(word string) bool {
	end := p.i + len(word)
	if end > len(p.s) || !strings.EqualFold(p.s[p.i:end], word) {
		return false
	}
	if end < len(p.s) && isKeyByte(p.s[end]) {
		return false
	}
	p.i = end
	return true
}

func (p *parser) key() (string, error) {
	start := p.i
	for p.i < len(p.s) && isKeyByte(p.s[p.i]) {
		p.i++
	}
	if p.i == start {
		if p.i == len(p.s) {
			return "", p.errf("expected a header name, found the end")
		}
		return "", p.errf("expected a header name, found %q", p.rest())
	}
	return p.s[start:p.i], nil
}

func (p *parser) value() (string, error) {
	p.skip()
	if p.i < len(p.s) && p.s[p.i] == '"' {
		start := p.i
		p.i++
		var b strings.Builder
		for p.i < len(p.s) {
			c := p.s[p.i]
			switch c {
			case '"':
				p.i++
				return b.String(), nil
			case '\\':
				if p.i+1 < len(p.s) && (p.s[p.i+1] == '"' || p.s[p.i+1] == '\\') {
					b.WriteByte(p.s[p.i+1])
					p.i += 2
					continue
				}
				return "", p.errf("only \\\" and \\\\ are escapes in a quoted value")
			}
			b.WriteByte(c)
			p.i++
		}
		return "", &Error{Pos: start, Msg: "unterminated quoted value"}
	}
	start := p.i
	for p.i < len(p.s) && isValueByte(p.s[p.i]) {
		p.i++
	}
	if p.i == start {
		if p.i == len(p.s) {
			return "", p.errf("expected a value, found the end")
		}
		return "", p.errf("expected a value, found %q (quote values with other characters)", p.rest())
	}
	return p.s[start:p.i], nil
}

func (p *parser) term() (term, error) {
	if p.s[p.i] == '!' {
		p.i++
		p.skip()
		k, err := p.key()
		if err != nil {
			return term{}, err
		}
		return term{key: k, op: opAbsent}, nil
	}
	k, err := p.key()
	if err != nil {
		return term{}, err
	}
	p.skip()
	switch {
	case strings.HasPrefix(p.s[p.i:], "!="):
		p.i += 2
		v, err := p.value()
		return term{key: k, op: opNe, values: []string{v}}, err
	case strings.HasPrefix(p.s[p.i:], "="):
		p.i++
		v, err := p.value()
		return term{key: k, op: opEq, values: []string{v}}, err
	case p.keyword("exists"):
		return term{key: k, op: opExists}, nil
	case p.keyword("in"):
		vs, err := p.list()
		return term{key: k, op: opIn, values: vs}, err
	case p.i == len(p.s):
		return term{}, p.errf("expected =, !=, in or exists after %q, found the end", k)
	}
	return term{}, p.errf("expected =, !=, in or exists after %q, found %q", k, p.rest())
}

func (p *parser) list() ([]string, error) {
	p.skip()
	if p.i == len(p.s) || p.s[p.i] != '(' {
		return nil, p.errf("expected ( after in")
	}
	p.i++
	var vs []string
	for {
		if len(vs) == MaxValues {
			return nil, p.errf("more than %d values in one in list", MaxValues)
		}
		v, err := p.value()
		if err != nil {
			return nil, err
		}
		vs = append(vs, v)
		p.skip()
		if p.i == len(p.s) {
			return nil, p.errf("expected , or ) in the in list, found the end")
		}
		switch p.s[p.i] {
		case ',':
			p.i++
		case ')':
			p.i++
			return vs, nil
		default:
			return nil, p.errf("expected , or ) in the in list, found %q", p.rest())
		}
	}
}

// len returns the number of terms (0 for nil).
func (f *Filter) len() int {
	if f == nil {
		return 0
	}
	return len(f.terms)
}
