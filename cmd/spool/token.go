package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spoolmq/spool/internal/auth"
)

func init() {
	addCommand(command{name: "token", summary: "token hash: print the hash of a token read from stdin, for auth.principals", run: tokenCmd})
}

// tokenUsage is the help of spool token.
const tokenUsage = `Usage: spool token hash < token-file

Reads a token (its first line) from stdin and prints its hash, the token_hash of a principal in
the auth section of the configuration file. The token itself is not stored: clients send it
(Hello token, text AUTH <token>, HTTP Authorization: Bearer <token>). Use a random token of at
least 16 characters.

Examples:
  openssl rand -hex 32 > token-file
  spool token hash < token-file
`

func tokenCmd(_ context.Context, args []string) error {
	return tokenRun(args, os.Stdin, os.Stdout, os.Stderr)
}

// tokenRun is spool token with its streams.
func tokenRun(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprint(stdout, tokenUsage)
		return flag.ErrHelp
	}
	if len(args) != 1 || args[0] != "hash" {
		fmt.Fprint(stderr, tokenUsage)
		return &usageError{msg: fmt.Sprintf("token: want \"hash\", got %q", args)} // usage printed
	}
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("token hash: reading stdin: %w", err)
	}
	token := strings.TrimRight(line, "\r\n")
	if token == "" {
		return errors.New("token hash: no token on stdin (spool token hash < token-file)")
	}
	if strings.TrimSpace(token) != token {
		return errors.New("token hash: the token starts or ends with spaces; clients would have to send them too")
	}
	h, err := auth.HashToken(token)
	if err != nil {
		return fmt.Errorf("token hash: %w", err)
	}
	_, err = fmt.Fprintln(stdout, h)
	return err
}
