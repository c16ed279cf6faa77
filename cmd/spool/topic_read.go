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
)

// maxTopicReadPage is the page size of one API call of spool topic read (the API's bound).
const maxTopicReadPage = 1000

var topicReadSpec = cmdSpec{
	name: "topic read",
	args: "[flags] <topic>",
	desc: `Prints retained messages of one partition without consuming them: no group's cursor, lease or
ack changes (GET /api/v1/topics/{topic}/messages; needs the consume or admin permission).
--from is an offset, a message id (partition:offset, which also selects the partition) or an
RFC 3339 time (the first message published at or after it); by default the first retained
message. Each line is: id, publish time, key, [headers], payload.`,
	examples: []string{
		"spool topic read orders.created",
		"spool topic read --partition 1 --from 500 --limit 10 orders.created",
		"spool topic read --from 1:500 orders.created",
		"spool topic read --from 2026-11-26T10:00:00Z --json orders.created",
	},
}

func runTopicRead(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(topicReadSpec)
	httpAddr := e.httpFlag(fs)
	partition := fs.Int("partition", -1, "the partition to read (default 0, or the one of a partition:offset --from)")
	from := fs.String("from", "", "start: an offset, a message id (partition:offset) or an RFC 3339 time")
	limit := fs.Int("limit", 100, "the most messages to print")
	jsonOut := fs.Bool("json", false, "print one JSON object per message (the API's message objects)")
	pos, api, err := e.adminArgs(fs, httpAddr, args, 1, 1, "<topic>")
	if err != nil {
		return err
	}
	if *limit < 1 {
		return usagef(fs, "topic read: --limit must be at least 1, got %d", *limit)
	}
	q := url.Values{}
	if *partition >= 0 {
		q.Set("partition", strconv.Itoa(*partition))
	}
	if *from != "" {
		q.Set("from", *from)
	}
	var jl *cli.JSONLines
	if *jsonOut {
		jl = cli.NewJSONLines(e.stdout)
	}
	for left := *limit; left > 0; {
		q.Set("limit", strconv.Itoa(min(left, maxTopicReadPage)))
		var page admin.MessageList
		if _, err := api.Call(ctx, http.MethodGet, cli.TopicPath(pos[0], "messages"), q, nil, &page); err != nil {
			return err
		}
		for _, m := range page.Messages {
			if jl != nil {
				if err := jl.Write(m); err != nil {
					return err
				}
				continue
			}
			if _, err := fmt.Fprintln(e.stdout, messageLine(m, e)); err != nil {
				return err
			}
		}
		if len(page.Messages) == 0 {
			break
		}
		left -= len(page.Messages)
		// The next page: the same partition, after the last message.
		q.Set("partition", strconv.Itoa(int(page.Partition)))
		q.Set("from", strconv.FormatInt(page.NextOffset, 10))
	}
	return nil
}

// messageLine is a message of spool topic read for people.
func messageLine(m admin.Message, e *cliEnv) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", m.ID, cli.Time(m.PublishedAt, e.loc))
	switch {
	case m.Key != nil:
		b.WriteString(" key=" + cli.Cell(*m.Key))
	case m.KeyBase64 != nil:
		b.WriteString(" key_base64=" + *m.KeyBase64)
	}
	if len(m.Headers) > 0 {
		b.WriteString(" [")
		for i, k := range slices.Sorted(maps.Keys(m.Headers)) {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(cli.Cell(k) + "=" + cli.Cell(m.Headers[k]))
		}
		b.WriteByte(']')
	}
	switch {
	case m.Payload != nil:
		b.WriteString(" " + cli.Cell(*m.Payload))
	case m.PayloadBase64 != nil:
		b.WriteString(" base64:" + *m.PayloadBase64)
	}
	return b.String()
}
