package protocol

import (
	"errors"
	"fmt"
	"regexp"
	"testing"
	"time"
)

// The table is the contract: codes and names are unique, names are UPPER_SNAKE, ranges hold.
func TestErrorTable(t *testing.T) {
	t.Parallel()
	codes, names := map[uint16]bool{}, map[string]bool{}
	name := regexp.MustCompile(`^[A-Z][A-Z_]*[A-Z]$`)
	for _, e := range Errors() {
		if e.Code == 0 || codes[e.Code] {
			t.Errorf("code %d is zero or duplicated", e.Code)
		}
		if names[e.Name] || !name.MatchString(e.Name) {
			t.Errorf("name %q is duplicated or not UPPER_SNAKE", e.Name)
		}
		codes[e.Code], names[e.Name] = true, true
		if e.Message != "" || e.RetryAfter != 0 {
			t.Errorf("%s: table entries carry no message", e.Name)
		}
		// Availability errors (2xx) are retryable, the others are not.
		if want := e.Code >= 200; e.Retryable != want {
			t.Errorf("%s: retryable %v, want %v for code %d", e.Name, e.Retryable, want, e.Code)
		}
	}
}

// Pin the wire values: changing one breaks every deployed client.
func TestErrorCodesNeverChange(t *testing.T) {
	t.Parallel()
	want := map[string]uint16{
		"MALFORMED_FRAME": 1, "FRAME_TOO_LARGE": 2, "UNKNOWN_OPCODE": 3, "UNSUPPORTED_VERSION": 4,
		"NOT_AUTHENTICATED": 5, "UNEXPECTED_FRAME": 6, "PERMISSION_DENIED": 7, "UNKNOWN_HANDLE": 8,
		"SESSION_TIMEOUT": 9, "UNKNOWN_COMMAND": 10, "LINE_TOO_LONG": 11,
		"INVALID_ARGUMENT": 100, "TOPIC_NOT_FOUND": 101, "TOPIC_EXISTS": 102, "TOPIC_HAS_SUBSCRIPTIONS": 103,
		"NO_SUBSCRIPTIONS": 104, "SUBSCRIPTION_NOT_FOUND": 105, "SUBSCRIPTION_EXISTS": 106,
		"SUBSCRIPTION_NOT_ACTIVE": 107, "INVALID_TRANSITION": 108, "LEASE_NOT_HELD": 109,
		"MESSAGE_TOO_LARGE": 110, "OFFSET_OUT_OF_RANGE": 111, "BINDING_EXISTS": 112, "BINDING_NOT_FOUND": 113,
		"STALE_GENERATION": 114, "LIMIT_EXCEEDED": 115, "TOPIC_CHANGED": 116,
		"CLOSED": 200, "INTERNAL": 201, "OVERLOADED": 202, "RATE_LIMITED": 203, "TIMEOUT": 204,
		"STORAGE_UNAVAILABLE": 205, "STORAGE_FULL": 206,
	}
	table := Errors()
	if len(table) != len(want) {
		t.Fatalf("table has %d entries, the pinned list %d: pin new codes here", len(table), len(want))
	}
	for _, e := range table {
		if code, ok := want[e.Name]; !ok || code != e.Code {
			t.Errorf("%s = %d, pinned %d", e.Name, e.Code, code)
		}
	}
}

func TestErrorForCode(t *testing.T) {
	t.Parallel()
	e, ok := ErrorForCode(CodeOverloaded)
	if !ok || e.Name != "OVERLOADED" || !e.Retryable || e == ErrOverloaded {
		t.Fatalf("got %+v, %v (must be a copy)", e, ok)
	}
	e.Message = "changed"
	if ErrOverloaded.Message != "" {
		t.Fatal("ErrorForCode returned the sentinel itself")
	}
	u, ok := ErrorForCode(4242)
	if ok || u.Code != 4242 || u.Name != "" || u.Retryable {
		t.Fatalf("unknown code: %+v, %v", u, ok)
	}
	if u.Error() != "CODE_4242" {
		t.Fatalf("unknown code prints %q", u.Error())
	}
	n, ok := ErrorForName("LEASE_NOT_HELD")
	if !ok || n.Code != CodeLeaseNotHeld {
		t.Fatalf("ErrorForName: %+v", n)
	}
	if _, ok := ErrorForName("NOPE"); ok {
		t.Fatal("unknown name found")
	}
}

func TestErrorIsAndRetryable(t *testing.T) {
	t.Parallel()
	received := &Error{Code: CodeTopicNotFound, Name: "TOPIC_NOT_FOUND", Message: "topic x"}
	wrapped := fmt.Errorf("publish: %w", received)
	if !errors.Is(wrapped, ErrTopicNotFound) || errors.Is(wrapped, ErrTopicExists) {
		t.Fatal("errors.Is must compare codes")
	}
	if IsRetryable(wrapped) || !IsRetryable(fmt.Errorf("x: %w", ErrClosed.WithMessage("bye"))) {
		t.Fatal("IsRetryable")
	}
	if IsRetryable(errors.New("plain")) || IsRetryable(nil) {
		t.Fatal("IsRetryable of a non-protocol error")
	}
	// A newer server's unknown code is retryable if the wire says so.
	if !IsRetryable(&Error{Code: 299, Retryable: true}) {
		t.Fatal("the wire's retry flag must count for unknown codes")
	}
	if got := ErrOverloaded.Errorf("%d in flight", 3); got.Message != "3 in flight" || got.Code != CodeOverloaded {
		t.Fatalf("Errorf: %+v", got)
	}
	if got := received.Error(); got != "TOPIC_NOT_FOUND: topic x" {
		t.Fatalf("Error() = %q", got)
	}
}

func TestAsError(t *testing.T) {
	t.Parallel()
	if AsError(nil) != nil {
		t.Fatal("nil")
	}
	e := ErrLeaseNotHeld.WithMessage("m")
	if AsError(e) != e {
		t.Fatal("an *Error is returned as is")
	}
	got := AsError(fmt.Errorf("%w: topic %q", ErrTopicNotFound, "x"))
	if got.Code != CodeTopicNotFound || got.Message != `topic "x"` {
		t.Fatalf("got %+v", got)
	}
	got = AsError(fmt.Errorf("ack: %w", ErrClosed))
	if got.Code != CodeClosed || !got.Retryable || got.Message != "ack: CLOSED" {
		t.Fatalf("got %+v", got)
	}
	got = AsError(fmt.Errorf("%w", ErrClosed))
	if got.Message != "" {
		t.Fatalf("got %+v", got)
	}
	got = AsError(errors.New("disk on fire"))
	if got.Code != CodeInternal || got.Message != "disk on fire" || !got.Retryable {
		t.Fatalf("got %+v", got)
	}
	// Decode errors map to their sentinel's code.
	de := new(Publish).Decode([]byte{1})
	if got := AsError(de); got.Code != CodeMalformedFrame {
		t.Fatalf("got %+v", got)
	}
}

func TestErrorFrameFillsName(t *testing.T) {
	t.Parallel()
	body, _ := (&Error{Code: CodeRateLimited, Retryable: true, RetryAfter: time.Second}).Encode(nil)
	var e Error
	if err := e.Decode(body); err != nil {
		t.Fatal(err)
	}
	if e.Name != "RATE_LIMITED" || e.RetryAfter != time.Second {
		t.Fatalf("got %+v", e)
	}
	ended := &SubscriptionEnded{Code: CodeSubNotFound, Message: "cancelled"}
	if err := ended.Err(); !errors.Is(err, ErrSubscriptionNotFound) || err.Message != "cancelled" {
		t.Fatalf("got %v", err)
	}
}
