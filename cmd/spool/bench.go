package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/spoolmq/spool/internal/bench"
	"github.com/spoolmq/spool/internal/bench/floor"
	"github.com/spoolmq/spool/internal/tlsconf"
)

func init() {
	addCommand(command{name: "bench", summary: "measure publish throughput and end-to-end latency of a running broker", run: runBench})
}

const benchUsage = `Usage: spool bench <mode> [flags]

Measures a running broker (spool serve) over TCP with the Go client.

Modes:
  publish   closed loop: publishers send as fast as the broker acknowledges (synchronous, each
            waiting for its acknowledgement, or --async with a window); reports msg/s, MB/s and
            the publish latency percentiles
  e2e       open loop: publishes --rate msg/s on a fixed schedule whatever the broker does while
            the consumers consume: on a PUB_SUB topic --groups consumer groups of --consumers
            consumers (each group receives every message); on a QUEUE topic (--semantics QUEUE)
            one group, its --consumers consumers sharing the topic's one subscription. Latency
            runs from each message's intended send time to its receipt (no coordinated
            omission). Reports the achieved publish rate, the rate consumed while publishing and
            the backlog when publishing ended (did the consumers keep up), deliveries/s and
            p50/p90/p99/p99.9/max end-to-end latency
  floor     no broker: this machine's ceiling for --publishers synchronous publishers, each on its
            own connection, fsync before each answer (a minimal group-commit server in a child
            process, publishers in this one); reports msg/s and CPU per message. Divide the
            publish figures by it, measured in the same window (docs/benchmarks.md). With
            --store postgres://... the server commits each round into PostgreSQL instead (one
            statement: offsets from a head row, one row per message): the ceiling of a broker
            in front of that database
  scenario  seed 000's pre-GA tests against a running broker, each with verdicts against the
            seed's targets: kill-resurrect, isolation, fanout, backfill-oltp (spool bench
            scenario -h)

A run uses a fresh topic, created through the HTTP admin API (--http) as --semantics (PUB_SUB by
default) with --partitions and the retention overrides, and deleted afterwards; the warm-up is
left out of every figure.

With --pg (the broker's PostgreSQL database, spool serve --store postgres://...), the run also
reports the WAL written over the measured time and per message published (whole cluster), dead
tuples and the tuple counters of the tables of --pg-schema, and samples the schema's total size
and the partitions of <schema>.messages every --pg-sample (a series, to see the size stay flat
once retention drops partitions). Errors reading statistics are reported, not fatal.

Examples:
  spool bench e2e --rate 10000 --groups 1 --consumers 4
  spool bench e2e --rate 2000 --groups 16 --consumers 1
  spool bench e2e --semantics QUEUE --rate 20000 --consumers 4 --pg postgres://spool@127.0.0.1/spool
  spool bench e2e --rate 5000 --groups 16 --consumers 1 --duration 10m --message-retention 1m \
      --max-retention 2m --pg postgres://spool@127.0.0.1/spool
  spool bench publish --publishers 10 --clients 1
  spool bench publish --async
  spool bench floor --publishers 10 --duration 10s
  spool bench floor --publishers 10 --store postgres://spool@127.0.0.1/spool
  spool bench scenario kill-resurrect --heartbeat-timeout 10s
`

// benchModesHelp ends the help of spool bench without a mode: the modes' flags and defaults
// differ (publish runs synchronously for 10 s after 2 s of warm-up, e2e asynchronously for 30 s
// after 5 s), so each mode lists its own.
const benchModesHelp = `
Each mode has its own flags and defaults: spool bench publish -h, spool bench e2e -h,
spool bench floor -h, spool bench scenario -h.
`

// runBench is spool bench.
func runBench(ctx context.Context, args []string) error {
	return benchMain(ctx, args, os.Stdout, os.Stderr)
}

func benchMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == modeFloor {
		return benchFloor(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == modeScenario {
		return benchScenario(ctx, args[1:], stdout, stderr)
	}
	if len(args) == 0 || (args[0] != bench.ModePublish && args[0] != bench.ModeE2E) {
		fmt.Fprint(stderr, benchUsage+benchModesHelp)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			return flag.ErrHelp
		}
		return &usageError{msg: "bench: give the mode, publish, e2e, floor or scenario"} // usage printed
	}
	mode := args[0]
	bf := newBenchFlags(mode, stderr)
	if err := parseFlagsOnly(bf.fs, args[1:]); err != nil {
		return err
	}
	cfg := bf.config()
	if *bf.tlsCA != "" || *bf.tlsCert != "" || *bf.tlsKey != "" {
		tc, err := tlsconf.ClientConfig(*bf.tlsCA, *bf.tlsCert, *bf.tlsKey)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		cfg.TLS = tc
	}
	cfg.Admin = benchAdminURL(cfg.Admin, cfg.TLS != nil)
	cfg.Token = os.Getenv(envToken)
	if *bf.tokenFile != "" {
		tok, err := readTokenFile(*bf.tokenFile)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		cfg.Token = tok
	}
	if *bf.cpuProfile != "" {
		stop, err := startCPUProfile(*bf.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	res, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if *bf.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	return res.WriteSummary(stdout)
}

// benchFlags are the flags of one mode.
type benchFlags struct {
	fs         *flag.FlagSet
	cfg        bench.Config
	json       *bool
	cpuProfile *string
	tlsCA      *string
	tlsCert    *string
	tlsKey     *string
	tokenFile  *string
}

// startCPUProfile writes the load generator's CPU profile to path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("bench: cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("bench: cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

func newBenchFlags(mode string, out io.Writer) *benchFlags {
	fs := flag.NewFlagSet("bench "+mode, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(out, benchUsage+"\nFlags of spool bench "+mode+":\n")
		fs.PrintDefaults()
	}
	b := &benchFlags{fs: fs, cfg: bench.Config{Mode: mode}}
	c := &b.cfg
	duration, warmup := bench.DefaultDuration, bench.DefaultWarmup
	if mode == bench.ModePublish {
		duration, warmup = bench.DefaultPublishDuration, bench.DefaultPublishWarmup
	}
	benchConnFlags(fs, &c.Addr, &c.Admin, "creates and deletes the topic")
	fs.BoolVar(&c.NoAdmin, "no-admin", false, "do not use the HTTP admin API: the first publish auto-creates the topic (QUEUE; one group only)")
	fs.StringVar(&c.Topic, "topic", "", "topic to use (default: a fresh topic bench.<run id> of --semantics, deleted after the run); an existing one is used as it is")
	fs.IntVar(&c.Partitions, "partitions", bench.DefaultPartitions, "partitions of the topic the run creates")
	fs.BoolVar(&c.Keep, "keep", false, "keep the topic the run created")
	fs.StringVar(&c.Semantics, "semantics", bench.DefaultSemantics, "semantics of the topic the run creates, PUB_SUB or QUEUE (QUEUE: one group whose consumers share the topic's subscription)")
	fs.DurationVar(&c.MessageRetention, "message-retention", 0, "message_retention of the topic the run creates (default: the broker's)")
	fs.DurationVar(&c.MaxRetention, "max-retention", 0, "max_retention of the topic the run creates (default: the broker's)")
	fs.Int64Var(&c.MaxBacklogMessages, "max-backlog-messages", 0, "max_backlog_messages of the topic the run creates: publishes are throttled or refused as its slowest group falls behind (default: no bound)")
	fs.StringVar(&c.BacklogPolicy, "backlog-policy", "", "backlog_policy of the topic the run creates: reject or throttle (default: reject)")
	fs.StringVar(&c.Completion, "completion", "", "completion_tracking of the topic the run creates: watermark or refcount (default: the broker's, watermark)")
	fs.StringVar(&c.PGURL, "pg", "", "PostgreSQL URL of the broker's database: report WAL, dead tuples, tuple counters and a size series of --pg-schema")
	fs.StringVar(&c.PGSchema, "pg-schema", bench.DefaultPGSchema, "the broker's PostgreSQL schema (--pg)")
	fs.DurationVar(&c.PGSample, "pg-sample", bench.DefaultPGSample, "interval of the size series (--pg; at least 1s)")
	fs.IntVar(&c.Size, "size", bench.DefaultSize, "payload size in bytes (e2e: at least 24, the stamp)")
	fs.IntVar(&c.Publishers, "publishers", bench.DefaultPublishers, "publishing goroutines")
	fs.IntVar(&c.Clients, "clients", 0, "client connections the publishers share (default: one per publisher; 1: all share one)")
	fs.BoolVar(&c.Async, "async", mode == bench.ModeE2E, "publish with PublishAsync instead of waiting for each acknowledgement")
	fs.IntVar(&c.Window, "window", 1024, "PublishAsync window per client (--async)")
	fs.DurationVar(&c.Duration, "duration", duration, "measured time, after the warm-up")
	fs.DurationVar(&c.Warmup, "warmup", warmup, "warm-up before the measured time, left out of every figure (negative: none)")
	if mode == bench.ModePublish {
		fs.IntVar(&c.Batch, "batch", 1, "messages per synchronous publish request")
		fs.Int64Var(&c.Count, "count", 0, "publish this many messages in all (warm-up included) instead of running for --duration")
	} else {
		fs.Float64Var(&c.Rate, "rate", bench.DefaultRate, "target publish rate in msg/s, over all publishers (open loop)")
		fs.IntVar(&c.Groups, "groups", bench.DefaultGroups, "consumer groups (each receives every message)")
		fs.IntVar(&c.Consumers, "consumers", bench.DefaultConsumers, "consumers per group, one connection each")
		fs.IntVar(&c.MaxInFlight, "max-in-flight", bench.DefaultMaxInFlight, "credit of each consumer")
		fs.DurationVar(&c.SlowConsumer, "slow-consumer", 0, "time the consumers of the first group take over each message (a slow group, for backpressure runs)")
		fs.DurationVar(&c.Drain, "drain", bench.DefaultDrain, "longest wait for the last publish acknowledgements after the schedule; then the wait for the last deliveries ends after this long without one (at most 10x in all)")
	}
	b.tlsCA = fs.String("tls-ca", "", "PEM file of the CA that signed the broker's certificate (connect with TLS; default: the system's CAs)")
	b.tlsCert = fs.String("tls-cert", "", "PEM client certificate for mutual TLS (with --tls-key; connect with TLS)")
	b.tlsKey = fs.String("tls-key", "", "PEM private key of --tls-cert")
	b.tokenFile = fs.String("token-file", "", "file whose first line is the token of a broker with authentication ($"+envToken+" otherwise)")
	b.json = fs.Bool("json", false, "print the result as JSON instead of a summary")
	b.cpuProfile = fs.String("cpuprofile", "", "write the load generator's CPU profile (pprof) of the whole run to this file")
	return b
}

// benchConnFlags defines --addr and --http (and --admin, its earlier name) as the client
// commands do: $SPOOL_ADDR and $SPOOL_HTTP override the defaults. what says what the admin API is
// used for.
func benchConnFlags(fs *flag.FlagSet, addr, admin *string, what string) {
	defAddr, defHTTP := cmp.Or(os.Getenv(envAddr), bench.DefaultAddr), cmp.Or(os.Getenv(envHTTP), bench.DefaultAdmin)
	fs.StringVar(addr, "addr", defAddr, "TCP address of the broker ($"+envAddr+" overrides the default)")
	fs.StringVar(admin, "http", defHTTP, "the broker's HTTP admin API, a URL or host:port ("+what+"; $"+envHTTP+" overrides the default)")
	fs.StringVar(admin, "admin", defHTTP, "the same as --http (its earlier name)")
}

// benchAdminURL is the admin API's URL: a host:port (the form of $SPOOL_HTTP that spool serve
// also reads) means https:// with TLS, as for the other client commands.
func benchAdminURL(addr string, useTLS bool) string {
	if useTLS && !strings.Contains(addr, "://") {
		return "https://" + addr
	}
	return addr
}

// config returns the run's configuration (semantics in capitals); a zero warm-up means none.
func (b *benchFlags) config() bench.Config {
	c := b.cfg
	c.Semantics = strings.ToUpper(c.Semantics)
	if c.Warmup == 0 {
		c.Warmup = -time.Nanosecond
	}
	return c
}

// modeFloor is spool bench floor: the machine's ceiling, no broker.
const modeFloor = "floor"

// benchFloor is spool bench floor, and with --serve the server child it starts (spool bench floor
// --serve FILE runs itself).
func benchFloor(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench floor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, benchUsage+"\nFlags of spool bench floor:\n")
		fs.PrintDefaults()
	}
	c := floor.Defaults()
	fs.IntVar(&c.Publishers, "publishers", c.Publishers, "publishers, each on its own connection, each waiting for its answer")
	fs.IntVar(&c.Size, "size", c.Size, "payload bytes per message")
	fs.IntVar(&c.Batch, "batch", c.Batch, "messages per request (each publisher waits for its request's answer)")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "measured time")
	fs.DurationVar(&c.Warmup, "warmup", c.Warmup, "time before the measurement starts")
	fs.StringVar(&c.Dir, "dir", "", "directory of the server's file (default: a temporary directory)")
	fs.Int64Var(&c.FileSize, "file-size", c.FileSize, "size of the server's preallocated file; writes wrap around")
	fs.BoolVar(&c.Gather, "gather", c.Gather, "the committer waits for as many requests as its last round carried")
	fs.StringVar(&c.Store, "store", "", "a PostgreSQL URL: commit each round there (offsets from a head row, one row per message) instead of into a file")
	fs.StringVar(&c.Schema, "schema", c.Schema, "the schema of the --store tables (dropped and made again, dropped at the end)")
	fs.IntVar(&c.Committers, "committers", c.Committers, "with --store: rounds committed side by side, each on its own connection and head row (as partitions)")
	serveFile := fs.String("serve", "", "internal: run the server child on this file")
	fs.BoolVar(&c.StoreStdin, "store-stdin", false, "internal: the server child reads --store from the first line of stdin")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	if *serveFile != "" {
		return floor.Serve(c, *serveFile)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench floor: %w", err)
	}
	c.Child = []string{self, "bench", modeFloor}
	if err := floor.Run(c, stdout); err != nil {
		return fmt.Errorf("bench floor: %w", err)
	}
	return nil
}
