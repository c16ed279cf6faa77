package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spoolmq/spool/internal/auth"
)

func TestTokenHash(t *testing.T) {
	t.Parallel()
	const tok = "0123456789abcdef0123"
	var out, errOut bytes.Buffer
	if err := tokenRun([]string{"hash"}, strings.NewReader(tok+"\n"), &out, &errOut); err != nil {
		t.Fatal(err)
	}
	h := strings.TrimSpace(out.String())
	if !auth.CheckToken(h, tok) {
		t.Fatalf("printed %q, which does not check %q", h, tok)
	}
	if strings.Contains(out.String(), tok) {
		t.Error("the token itself was printed")
	}
	for _, c := range []struct{ in, want string }{
		{"", "no token"},
		{"short\n", "too short"},
		{" " + tok + "\n", "spaces"},
	} {
		if err := tokenRun([]string{"hash"}, strings.NewReader(c.in), &out, &errOut); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("stdin %q: %v, want %q", c.in, err, c.want)
		}
	}
	if err := tokenRun([]string{"make"}, strings.NewReader(tok), &out, &errOut); err == nil {
		t.Error("spool token make accepted")
	}
}

// TestReadTokenFileEmpty: a --token-file with nothing on its first line is refused before any
// request (it used to send no token, and the broker answered NOT_AUTHENTICATED).
func TestReadTokenFileEmpty(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for i, data := range []string{"", "\n", " \r\ntoken-on-line-two\n"} {
		path := filepath.Join(dir, fmt.Sprintf("empty%d", i))
		writeFile(t, path, []byte(data))
		if tok, err := readTokenFile(path); !errors.Is(err, errEmptyTokenFile) {
			t.Errorf("%q: %q, %v; want errEmptyTokenFile", data, tok, err)
		}
	}
	path := filepath.Join(dir, "good")
	writeFile(t, path, []byte("0123456789abcdef\r\n"))
	if tok, err := readTokenFile(path); err != nil || tok != "0123456789abcdef" {
		t.Errorf("good file: %q, %v", tok, err)
	}
	// Through a command: refused with the message, no request made (nothing listens there).
	var out, errb bytes.Buffer
	e := &cliEnv{stdin: strings.NewReader(""), stdout: &out, stderr: &errb}
	code := runCLI(context.Background(), e, runTopic, []string{"list", "--http", "127.0.0.1:1", "--token-file", filepath.Join(dir, "empty0")})
	if code == 0 || !strings.Contains(errb.String(), "the first line holds no token") {
		t.Errorf("spool topic list with an empty --token-file: exit %d: %s", code, errb.String())
	}
}
