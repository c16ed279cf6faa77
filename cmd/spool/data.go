package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spoolmq/spool/internal/config"
	"github.com/spoolmq/spool/internal/storage/wal"
	"github.com/spoolmq/spool/internal/storage/wal/wlog"
)

func init() {
	addCommand(command{name: "data", summary: "verify a data directory, truncate a damaged partition or DLQ log (broker stopped)",
		run: func(ctx context.Context, args []string) error {
			if code := runCLI(ctx, osEnv(), runData, args); code != 0 {
				os.Exit(code)
			}
			return nil
		}})
}

func runData(ctx context.Context, e *cliEnv, args []string) error {
	return dispatch(ctx, e, "data", "Checks and repairs the data directory of the embedded engine. The broker must be stopped: the\ncommands refuse to run while it holds the directory's LOCK.", []subcommand{
		{"verify", "read every record of every log and report damage", runDataVerify},
		{"truncate", "cut a damaged partition's or DLQ's log at its first damage", runDataTruncate},
	}, args)
}

var dataVerifySpec = cmdSpec{
	name: "data verify",
	args: "[flags]",
	desc: `Reads every record of the state log, of every partition log and of every DLQ log in
--data-dir and checks its checksum. For each damaged log it prints the file and byte offset of the first damage and what
"spool data truncate" would give up. Exits with status 1 when a log is damaged. Opening a log
applies the recovery the broker does at start (a torn tail is cleared); nothing else is changed.`,
	examples: []string{"spool data verify --data-dir /var/lib/spool"},
}

func runDataVerify(_ context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(dataVerifySpec)
	dir := fs.String("data-dir", config.Defaults().DataDir, "directory of the embedded engine")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 0, 0, ""); err != nil {
		return err
	}
	reports, err := wal.VerifyDir(*dir)
	if err != nil {
		return fmt.Errorf("data verify: %w", err)
	}
	damaged := 0
	for _, r := range reports {
		name := "state log"
		switch {
		case r.Topic != "":
			name = fmt.Sprintf("topic %q partition %d", r.Topic, r.Partition)
		case r.DLQ != 0:
			name = fmt.Sprintf("DLQ log of subscription %d", r.DLQ)
		}
		if r.Damage == nil {
			fmt.Fprintf(e.stdout, "%s: ok\n", name)
			continue
		}
		damaged++
		fmt.Fprintf(e.stdout, "%s: DAMAGED in file %s at byte %d: %s\n", name, r.Damage.Err.Path, r.Damage.Err.Offset, r.Damage.Err.Reason)
		if r.Topic == "" && r.DLQ == 0 {
			fmt.Fprintf(e.stdout, "  the state log cannot be truncated with spool data truncate\n")
			continue
		}
		fmt.Fprintf(e.stdout, "  truncating gives up %s\n", givenUp(r.Damage, r.DLQ != 0))
		if r.DLQ != 0 {
			// A damaged DLQ log fails that DLQ's reads, and the broker's start when Open meets it.
			fmt.Fprintf(e.stdout, "  spool data truncate --data-dir %s --dlq %d --yes\n", *dir, r.DLQ)
			continue
		}
		fmt.Fprintf(e.stdout, "  spool data truncate --data-dir %s --topic %s --partition %d --yes\n", *dir, r.Topic, r.Partition)
	}
	fmt.Fprintf(e.stdout, "%d logs verified, %d damaged\n", len(reports), damaged)
	if damaged > 0 {
		return fmt.Errorf("data verify: %d of %d logs damaged", damaged, len(reports))
	}
	return nil
}

