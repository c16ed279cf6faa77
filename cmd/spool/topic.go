package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/cli"
)

func runTopic(ctx context.Context, e *cliEnv, args []string) error {
	return dispatch(ctx, e, "topic", "Manages topics through the HTTP admin API (--http, $"+envHTTP+").", []subcommand{
		{"create", "create a topic", runTopicCreate},
		{"list", "list topics with their statistics", runTopicList},
		{"describe", "show a topic's configuration, partitions and groups", runTopicDescribe},
		{"read", "print a partition's messages without consuming them", runTopicRead},
		{"completion", "print a message's completion record (refcount topics)", runTopicCompletion},
		{"update", "change a topic's configuration", runTopicUpdate},
		{"delete", "delete a topic with its messages and subscriptions", runTopicDelete},
	}, args)
}

// topicConfigFlags are the flags of every TopicConfig field (admin.TopicConfig), for create and
// update. Only the flags given on the command line are sent: an update changes exactly those.
type topicConfigFlags struct {
	semantics, completionTracking                             string
	partitions, maxDeliveries, maxMessageBytes                int
	blockWrites                                               bool
	ackWait, messageRetention, zeroSubRetention, maxRetention cli.DurationValue
	dedupWindow, zombieTTL                                    cli.DurationValue
	maxBacklogMessages, maxBacklogBytes                       int64
	backlogPolicy                                             string
	maxMessages, maxBytes                                     int64
	sizePolicy                                                string
	poisonSameReason                                          bool
	poisonMaxFailures                                         int
	poisonWindow                                              cli.DurationValue
}

// poisonFlagFields maps the poison-rule flags to their fields inside poison_rules (the server
// merges them into the topic's current rules).
var poisonFlagFields = map[string]string{
	"poison-same-reason":  "distinct_members",
	"poison-max-failures": "max_failures",
	"poison-window":       "window",
}

// flagField maps a flag to its field in the API's JSON.
var topicFlagFields = map[string]string{
	"semantics":                          "semantics",
	"partitions":                         "partitions",
	"ack-wait":                           "ack_wait",
	"max-deliveries":                     "max_deliveries",
	"message-retention":                  "message_retention",
	"zero-subscription-retention":        "zero_subscription_retention",
	"block-writes-on-zero-subscriptions": "block_writes_on_zero_subscriptions",
	"completion-tracking":                "completion_tracking",
	"max-retention":                      "max_retention",
	"zombie-ttl":                         "zombie_ttl",
	"max-message-bytes":                  "max_message_bytes",
	"dedup-window":                       "dedup_window",
	"max-backlog-messages":               "max_backlog_messages",
	"max-backlog-bytes":                  "max_backlog_bytes",
	"backlog-policy":                     "backlog_policy",
	"max-messages":                       "max_messages",
	"max-bytes":                          "max_bytes",
	"size-policy":                        "size_policy",
}

