package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
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
	args: "[flags] <topic> <group> | --all <topic>",
	desc: `Completes, for one group (or with --all every group of the topic: ACTIVE, PAUSED and DEAD, not
CANCELLED), every message published more than --older-than ago that the group has not completed
(never delivered, leased or waiting for redelivery), so retention can remove them. Work a live
consumer still does on them is lost to the group: use it for a group that will never process
them. Dead-lettered messages stay in the DLQ. Prints how many were completed (per group with
--all). ORDERED groups are refused (skipped with --all): their acks are fenced by partition
ownership, which an admin does not hold; remove such a group, or resurrect a DEAD one without
backfill, to give up its backlog.`,
	examples: []string{
		"spool group force-complete orders.created billing --older-than 24h",
		"spool group force-complete --all orders.created --older-than 168h",
	},
}

func runGroupForceComplete(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(groupForceCompleteSpec)
	httpAddr := e.httpFlag(fs)
	olderThan := fs.Duration("older-than", 0, "complete messages published more than this ago (required, at least 1s)")
	limit := fs.Int("limit", 0, "the most messages one call completes, over all groups with --all (default 100000, at most 1000000)")
	all := fs.Bool("all", false, "every group of the topic (give the topic only)")
	jsonOut := fs.Bool("json", false, "print the API's JSON answer")
	pos, api, err := e.adminArgs(fs, httpAddr, args, 1, 2, "<topic> <group>")
	if err != nil {
		return err
	}
	switch {
	case *all && len(pos) != 1:
		return usagef(fs, "--all takes the topic only, got %d arguments", len(pos))
	case !*all && len(pos) != 2:
		return usagef(fs, "give <topic> <group>, or --all <topic>")
	case *olderThan <= 0:
		return usagef(fs, "--older-than is required")
	}
	if *all {
		r, err := api.ForceCompleteTopic(ctx, pos[0], *olderThan, *limit)
		if err != nil {
			return err
		}
		if *jsonOut {
			return cli.NewJSONLines(e.stdout).Write(r)
		}
		tab := cli.NewTable("GROUP", "COMPLETED", "ALREADY-DONE", "NOTE")
		ordered := false
		for _, g := range r.Groups {
			note := "-"
			switch {
			case strings.HasPrefix(g.Skipped, "ORDERED"):
				note, ordered = "skipped: ORDERED", true
			case g.Skipped != "":
				note = "skipped: limit reached"
			case g.Truncated:
				note = "stopped at the limit"
			}
			tab.Row(g.Group, strconv.Itoa(g.Completed), strconv.Itoa(g.AlreadyDone), note)
		}
		if err := tab.Write(e.stdout); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "topic %s: %d messages published before %s completed over %d groups\n",
			r.Topic, r.Completed, cli.Time(r.Before, e.loc), len(r.Groups))
		if ordered {
			fmt.Fprintln(e.stderr, "ORDERED groups are not force-completed: their acks are fenced by partition ownership, which an admin does not hold")
		}
		if r.Truncated {
			fmt.Fprintln(e.stderr, "stopped at the limit: run it again for the rest")
		}
		return nil
	}
	r, err := api.ForceCompleteGroup(ctx, pos[0], pos[1], *olderThan, *limit)
	if err != nil {
		return err
	}
	if *jsonOut {
		return cli.NewJSONLines(e.stdout).Write(r)
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
