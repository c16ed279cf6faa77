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
	addCommand(command{name: "data", summary: "verify a data directory, truncate a damaged partition (broker stopped)",
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
		{"truncate", "cut a damaged partition's log at its first damage", runDataTruncate},
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
		if r.DLQ != 0 {
			// The broker refuses to start with it; without it, it starts without that DLQ's entries.
			fmt.Fprintf(e.stdout, "  a DLQ log cannot be truncated; moving %s out of the data directory lets the broker start without that DLQ's entries\n", r.Dir)
			continue
		}
		if r.Topic == "" {
			fmt.Fprintf(e.stdout, "  the state log cannot be truncated with spool data truncate\n")
			continue
		}
		fmt.Fprintf(e.stdout, "  truncating gives up %s\n", givenUp(r.Damage))
		fmt.Fprintf(e.stdout, "  spool data truncate --data-dir %s --topic %s --partition %d --yes\n", *dir, r.Topic, r.Partition)
	}
	fmt.Fprintf(e.stdout, "%d logs verified, %d damaged\n", len(reports), damaged)
	if damaged > 0 {
		return fmt.Errorf("data verify: %d of %d logs damaged", damaged, len(reports))
	}
	return nil
}

// givenUp says what cutting a log at d gives up.
func givenUp(d *wlog.Damage) string {
	var b strings.Builder
	if d.End < 0 {
		fmt.Fprintf(&b, "the messages from offset %d on (at least 1; the damage hides where the log ended)", d.Index)
	} else {
		fmt.Fprintf(&b, "%d messages, offsets %d to %d", d.End-d.Index, d.Index, d.End-1)
	}
	fmt.Fprintf(&b, ", %d bytes", d.Bytes)
	if n := len(d.Removed()); n > 0 {
		fmt.Fprintf(&b, ", and %d later segment files", n)
	}
	return b.String()
}

var dataTruncateSpec = cmdSpec{
	name: "data truncate",
	args: "[flags] --topic T --partition P",
	desc: `Cuts the log of one partition at its first damaged record, so that the broker serves the
partition again with the messages before it. Prints exactly what is given up (offsets, messages,
bytes); without --yes it changes nothing. Subscription positions above the new end are moved back
to it when the broker starts; messages published afterwards reuse the offsets given up.`,
	examples: []string{
		"spool data truncate --data-dir /var/lib/spool --topic orders --partition 3",
		"spool data truncate --data-dir /var/lib/spool --topic orders --partition 3 --yes",
	},
}

func runDataTruncate(_ context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(dataTruncateSpec)
	dir := fs.String("data-dir", config.Defaults().DataDir, "directory of the embedded engine")
	topic := fs.String("topic", "", "topic of the damaged partition (required)")
	part := fs.Int("partition", -1, "the damaged partition (required)")
	yes := fs.Bool("yes", false, "cut the log (without it, only print what would be given up)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 0, 0, ""); err != nil {
		return err
	}
	if *topic == "" || *part < 0 {
		return usagef(fs, "data truncate: --topic and --partition are required")
	}
	d, err := wal.TruncatePartition(*dir, *topic, *part, *yes)
	if err != nil {
		return fmt.Errorf("data truncate: %w", err)
	}
	name := fmt.Sprintf("topic %q partition %d", *topic, *part)
	if d == nil {
		fmt.Fprintf(e.stdout, "%s: no damage, nothing to do\n", name)
		return nil
	}
	fmt.Fprintf(e.stdout, "%s: damaged in file %s at byte %d: %s\n", name, d.Err.Path, d.Err.Offset, d.Err.Reason)
	if !*yes {
		fmt.Fprintf(e.stdout, "truncating would give up %s\n", givenUp(d))
		return errors.New("data truncate: nothing changed: run again with --yes to truncate")
	}
	fmt.Fprintf(e.stdout, "truncated at offset %d: gave up %s\n", d.Index, givenUp(d))
	return nil
}
