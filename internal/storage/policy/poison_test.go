package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/storage"
)

func TestPoison(t *testing.T) {
	t.Parallel()
	s := int64(time.Second)
	both := storage.PoisonRules{DistinctMembers: true, MaxFailures: 3, Window: 30 * time.Second}
	cases := []struct {
		name  string
		rules storage.PoisonRules
		h     []Failure
		now   int64
		want  storage.PoisonRule
	}{
		{"off", storage.PoisonRules{}, []Failure{{"a", "x", 0}, {"b", "x", s}, {"c", "x", 2 * s}}, 2 * s, ""},
		{"no history", both, nil, 0, ""},
		{"same reason two members", both, []Failure{{"a", "bad json", 0}, {"b", "bad json", 100 * s}}, 100 * s, storage.RuleSameReason},
		{"same member repeats", both, []Failure{{"a", "bad json", 0}, {"a", "bad json", 100 * s}}, 100 * s, ""},
		{"different reasons", both, []Failure{{"a", "x", 0}, {"b", "y", 100 * s}}, 100 * s, ""},
		{"empty reasons", both, []Failure{{"a", "", 0}, {"b", "", 100 * s}}, 100 * s, ""},
		{"only the last failure counts", both, []Failure{{"a", "x", 0}, {"b", "x", 50 * s}, {"c", "y", 100 * s}}, 100 * s, ""},
		{"distinct off", storage.PoisonRules{MaxFailures: 3, Window: 30 * time.Second}, []Failure{{"a", "x", 0}, {"b", "x", 100 * s}}, 100 * s, ""},
		{"three in window", both, []Failure{{"a", "1", 0}, {"a", "2", 10 * s}, {"a", "3", 30 * s}}, 30 * s, storage.RuleFailuresInWindow},
		{"window passed", both, []Failure{{"a", "1", 0}, {"a", "2", 10 * s}, {"a", "3", 31 * s}}, 31 * s, ""},
		{"two in window", both, []Failure{{"a", "1", 0}, {"a", "2", 10 * s}}, 10 * s, ""},
		{"window off", storage.PoisonRules{DistinctMembers: true}, []Failure{{"a", "1", 0}, {"a", "2", 0}, {"a", "3", 0}}, 0, ""},
		{"max 1", storage.PoisonRules{MaxFailures: 1, Window: time.Second}, []Failure{{"a", "", 5 * s}}, 5 * s, storage.RuleFailuresInWindow},
	}
	for _, c := range cases {
		if got := Poison(c.rules, c.h, c.now); got != c.want {
			t.Errorf("%s: Poison = %q, want %q", c.name, got, c.want)
		}
	}
}

func TestAddFailureBounded(t *testing.T) {
	t.Parallel()
	var h []Failure
	for i := range 8 {
		h = AddFailure(h, Failure{Member: "m", Reason: strings.Repeat("r", 300), At: int64(i)})
	}
	if len(h) != storage.MaxFailureHistory {
		t.Fatalf("history has %d failures, want %d", len(h), storage.MaxFailureHistory)
	}
	for i, f := range h {
		if f.At != int64(3+i) {
			t.Fatalf("failure %d at %d, want %d (the last ones, oldest first)", i, f.At, 3+i)
		}
		if len(f.Reason) != storage.MaxFailureReasonBytes {
			t.Fatalf("reason of %d bytes kept, want %d", len(f.Reason), storage.MaxFailureReasonBytes)
		}
	}
	fs := Failures(h[:1])
	if len(fs) != 1 || fs[0].Member != "m" || !fs[0].At.Equal(time.Unix(0, 3)) {
		t.Fatalf("Failures = %+v", fs)
	}
}
