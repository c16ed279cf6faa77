package main

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/cli"
	"github.com/spoolmq/spool/internal/storage"
)

// dlqPageSize is the page size of dlq list's requests (entries carry whole messages).
const dlqPageSize = 100

func runDLQ(ctx context.Context, e *cliEnv, args []string) error {
	return dispatch(ctx, e, "dlq", "Manages the dead-letter queue of each subscription through the HTTP admin API (--http, $"+envHTTP+").", []subcommand{
		{"list", "list a subscription's dead-lettered messages", runDLQList},
		{"inspect", "show one DLQ entry with its message's key, headers and payload", runDLQInspect},
		{"replay", "redeliver DLQ entries to their subscription (only that group)", dlqOp("replay")},
		{"purge", "remove DLQ entries", dlqOp("purge")},
	}, args)
}

var dlqListSpec = cmdSpec{
	name: "dlq list",
	args: "[flags] <topic> [group]",
	desc: `Lists a subscription's dead-lettered messages in entry id order: the entry id (what replay and
purge take), the message id, why it was dead-lettered (max_deliveries, rejected or poison, with its rule), its delivery
attempts, the last error a consumer gave, and when.
` + groupArgHelp,
	examples: []string{
		"spool dlq list orders.created billing",
		"spool dlq list jobs --limit 0 --json   # the QUEUE subscription, every entry",
	},
}

func runDLQList(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(dlqListSpec)
	httpAddr := e.httpFlag(fs)
	jsonOut := fs.Bool("json", false, "print the API's JSON (pages merged into one object)")
	limit := fs.Int("limit", 100, "most entries to list (0: all)")
	afterID := fs.Int64("after-id", 0, "list entries with a larger id (paging)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, 2, "<topic>"); err != nil {
		return err
	}
	if *limit < 0 || *afterID < 0 {
		return usagef(fs, "dlq list: --limit and --after-id must not be negative")
	}
	api, err := e.admin(fs, *httpAddr)
	if err != nil {
		return err
	}
	topic, group := pos[0], argAt(pos, 1)
	out := admin.DLQList{Entries: []admin.DLQEntry{}}
	after := *afterID
	for {
		size := dlqPageSize
		if *limit > 0 {
			size = min(size, *limit-len(out.Entries))
		}
		q := url.Values{"limit": {strconv.Itoa(size)}, "after_id": {strconv.FormatInt(after, 10)}}
		var page admin.DLQList
		if _, err := api.Call(ctx, http.MethodGet, cli.GroupPath(topic, group, "dlq"), q, nil, &page); err != nil {
			return err
		}
		out.Entries = append(out.Entries, page.Entries...)
		out.NextAfterID = page.NextAfterID
		if page.NextAfterID == nil || (*limit > 0 && len(out.Entries) >= *limit) {
			break
		}
		after = *page.NextAfterID
	}
	if *jsonOut {
		return cli.NewJSONLines(e.stdout).Write(out)
	}
	if len(out.Entries) == 0 {
		fmt.Fprintf(e.stderr, "no dead-lettered messages in group %s of topic %s\n", cli.Group(group), topic)
		return nil
	}
	tab := cli.NewTable("ID", "MESSAGE-ID", "REASON", "ATTEMPTS", "LAST-ERROR", "DEAD-AT", "FAILURES")
	for _, d := range out.Entries {
		reason := string(d.Reason)
		if d.Rule != "" {
			reason += " (" + string(d.Rule) + ")"
		}
		tab.Row(strconv.FormatInt(d.ID, 10), d.Message.ID, reason, strconv.Itoa(d.Attempts),
			cli.Truncate(d.LastError, 60), cli.Time(d.DeadAt, e.loc), cli.Truncate(failuresText(d.Failures), 80))
	}
	if err := tab.Write(e.stdout); err != nil {
		return err
	}
	if out.NextAfterID != nil {
		fmt.Fprintf(e.stderr, "more entries: add --after-id %d (or --limit 0 for all)\n", *out.NextAfterID)
	}
	return nil
}

var dlqInspectSpec = cmdSpec{
	name: "dlq inspect",
	args: "[flags] <topic> <group> <entry-id>",
	desc: `Shows one DLQ entry whole: why and when it was dead-lettered, its attempts, the last error and
the poison-rule failures, and its message with key, headers and payload (text, or base64 when it
is not UTF-8). The entry id is the ID column of "spool dlq list"; the group is "" or '$queue' for
the QUEUE subscription.`,
	examples: []string{
		"spool dlq inspect orders.created billing 12",
		"spool dlq inspect jobs '$queue' 7 --json",
	},
}

