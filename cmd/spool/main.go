// Command spool is the Spool message broker and its command-line client.
//
//	spool serve [flags]            run the broker (TCP 9092, HTTP 8080, data in ./spool-data)
//	spool pub|sub ...              publish and consume over the binary protocol
//	spool topic|group|dlq ...      administer over the HTTP API
//	spool bench ...                measure throughput and end-to-end latency
//	spool data verify|truncate     check a data directory, cut a damaged partition (broker stopped)
//	spool completion bash|zsh|fish print a shell completion script
//	spool --version                print the version (stamped with -ldflags "-X main.version=...")
//
// Each subcommand lives in its own file and registers itself with addCommand from an init
// function, so adding one does not touch this file. "spool help" lists them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
)

// command is one subcommand.
type command struct {
	// name is the word after spool.
	name string
	// summary is its line in the usage text.
	summary string
	// run runs it with the arguments after its name. ctx is cancelled on SIGINT or SIGTERM. An
	// error wrapping flag.ErrHelp exits with status 0 (the flag package printed the help), a
	// *usageError with status 2 (see exitCode).
	run func(ctx context.Context, args []string) error
}

// commands are the registered subcommands.
var commands []command

// addCommand registers a subcommand; call it from an init function.
func addCommand(c command) {
	commands = append(commands, c)
}

func init() {
	addCommand(command{name: "serve", summary: "run the broker (embedded engine; data in ./spool-data)", run: serve})
}

func usage(w io.Writer) {
	cmds := slices.Clone(commands)
	slices.SortFunc(cmds, func(a, b command) int { return strings.Compare(a.name, b.name) })
	fmt.Fprint(w, "Usage: spool <command> [flags]\n\nCommands:\n")
	for _, c := range cmds {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, "\nRun \"spool <command> -h\" for the flags of a command, \"spool --version\" for the version.\n")
}

func main() {
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(2)
	}
	name, args := os.Args[1], os.Args[2:]
	switch name {
	case "help", "-h", "--help":
		usage(os.Stdout)
		return
	case "version", "--version":
		fmt.Println(versionLine())
		return
	case "__complete": // the shell completion scripts' helper (spool completion)
		completeMain(args)
		return
	}
	i := slices.IndexFunc(commands, func(c command) bool { return c.name == name })
	if i < 0 {
		fmt.Fprintf(os.Stderr, "spool: unknown command %q\n\n", name)
		usage(os.Stderr)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := commands[i].run(ctx, args)
	stop()
	if code := exitCode(err, os.Stderr); code != 0 {
		os.Exit(code)
	}
}

// exitCode prints a command's error on stderr (errorText) and returns the exit status: 0 without
// one (also -h), 2 for a *usageError (a bad flag or argument), 1 otherwise: the client commands'
// through runCLI, serve, migrate, bench and token's through main.
func exitCode(err error, stderr io.Writer) int {
	var ue *usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		ue.report(stderr)
		return 2
	}
	fmt.Fprintf(stderr, "spool: %s\n", errorText(err))
	return 1
}
