package storagetest

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"
)

// Require-style assertions: each stops the test at the first failure. They must only be called
// from the test's own goroutine (t.FailNow); goroutines use t.Errorf and return.

func noErr(t testing.TB, err error, what string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: unexpected error: %v", fmt.Sprintf(what, args...), err)
	}
}

func errIs(t testing.TB, err, target error, what string, args ...any) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got error %v, want one wrapping %q", fmt.Sprintf(what, args...), err, target)
	}
}

// errIsAny requires err to wrap one of targets and returns the first that matches.
func errIsAny(t testing.TB, err error, what string, targets ...error) error {
	t.Helper()
	for _, target := range targets {
		if errors.Is(err, target) {
			return target
		}
	}
	t.Fatalf("%s: got error %v, want one wrapping any of %q", what, err, targets)
	return nil
}

func equal[T comparable](t testing.TB, got, want T, what string, args ...any) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: got %v, want %v", fmt.Sprintf(what, args...), got, want)
	}
}

func deepEqual(t testing.TB, got, want any, what string, args ...any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got: %+v\nwant: %+v", fmt.Sprintf(what, args...), got, want)
	}
}

func timeEqual(t testing.TB, got, want time.Time, what string, args ...any) {
	t.Helper()
	if !got.Equal(want) {
		t.Fatalf("%s: got %s, want %s", fmt.Sprintf(what, args...), fmtTime(got), fmtTime(want))
	}
}

func isTrue(t testing.TB, cond bool, what string, args ...any) {
	t.Helper()
	if !cond {
		t.Fatalf(what, args...)
	}
}

// fmtTime prints a time relative to the suite's base time, which reads better than dates.
func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "zero"
	}
	return fmt.Sprintf("base%+v", t.Sub(baseTime))
}
