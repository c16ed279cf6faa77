package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/cli"
)

var topicCompletionSpec = cmdSpec{
	name: "topic completion",
	args: "[flags] <topic> <message id>",
	desc: `Prints a message's completion record on a topic with --completion-tracking refcount
(GET /api/v1/topics/{topic}/messages/{id}/completion; needs the consume or admin permission):
the groups it waits or waited for (those live when it was published, plus those that joined
while it was pending), each pending, acked, dead_lettered or removed (it left while the message
was pending for it: DEAD or CANCELLED), with the time. The id is the offset, or partition:offset
on a topic with several partitions (as spool topic read prints it).`,
	examples: []string{
		"spool topic completion audit.events 0",
		"spool topic completion --json audit.events 0",
	},
}

func runTopicCompletion(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(topicCompletionSpec)
	httpAddr := e.httpFlag(fs)
	jsonOut := fs.Bool("json", false, "print the API's JSON answer")
	pos, api, err := e.adminArgs(fs, httpAddr, args, 2, 2, "<topic> <message id>")
	if err != nil {
		return err
	}
	var mc admin.MessageCompletion
	raw, err := api.Call(ctx, http.MethodGet, cli.TopicPath(pos[0], "messages", pos[1], "completion"), nil, nil, &mc)
	if err != nil {
		return err
	}
	if *jsonOut {
		return writeRaw(e, raw)
	}
	f := &cli.Fields{}
	f.Add("Topic", mc.Topic)
	f.Add("Message", mc.ID)
	f.Add("Published", cli.Time(mc.PublishedAt, e.loc))
	f.Add("Complete", strconv.FormatBool(mc.Complete))
	if err := f.Write(e.stdout); err != nil {
		return err
	}
	if len(mc.Groups) == 0 {
		_, err := fmt.Fprintln(e.stdout, "\nNo group: it waits for one to join (within zero_subscription_retention).")
		return err
	}
	fmt.Fprintln(e.stdout)
	tab := cli.NewTable("GROUP", "SUBSCRIPTION", "STATE", "AT")
	for _, g := range mc.Groups {
		at := ""
		if !g.At.IsZero() {
			at = cli.Time(g.At, e.loc)
		}
		tab.Row(cli.Cell(g.Group), strconv.FormatInt(g.SubscriptionID, 10), string(g.State), at)
	}
	return tab.Write(e.stdout)
}