func addTopicConfigFlags(fs *flag.FlagSet, create bool) *topicConfigFlags {
	t := &topicConfigFlags{}
	def := func(d string) string {
		if create {
			return " (default " + d + ")"
		}
		return ""
	}
	fs.StringVar(&t.semantics, "semantics", "", "QUEUE (one consumer per message) or PUB_SUB (every group)"+def("QUEUE"))
	fs.IntVar(&t.partitions, "partitions", 0, "number of partitions; it may grow, never shrink"+def("1"))
	fs.Var(&t.ackWait, "ack-wait", "lease of a delivery before it is redelivered"+def("30s"))
	fs.IntVar(&t.maxDeliveries, "max-deliveries", 0, "deliveries before a message goes to the group's DLQ"+def("5"))
	fs.Var(&t.messageRetention, "message-retention", "how long completed messages are kept for replay"+def("24h, or --max-retention when shorter"))
	fs.Var(&t.zeroSubRetention, "zero-subscription-retention", "how long a topic whose subscriptions all stopped holding retention keeps messages (PUB_SUB: no ACTIVE or PAUSED group; QUEUE: its queue subscription DEAD or CANCELLED)"+def("24h"))
	fs.BoolVar(&t.blockWrites, "block-writes-on-zero-subscriptions", false, "refuse publishes to a PUB_SUB topic without an ACTIVE subscription")
	fs.StringVar(&t.completionTracking, "completion-tracking", "", "watermark (retention follows each group's ack floor) or refcount "+
		"(strict: a message waits for the groups live at its publish; audit with spool topic completion); not changeable while the topic holds messages"+def("watermark"))
	fs.Var(&t.maxRetention, "max-retention", "hard cap on the age of any message"+def("30d"))
	fs.Var(&t.zombieTTL, "zombie-ttl", "a group whose ack floor is stuck longer than this gives up the messages older than it (at least 1s, at most --max-retention)"+def("7d"))
	fs.IntVar(&t.maxMessageBytes, "max-message-bytes", 0, "bound of key + headers + payload of one message"+def("1048576"))
	fs.Var(&t.dedupWindow, "dedup-window", "how long a producer id is remembered: a message repeating one is not stored again"+def("2m"))
	fs.Int64Var(&t.maxBacklogMessages, "max-backlog-messages", 0, "backpressure: bound on the messages the slowest active group has not done; 0: none"+def("0"))
	fs.Int64Var(&t.maxBacklogBytes, "max-backlog-bytes", 0, "backpressure: the same bound in bytes (estimated); 0: none"+def("0"))
	fs.StringVar(&t.backlogPolicy, "backlog-policy", "", "at the bound: reject (publishes refused RATE_LIMITED) or throttle (slowed from half the bound, refused at it)"+def("reject"))
	fs.Int64Var(&t.maxMessages, "max-messages", 0, "size bound: retention removes the oldest messages to keep at most this many; 0: none"+def("0"))
	fs.Int64Var(&t.maxBytes, "max-bytes", 0, "size bound: the same in bytes of the log; 0: none"+def("0"))
	fs.StringVar(&t.sizePolicy, "size-policy", "", "what the size bound may remove: keep_needed (only messages every active or paused group completed) or drop_oldest (any)"+def("keep_needed"))
	fs.BoolVar(&t.poisonSameReason, "poison-same-reason", false, "poison rule: dead-letter a message nacked with the same reason by more than one member")
	fs.IntVar(&t.poisonMaxFailures, "poison-max-failures", 0, "poison rule: dead-letter a message after this many nacks within --poison-window (1 to 5; 0: off)"+def("0"))
	fs.Var(&t.poisonWindow, "poison-window", "window of --poison-max-failures"+def("30s"))
	return t
}

// body returns the API fields of the flags given on the command line.
func (t *topicConfigFlags) body(fs *flag.FlagSet) (map[string]any, error) {
	out := map[string]any{}
	var err error
	fs.Visit(func(f *flag.Flag) {
		if sub, ok := poisonFlagFields[f.Name]; ok {
			rules, _ := out["poison_rules"].(map[string]any)
			if rules == nil {
				rules = map[string]any{}
				out["poison_rules"] = rules
			}
			switch f.Name {
			case "poison-same-reason":
				rules[sub] = t.poisonSameReason
			case "poison-max-failures":
				rules[sub] = t.poisonMaxFailures
			default:
				rules[sub] = t.poisonWindow.D.String()
			}
			return
		}
		field, ok := topicFlagFields[f.Name]
		if !ok || err != nil {
			return
		}
		switch f.Name {
		case "semantics":
			s := strings.ReplaceAll(strings.ToUpper(t.semantics), "-", "_")
			if s == "PUBSUB" {
				s = "PUB_SUB"
			}
			if s != "QUEUE" && s != "PUB_SUB" {
				err = usagef(fs, "--semantics must be QUEUE or PUB_SUB, got %q", t.semantics)
				return
			}
			out[field] = s
		case "completion-tracking":
			out[field] = strings.ToLower(t.completionTracking)
		case "partitions":
			out[field] = t.partitions
		case "max-deliveries":
			out[field] = t.maxDeliveries
		case "max-message-bytes":
			out[field] = t.maxMessageBytes
		case "max-backlog-messages":
			out[field] = t.maxBacklogMessages
		case "max-backlog-bytes":
			out[field] = t.maxBacklogBytes
		case "backlog-policy":
			out[field] = strings.ToLower(t.backlogPolicy)
		case "max-messages":
			out[field] = t.maxMessages
		case "max-bytes":
			out[field] = t.maxBytes
		case "size-policy":
			out[field] = strings.ReplaceAll(strings.ToLower(t.sizePolicy), "-", "_")
		case "block-writes-on-zero-subscriptions":
			out[field] = t.blockWrites
		default:
			// The API reads Go durations (no days).
			out[field] = f.Value.(*cli.DurationValue).D.String()
		}
	})
	return out, err
}

