package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/client"
	"github.com/spoolmq/spool/internal/config"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/testutil"
	"github.com/spoolmq/spool/protocol"
)

func TestParseArgsInterspersed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args    []string
		wantPos []string
		wantAll bool
		wantN   int
	}{
		{[]string{"orders", "g", "--all"}, []string{"orders", "g"}, true, 0},
		{[]string{"--all", "orders", "-n", "3", "g"}, []string{"orders", "g"}, true, 3},
		{[]string{"orders", "--", "--all", "-n"}, []string{"orders", "--all", "-n"}, false, 0},
		{[]string{"--", "-x"}, []string{"-x"}, false, 0},
		{nil, nil, false, 0},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		all := fs.Bool("all", false, "")
		n := fs.Int("n", 0, "")
		pos, err := parseArgs(fs, tc.args)
		if err != nil || !slices.Equal(pos, tc.wantPos) || *all != tc.wantAll || *n != tc.wantN {
			t.Errorf("parseArgs(%q) = %q, %v (all=%v n=%d); want %q all=%v n=%d", tc.args, pos, err, *all, *n,
				tc.wantPos, tc.wantAll, tc.wantN)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var ue *usageError
	if _, err := parseArgs(fs, []string{"x", "--nope"}); !errors.As(err, &ue) {
		t.Errorf("unknown flag: %v, want a usage error", err)
	}
	if _, err := parseArgs(fs, []string{"x", "-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
}

func TestParseStart(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                          "FROM_NOW",
		"now":                       "FROM_NOW",
		"Beginning":                 "FROM_BEGINNING",
		"42":                        "FROM_MESSAGE_ID 42",
		"1:42":                      "FROM_MESSAGE_ID 1:42",
		"2025-01-02T15:04:05Z":      "FROM_TIMESTAMP 2025-01-02T15:04:05Z",
		"2025-01-02T16:04:05+01:00": "FROM_TIMESTAMP 2025-01-02T16:04:05+01:00",
	} {
		got, err := parseStart(in)
		if err != nil || !strings.HasPrefix(got.String(), want) {
			t.Errorf("parseStart(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"yesterday", "1:", ":1", "-1", "2025-01-02", "1:2:3"} {
		if got, err := parseStart(in); err == nil {
			t.Errorf("parseStart(%q) = %v, want an error", in, got)
		}
	}
}

// --from takes the seed's position names too, in any case, with '=' before a value, in spool
// sub and group create/update alike; bad values name the accepted forms.
func TestParseFromSeedNames(t *testing.T) {
	t.Parallel()
	ts := time.Date(2025, 1, 2, 15, 4, 5, 0, time.UTC)
	for in, want := range map[string]storage.StartPosition{
		"FROM_NOW":                            {Kind: storage.FromNow},
		"from_beginning":                      {Kind: storage.FromBeginning},
		"From_Timestamp=2025-01-02T15:04:05Z": {Kind: storage.FromTimestamp, Time: ts},
		"FROM_MESSAGE_ID=42":                  {Kind: storage.FromMessageID, Offset: 42},
		"from_message_id=1:42":                {Kind: storage.FromMessageID, Partition: 1, Offset: 42},
		"beginning":                           {Kind: storage.FromBeginning},
		"2025-01-02T15:04:05Z":                {Kind: storage.FromTimestamp, Time: ts},
		"3:7":                                 {Kind: storage.FromMessageID, Partition: 3, Offset: 7},
	} {
		got, err := parseGroupStart(in)
		if err != nil || got.Kind != want.Kind || !got.Time.Equal(want.Time) || got.Partition != want.Partition || got.Offset != want.Offset {
			t.Errorf("parseGroupStart(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		sub, err := parseStart(in)
		wantSub := string(want.Kind)
		switch want.Kind {
		case storage.FromTimestamp:
			wantSub += " 2025-01-02T15:04:05Z"
		case storage.FromMessageID:
			wantSub += fmt.Sprintf(" %d:%d", want.Partition, want.Offset)
			if want.Partition == 0 {
				wantSub = string(want.Kind) + " 42"
			}
		}
		if err != nil || sub.String() != wantSub {
			t.Errorf("parseStart(%q) = %v, %v; want %s", in, sub, err, wantSub)
		}
	}
	for in, wantErr := range map[string]string{
		"FROM_TIMESTAMP":                      "FROM_TIMESTAMP=<RFC 3339 time>",
		"FROM_TIMESTAMP=yesterday":            "FROM_TIMESTAMP=<RFC 3339 time>",
		"FROM_TIMESTAMP:2025-01-02T15:04:05Z": "FROM_TIMESTAMP=<RFC 3339 time>",
		"FROM_MESSAGE_ID":                     "FROM_MESSAGE_ID=<id>",
		"FROM_MESSAGE_ID=1:x":                 "PARTITION:OFFSET",
		"FROM_MESSAGE_ID=-1":                  "PARTITION:OFFSET",
		"FROM_NOW=1":                          "takes no value",
		"FROM_LATEST":                         "FROM_MESSAGE_ID=<id> (any case)",
		"earliest":                            "FROM_BEGINNING, FROM_NOW",
	} {
		for name, parse := range map[string]func(string) error{
			"parseGroupStart": func(s string) error { _, err := parseGroupStart(s); return err },
			"parseStart":      func(s string) error { _, err := parseStart(s); return err },
		} {
			if err := parse(in); err == nil || !strings.Contains(err.Error(), wantErr) {
				t.Errorf("%s(%q) = %v, want an error naming %q", name, in, err, wantErr)
			}
		}
	}
}

func TestDeliveryLine(t *testing.T) {
	t.Parallel()
	d := &client.Delivery{Topic: "orders.created", Partition: 1, Offset: 42, Attempt: 3, Key: []byte("user 7"),
		Headers: map[string]string{"trace": "abc", "a": "line\nbreak"}, Payload: []byte(`{"id":1}`)}
	want := `orders.created 1:42 attempt=3 key=user 7 [a="line\nbreak" trace=abc] {"id":1}`
	if got := deliveryLine(d); got != want {
		t.Errorf("deliveryLine = %s\nwant           %s", got, want)
	}
	d = &client.Delivery{Topic: "t", Attempt: 1, Payload: []byte{0xff, '\n'}}
	if got := deliveryLine(d); got != `t 0:0 attempt=1 "\xff\n"` {
		t.Errorf("deliveryLine(binary) = %s", got)
	}
}

// TestPublisherPrintsInInputOrder feeds outcomes in completion order and checks that they are
// printed in input order, failures on stderr.
func TestPublisherPrintsInInputOrder(t *testing.T) {
	t.Parallel()
	var out, errb testutil.SyncBuffer
	e := &cliEnv{stdout: &out, stderr: &errb}
	p := &publisher{e: e, o: &pubOptions{topic: "t"}, results: map[int]pubResult{}, next: 1, start: time.Now()}
	pos := func(off int64) pubResult { return pubResult{pos: client.Position{Partition: 0, Offset: off}} }
	p.done(3, pos(12))
	p.done(2, pubResult{err: protocol.ErrMessageTooLarge.WithMessage("too big")})
	if out.String() != "" {
		t.Fatalf("printed %q before message 1 completed", out.String())
	}
	p.done(1, pos(10))
	p.done(4, pos(13))
	if out.String() != "0:10\n0:12\n0:13\n" {
		t.Fatalf("stdout %q", out.String())
	}
	if errb.String() != "spool: message 2 not published: MESSAGE_TOO_LARGE: too big\n" {
		t.Fatalf("stderr %q", errb.String())
	}
	p.sent = 4
	p.finish(false)
	if !strings.Contains(errb.String(), "published 3 messages to t in ") || !strings.HasSuffix(errb.String(), "; 1 failed\n") {
		t.Fatalf("summary %q", errb.String())
	}
	if p.firstErr == nil || !errors.Is(p.firstErr, protocol.ErrMessageTooLarge) {
		t.Fatalf("firstErr %v", p.firstErr)
	}
}

func TestTopicFlagsSendOnlyWhatIsGiven(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	cfg := addTopicConfigFlags(fs, false)
	if _, err := parseArgs(fs, []string{"--semantics", "pub-sub", "--max-retention", "30d", "--block-writes-on-zero-subscriptions=false",
		"--completion-tracking", "WATERMARK", "--partitions", "4", "--max-backlog-messages", "0", "--backlog-policy", "Throttle",
		"--zombie-ttl", "2d", "--max-messages", "1000", "--size-policy", "Drop-Oldest"}); err != nil {
		t.Fatal(err)
	}
	body, err := cfg.body(fs)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"semantics": "PUB_SUB", "max_retention": "720h0m0s", "block_writes_on_zero_subscriptions": false,
		"completion_tracking": "watermark", "partitions": 4, "max_backlog_messages": int64(0), "backlog_policy": "throttle",
		"zombie_ttl": "48h0m0s", "max_messages": int64(1000), "size_policy": "drop_oldest"}
	if len(body) != len(want) {
		t.Fatalf("body %v, want %v", body, want)
	}
	for k, v := range want {
		if body[k] != v {
			t.Fatalf("body[%s] = %v, want %v (body %v)", k, body[k], v, body)
		}
	}
	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg = addTopicConfigFlags(fs, true)
	if _, err := parseArgs(fs, []string{"--semantics", "fanout"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cfg.body(fs); err == nil {
		t.Fatal("--semantics fanout: want an error")
	}
	for _, name := range []string{"ack-wait", "message-retention", "zero-subscription-retention", "max-retention", "zombie-ttl"} {
		if err := fs.Set(name, "2w"); err == nil {
			t.Errorf("--%s 2w: want an error", name)
		}
	}
}

// TestUsage checks every command's -h (exit 0, flags and an example) and usage errors (exit 2 with
// the usage), without a broker: nothing is dialled before the arguments are checked.
func TestUsage(t *testing.T) {
	t.Parallel()
	s := &cliStack{addr: "127.0.0.1:1", httpURL: "http://127.0.0.1:1"}
	for _, args := range [][]string{
		{"pub", "-h"}, {"sub", "-h"}, {"topic", "create", "-h"}, {"topic", "list", "-h"}, {"topic", "describe", "-h"},
		{"topic", "update", "-h"}, {"topic", "delete", "-h"}, {"group", "list", "-h"}, {"group", "describe", "-h"},
		{"group", "pause", "-h"}, {"group", "resume", "-h"}, {"group", "cancel", "-h"}, {"dlq", "list", "-h"},
		{"dlq", "replay", "--help"}, {"dlq", "purge", "-h"}, {"dlq", "inspect", "-h"}, {"group", "rebalance", "-h"},
	} {
		r := s.run(t, "", args...)
		name := strings.Join(args[:len(args)-1], " ")
		if r.code != 0 || !strings.HasPrefix(r.stderr, "Usage: spool "+name+" ") || !strings.Contains(r.stderr, "\nFlags:\n") ||
			!strings.Contains(r.stderr, "\nExamples:\n  spool "+name) {
			t.Errorf("spool %s: %v", strings.Join(args, " "), r)
		}
	}
	for _, args := range [][]string{{"topic", "-h"}, {"group", "help"}, {"dlq", "--help"}} {
		if r := s.run(t, "", args...); r.code != 0 || !strings.Contains(r.stderr, "Commands:\n") {
			t.Errorf("spool %s: %v", strings.Join(args, " "), r)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"pub"}, "spool: pub: missing <topic>\n\nUsage: spool pub "},
		{[]string{"pub", "--count", "0", "t", "x"}, "spool: pub: --count must be at least 1, got 0\n\nUsage: spool pub "},
		{[]string{"pub", "--count", "2", "t"}, "stdin lines are published once each"},
		{[]string{"pub", "--file", "f", "t", "x"}, "give payload arguments or --file, not both"},
		{[]string{"pub", "--header", "novalue", "t", "x"}, `invalid value "novalue" for flag -header: want k=v`},
		{[]string{"sub", "--from", "yesterday", "t"}, "spool: sub: --from \"yesterday\": want beginning, now"},
		{[]string{"sub", "a", "b"}, `spool: sub: unexpected arguments ["b"]`},
		{[]string{"sub", "--concurrency", "0", "t"}, "--concurrency must be between 1"},
		{[]string{"topic"}, "spool: topic: missing command\n\nUsage: spool topic <command>"},
		{[]string{"topic", "rename"}, `spool: topic: unknown command "rename"`},
		{[]string{"topic", "create"}, "spool: topic create: missing <topic>\n\nUsage: spool topic create "},
		{[]string{"topic", "create", "t", "--ack-wait", "soon"}, `invalid value "soon" for flag -ack-wait`},
		{[]string{"topic", "create", "t", "--semantics", "fanout"}, `--semantics must be QUEUE or PUB_SUB, got "fanout"`},
		{[]string{"topic", "update", "t"}, "topic update: nothing to change"},
		{[]string{"topic", "list", "--http", "ftp://x:1"}, "scheme must be http or https"},
		{[]string{"group", "describe"}, "spool: group describe: missing <topic>"},
		{[]string{"group", "pause", "t", "g", "extra"}, `unexpected arguments ["extra"]`},
		{[]string{"dlq", "replay", "t", "g"}, "missing <topic> <group> and entry ids (or --all)"},
		{[]string{"dlq", "purge", "t", "g", "x1"}, `dlq purge: entry id "x1" is not a positive integer`},
		{[]string{"dlq", "list", "t", "--limit", "-1"}, "must not be negative"},
	} {
		r := s.run(t, "", tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) || !strings.Contains(r.stderr, "Usage: spool ") || r.stdout != "" {
			t.Errorf("spool %s: want exit 2 and %q, got %v", strings.Join(tc.args, " "), tc.want, r)
		}
	}
}

// TestUsageExitStatusOfOtherCommands: a bad flag or argument of migrate, bench and token exits
// with status 2, as those of the client commands; -h with 0, another error with 1.
func TestUsageExitStatusOfOtherCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var out, errOut bytes.Buffer
	bench := func(args ...string) error { return benchMain(ctx, args, &out, &errOut) }
	for _, c := range []struct {
		name string
		err  error
		want int
	}{
		{"serve --bogus", serve(ctx, []string{"--bogus"}), 2},
		{"serve extra", serve(ctx, []string{"extra"}), 2},
		{"migrate --bogus", migrate(ctx, []string{"--bogus"}), 2},
		{"migrate extra", migrate(ctx, []string{"extra"}), 2},
		{"bench", bench(), 2},
		{"bench fast", bench("fast"), 2},
		{"bench e2e --bogus", bench("e2e", "--bogus"), 2},
		{"bench e2e --rate x", bench("e2e", "--rate", "x"), 2},
		{"bench publish extra", bench("publish", "extra"), 2},
		{"bench floor --bogus", bench("floor", "--bogus"), 2},
		{"bench floor extra", bench("floor", "extra"), 2},
		{"bench scenario", bench("scenario"), 2},
		{"bench scenario chaos", bench("scenario", "chaos"), 2},
		{"bench scenario isolation --bogus", bench("scenario", "isolation", "--bogus"), 2},
		{"bench scenario isolation extra", bench("scenario", "isolation", "extra"), 2},
		{"bench e2e -h", bench("e2e", "-h"), 0},
		{"bench e2e --size 10", bench("e2e", "--size", "10"), 1},
		{"token make", tokenRun([]string{"make"}, strings.NewReader(""), &out, &errOut), 2},
		{"token", tokenRun(nil, strings.NewReader(""), &out, &errOut), 2},
		{"token hash, no token", tokenRun([]string{"hash"}, strings.NewReader(""), &out, &errOut), 1},
	} {
		var stderr bytes.Buffer
		if got := exitCode(c.err, &stderr); got != c.want {
			t.Errorf("spool %s: exit %d (%v), want %d", c.name, got, c.err, c.want)
		}
	}
	var stderr bytes.Buffer // the usage goes to os.Stderr, migrate's flag set's output
	if exitCode(migrate(ctx, []string{"extra"}), &stderr); stderr.String() != "spool: migrate: unexpected arguments [\"extra\"]\n\n" {
		t.Errorf("migrate extra printed %q", stderr.String())
	}
}

// TestStartupLogNamesTheEngine: with --store postgres://... the "spool serving" line names the
// store (without its password), not the data_dir it does not use.
func TestStartupLogNamesTheEngine(t *testing.T) {
	t.Parallel()
	cfg := config.Defaults()
	if a := engineAttr(cfg); a.Key != "data_dir" || a.Value.String() != "./spool-data" {
		t.Errorf("embedded engine: %v", a)
	}
	cfg.Store = "postgres://spool:secret@db:5432/spool"
	if a := engineAttr(cfg); a.Key != "store" || a.Value.String() != "postgres://spool:***@db:5432/spool" {
		t.Errorf("PostgreSQL engine: %v", a)
	}
}