// givenUp says what cutting a log at d gives up: messages by offset in a partition's log, entries
// by ID in a DLQ log (dlq; an entry's ID is its record's index plus one).
func givenUp(d *wlog.Damage, dlq bool) string {
	var b strings.Builder
	what, pos, shift := "messages", "offset", int64(0)
	if dlq {
		what, pos, shift = "DLQ entries", "ID", 1
	}
	if d.End < 0 {
		fmt.Fprintf(&b, "the %s from %s %d on (at least 1; the damage hides where the log ended)", what, pos, d.Index+shift)
	} else {
		fmt.Fprintf(&b, "%d %s, %ss %d to %d", d.End-d.Index, what, pos, d.Index+shift, d.End-1+shift)
	}
	fmt.Fprintf(&b, ", %d bytes", d.Bytes)
	if n := len(d.Removed()); n > 0 {
		fmt.Fprintf(&b, ", and %d later segment files", n)
	}
	return b.String()
}

var dataTruncateSpec = cmdSpec{
	name: "data truncate",
	args: "[flags] (--topic T --partition P | --dlq SUBSCRIPTION-ID)",
	desc: `Cuts the log of one partition at its first damaged record, so that the broker serves the
partition again with the messages before it. Prints exactly what is given up (offsets, messages,
bytes); without --yes it changes nothing but the recovery the broker does at start (opening the
log clears a torn tail, as verify does). Subscription positions above the new end are moved back
to it when the broker starts; messages published afterwards reuse the offsets given up.

With --dlq it cuts the DLQ log of that subscription (spool data verify names it) the same way. A
damaged DLQ log fails the reads of that DLQ (list, replay), and the broker's start when the damage
is in what opening reads (a segment's header); after the cut the DLQ keeps the entries before the
damage, and the entries given up (IDs) leave it, replays of them included.`,
	examples: []string{
		"spool data truncate --data-dir /var/lib/spool --topic orders --partition 3",
		"spool data truncate --data-dir /var/lib/spool --topic orders --partition 3 --yes",
		"spool data truncate --data-dir /var/lib/spool --dlq 42 --yes",
	},
}

func runDataTruncate(_ context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(dataTruncateSpec)
	dir := fs.String("data-dir", config.Defaults().DataDir, "directory of the embedded engine")
	topic := fs.String("topic", "", "topic of the damaged partition")
	part := fs.Int("partition", -1, "the damaged partition")
	dlq := fs.Int64("dlq", 0, "ID of the subscription whose DLQ log is damaged (instead of --topic and --partition)")
	yes := fs.Bool("yes", false, "cut the log (without it, only print what would be given up)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 0, 0, ""); err != nil {
		return err
	}
	var name string
	var d *wlog.Damage
	switch {
	case *dlq != 0 && (*topic != "" || *part >= 0):
		return usagef(fs, "data truncate: --dlq cuts a DLQ log, --topic and --partition a partition's: give one or the other")
	case *dlq < 0:
		return usagef(fs, "data truncate: --dlq must be a subscription ID (above 0), got %d", *dlq)
	case *dlq > 0:
		name = fmt.Sprintf("DLQ log of subscription %d", *dlq)
		d, err = wal.TruncateDLQ(*dir, *dlq, *yes)
	case *topic == "" || *part < 0:
		return usagef(fs, "data truncate: --topic and --partition are required (or --dlq for a DLQ log)")
	default:
		name = fmt.Sprintf("topic %q partition %d", *topic, *part)
		d, err = wal.TruncatePartition(*dir, *topic, *part, *yes)
	}
	if err != nil {
		return fmt.Errorf("data truncate: %w", err)
	}
	if d == nil {
		fmt.Fprintf(e.stdout, "%s: no damage, nothing to do\n", name)
		return nil
	}
	fmt.Fprintf(e.stdout, "%s: damaged in file %s at byte %d: %s\n", name, d.Err.Path, d.Err.Offset, d.Err.Reason)
	if !*yes {
		fmt.Fprintf(e.stdout, "truncating would give up %s\n", givenUp(d, *dlq > 0))
		return errors.New("data truncate: nothing changed: run again with --yes to truncate")
	}
	at := fmt.Sprintf("offset %d", d.Index)
	if *dlq > 0 {
		at = fmt.Sprintf("DLQ entry ID %d", d.Index+1)
	}
	fmt.Fprintf(e.stdout, "truncated at %s: gave up %s\n", at, givenUp(d, *dlq > 0))
	return nil
}
