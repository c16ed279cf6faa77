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
//     whatever the broker does; Groups consumer groups of Consumers consumers each (one
//     connection each) receive them. Every message carries a stamp (run id, sequence number,
//     intended send time) at the start of its payload, and its end-to-end latency runs from its
//     intended send time, not from when it was actually sent, to its receipt by a consumer's
//     handler: a broker that stalls delays the messages due during the stall, and the stall shows
//     in the percentiles (no coordinated omission). Reports the achieved publish rate and whether
//     the target was held, deliveries/s, p50/p90/p99/p99.9/max end-to-end latency, the
//     publishers' latency (intended send time to acknowledgement), and the sender's lag behind
//     its schedule (the load generator's own share of the latency).
//
// Both run a warm-up that every figure leaves out. A run uses a fresh topic ("bench.<run id>"),
// created PUB_SUB through the HTTP admin API and deleted afterwards, unless told otherwise.
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
// Run is safe to call from one goroutine at a time per Config; it owns every goroutine and client
// it starts and stops them before returning. Histogram is not safe for concurrent use.
package bench
