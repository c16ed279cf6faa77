package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	api "github.com/spoolmq/spool/client/admin"
	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/cli"
)

const groupArgHelp = `<group> is the consumer group; "" or '$queue' (or leaving it out) names the one
subscription of a QUEUE topic.`

func runGroup(ctx context.Context, e *cliEnv, args []string) error {
	return dispatch(ctx, e, "group", "Manages consumer groups (subscriptions of groups on topics) through the HTTP admin API (--http, $"+envHTTP+").", []subcommand{
		{"list", "list subscriptions with their health", runGroupList},
		{"create", "create a group on a PUB_SUB topic ahead of its consumers", runGroupCreate},
		{"update", "change a group's start position (before it delivered anything) or heartbeat timeout", runGroupUpdate},
		{"describe", "show a subscription with its members and partitions", runGroupDescribe},
		{"pause", "pause a subscription: it receives nothing and keeps holding retention", groupOp("pause")},
		{"resume", "resume a PAUSED subscription (a DEAD one: as resurrect --backfill)", groupOp("resume")},
		{"cancel", "cancel a subscription: it releases everything (terminal)", groupOp("cancel")},
		{"remove", "cancel a group and delete it at once", runGroupRemove},
		{"resurrect", "make a DEAD group ACTIVE again", runGroupResurrect},
		{"force-complete", "complete a group's messages older than a duration (counted)", runGroupForceComplete},
		{"rebalance", "reassign an ordered group's partitions now, optionally with a new strategy", runGroupRebalance},
		{"backfill", "show (status --watch: progress bar), cancel or resume a group's backfill", runGroupBackfill},
	}, args)
}

var groupListSpec = cmdSpec{
	name: "group list",
	args: "[flags] [topic]",
	desc: `Lists subscriptions (one per consumer group and topic; "$queue" is a QUEUE topic's subscription)
with their health: state, verdict (OK, WARN, FAIL: group describe and doctor say why), members,
pending (not yet done), lag (never delivered), in flight (leased), redelivering, dead-lettered
(DLQ entries), heartbeat (when a broker last saw a member), with a topic oldest (the age of the
oldest unacked message; the all-topics listing does not read it), and backfill (its state, with
the percentage done while IN_PROGRESS; - when the group never had one). --json adds processed,
failed and filtered, counted by the broker answering since it started.`,
	examples: []string{
		"spool group list",
		"spool group list orders.created",
		"spool group list --state PAUSED --json",
	},
}

func runGroupList(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(groupListSpec)
	httpAddr := e.httpFlag(fs)
	jsonOut := fs.Bool("json", false, "print the API's JSON answer")
	group := fs.String("group", "", "only this group")
	state := fs.String("state", "", "only this state: ACTIVE, PAUSED, DEAD or CANCELLED (any case)")
	pos, api, err := e.adminArgs(fs, httpAddr, args, 0, 1, "")
	if err != nil {
		return err
	}
	switch s := strings.ToUpper(*state); s {
	case "", "ACTIVE", "PAUSED", "DEAD", "CANCELLED":
		*state = s
	default:
		return usagef(fs, "group list: --state must be ACTIVE, PAUSED, DEAD or CANCELLED, got %q", *state)
	}
	q := url.Values{}
	if *group != "" {
		q.Set("group", *group)
	}
	if *state != "" {
		q.Set("state", *state)
	}
	path := "/api/v1/groups"
	if len(pos) == 0 {
		q.Set("limit", "1000") // the largest page
	}
	if len(pos) == 1 {
		// The topic's own listing: an unknown topic is TOPIC_NOT_FOUND, not an empty list.
		path = cli.TopicPath(pos[0], "groups")
	}
	var list admin.GroupList
	raw, err := api.Call(ctx, http.MethodGet, path, q, nil, &list)
	if err != nil {
		return err
	}
	if list.NextAfterID != nil {
		// GET /api/v1/groups pages: read the rest, and print the whole list as one answer.
		for next := list.NextAfterID; next != nil; {
			q.Set("after_id", strconv.FormatInt(*next, 10))
			var page admin.GroupList
			if _, err := api.Call(ctx, http.MethodGet, path, q, nil, &page); err != nil {
				return err
			}
			list.Groups = append(list.Groups, page.Groups...)
			next = page.NextAfterID
		}
		list.NextAfterID = nil
		if raw, err = json.Marshal(list); err != nil {
			return err
		}
	}
	groups := list.Groups
	if *jsonOut {
		return writeRaw(e, raw)
	}
	if len(groups) == 0 {
		fmt.Fprintln(e.stderr, "no groups")
		return nil
	}
	return groupTable(groups, true, len(pos) == 1).Write(e.stdout)
}

