// Package bench is the load generator behind `spool bench`: it drives a running broker over TCP
// with the Go client and measures publish throughput and end-to-end latency.
//
// # Modes
//
//   - publish (closed loop): Publishers goroutines publish as fast as the broker acknowledges,
//     synchronously (each waits for its acknowledgement; Batch messages per request) or with
//     PublishAsync (each client's window bounds what is in flight), over Clients connections.
//     Reports msg/s, MB/s and the publish latency percentiles of the measured time.
//   - e2e (open loop): a fixed-rate schedule (Schedule) publishes Rate messages per second,
//     whatever the broker does, while the consumers consume: on a PUB_SUB topic, Groups consumer
//     groups of Consumers consumers each (one connection each), every group receiving every
//     message; on a QUEUE topic (Semantics), one group: its Consumers consumers subscribe without
//     a group and share the topic's one subscription, each message going to one of them. Every
//     message carries a stamp (run id, sequence number, intended send time) at the start of its
//     payload, and its end-to-end latency runs from its intended send time, not from when it was
//     actually sent, to its receipt by a consumer's handler: a broker that stalls delays the
//     messages due during the stall, and the stall shows in the percentiles (no coordinated
//     omission). Reports the achieved publish rate and whether the target was held, the rate
//     consumed while publishing (receipts from the end of the warm-up to the last publish
//     acknowledgement, the publish rate's time) and the backlog of the slowest group when
//     publishing ended (did the consumers keep up), deliveries/s, p50/p90/p99/p99.9/max
//     end-to-end latency, the publishers' latency (intended send time to acknowledgement), and the
//     sender's lag behind its schedule (the load generator's own share of the latency).
//
// Both run a warm-up that every figure leaves out. A run uses a fresh topic ("bench.<run id>"),
// created through the HTTP admin API (Semantics, PUB_SUB by default; Partitions; the
// MessageRetention and MaxRetention overrides) and deleted afterwards, unless told otherwise. An
// existing topic given by name is used as it is, its semantics read through the admin API.
//
// # Scenarios
//
// RunKill, RunIsolation, RunFanout and RunOLTP are seed 000's pre-GA tests (spool bench scenario): each
// drives the broker through a fixed scenario, built on the pieces above (the e2e stamp and
// recorders, Run itself for isolation and fan-out, the PostgreSQL statistics), and judges its
// figures against the seed's targets, one Verdict per criterion (scenario.go). Kill-and-resurrect
// runs the consumer it SIGKILLs in a child process (RunKillChild; spool re-executes itself);
// backfill against OLTP runs pgbench, in a schema of its own, beside a backfill (scenario_oltp.go).
//
// # PostgreSQL statistics
//
// With Config.PGURL (the database of a broker on the PostgreSQL engine), a pgMonitor on its own
// connection reads, for the measured window (end of the warm-up to the last publish
// acknowledgement): the WAL written (pg_current_wal_lsn, whole cluster) and per message
// published, pg_stat_wal records and full-page images, and per table of Config.PGSchema the
// n_tup_ins/upd/hot_upd/del and autovacuum deltas; at the end of the run (before the topic is
// deleted) dead and live tuples and sizes per table; and, every Config.PGSample, a series of the
// schema's total size (pg_total_relation_size, the partitions of <schema>.messages included),
// their number and the dead tuples, to see the size stay flat once retention drops partitions
// (PGResult). Errors reading statistics go into the result; the run goes on.
//
// # Memory
//
// Nothing grows per message: the histograms are fixed (58 KiB each), publishing is bounded by
// the async window (or one request per publisher), deliveries by each consumer's credit, and the
// receipt bookkeeping is one bit per scheduled message per group and one for the publish
// acknowledgements, allocated up front and bounded by Config.Validate (MaxSeenBytes; 6 MiB for
// 16 groups x 5,000 msg/s x 10 minutes). Result
// reports the process's peak RSS (LoadGenerator).
//
// # Percentiles
//
// Histogram is a log-linear histogram in the manner of HdrHistogram: 128 linear buckets per
// power of two, so quantiles are within 0.4% of the recorded values at any scale, in 58 KiB and
// without storing samples.
//
// # Pacing
//
// SystemClock sleeps with nanosleep(2) on a locked OS thread (timer slack 1 ns): the Go
// runtime's timers wake an idle process up to a millisecond late, which would add up to a
// millisecond of the load generator's own delay to every measured latency at 10,000 msg/s.
//
// # Concurrency
//
// Run is safe to call from several goroutines with different Configs (the isolation scenario
// runs two at once); each call owns every goroutine and client it starts and stops them before
// returning. Histogram is not safe for concurrent use.
package bench