var topicCreateSpec = cmdSpec{
	name: "topic create",
	args: "[flags] <topic>",
	desc: "Creates a topic. Flags not given take the defaults (shown); durations take s, m, h and d units.",
	examples: []string{
		"spool topic create orders.created --semantics PUB_SUB --partitions 4",
		"spool topic create jobs --ack-wait 5m --max-deliveries 3 --message-retention 7d",
		"spool topic create payments.settled --semantics PUB_SUB --completion-tracking refcount",
	},
}

func runTopicCreate(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(topicCreateSpec)
	httpAddr := e.httpFlag(fs)
	jsonOut := fs.Bool("json", false, "print the API's JSON answer")
	cfg := addTopicConfigFlags(fs, true)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, 1, "<topic>"); err != nil {
		return err
	}
	body, err := cfg.body(fs)
	if err != nil {
		return err
	}
	body["name"] = pos[0]
	api, err := e.admin(fs, *httpAddr)
	if err != nil {
		return err
	}
	var t admin.Topic
	raw, err := api.Call(ctx, http.MethodPost, "/api/v1/topics", nil, body, &t)
	if err != nil {
		return err
	}
	if *jsonOut {
		return writeRaw(e, raw)
	}
	fmt.Fprintf(e.stdout, "created topic %s (%s, %d partition%s)\n", t.Name, t.Config.Semantics, t.Config.Partitions, pluralS(t.Config.Partitions))
	return nil
}

var topicListSpec = cmdSpec{
	name: "topic list",
	args: "[flags]",
	desc: "Lists topics with their statistics: retained messages and bytes, subscriptions, members connected to this broker.",
	examples: []string{
		"spool topic list",
		"spool topic list --pattern 'orders.#' --json",
	},
}

func runTopicList(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(topicListSpec)
	httpAddr := e.httpFlag(fs)
	jsonOut := fs.Bool("json", false, "print the API's JSON (every page merged into one object)")
	pattern := fs.String("pattern", "", "only topics matching this name or wildcard pattern")
	_, api, err := e.adminArgs(fs, httpAddr, args, 0, 0, "")
	if err != nil {
		return err
	}
	all := admin.TopicList{Topics: []admin.Topic{}}
	for {
		q := url.Values{"limit": {"1000"}, "offset": {strconv.Itoa(len(all.Topics))}}
		if *pattern != "" {
			q.Set("pattern", *pattern)
		}
		var page admin.TopicList
		if _, err := api.Call(ctx, http.MethodGet, "/api/v1/topics", q, nil, &page); err != nil {
			return err
		}
		all.Topics = append(all.Topics, page.Topics...)
		all.Total = page.Total
		if len(page.Topics) == 0 || len(all.Topics) >= page.Total {
			break
		}
	}
	all.Limit = len(all.Topics)
	if *jsonOut {
		return cli.NewJSONLines(e.stdout).Write(all)
	}
	if len(all.Topics) == 0 {
		fmt.Fprintln(e.stderr, "no topics")
		return nil
	}
	tab := cli.NewTable("NAME", "SEMANTICS", "PARTITIONS", "MESSAGES", "SIZE", "SUBSCRIPTIONS", "MEMBERS", "CREATED")
	for _, t := range all.Topics {
		msgs, size := "0", "0 B"
		if t.Stats != nil {
			msgs, size = strconv.FormatInt(t.Stats.Messages, 10), cli.Bytes(t.Stats.Bytes)
		}
		tab.Row(t.Name, string(t.Config.Semantics), strconv.Itoa(t.Config.Partitions), msgs, size,
			strconv.Itoa(t.Subscriptions), strconv.Itoa(t.Members), cli.Time(t.CreatedAt, e.loc))
	}
	return tab.Write(e.stdout)
}

var topicDescribeSpec = cmdSpec{
	name:     "topic describe",
	args:     "[flags] <topic>",
	desc:     "Shows a topic's configuration, statistics, partitions and subscriptions (groups).",
	examples: []string{"spool topic describe orders.created"},
}