// groupTable is the table of group list (withTopic) and topic describe. oldest adds the age of
// each group's oldest unacked message, which only the one-topic listing has (GET /api/v1/groups
// leaves it out: a read per partition). HEARTBEAT is how long ago a broker last saw a member of
// the group, on this machine's clock.
func groupTable(groups []admin.Group, withTopic, oldest bool) *cli.Table {
	head := []string{"GROUP", "STATE", "HEALTH", "MEMBERS", "PENDING", "LAG", "IN-FLIGHT", "REDELIVERING", "DLQ", "HEARTBEAT"}
	if oldest {
		head = append(head, "OLDEST")
	}
	head = append(head, "BACKFILL")
	if withTopic {
		head = append([]string{"TOPIC"}, head...)
	}
	tab := cli.NewTable(head...)
	now := time.Now()
	for _, g := range groups {
		row := []string{g.Group, string(g.State), g.Health, strconv.Itoa(g.MemberCount), i64(g.Pending), i64(g.Lag),
			i64(g.InFlight), i64(g.Redelivering), i64(g.DeadLettered), "-"}
		if !g.LastHeartbeatAt.IsZero() {
			row[len(row)-1] = shortAge(now.Sub(g.LastHeartbeatAt)) + " ago"
		}
		if oldest {
			age := "-" // nothing unacked
			if g.OldestUnackedAge != nil {
				age = shortAge(time.Duration(*g.OldestUnackedAge))
			}
			row = append(row, age)
		}
		row = append(row, backfillCell(g.Backfill))
		if withTopic {
			row = append([]string{g.Topic}, row...)
		}
		tab.Row(row...)
	}
	return tab
}

// shortAge is d in its largest unit, rounded down: 45s, 12m, 5h, 3d (0s when negative: clocks
// differ).
func shortAge(d time.Duration) string {
	switch {
	case d < time.Minute:
		return strconv.FormatInt(int64(max(d, 0)/time.Second), 10) + "s"
	case d < time.Hour:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	case d < 48*time.Hour:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	}
	return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
}

// backfillCell is a group's backfill state for a table: "-" when it never had one, the state
// otherwise, with the percentage done while IN_PROGRESS.
func backfillCell(b *api.BackfillInfo) string {
	if b == nil || b.State == "" || b.State == api.BackfillNotStarted {
		return "-"
	}
	if b.State == api.BackfillInProgress && b.Total > 0 {
		return fmt.Sprintf("%s:%d%%", b.State, b.Processed*100/b.Total)
	}
	return string(b.State)
}

func i64(n int64) string { return strconv.FormatInt(n, 10) }

var groupDescribeSpec = cmdSpec{
	name:     "group describe",
	args:     "[flags] <topic> [group]",
	desc:     "Shows a subscription: state, start position, health, members and per-partition positions.\n" + groupArgHelp,
	examples: []string{"spool group describe orders.created billing", "spool group describe jobs   # the QUEUE subscription"},
}

