package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spoolmq/spool/internal/bench"
	"github.com/spoolmq/spool/internal/tlsconf"
)

// modeScenario is spool bench scenario: seed 000's pre-GA tests against a running broker.
const modeScenario = "scenario"

// scenarioKillChild is the internal consumer child of kill-resurrect (spool re-executes itself).
const scenarioKillChild = "kill-child"

const scenarioUsage = `Usage: spool bench scenario <name> [flags]

Runs one of seed 000's pre-GA tests, scaled to one machine, against a running broker (spool serve,
through --addr and --http), prints its figures and one verdict per criterion against the seed's
target (PASS, FAIL, or INCONCLUSIVE when the run could not judge, with the reason), and the
scenario's outcome. docs/benchmarks.md says how to run each and what to read.

Scenarios:
  kill-resurrect  three groups (email, analytics, inventory) on one topic at --rate msg/s, each
                  with --heartbeat-timeout; inventory's consumer is a child process, SIGKILLed
                  after --live. Verdicts: inventory DEAD within the timeout plus the broker's
                  detection interval; email and analytics never blocked (p99 and max latency of
                  the whole run); storage while DEAD grows < 10% (DEAD does not hold retention);
                  after --dead-for a consumer comes back: inventory ACTIVE again, the messages it
                  gets that were published before its return (the backfill) within
                  --backfill-bound, in 5 min at most. Run the broker with a short
                  broker.retention_interval (and wal.segment_bytes) so that retention reaches a
                  steady size within --live.
  isolation       a --big-rate topic with --big-groups groups beside a --small-rate topic with
                  --small-groups groups (seed: 10,000 msg/s x 10 and 10 msg/s x 2). Verdicts: the
                  small topic's end-to-end p95 < 50 ms (p99 reported) and lag < 10 s; whether the
                  big topic kept up is reported (INCONCLUSIVE when it did not: isolation measured
                  under overload).
  fanout          PostgreSQL engine (--pg): one e2e run per --groups count (4,8,16,32,64) at
                  --rate msg/s, one consumer per group. Per count: WAL bytes per message and
                  MB/s, dead tuples, table bloat as each table's growth over the second half
                  of the measured window (< 20%; messages left out, growth under 1 MiB not
                  judged, INCONCLUSIVE when that half is under 2 min), the retention cleanup rate
                  against the production rate over the second half of the run (cleanup keeps
                  pace), the consumers kept up. --completion sets the topics' completion
                  tracking.

  backfill-oltp   PostgreSQL engine (--pg): pgbench (its own schema in the broker's database,
                  dropped at the end) at --tps (seed: 500) alone for --baseline, then for
                  --duration beside the backfill of a group created FROM_BEGINNING on a topic
                  seeded with --messages messages of --size bytes (seed: 5,000,000; the default
                  1,000,000 x 100 B fits a shared disk). Verdicts: pgbench's p95 while the
                  backfill runs < 100 ms (alone: reported), pgbench held its rate, the backfill
                  completed, and it throttled itself (its rate limit went down). A load spike,
                  a second pgbench without a rate limit (--spike long, --spike-clients), starts
                  2 s into the backfill and slows the database: the pacer must lower its rate
                  (pgbench's p95 verdict leaves the spike out; its figures are printed).
                  Without a spike (--spike 0) a database that never slowed the claims makes
                  that verdict INCONCLUSIVE. Prints the backfill's rate and rate limit every
                  --sample. The topic is deleted at the end.

Examples:
  spool bench scenario kill-resurrect --heartbeat-timeout 10s --live 2m --dead-for 2m
  spool bench scenario isolation --big-rate 10000 --big-groups 10 --duration 5m
  spool bench scenario fanout --pg postgres://spool@127.0.0.1/spool --groups 4,8,16 --rate 2000
  spool bench scenario backfill-oltp --pg postgres://spool@127.0.0.1/spool --messages 5000000

Flags:
`

// scenarioCommon are the flags of every scenario (and of the kill child).
type scenarioCommon struct {
	addr, admin                  *string
	tlsCA, tlsCert, tlsKey, tokF *string
	json                         *bool
}

