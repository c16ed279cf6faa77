package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/cli"
	"github.com/spoolmq/spool/internal/storage"
)

var groupBackfillSpec = cmdSpec{
	name: "group backfill",
	args: "[flags] status|cancel|resume <topic> <group>",
	desc: `Shows or steers a group's backfill: the messages from its start (or, after it was DEAD, from
where it stopped) up to the log end when it was created or resurrected, bounded to its newest
max_backfill_messages (group create --max-backfill-messages; default 1,000,000). The broker
delivers them at an adaptive rate (at most 50,000 msg/s, slower while its claims' p95 latency is
above 10 ms); newer messages are not slowed down. status prints state (NOT_STARTED, IN_PROGRESS,
COMPLETED, CANCELLED, FAILED), processed/total, skipped, rate and ETA; --watch redraws a progress
bar until the backfill is no longer IN_PROGRESS. cancel stops it: the rest is held back (nothing
of it is delivered) until resume, or given up at once with --skip (counted in
spool_backfill_missed_messages_total). resume continues where it stopped.`,
	examples: []string{
		"spool group backfill status orders.created billing",
		"spool group backfill status --watch orders.created billing",
		"spool group backfill cancel orders.created billing",
		"spool group backfill resume orders.created billing",
	},
}

// backfillFlagUse says which use of group backfill each of its own flags is for.
var backfillFlagUse = map[string]string{
	"skip":     "cancel only",
	"watch":    "status only",
	"interval": "status --watch only",
	"json":     "not with --watch",
}

func runGroupBackfill(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(groupBackfillSpec)
	httpAddr := e.httpFlag(fs)
	jsonOut := fs.Bool("json", false, "print the API's JSON answer")
	watch := fs.Bool("watch", false, "status: redraw a progress bar until the backfill is no longer IN_PROGRESS")
	every := fs.Duration("interval", time.Second, "status --watch: time between two redraws")
	skip := fs.Bool("skip", false, "cancel: give the rest of the range up instead of holding it back")
	pos, api, err := e.adminArgs(fs, httpAddr, args, 3, 3, "status|cancel|resume <topic> <group>")
	if err != nil {
		return err
	}
	action, topic, group := pos[0], pos[1], pos[2]
	switch {
	case action != "status" && action != "cancel" && action != "resume":
		return usagef(fs, "unknown backfill command %q: want status, cancel or resume", action)
	case *every <= 0:
		return usagef(fs, "--interval must be positive, got %s", *every)
	}
	// A flag of another action would be parsed and ignored: refuse it.
	var misfit error
	fs.Visit(func(f *flag.Flag) {
		var fits bool
		what := "backfill " + action
		switch f.Name {
		case "skip":
			fits = action == "cancel"
		case "watch":
			fits = action == "status"
		case "interval":
			fits = action == "status" && *watch
		case "json":
			fits, what = !*watch, what+" --watch"
		default:
			return
		}
		if !fits && misfit == nil {
			misfit = usagef(fs, "--%s does not apply to %s (%s)", f.Name, what, backfillFlagUse[f.Name])
		}
	})
	if misfit != nil {
		return misfit
	}
	path := cli.GroupPath(topic, group, "backfill")
	var info broker.BackfillInfo
	var raw []byte
	switch action {
	case "status":
		raw, err = api.Call(ctx, http.MethodGet, path, nil, nil, &info)
	case "cancel":
		raw, err = api.Call(ctx, http.MethodPost, path+"/cancel", nil, map[string]any{"skip": *skip}, &info)
	case "resume":
		raw, err = api.Call(ctx, http.MethodPost, path+"/resume", nil, nil, &info)
	}
	if err != nil {
		return err
	}
	if *jsonOut && !*watch {
		_, err := e.stdout.Write(append(raw, '\n'))
		return err
	}
	if !*watch || action != "status" {
		fmt.Fprintf(e.stdout, "group %s on topic %s: backfill %s\n", group, topic, backfillLine(&info))
		return nil
	}
	// --watch: one line rewritten in place until the backfill is no longer IN_PROGRESS.
	t := time.NewTicker(*every)
	defer t.Stop()
	for {
		fmt.Fprintf(e.stdout, "\r\x1b[K%s %s", progressBar(info.Processed, info.Total, 30), backfillLine(&info))
		if info.State != storage.BackfillInProgress {
			fmt.Fprintln(e.stdout)
			return nil
		}
		select {
		case <-ctx.Done():
			fmt.Fprintln(e.stdout)
			return nil
		case <-t.C:
		}
		info = broker.BackfillInfo{}
		if _, err := api.Call(ctx, http.MethodGet, path, nil, nil, &info); err != nil {
			fmt.Fprintln(e.stdout)
			return err
		}
	}
}

// backfillLine describes a backfill on one line.
func backfillLine(b *broker.BackfillInfo) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s %d/%d", b.State, b.Processed, b.Total)
	if b.Skipped > 0 {
		fmt.Fprintf(&sb, ", %d skipped", b.Skipped)
	}
	if b.Rate > 0 {
		fmt.Fprintf(&sb, ", %.0f msg/s", b.Rate)
	}
	if b.ETASeconds > 0 {
		fmt.Fprintf(&sb, ", ETA %s", (time.Duration(b.ETASeconds) * time.Second).Round(time.Second))
	}
	if b.Error != "" {
		fmt.Fprintf(&sb, ", error: %s", b.Error)
	}
	return sb.String()
}

// progressBar draws done/total as [#####.....] 50%.
func progressBar(done, total int64, width int) string {
	frac := 1.0
	if total > 0 {
		frac = min(1, float64(done)/float64(total))
	}
	n := int(frac * float64(width))
	return fmt.Sprintf("[%s%s] %3.0f%%", strings.Repeat("#", n), strings.Repeat(".", width-n), frac*100)
}