func runGroupDescribe(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(groupDescribeSpec)
	httpAddr := e.httpFlag(fs)
	jsonOut := fs.Bool("json", false, "print the API's JSON answer")
	pos, api, err := e.adminArgs(fs, httpAddr, args, 1, 2, "<topic>")
	if err != nil {
		return err
	}
	var g admin.Group
	raw, err := api.Call(ctx, http.MethodGet, cli.GroupPath(pos[0], argAt(pos, 1)), nil, nil, &g)
	if err != nil {
		return err
	}
	if *jsonOut {
		return writeRaw(e, raw)
	}
	f := &cli.Fields{}
	f.Add("Topic", g.Topic)
	f.Add("Group", g.Group)
	f.Add("Subscription", strconv.FormatInt(g.SubscriptionID, 10))
	f.Add("State", string(g.State))
	if g.Pattern != "" {
		f.Add("Pattern", g.Pattern)
	}
	f.Add("Ephemeral", strconv.FormatBool(g.Ephemeral))
	f.Add("Mode", cmpStr(g.Mode, "shared"))
	f.Add("Start", startText(g.Start, e))
	f.Add("Created", cli.Time(g.CreatedAt, e.loc))
	f.Add("Updated", cli.Time(g.UpdatedAt, e.loc))
	// Labels of at most 13 characters keep the column of the other fields.
	f.Add("Dead after", cli.Duration(time.Duration(g.HeartbeatTimeout))+" without a member (heartbeat timeout)")
	f.Add("Last seen", cli.Time(g.LastHeartbeatAt, e.loc)+" (last heartbeat)")
	f.Add("Members", strconv.Itoa(g.MemberCount))
	f.Add("Pending", i64(g.Pending))
	f.Add("Lag", i64(g.Lag))
	f.Add("In flight", i64(g.InFlight))
	f.Add("Redelivering", i64(g.Redelivering))
	f.Add("Dead-lettered", i64(g.DeadLettered))
	if g.OldestUnackedAge != nil {
		f.Add("Oldest", "unacked message "+cli.Duration(time.Duration(*g.OldestUnackedAge).Round(time.Second))+" old")
	}
	f.Add("Health", g.Health)
	for _, r := range g.Reasons {
		f.Add("Why", r)
	}
	if err := f.Write(e.stdout); err != nil {
		return err
	}
	if len(g.Members) > 0 {
		fmt.Fprintln(e.stdout, "\nMembers (connected to this broker):")
		tab := cli.NewTable("MEMBER", "PATTERN", "IN-FLIGHT", "MAX-IN-FLIGHT", "DELIVERED", "FILTER")
		for _, m := range g.Members {
			filter := m.Filter
			if filter == "" {
				filter = "-"
			}
			tab.Row(m.ID, m.Pattern, strconv.Itoa(m.InFlight), strconv.Itoa(m.MaxInFlight), i64(m.Delivered), filter)
		}
		if err := tab.Write(e.stdout); err != nil {
			return err
		}
	}
	if err := writeOrdered(e, &g); err != nil {
		return err
	}
	if len(g.Partitions) > 0 {
		fmt.Fprintln(e.stdout, "\nPartitions:")
		tab := cli.NewTable("PARTITION", "ACK-FLOOR", "CURSOR", "HIGH-WATER")
		for _, p := range g.Partitions {
			tab.Row(strconv.Itoa(int(p.Partition)), i64(p.AckFloor), i64(p.Cursor), i64(p.HighWater))
		}
		if err := tab.Write(e.stdout); err != nil {
			return err
		}
	}
	return nil
}

// startText describes a start position.
func startText(s api.StartPosition, e *cliEnv) string {
	switch s.Kind {
	case api.FromTimestamp:
		return string(s.Kind) + " " + cli.Time(s.Time, e.loc)
	case api.FromMessageID:
		return fmt.Sprintf("%s %d:%d", s.Kind, s.Partition, s.Offset)
	case "":
		return string(api.FromNow)
	}
	return string(s.Kind)
}