func addScenarioCommon(fs *flag.FlagSet) *scenarioCommon {
	var addr, admin string
	benchConnFlags(fs, &addr, &admin, "creates and deletes the scenario's topics")
	return &scenarioCommon{
		addr:    &addr,
		admin:   &admin,
		tlsCA:   fs.String("tls-ca", "", "PEM file of the CA that signed the broker's certificate (connect with TLS)"),
		tlsCert: fs.String("tls-cert", "", "PEM client certificate for mutual TLS (with --tls-key)"),
		tlsKey:  fs.String("tls-key", "", "PEM private key of --tls-cert"),
		tokF:    fs.String("token-file", "", "file whose first line is the token of a broker with authentication ($"+envToken+" otherwise)"),
		json:    fs.Bool("json", false, "print the result as JSON instead of a summary"),
	}
}

// conn returns the TLS configuration and the token the flags give.
func (s *scenarioCommon) conn() (*tls.Config, string, error) {
	var tc *tls.Config
	if *s.tlsCA != "" || *s.tlsCert != "" || *s.tlsKey != "" {
		c, err := tlsconf.ClientConfig(*s.tlsCA, *s.tlsCert, *s.tlsKey)
		if err != nil {
			return nil, "", fmt.Errorf("bench scenario: %w", err)
		}
		tc = c
	}
	tok := os.Getenv(envToken)
	if *s.tokF != "" {
		t, err := readTokenFile(*s.tokF)
		if err != nil {
			return nil, "", fmt.Errorf("bench scenario: %w", err)
		}
		tok = t
	}
	return tc, tok, nil
}

// adminURL is --http, https:// for a host:port when a --tls-* flag is set.
func (s *scenarioCommon) adminURL() string {
	return benchAdminURL(*s.admin, *s.tlsCA != "" || *s.tlsCert != "" || *s.tlsKey != "")
}

// childArgs are the flags the kill child needs to reach the broker as this process does.
func (s *scenarioCommon) childArgs() []string {
	args := []string{"--addr", *s.addr}
	for _, f := range []struct {
		name string
		v    *string
	}{{"tls-ca", s.tlsCA}, {"tls-cert", s.tlsCert}, {"tls-key", s.tlsKey}, {"token-file", s.tokF}} {
		if *f.v != "" {
			args = append(args, "--"+f.name, *f.v)
		}
	}
	return args
}

