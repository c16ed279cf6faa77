// Package names validates topic names, topic patterns and group names, and matches topics against
// patterns.
//
// A topic name is one or more segments of [A-Za-z0-9_-]+ joined by '.', at most 255 bytes. A pattern
// is a topic name whose segments may also be '*' (exactly one segment) or, as the last segment only,
// '#' (zero or more trailing segments). These rules keep names safe as file names and metric label
// values: no '/', no "..", no empty segment.
package names

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxLen is the maximum length of a topic name, pattern or group name in bytes.
const MaxLen = 255

// ErrInvalidName is wrapped by every error of this package.
var ErrInvalidName = errors.New("invalid name")

// ValidateTopic returns nil if name is a valid topic name, else an error wrapping ErrInvalidName
// that says what is wrong.
func ValidateTopic(name string) error {
	return validate("topic name", name, false)
}

// ValidatePattern returns nil if pattern is a valid topic name or wildcard pattern.
func ValidatePattern(pattern string) error {
	return validate("topic pattern", pattern, true)
}

// IsPattern reports whether s contains a wildcard segment.
func IsPattern(s string) bool {
	for seg := range strings.SplitSeq(s, ".") {
		if seg == "*" || seg == "#" {
			return true
		}
	}
	return false
}

// ValidateGroup returns nil if group is a valid consumer group or member name: 1 to 255 bytes of
// [A-Za-z0-9_.-], other than "." and "..". Those two are refused because URLs cannot carry them:
// browsers and HTTP routers resolve them as dot segments, so the admin API could not name the
// group. (Topic names cannot be either: a segment is never empty.)
func ValidateGroup(group string) error {
	if group == "" {
		return fmt.Errorf("%w: group name must not be empty", ErrInvalidName)
	}
	if group == "." || group == ".." {
		return fmt.Errorf("%w: group name %q is not allowed (a URL path cannot name it)", ErrInvalidName, group)
	}
	if len(group) > MaxLen {
		return fmt.Errorf("%w: group name is %d bytes, at most %d allowed", ErrInvalidName, len(group), MaxLen)
	}
	for i := 0; i < len(group); i++ {
		if c := group[i]; !isNameByte(c) && c != '.' {
			return fmt.Errorf("%w: group name %q: %s at byte %d is not one of [A-Za-z0-9_.-]", ErrInvalidName, group, charAt(group, i), i)
		}
	}
	return nil
}

func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

func validate(what, s string, wildcards bool) error {
	if s == "" {
		return fmt.Errorf("%w: %s must not be empty", ErrInvalidName, what)
	}
	if len(s) > MaxLen {
		return fmt.Errorf("%w: %s is %d bytes, at most %d allowed", ErrInvalidName, what, len(s), MaxLen)
	}
	// Segment by segment without splitting (it runs on every publish).
	for rest := s; ; {
		seg, tail, more := strings.Cut(rest, ".")
		rest = tail
		switch {
		case seg == "":
			return fmt.Errorf("%w: %s %q has an empty segment (segments are joined by single dots)", ErrInvalidName, what, s)
		case seg == "*" || seg == "#":
			if !wildcards {
				return fmt.Errorf("%w: %s %q contains wildcard %q (only allowed in patterns)", ErrInvalidName, what, s, seg)
			}
			if seg == "#" && more {
				return fmt.Errorf("%w: %s %q: '#' must be the last segment", ErrInvalidName, what, s)
			}
		default:
			for j := 0; j < len(seg); j++ {
				if !isNameByte(seg[j]) {
					return fmt.Errorf("%w: %s %q: segment %q contains %s; allowed are [A-Za-z0-9_-], '.' between segments%s",
						ErrInvalidName, what, s, seg, charAt(seg, j), wildcardHint(wildcards))
				}
			}
		}
		if !more {
			return nil
		}
	}
}

// charAt describes the character that starts at byte i of s for an error message: the whole
// UTF-8 character quoted ('é', not the 'Ã' of its first byte), or the byte in hex when s is not
// valid UTF-8 there.
func charAt(s string, i int) string {
	r, size := utf8.DecodeRuneInString(s[i:])
	if r == utf8.RuneError && size <= 1 {
		return fmt.Sprintf("byte 0x%02x (not UTF-8)", s[i])
	}
	return fmt.Sprintf("%q", r)
}

func wildcardHint(wildcards bool) string {
	if wildcards {
		return ", and whole segments '*' or a last '#'"
	}
	return ""
}

// Match reports whether topic matches pattern. Both must be valid; a pattern without wildcards
// matches only the identical topic. '*' matches exactly one segment; a final '#' matches zero or
// more trailing segments.
func Match(pattern, topic string) bool {
	for {
		pseg, prest, pmore := strings.Cut(pattern, ".")
		if pseg == "#" && !pmore {
			return true
		}
		tseg, trest, tmore := strings.Cut(topic, ".")
		if topic == "" {
			return false
		}
		if pseg != "*" && pseg != tseg {
			return false
		}
		if !pmore || !tmore {
			// One side ran out. They match if both did, or if the pattern's remainder is a final '#'
			// (zero trailing segments).
			return pmore == tmore || pmore && prest == "#"
		}
		pattern, topic = prest, trest
	}
}