// argAt returns pos[i], or "" when there are fewer arguments.
func argAt(pos []string, i int) string {
	if i < len(pos) {
		return pos[i]
	}
	return ""
}

// groupOp returns the command of pause, resume or cancel.
func groupOp(op string) cliFunc {
	spec := cmdSpec{
		name: "group " + op,
		args: "[flags] <topic> [group]",
		examples: []string{
			"spool group " + op + " orders.created billing",
			"spool group " + op + " jobs   # the QUEUE subscription",
		},
	}
	switch op {
	case "pause":
		spec.desc = "Pauses a subscription: it receives nothing and keeps holding retention (bounded by zombie_ttl, 7 days by default, and max_retention)."
	case "resume":
		spec.desc = "Resumes a PAUSED subscription: it is ACTIVE again and its deliveries continue where they stopped."
	case "cancel":
		spec.desc = "Cancels a subscription: it releases everything at once; terminal (subscribing again creates a new one)."
	}
	spec.desc += "\n" + groupArgHelp
	return func(ctx context.Context, e *cliEnv, args []string) error {
		fs := e.flagSet(spec)
		httpAddr := e.httpFlag(fs)
		jsonOut := fs.Bool("json", false, "print the API's JSON answer (the group afterwards)")
		pos, api, err := e.adminArgs(fs, httpAddr, args, 1, 2, "<topic>")
		if err != nil {
			return err
		}
		var g admin.Group
		raw, err := api.Call(ctx, http.MethodPost, cli.GroupPath(pos[0], argAt(pos, 1), op), nil, nil, &g)
		if err != nil {
			return err
		}
		if *jsonOut {
			return writeRaw(e, raw)
		}
		fmt.Fprintf(e.stdout, "group %s on topic %s: %s\n", g.Group, g.Topic, g.State)
		return nil
	}
}

var groupRebalanceSpec = cmdSpec{
	name: "group rebalance",
	args: "[flags] <topic> <group>",
	desc: `Reassigns an ordered group's partitions to its members now and prints the new generation and
assignment (members that lose a partition can no longer ack it). --strategy makes round-robin or
sticky the group's strategy first. --drop-foreign leaves out the members that other broker
instances listed (PostgreSQL): the way to take the partitions of an instance that crashed
without waiting for its members to expire. A shared group is refused (INVALID_ARGUMENT).`,
	examples: []string{
		"spool group rebalance accounts ledger",
		"spool group rebalance --strategy sticky accounts ledger",
		"spool group rebalance --drop-foreign accounts ledger   # after a broker instance crashed",
	},
}

func runGroupRebalance(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(groupRebalanceSpec)
	httpAddr := e.httpFlag(fs)
	strategy := fs.String("strategy", "", "the group's new assignment strategy: round-robin or sticky (default: keep it)")
	dropForeign := fs.Bool("drop-foreign", false, "leave out the members other broker instances listed")
	jsonOut := fs.Bool("json", false, "print the API's JSON answer (the group afterwards)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 2, 2, "<topic> <group>"); err != nil {
		return err
	}
	switch *strategy {
	case "", "round-robin", "sticky":
	default:
		return usagef(fs, "group rebalance: --strategy must be round-robin or sticky, got %q", *strategy)
	}
	api, err := e.admin(fs, *httpAddr)
	if err != nil {
		return err
	}
	var g admin.Group
	req := admin.RebalanceRequest{Strategy: *strategy, DropForeign: *dropForeign}
	raw, err := api.Call(ctx, http.MethodPost, cli.GroupPath(pos[0], pos[1], "rebalance"), nil, req, &g)
	if err != nil {
		return err
	}
	if *jsonOut {
		return writeRaw(e, raw)
	}
	fmt.Fprintf(e.stdout, "group %s on topic %s: rebalanced, generation %d (%s)\n", g.Group, g.Topic, g.Generation, g.Strategy)
	return writeOrdered(e, &g)
}
