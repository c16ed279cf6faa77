package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"time"

	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/cli"
	"github.com/spoolmq/spool/internal/storage"
)

// fromHelp describes --from of group create and update: the syntax of spool sub's --from.
const fromHelp = "where the group starts (as spool sub --from): " + fromForms

var groupCreateSpec = cmdSpec{
	name: "group create",
	args: "[flags] <topic> <group>",
	desc: `Creates a consumer group on an existing PUB_SUB topic ahead of its consumers: messages from its
start position on are kept for it, and its consumers continue from there when they subscribe
(spool sub --group). A group without a live consumer for its heartbeat timeout becomes DEAD and
stops holding retention; a consumer subscribing makes it ACTIVE again. Its start position can be
changed with spool group update until it delivered something. The messages before now it gets
(its backfill, see group backfill) are bounded by --max-backfill-messages: the newest are kept.
With --ordered the group is an ordered one (its consumers subscribe with spool sub --ordered):
--strategy and --max-in-flight-per-partition set how its partitions are assigned and how many
messages of a partition are unsettled at a time (1 by default: strict order, one at a time).`,
	examples: []string{
		"spool group create orders.created shipping",
		"spool group create --ordered --strategy sticky --max-in-flight-per-partition 8 orders.created ledger",
		"spool group create --from beginning --heartbeat-timeout 10m --max-backfill-messages 100000 orders.created audit",
		"spool group create --from 2025-01-02T15:04:05Z orders.created replay",
	},
}

var groupUpdateSpec = cmdSpec{
	name: "group update",
	args: "[flags] <topic> <group>",
	desc: `Changes a consumer group's start position (--from: only while it has delivered nothing, else
INVALID_TRANSITION and nothing changes) or its heartbeat timeout.`,
	examples: []string{
		"spool group update --from beginning orders.created shipping   # nothing delivered yet",
		"spool group update --heartbeat-timeout 30m orders.created billing",
	},
}

// groupWriteFlags are the flags of group create and update.
type groupWriteFlags struct {
	from        *string
	timeout     cli.DurationValue
	maxBackfill *int64
	// create only: an ordered group and its settings
	ordered      *bool
	strategy     *string
	perPartition *int
}

func addGroupWriteFlags(fs *flag.FlagSet, create bool) *groupWriteFlags {
	g := &groupWriteFlags{}
	def := ""
	if create {
		def = " (default now)"
	}
	g.from = fs.String("from", "", fromHelp+def)
	fs.Var(&g.timeout, "heartbeat-timeout", "how long the group may have no live consumer before it becomes DEAD, 5s to 168h (default 5m)")
	if create {
		g.maxBackfill = fs.Int64("max-backfill-messages", 0,
			"bound of the group's backfill (messages before now it gets, and what it missed while DEAD): the newest are kept; 0: 1000000, -1: none")
		g.ordered = fs.Bool("ordered", false, "an ordered group: each partition owned by one consumer at a time, in offset order (its consumers subscribe with spool sub --ordered)")
		g.strategy = fs.String("strategy", "", "ordered groups: how partitions are assigned to consumers, round-robin (default) or sticky")
		g.perPartition = fs.Int("max-in-flight-per-partition", 0, "ordered groups: messages of one partition unsettled at a time, 1 to 1000 (default 1)")
	}
	return g
}

// body returns the API fields of the flags given.
func (g *groupWriteFlags) body(fs *flag.FlagSet) (map[string]any, error) {
	out := map[string]any{}
	var err error
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "from":
			var sp storage.StartPosition
			if sp, err = parseGroupStart(*g.from); err == nil {
				out["start"] = sp
			}
		case "heartbeat-timeout":
			out["heartbeat_timeout"] = g.timeout.D.String()
		case "max-backfill-messages":
			out["max_backfill_messages"] = *g.maxBackfill
		case "ordered":
			if *g.ordered {
				out["mode"] = "ordered"
			}
		case "strategy":
			out["strategy"] = *g.strategy
		case "max-in-flight-per-partition":
			out["max_in_flight_per_partition"] = *g.perPartition
		}
	})
	return out, err
}

func runGroupCreate(ctx context.Context, e *cliEnv, args []string) error {
	return runGroupWrite(ctx, e, args, groupCreateSpec, true)
}

func runGroupUpdate(ctx context.Context, e *cliEnv, args []string) error {
	return runGroupWrite(ctx, e, args, groupUpdateSpec, false)
}

func runGroupWrite(ctx context.Context, e *cliEnv, args []string, spec cmdSpec, create bool) error {
	fs := e.flagSet(spec)
	httpAddr := e.httpFlag(fs)
	jsonOut := fs.Bool("json", false, "print the API's JSON answer (the group)")
	flags := addGroupWriteFlags(fs, create)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 2, 2, "<topic> <group>"); err != nil {
		return err
	}
	body, err := flags.body(fs)
	if err != nil {
		return err
	}
	if !create && len(body) == 0 {
		return usagef(fs, "%s: nothing to change: give --from or --heartbeat-timeout", fs.Name())
	}
	api, err := e.admin(fs, *httpAddr)
	if err != nil {
		return err
	}
	method, path, verb := http.MethodPut, cli.GroupPath(pos[0], pos[1], "config"), "updated"
	if create {
		body["group"] = pos[1]
		method, path, verb = http.MethodPost, cli.TopicPath(pos[0], "groups"), "created"
	}
	var g admin.Group
	raw, err := api.Call(ctx, method, path, nil, body, &g)
	if err != nil {
		return err
	}
	if *jsonOut {
		return writeRaw(e, raw)
	}
	fmt.Fprintf(e.stdout, "%s group %s on topic %s: %s, start %s, heartbeat timeout %s\n", verb, g.Group, g.Topic, g.State,
		startText(g.Start, e), cli.Duration(time.Duration(g.HeartbeatTimeout)))
	return nil
}
