// Command spool is the Spool message broker.
//
//	spool serve [flags]    run the broker on the embedded engine
//
// The client subcommands (pub, sub, topic, group, dlq, bench) and migrate arrive with the wire
// protocol and the PostgreSQL engine.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

const usage = `Usage: spool <command> [flags]

Commands:
  serve    run the broker (embedded engine; data in ./spool-data)

Run "spool <command> -h" for the flags of a command.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "serve":
		err = serve(ctx, args)
	case "help", "-h", "--help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "spool: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "spool:", err)
		os.Exit(1)
	}
}
