package main

import (
	"bytes"
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