func runTopicDescribe(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(topicDescribeSpec)
	httpAddr := e.httpFlag(fs)
	jsonOut := fs.Bool("json", false, "print the API's JSON answer (the topic, without its groups)")
	pos, api, err := e.adminArgs(fs, httpAddr, args, 1, 1, "<topic>")
	if err != nil {
		return err
	}
	var t admin.Topic
	raw, err := api.Call(ctx, http.MethodGet, cli.TopicPath(pos[0]), nil, nil, &t)
	if err != nil {
		return err
	}
	if *jsonOut {
		return writeRaw(e, raw)
	}
	groups, err := api.TopicGroups(ctx, pos[0]) // every page
	if err != nil {
		return err
	}
	c := t.Config
	f := &cli.Fields{}
	f.Add("Name", t.Name)
	f.Add("Semantics", string(c.Semantics))
	f.Add("Partitions", strconv.Itoa(c.Partitions))
	f.Add("Created", cli.Time(t.CreatedAt, e.loc))
	if t.Stats != nil {
		f.Add("Messages", strconv.FormatInt(t.Stats.Messages, 10))
		f.Add("Size", cli.Bytes(t.Stats.Bytes))
	}
	f.Add("Subscriptions", strconv.Itoa(t.Subscriptions))
	f.Add("Members", strconv.Itoa(t.Members))
	f.Add("Ack wait", cli.Duration(time.Duration(c.AckWait)))
	f.Add("Max deliveries", strconv.Itoa(c.MaxDeliveries))
	f.Add("Message retention", cli.Duration(time.Duration(c.MessageRetention)))
	f.Add("Zero-subscription retention", cli.Duration(time.Duration(c.ZeroSubscriptionRetention)))
	f.Add("Block writes on zero subscriptions", strconv.FormatBool(c.BlockWritesOnZeroSubscriptions))
	f.Add("Completion tracking", string(c.CompletionTracking))
	f.Add("Max retention", cli.Duration(time.Duration(c.MaxRetention)))
	f.Add("Zombie TTL", cli.Duration(time.Duration(c.ZombieTTL)))
	f.Add("Max message size", cli.Bytes(int64(c.MaxMessageBytes)))
	f.Add("Dedup window", cli.Duration(time.Duration(c.DedupWindow)))
	f.Add("Poison rules", poisonText(c.PoisonRules))
	if c.MaxMessages > 0 || c.MaxBytes > 0 {
		var bound []string
		if c.MaxMessages > 0 {
			bound = append(bound, strconv.FormatInt(c.MaxMessages, 10)+" messages")
		}
		if c.MaxBytes > 0 {
			bound = append(bound, cli.Bytes(c.MaxBytes))
		}
		policy := c.SizePolicy
		if policy == "" {
			policy = "keep_needed"
		}
		v := fmt.Sprintf("%s (%s)", strings.Join(bound, ", "), policy)
		if t.SizeBoundExceeded {
			v += "; exceeded: groups still need the oldest messages"
		}
		f.Add("Size bound", v)
	}
	if bp := t.Backpressure; bp != nil {
		var bound []string
		if bp.MaxBacklogMessages > 0 {
			bound = append(bound, strconv.FormatInt(bp.MaxBacklogMessages, 10)+" messages")
		}
		if bp.MaxBacklogBytes > 0 {
			bound = append(bound, cli.Bytes(bp.MaxBacklogBytes))
		}
		f.Add("Backlog bound", fmt.Sprintf("%s (%s)", strings.Join(bound, ", "), bp.Policy))
		f.Add("Backpressure", fmt.Sprintf("%s, backlog %d; %d publishes throttled, %d refused", bp.State, bp.BacklogMessages, bp.Throttled, bp.Rejected))
	}
	if err := f.Write(e.stdout); err != nil {
		return err
	}
	if t.Stats != nil && len(t.Stats.Partitions) > 0 {
		fmt.Fprintln(e.stdout, "\nPartitions:")
		tab := cli.NewTable("PARTITION", "LOW-OFFSET", "HIGH-WATER", "MESSAGES", "SIZE")
		var damaged []string
		for _, p := range t.Stats.Partitions {
			tab.Row(strconv.Itoa(int(p.Partition)), strconv.FormatInt(p.LowOffset, 10), strconv.FormatInt(p.HighWater, 10),
				strconv.FormatInt(p.HighWater-p.LowOffset, 10), cli.Bytes(p.Bytes))
			if p.Damaged {
				damaged = append(damaged, strconv.Itoa(int(p.Partition)))
			}
		}
		if err := tab.Write(e.stdout); err != nil {
			return err
		}
		if len(damaged) > 0 {
			fmt.Fprintf(e.stdout, "Damaged partitions: %s (unavailable until repaired: see the broker's log, spool data verify)\n",
				strings.Join(damaged, ", "))
		}
	}
	fmt.Fprintln(e.stdout, "\nGroups:")
	if len(groups) == 0 {
		fmt.Fprintln(e.stdout, "  none")
		return nil
	}
	return groupTable(groups, false, true).Write(e.stdout)
}

