package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spoolmq/spool/internal/cli"
)

// Seed 000's manual admin operations on a group: remove, resurrect, force-complete.

var groupRemoveSpec = cmdSpec{
	name: "group remove",
	args: "[flags] <topic> <group>",
	desc: `Removes a group: cancels its subscription (its consumers are detached, it holds no retention
any more, leases on its messages are fenced) and deletes it at once, without waiting
subscription_retention. Subscribing again creates a new subscription starting at its start position.`,
	examples: []string{"spool group remove orders.created replay"},
}

func runGroupRemove(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(groupRemoveSpec)
	httpAddr := e.httpFlag(fs)
	pos, api, err := e.adminArgs(fs, httpAddr, args, 2, 2, "<topic> <group>")
	if err != nil {
		return err
	}
	if err := api.RemoveGroup(ctx, pos[0], pos[1]); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "group %s on topic %s: removed\n", pos[1], pos[0])
	return nil
}

var groupResurrectSpec = cmdSpec{
	name: "group resurrect",
	args: "[flags] <topic> <group>",
	desc: `Makes a DEAD group ACTIVE again (a consumer subscribing does the same). Other states are refused:
resume a PAUSED group. With --backfill it receives what it missed while DEAD (from where it
stopped, bounded to its newest max_backfill_messages; messages retention removed meanwhile are
gone), as a consumer subscribing does: see group backfill. Without it gives all of that up
(counted in spool_backfill_missed_messages_total) and continues with new messages.`,
	examples: []string{"spool group resurrect --backfill orders.created billing"},
}

func runGroupResurrect(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(groupResurrectSpec)
	httpAddr := e.httpFlag(fs)
	backfill := fs.Bool("backfill", false, "deliver what the group missed while DEAD, bounded (without: give it up)")
	pos, api, err := e.adminArgs(fs, httpAddr, args, 2, 2, "<topic> <group>")
	if err != nil {
		return err
	}
	g, err := api.ResurrectGroup(ctx, pos[0], pos[1], *backfill)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "group %s on topic %s: %s\n", g.Group, g.Topic, g.State)
	return nil
}

var groupForceCompleteSpec = cmdSpec{
	name: "group force-complete",
	args: "[flags] <topic> <group>",
	desc: `Completes, for one group, every message published more than --older-than ago that the group has not
completed (never delivered, leased or waiting for redelivery), so retention can remove them.
Work a live consumer still does on them is lost to the group: use it for a group that will never
process them. Dead-lettered messages stay in the DLQ. Prints how many were completed.`,
	examples: []string{"spool group force-complete orders.created billing --older-than 24h"},
}

func runGroupForceComplete(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(groupForceCompleteSpec)
	httpAddr := e.httpFlag(fs)
	olderThan := fs.Duration("older-than", 0, "complete messages published more than this ago (required, at least 1s)")
	limit := fs.Int("limit", 0, "the most messages one call completes (default 100000, at most 1000000)")
	pos, api, err := e.adminArgs(fs, httpAddr, args, 2, 2, "<topic> <group>")
	if err != nil {
		return err
	}
	if *olderThan <= 0 {
		return usagef(fs, "--older-than is required")
	}
	r, err := api.ForceCompleteGroup(ctx, pos[0], pos[1], *olderThan, *limit)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "group %s on topic %s: %d messages published before %s completed (%d already done)\n",
		r.Group, r.Topic, r.Completed, cli.Time(r.Before, e.loc), r.AlreadyDone)
	if r.Truncated {
		fmt.Fprintln(e.stderr, "stopped at the limit: run it again for the rest")
	}
	return nil
}

// since returns how long ago t was, rounded to the second ("-" for the zero time).
func since(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return cli.Duration(time.Since(t).Round(time.Second)) + " ago"
}
