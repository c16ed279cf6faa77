package protocol

import (
	"bytes"
	"errors"
	"io"
	"net"
	"reflect"
	"testing"
	"time"
)

func TestNegotiateVersion(t *testing.T) {
	t.Parallel()
	if v, err := NegotiateVersion(1, 6); err != nil || v != MaxVersion {
		t.Fatalf("got %d, %v", v, err)
	}
	// Version 1 (the pre-release layout) is no longer spoken.
	for _, r := range [][2]uint16{{MaxVersion + 1, 5}, {0, 0}, {3, 1}, {1, 1}} {
		if _, err := NegotiateVersion(r[0], r[1]); !errors.Is(err, ErrUnsupportedVersion) {
			t.Fatalf("%v: want UNSUPPORTED_VERSION, got %v", r, err)
		}
	}
}

// scriptedServer reads the client's preamble and Hello, then writes the given bytes and closes.
func scriptedServer(t *testing.T, reply func(hello *Hello) []byte) (*Reader, *Writer) {
	t.Helper()
	c, s := net.Pipe()
	t.Cleanup(func() { c.Close() })
	go func() {
		defer s.Close()
		r := NewReader(s, 0)
		if err := r.ReadPreamble(); err != nil {
			t.Error(err)
			return
		}
		corr, m, err := r.ReadClientMessage()
		if err != nil || corr != 1 {
			t.Errorf("server: %d %v", corr, err)
			return
		}
		_, _ = s.Write(reply(m.(*Hello)))
	}()
	return NewReader(c, 0), NewWriter(c, 0)
}

func frameBytes(t *testing.T, pre bool, corr uint32, m Message) []byte {
	t.Helper()
	var b []byte
	if pre {
		b = append(b, Preamble[:]...)
	}
	b, err := AppendFrame(b, corr, m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestClientHandshake(t *testing.T) {
	t.Parallel()
	okMsg := &HelloOK{Version: MaxVersion, ServerName: "s", HeartbeatInterval: 10 * time.Second, SessionTimeout: 30 * time.Second,
		MaxFrameSize: 2 << 20, MaxMessageSize: 1 << 20}
	t.Run("ok", func(t *testing.T) {
		t.Parallel()
		var sent *Hello
		r, w := scriptedServer(t, func(h *Hello) []byte { sent = h; return frameBytes(t, true, 1, okMsg) })
		got, err := ClientHandshake(r, w, &Hello{ClientName: "c"})
		if err != nil || !reflect.DeepEqual(got, okMsg) {
			t.Fatalf("%+v %v", got, err)
		}
		if sent.MinVersion != MinVersion || sent.MaxVersion != MaxVersion || sent.ClientName != "c" {
			t.Fatalf("sent %+v", sent)
		}
		if r.MaxFrameSize() != 2<<20 || w.MaxFrameSize() != 2<<20 {
			t.Fatal("max frame size not applied")
		}
	})
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		r, w := scriptedServer(t, func(*Hello) []byte { return frameBytes(t, true, 1, ErrNotAuthenticated.WithMessage("bad token")) })
		_, err := ClientHandshake(r, w, &Hello{})
		var e *Error
		if !errors.As(err, &e) || !errors.Is(err, ErrNotAuthenticated) || e.Message != "bad token" {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("bad max frame", func(t *testing.T) {
		t.Parallel()
		bad := *okMsg
		bad.MaxFrameSize = 100
		r, w := scriptedServer(t, func(*Hello) []byte { return frameBytes(t, true, 1, &bad) })
		if _, err := ClientHandshake(r, w, &Hello{}); !errors.Is(err, ErrMalformedFrame) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("not a spool server", func(t *testing.T) {
		t.Parallel()
		r, w := scriptedServer(t, func(*Hello) []byte { return []byte("HTTP/1.1 400 Bad Request\r\n\r\n") })
		if _, err := ClientHandshake(r, w, &Hello{}); !errors.Is(err, ErrMalformedFrame) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("closed", func(t *testing.T) {
		t.Parallel()
		r, w := scriptedServer(t, func(*Hello) []byte { return Preamble[:] })
		if _, err := ClientHandshake(r, w, &Hello{}); !errors.Is(err, io.EOF) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("wrong frame", func(t *testing.T) {
		t.Parallel()
		r, w := scriptedServer(t, func(*Hello) []byte { return frameBytes(t, true, 0, &Deliver{}) })
		if _, err := ClientHandshake(r, w, &Hello{}); !errors.Is(err, ErrUnexpectedFrame) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("write fails", func(t *testing.T) {
		t.Parallel()
		_, err := ClientHandshake(NewReader(bytes.NewReader(nil), 0), NewWriter(&failingWriter{}, 0), &Hello{})
		if err == nil {
			t.Fatal("want an error")
		}
	})
}