var topicUpdateSpec = cmdSpec{
	name: "topic update",
	args: "[flags] <topic>",
	desc: `Changes a topic's configuration: only the flags given change. Partitions only grow. Changing a
QUEUE topic to PUB_SUB needs --queue-to-group, the group its queue subscription becomes (nothing
pending is lost); the server refuses --queue-to-group with any other update. Concurrent updates of
other fields are kept: the server re-applies the flags to their result, and answers TOPIC_CHANGED
(changing nothing: run the command again) only if the topic kept changing meanwhile.`,
	examples: []string{
		"spool topic update orders.created --max-deliveries 10 --ack-wait 1m",
		"spool topic update jobs --semantics PUB_SUB --queue-to-group workers",
	},
}

func runTopicUpdate(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(topicUpdateSpec)
	httpAddr := e.httpFlag(fs)
	jsonOut := fs.Bool("json", false, "print the API's JSON answer")
	cfg := addTopicConfigFlags(fs, false)
	queueToGroup := fs.String("queue-to-group", "", "QUEUE to PUB_SUB: the group the queue subscription becomes (with --semantics PUB_SUB only)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, 1, "<topic>"); err != nil {
		return err
	}
	body, err := cfg.body(fs)
	if err != nil {
		return err
	}
	if *queueToGroup != "" {
		body["queue_to_group"] = *queueToGroup
	}
	if len(body) == 0 {
		return usagef(fs, "topic update: nothing to change: give at least one configuration flag")
	}
	api, err := e.admin(fs, *httpAddr)
	if err != nil {
		return err
	}
	var t admin.Topic
	raw, err := api.Call(ctx, http.MethodPut, cli.TopicPath(pos[0], "config"), nil, body, &t)
	if err != nil {
		return err
	}
	if *jsonOut {
		return writeRaw(e, raw)
	}
	fmt.Fprintf(e.stdout, "updated topic %s (%s, %d partition%s, ack wait %s, max deliveries %d)\n", t.Name, t.Config.Semantics,
		t.Config.Partitions, pluralS(t.Config.Partitions), cli.Duration(time.Duration(t.Config.AckWait)), t.Config.MaxDeliveries)
	return nil
}

var topicDeleteSpec = cmdSpec{
	name: "topic delete",
	args: "[flags] <topic>",
	desc: `Deletes a topic with its messages, subscriptions and dead-letter queues. A topic with live
durable subscriptions (or a QUEUE topic with unfinished messages) is kept unless --force, which
cancels them.`,
	examples: []string{"spool topic delete orders.created", "spool topic delete --force orders.created"},
}

func runTopicDelete(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(topicDeleteSpec)
	httpAddr := e.httpFlag(fs)
	force := fs.Bool("force", false, "delete even with live subscriptions or unfinished messages (cancels them)")
	jsonOut := fs.Bool("json", false, "print nothing on success (the API answers 204 without a body)")
	pos, api, err := e.adminArgs(fs, httpAddr, args, 1, 1, "<topic>")
	if err != nil {
		return err
	}
	var q url.Values
	if *force {
		q = url.Values{"force": {"true"}}
	}
	if _, err := api.Call(ctx, http.MethodDelete, cli.TopicPath(pos[0]), q, nil, nil); err != nil {
		return err
	}
	if !*jsonOut {
		fmt.Fprintf(e.stdout, "deleted topic %s\n", pos[0])
	}
	return nil
}

// writeRaw prints an API answer as it came, ending with a newline.
func writeRaw(e *cliEnv, raw []byte) error {
	if len(raw) > 0 && raw[len(raw)-1] != '\n' {
		raw = append(raw, '\n')
	}
	_, err := e.stdout.Write(raw)
	return err
}

// poisonText describes a topic's poison rules for topic get.
func poisonText(r *admin.PoisonRules) string {
	if r == nil {
		return "off"
	}
	var on []string
	if r.DistinctMembers {
		on = append(on, "same nack reason from several members")
	}
	if r.MaxFailures > 0 {
		on = append(on, fmt.Sprintf("%d failures within %s", r.MaxFailures, cli.Duration(time.Duration(r.Window))))
	}
	return strings.Join(on, "; ")
}