// benchScenario is spool bench scenario <name>.
func benchScenario(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	usage := func(fs *flag.FlagSet) func() {
		return func() {
			fmt.Fprint(stderr, scenarioUsage)
			if fs != nil {
				fs.PrintDefaults()
			}
		}
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") || args[0] == "help" {
		usage(nil)()
		if len(args) > 0 {
			return flag.ErrHelp
		}
		return &usageError{msg: "bench scenario: give the scenario, kill-resurrect, isolation, fanout or backfill-oltp"} // usage printed
	}
	name := args[0]
	fs := flag.NewFlagSet("bench scenario "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = usage(fs)
	common := addScenarioCommon(fs)
	var run func(context.Context) (any, error)
	switch name {
	case bench.ScenarioKill:
		c := bench.KillConfig{}
		fs.Float64Var(&c.Rate, "rate", bench.DefaultKillRate, "publish rate of the topic (msg/s)")
		fs.IntVar(&c.Size, "size", bench.DefaultSize, "payload size in bytes (at least 24)")
		fs.DurationVar(&c.HeartbeatTimeout, "heartbeat-timeout", bench.DefaultKillHeartbeatTimeout, "the groups' heartbeat timeout (spool group create --heartbeat-timeout)")
		fs.DurationVar(&c.Live, "live", bench.DefaultKillLive, "time from the first message to the kill")
		fs.DurationVar(&c.DeadFor, "dead-for", bench.DefaultKillDeadFor, "time inventory stays down after its DEAD bound (heartbeat timeout plus detection interval) passed")
		fs.DurationVar(&c.After, "after", bench.DefaultKillAfter, "time after inventory's consumer came back")
		fs.DurationVar(&c.MessageRetention, "message-retention", bench.DefaultKillRetention, "message_retention of the topic")
		fs.DurationVar(&c.MaxRetention, "max-retention", 0, "max_retention of the topic (default: the broker's)")
		fs.Int64Var(&c.BackfillBound, "backfill-bound", bench.DefaultKillBackfillBound, "most messages published before the return the resurrected group may get (seed: 100,000)")
		fs.DurationVar(&c.Stall, "stall", bench.DefaultKillStall, "largest end-to-end latency of email and analytics that is not a stall")
		fs.DurationVar(&c.Sample, "sample", bench.DefaultKillSample, "interval of the storage and state series")
		fs.DurationVar(&c.Drain, "drain", bench.DefaultDrain, "longest wait for the last deliveries after the schedule")
		run = func(ctx context.Context) (any, error) {
			self, err := os.Executable()
			if err != nil {
				return nil, err
			}
			c.Addr, c.Admin = *common.addr, common.adminURL()
			if c.TLS, c.Token, err = common.conn(); err != nil {
				return nil, err
			}
			c.Child = append([]string{self, "bench", modeScenario, scenarioKillChild}, common.childArgs()...)
			return bench.RunKill(ctx, c)
		}
	case bench.ScenarioIsolation:
		c := bench.IsolationConfig{}
		fs.Float64Var(&c.BigRate, "big-rate", bench.DefaultIsolationBigRate, "publish rate of the big topic (msg/s)")
		fs.IntVar(&c.BigGroups, "big-groups", bench.DefaultIsolationBigGroups, "groups of the big topic")
		fs.IntVar(&c.BigConsumers, "big-consumers", 1, "consumers of each big group")
		fs.IntVar(&c.BigPublishers, "big-publishers", 1, "publishers of the big topic")
		fs.Float64Var(&c.SmallRate, "small-rate", bench.DefaultIsolationSmallRate, "publish rate of the small topic (msg/s)")
		fs.IntVar(&c.SmallGroups, "small-groups", bench.DefaultIsolationSmallGroups, "groups of the small topic")
		fs.IntVar(&c.Size, "size", bench.DefaultSize, "payload size in bytes (at least 24)")
		fs.DurationVar(&c.Duration, "duration", bench.DefaultDuration, "measured time")
		fs.DurationVar(&c.Warmup, "warmup", bench.DefaultWarmup, "warm-up, left out of every figure")
		run = func(ctx context.Context) (any, error) {
			c.Addr, c.Admin = *common.addr, common.adminURL()
			var err error
			if c.TLS, c.Token, err = common.conn(); err != nil {
				return nil, err
			}
			return bench.RunIsolation(ctx, c)
		}
	case bench.ScenarioFanout:
		c := bench.FanoutConfig{}
		groups := fs.String("groups", joinInts(bench.DefaultFanoutGroups), "group counts, one run each (comma-separated)")
		fs.Float64Var(&c.Rate, "rate", bench.DefaultFanoutRate, "publish rate (msg/s)")
		fs.StringVar(&c.Completion, "completion", "", "completion_tracking of the topics: watermark or refcount (default: the broker's, watermark)")
		fs.StringVar(&c.PGURL, "pg", "", "PostgreSQL URL of the broker's database (required)")
		fs.StringVar(&c.PGSchema, "pg-schema", bench.DefaultPGSchema, "the broker's PostgreSQL schema")
		fs.DurationVar(&c.PGSample, "pg-sample", bench.DefaultPGSample, "interval of the size series")
		fs.IntVar(&c.Size, "size", bench.DefaultSize, "payload size in bytes (at least 24)")
		fs.IntVar(&c.Publishers, "publishers", 1, "publishers")
		fs.DurationVar(&c.Duration, "duration", bench.DefaultFanoutDuration, "measured time of each run")
		fs.DurationVar(&c.Warmup, "warmup", bench.DefaultFanoutWarmup, "warm-up of each run")
		fs.DurationVar(&c.MessageRetention, "message-retention", bench.DefaultFanoutRetention, "message_retention of the topics")
		run = func(ctx context.Context) (any, error) {
			var err error
			if c.Groups, err = parseInts(*groups); err != nil {
				return nil, fmt.Errorf("bench scenario: --groups: %w", err)
			}
			c.Addr, c.Admin = *common.addr, common.adminURL()
			if c.TLS, c.Token, err = common.conn(); err != nil {
				return nil, err
			}
			return bench.RunFanout(ctx, c)
		}
	case bench.ScenarioOLTP:
		c := bench.OLTPConfig{}
		fs.StringVar(&c.PGURL, "pg", "", "PostgreSQL URL of the broker's database (required): pgbench runs there")
		fs.StringVar(&c.PGBench, "pgbench", "", "the pgbench binary (default: on PATH, else the newest /usr/lib/postgresql/*/bin/pgbench)")
		fs.Int64Var(&c.Messages, "messages", bench.DefaultOLTPMessages, "messages seeded, all backfilled (seed: 5,000,000)")
		fs.IntVar(&c.Size, "size", bench.DefaultOLTPSize, "payload size in bytes")
		fs.IntVar(&c.Partitions, "partitions", 4, "partitions of the topic")
		fs.IntVar(&c.Consumers, "consumers", 2, "consumers of the backfilling group")
		fs.Float64Var(&c.TPS, "tps", bench.DefaultOLTPTPS, "pgbench's fixed rate (pgbench -R)")
		fs.IntVar(&c.Clients, "clients", bench.DefaultOLTPClients, "pgbench's connections (pgbench -c)")
		fs.IntVar(&c.Scale, "scale", bench.DefaultOLTPScale, "pgbench's scale factor (pgbench -i -s)")
		fs.DurationVar(&c.Baseline, "baseline", bench.DefaultOLTPBaseline, "pgbench's run alone")
		fs.DurationVar(&c.Duration, "duration", bench.DefaultOLTPDuration, "pgbench's run beside the backfill")
		fs.DurationVar(&c.Timeout, "timeout", bench.DefaultOLTPTimeout, "longest wait for the backfill's end after pgbench's run")
		fs.DurationVar(&c.Sample, "sample", bench.DefaultOLTPSample, "interval of the backfill's progress series")
		fs.DurationVar(&c.Spike, "spike", bench.DefaultOLTPSpike, "length of the load spike (unthrottled pgbench) 2 s into the backfill; 0: none")
		fs.IntVar(&c.SpikeClients, "spike-clients", bench.DefaultOLTPClients, "the load spike's connections")
		run = func(ctx context.Context) (any, error) {
			c.Addr, c.Admin = *common.addr, common.adminURL()
			var err error
			if c.TLS, c.Token, err = common.conn(); err != nil {
				return nil, err
			}
			return bench.RunOLTP(ctx, c)
		}
	case scenarioKillChild:
		c := bench.KillChildConfig{}
		fs.StringVar(&c.Topic, "topic", "", "topic")
		fs.StringVar(&c.Group, "group", "", "group")
		if err := parseFlagsOnly(fs, args[1:]); err != nil {
			return err
		}
		var err error
		c.Addr = *common.addr
		if c.TLS, c.Token, err = common.conn(); err != nil {
			return err
		}
		return bench.RunKillChild(ctx, c, os.Stdin, stdout)
	default:
		usage(nil)()
		return &usageError{msg: fmt.Sprintf("bench scenario: unknown scenario %q: kill-resurrect, isolation, fanout or backfill-oltp", name)}
	}
	if err := parseFlagsOnly(fs, args[1:]); err != nil {
		return err
	}
	res, err := run(ctx)
	if err != nil {
		return err
	}
	if *common.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	return res.(interface{ WriteSummary(io.Writer) error }).WriteSummary(stdout)
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// parseInts reads a comma-separated list of counts from 1 to 1000.
func parseInts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 1000 {
			return nil, fmt.Errorf("want counts from 1 to 1000, got %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}
