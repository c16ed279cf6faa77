package names

import (
	"errors"
	"strings"
	"testing"
)

func TestMatchSeedExamples(t *testing.T) {
	t.Parallel()
	// Seed 002 section 2.2 TM-5 (dot examples), plus the slash examples rewritten with '.'.
	cases := []struct {
		pattern, topic string
		want           bool
	}{
		{"orders.*.created", "orders.payments.created", true},
		{"orders.*.created", "orders.shipping.created", true},
		{"orders.*.created", "orders.created", false},
		{"orders.*.created", "orders.payments.items.created", false},
		{"orders.#", "orders.created", true},
		{"orders.#", "orders.payments.created", true},
		{"orders.#", "orders.payments.items.created", true},
		{"orders.#", "inventory.created", false},
		{"orders.#", "orders", true}, // '#' matches zero segments
		{"sensors.*.temperature", "sensors.room1.temperature", true},
		{"sensors.*.temperature", "sensors.floor1.room1.temperature", false},
		{"sensors.#", "sensors.floor1.room1.temperature", true},
		{"sensors.*.#", "sensors.room1.temperature.celsius", true},
		{"sensors.*.#", "sensors.room1", true},
		{"sensors.*.#", "sensors", false},
		{"sensors.*.building1", "sensors.temperature.building1", true},
		{"sensors.*.building1", "sensors.building1", false},
		{"sensors.*.building1", "sensors.temp.room.building1", false},
		{"sensors.temperature.#", "sensors.temperature", true},
		{"sensors.temperature.#", "sensors.temperature.building1", true},
		{"sensors.temperature.#", "sensors.temperature.building1.floor2", true},
		{"sensors.*.building1.#", "sensors.temperature.building1.floor2.room5", true},
		{"test.*", "test.temperature", true},
		{"test.*", "test.humidity", true},
		{"test.*", "test.room.sensor1", false},
		{"test.#", "test.room.sensor1", true},
		{"#", "anything.at.all", true},
		{"*", "one", true},
		{"*", "one.two", false},
		{"a.b", "a.b", true},
		{"a.b", "a.b.c", false},
		{"a.b.c", "a.b", false},
		{"a.bc", "a.b", false},
	}
	for _, c := range cases {
		if err := ValidatePattern(c.pattern); err != nil {
			t.Fatalf("pattern %q: %v", c.pattern, err)
		}
		if err := ValidateTopic(c.topic); err != nil {
			t.Fatalf("topic %q: %v", c.topic, err)
		}
		if got := Match(c.pattern, c.topic); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.pattern, c.topic, got, c.want)
		}
	}
}

func TestValidateRejects(t *testing.T) {
	t.Parallel()
	badPatterns := map[string]string{
		"sensors.#.building1":    "last segment",
		"sensors.*.":             "empty segment",
		"#.temperature":          "last segment",
		"":                       "empty",
		"a..b":                   "empty segment",
		".a":                     "empty segment",
		"a/b":                    "contains",
		"../etc":                 "empty segment",
		"a.b*":                   "contains",
		"a b":                    "contains",
		strings.Repeat("a", 256): "at most 255",
	}
	for p, want := range badPatterns {
		err := ValidatePattern(p)
		if err == nil || !errors.Is(err, ErrInvalidName) || !strings.Contains(err.Error(), want) {
			t.Errorf("ValidatePattern(%q) = %v, want an ErrInvalidName mentioning %q", p, err, want)
		}
	}
	for _, topic := range []string{"orders.*", "orders.#", "*", "a/b", "a..b", "ä"} {
		if err := ValidateTopic(topic); !errors.Is(err, ErrInvalidName) {
			t.Errorf("ValidateTopic(%q) = %v, want ErrInvalidName", topic, err)
		}
	}
	if err := ValidateTopic(strings.Repeat("a", 255)); err != nil {
		t.Errorf("255-byte topic: %v", err)
	}
	for _, g := range []string{"", "a b", "a/b", strings.Repeat("g", 256)} {
		if err := ValidateGroup(g); !errors.Is(err, ErrInvalidName) {
			t.Errorf("ValidateGroup(%q) = %v, want ErrInvalidName", g, err)
		}
	}
	if err := ValidateGroup("order-processors.v2"); err != nil {
		t.Errorf("ValidateGroup: %v", err)
	}
}

// TestDotSegmentsRejected: "." and ".." cannot be named in a URL path (browsers and ServeMux
// resolve them), so they are no group, member or topic name; longer runs of dots are groups.
func TestDotSegmentsRejected(t *testing.T) {
	for _, name := range []string{".", ".."} {
		if err := ValidateGroup(name); !errors.Is(err, ErrInvalidName) || !strings.Contains(err.Error(), "not allowed") {
			t.Errorf("ValidateGroup(%q) = %v, want ErrInvalidName saying it is not allowed", name, err)
		}
		if err := ValidateTopic(name); !errors.Is(err, ErrInvalidName) {
			t.Errorf("ValidateTopic(%q) = %v, want ErrInvalidName", name, err)
		}
		if err := ValidatePattern(name); !errors.Is(err, ErrInvalidName) {
			t.Errorf("ValidatePattern(%q) = %v, want ErrInvalidName", name, err)
		}
	}
	for _, name := range []string{"...", ".a", "a.", "a..b"} {
		if err := ValidateGroup(name); err != nil {
			t.Errorf("ValidateGroup(%q) = %v, want nil", name, err)
		}
	}
}

func FuzzMatch(f *testing.F) {
	f.Add("orders.*.created", "orders.payments.created")
	f.Add("orders.#", "orders")
	f.Fuzz(func(t *testing.T, pattern, topic string) {
		if ValidatePattern(pattern) != nil || ValidateTopic(topic) != nil {
			return
		}
		got := Match(pattern, topic)
		if want := matchReference(strings.Split(pattern, "."), strings.Split(topic, ".")); got != want {
			t.Fatalf("Match(%q, %q) = %v, reference says %v", pattern, topic, got, want)
		}
	})
}

// matchReference is the recursive definition Match must agree with.
func matchReference(p, t []string) bool {
	if len(p) == 0 {
		return len(t) == 0
	}
	if p[0] == "#" {
		return true
	}
	if len(t) == 0 {
		return false
	}
	return (p[0] == "*" || p[0] == t[0]) && matchReference(p[1:], t[1:])
}

// TestInvalidCharacterNamed checks that an error names the offending character whole: the
// topic "café" used to be reported as containing 'Ã', the first byte of 'é'.
func TestInvalidCharacterNamed(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want string
	}{
		{ValidateTopic("café"), `contains 'é'`},
		{ValidatePattern("orders.*.naïve"), `contains 'ï'`},
		{ValidateTopic("a\xffb"), "contains byte 0xff (not UTF-8)"},
		{ValidateGroup("grüppe"), `'ü' at byte 2`},
		{ValidateTopic("a b"), `contains ' '`},
	} {
		if c.err == nil || !errors.Is(c.err, ErrInvalidName) || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("error %v, want one mentioning %s", c.err, c.want)
		}
	}
}