func runDLQInspect(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(dlqInspectSpec)
	httpAddr := e.httpFlag(fs)
	jsonOut := fs.Bool("json", false, "print the API's JSON answer")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 3, 3, "<topic> <group> <entry-id>"); err != nil {
		return err
	}
	id, err := strconv.ParseInt(strings.TrimPrefix(pos[2], "dlq-"), 10, 64)
	if err != nil || id < 1 {
		return usagef(fs, "dlq inspect: entry id %q is not a positive integer", pos[2])
	}
	api, err := e.admin(fs, *httpAddr)
	if err != nil {
		return err
	}
	var d admin.DLQEntry
	raw, err := api.Call(ctx, http.MethodGet, cli.GroupPath(pos[0], pos[1], "dlq", strconv.FormatInt(id, 10)), nil, nil, &d)
	if err != nil {
		return err
	}
	if *jsonOut {
		return writeRaw(e, raw)
	}
	m := d.Message
	f := &cli.Fields{}
	f.Add("Entry", strconv.FormatInt(d.ID, 10))
	f.Add("Topic", pos[0])
	f.Add("Group", cli.Group(pos[1]))
	f.Add("Message", m.ID)
	reason := string(d.Reason)
	if d.Rule != "" {
		reason += " (" + string(d.Rule) + ")"
	}
	f.Add("Reason", reason)
	f.Add("Attempts", strconv.Itoa(d.Attempts))
	f.Add("Last error", d.LastError)
	f.Add("Dead at", cli.Time(d.DeadAt, e.loc))
	for _, x := range d.Failures {
		f.Add("Failure", x.Member+": "+x.Reason+" ("+cli.Time(x.At, e.loc)+")")
	}
	f.Add("Published", cli.Time(m.PublishedAt, e.loc))
	switch {
	case m.Key != nil:
		f.Add("Key", *m.Key)
	case m.KeyBase64 != nil:
		f.Add("Key", "base64:"+*m.KeyBase64)
	}
	if m.ProducerID != "" {
		f.Add("Producer id", m.ProducerID)
	}
	if !m.NotBefore.IsZero() {
		f.Add("Not before", cli.Time(m.NotBefore, e.loc))
	}
	if !m.ExpiresAt.IsZero() {
		f.Add("Expires", cli.Time(m.ExpiresAt, e.loc))
	}
	for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
		f.Add("Header", k+"="+m.Headers[k])
	}
	switch {
	case m.Payload != nil && *m.Payload == "":
		f.Add("Payload", `""`) // Fields prints "" as "-"
	case m.Payload != nil:
		f.Add("Payload", *m.Payload)
	case m.PayloadBase64 != nil:
		f.Add("Payload", "base64:"+*m.PayloadBase64)
	}
	return f.Write(e.stdout)
}

// dlqOp returns the command of replay or purge.
func dlqOp(op string) cliFunc {
	spec := cmdSpec{
		name: "dlq " + op,
		args: "[flags] <topic> <group> (<entry-id> ... | --all)",
	}
	if op == "replay" {
		spec.desc = `Replays DLQ entries to their subscription only (not to the topic's other groups): each message is
delivered again at once with a fresh attempt count, keeping its message id.`
	} else {
		spec.desc = "Removes DLQ entries for good."
	}
	spec.desc += `
Entry ids are the ID column of "spool dlq list". With --all the group may be left out for a QUEUE
topic; otherwise give it, as "" or '$queue' for the QUEUE subscription.`
	spec.examples = []string{
		"spool dlq " + op + " orders.created billing 12 13",
		"spool dlq " + op + " orders.created billing --all",
		"spool dlq " + op + " jobs '$queue' 7",
	}
	return func(ctx context.Context, e *cliEnv, args []string) error {
		fs := e.flagSet(spec)
		httpAddr := e.httpFlag(fs)
		jsonOut := fs.Bool("json", false, "print the API's JSON answer")
		all := fs.Bool("all", false, "every entry of the subscription's DLQ")
		pos, err := parseArgs(fs, args)
		if err != nil {
			return err
		}
		sel := admin.DLQSelection{All: *all}
		if *all {
			if err := wantArgs(fs, pos, 1, 2, "<topic>"); err != nil {
				return err
			}
		} else {
			if err := wantArgs(fs, pos, 3, -1, "<topic> <group> and entry ids (or --all)"); err != nil {
				return err
			}
			for _, s := range pos[2:] {
				id, err := strconv.ParseInt(strings.TrimPrefix(s, "dlq-"), 10, 64)
				if err != nil || id < 1 {
					return usagef(fs, "dlq %s: entry id %q is not a positive integer", op, s)
				}
				sel.IDs = append(sel.IDs, id)
			}
		}
		api, err := e.admin(fs, *httpAddr)
		if err != nil {
			return err
		}
		topic, group := pos[0], argAt(pos, 1)
		var res admin.DLQResult
		raw, err := api.Call(ctx, http.MethodPost, cli.GroupPath(topic, group, "dlq", op), nil, sel, &res)
		if err != nil {
			return err
		}
		if *jsonOut {
			return writeRaw(e, raw)
		}
		n, verb := 0, "replayed"
		if res.Replayed != nil {
			n = *res.Replayed
		}
		if op == "purge" {
			verb = "purged"
			if res.Purged != nil {
				n = *res.Purged
			}
		}
		fmt.Fprintf(e.stdout, "%s %d entr%s of group %s on topic %s\n", verb, n, pluralY(n), cli.Group(group), topic)
		return nil
	}
}

func pluralY(n int) string {
	if n == 1 {
		return "y"
	}
	return "ies"
}

// failuresText summarises a DLQ entry's failures (poison rules) as "member: reason" pairs, oldest
// first; --json has their times.
func failuresText(fs []storage.DeliveryFailure) string {
	parts := make([]string, len(fs))
	for i, f := range fs {
		parts[i] = f.Member + ": " + f.Reason
	}
	return strings.Join(parts, ", ")
}
