// Package metrics holds Spool's Prometheus metrics: one Metrics struct created with
// New(registerer) and passed down (no globals, no init registration, STYLE.md C20).
//
// # Two kinds of metrics
//
// Hook metrics are counters and histograms that the code which sees an event updates through the
// methods of Metrics (ObservePublish, ObserveDelivery, ObserveAck, ObserveNack, ObserveRetention,
// ObserveFsync, ConnectionOpened, ObserveHTTPRequest, ...). They count what this process did. Every method is
// safe for concurrent use, cheap (an atomic add or a histogram observation after a label lookup)
// and a no-op on a nil *Metrics, so callers with optional metrics need no checks.
//
// Broker metrics are read from the broker when Prometheus scrapes (RegisterBroker): topics,
// subscriptions and their statistics. They describe the state of the topics and subscriptions,
// which on PostgreSQL is shared by every broker instance: every instance reports the same values,
// so aggregate them across instances with max(), not sum(). A scrape costs one Broker.Topics and
// one Broker.Groups call: a few engine calls per topic and per subscription (sparse state, no work
// per message) and short read locks; scrapes are serialized and bounded by a timeout. A scrape
// has 7 series per topic and 10 per (topic, group) (4 of them spool_subscription_state):
// 10,000 topics with 12,000 subscriptions give 170,000 series and 9.5 MB of text; on the embedded
// engine reading the broker takes 35 ms of the scrape's 0.4 s, the rest is building and encoding
// the series (internal/admin/scale_test.go), and publishes are not held up meanwhile.
//
// # Names
//
// The three figures seed 002 names keep their names: queue_depth{topic}, consumer_lag{topic,group}
// and message_throughput{topic}. Everything else is spool_-prefixed, with Prometheus naming (unit
// suffixes, _total for counters). Labels are bounded: topic and group at most (never a message key
// or id), plus protocol, state, route and code, which take a fixed set of values.
//
// Group label values: a durable group's name; "$queue" for the one subscription of a QUEUE topic;
// "$ephemeral" for the ephemeral subscriptions of members without a group on a PUB_SUB topic (the
// engine names each one "$ephemeral-<id>"; they are aggregated into one series per topic so that
// short-lived subscribers do not create unbounded series). Hook methods take the group of the
// subscription as it names itself (broker.Member.SubscriptionGroup: "$queue", "$ephemeral-<id>"
// or the durable group, not the group a member subscribed with, which is empty for a member
// without a group and may be any name on a QUEUE topic) and apply the same folding of
// "$ephemeral-<id>", so that hook and broker metrics of a subscription carry the same labels.
//
// # Metric reference
//
// Broker metrics (scrape time, RegisterBroker):
//
//	queue_depth{topic}                        gauge    messages of the topic not yet done by its consumers: for a QUEUE topic
//	                                                   the pending count of its queue subscription; for a PUB_SUB topic the
//	                                                   largest pending count over its ACTIVE and PAUSED subscriptions (the group
//	                                                   furthest behind; 0 without one). DEAD and CANCELLED subscriptions hold no
//	                                                   retention and are left out; their figures are in spool_subscription_*.
//	consumer_lag{topic,group}                 gauge    messages never delivered to the subscription (high-water mark minus cursor,
//	                                                   summed over partitions): how far the group's cursor is behind the head.
//	                                                   Messages delivered but not yet acked are in spool_subscription_in_flight,
//	                                                   everything not done in spool_subscription_pending.
//	message_throughput{topic}                 counter  messages ever appended to the topic: the sum of its partitions' high-water
//	                                                   marks, read from the log. A counter, not a rate: Prometheus computes the
//	                                                   rate over any window with rate(message_throughput[1m]) (the seed's 1, 5 and
//	                                                   15 minute EWMA windows become [1m], [5m], [15m]), a gauge of a rate computed
//	                                                   here would fix one window and lose what happened between scrapes. Read from
//	                                                   the log it counts every publish (TCP, HTTP, in-process, other broker
//	                                                   instances) and survives restarts; it restarts at 0 only when the topic is
//	                                                   deleted and created again, which rate() treats as a counter reset.
//	spool_topic_messages{topic}               gauge    retained messages (high-water mark minus first retained offset).
//	spool_topic_bytes{topic}                  gauge    bytes of the topic's log segments.
//	spool_topic_size_bound_exceeded{topic}    gauge    for a topic with max_messages or max_bytes: 1 while it holds more than
//	                                                   that (what its size bound may not remove because an ACTIVE or PAUSED group
//	                                                   still needs it, or what came since the last retention run), else 0;
//	                                                   absent without a bound.
//	spool_topic_partitions{topic}             gauge    partitions.
//	spool_topic_subscriptions{topic}          gauge    subscriptions that are not DELETED (durable and ephemeral).
//	spool_topic_members{topic}                gauge    members of this broker attached to the topic.
//	spool_subscription_state{topic,group,state} gauge  1 for the subscription's state, 0 for the other states (ACTIVE, PAUSED,
//	                                                   DEAD, CANCELLED); for "$ephemeral" the number of ephemeral subscriptions in
//	                                                   each state.
//	spool_subscription_pending{topic,group}   gauge    messages not yet done: never delivered, leased, or waiting for redelivery.
//	spool_subscription_in_flight{topic,group} gauge    leased messages.
//	spool_subscription_redelivering{topic,group} gauge messages waiting for their redelivery backoff or ready for redelivery.
//	spool_subscription_dead_lettered{topic,group} gauge entries in the subscription's dead-letter queue.
//	spool_subscription_members{topic,group}   gauge    members of this broker attached to the subscription.
//	spool_topic_backpressure_state{topic}     gauge    for a topic with a backlog bound (max_backlog_messages/_bytes): 0 normal,
//	                                                   1 throttled (publishes delayed), 2 rejecting (publishes refused
//	                                                   RATE_LIMITED); read every broker backpressure refresh (1 s).
//	spool_topic_backlog_messages{topic}       gauge    that topic's backlog: messages not done by its slowest ACTIVE subscription.
//	spool_publishes_throttled_total{topic}    counter  publishes delayed by the topic's backpressure since the broker started.
//	spool_publishes_rejected_total{topic}     counter  publishes refused by the topic's backpressure since the broker started.
//	spool_broker_members                      gauge    live members (consumers) of this broker.
//	spool_broker_up                           gauge    1 if the broker answered the scrape, 0 if not (stopped, engine closed,
//	                                                   timeout); the broker metrics above are absent when 0.
//	spool_storage_full                        gauge    1 while publishes are refused because the storage is out of
//	                                                   space (from a publish refused with STORAGE_FULL until one is
//	                                                   stored again, or 10 s after the last refusal; /readyz
//	                                                   answers 503 STORAGE_FULL meanwhile).
//	spool_metrics_collect_duration_seconds    gauge    how long reading the broker took at this scrape.
//	spool_metrics_collect_errors_total        counter  scrapes at which reading the broker failed.
//
// Hook metrics (updated by the server, the admin API, the broker's retention job and the engine
// through Metrics' methods):
//
//	spool_messages_published_total{topic}           counter   messages this process accepted (ObservePublish).
//	spool_publish_duration_seconds                  histogram duration of a publish call, including the fsync (ObservePublish).
//	spool_publish_errors_total{code}                counter   failed publish calls by protocol error name (ObservePublishError), also
//	                                                          those refused before the broker (authentication, request body,
//	                                                          validation); over HTTP the code of the error answer, which may be
//	                                                          one of HTTP's own (UNSUPPORTED_MEDIA_TYPE, FORBIDDEN).
//	spool_messages_delivered_total{topic,group}     counter   deliveries handed to consumers (ObserveDelivery).
//	spool_messages_redelivered_total{topic,group}   counter   of those, deliveries with attempt > 1.
//	spool_end_to_end_latency_seconds{topic}         histogram from publish time to the first delivery to a consumer.
//	spool_messages_acked_total{topic,group}         counter   acked deliveries (ObserveAck).
//	spool_messages_nacked_total{topic,group}        counter   nacked deliveries (ObserveNack), TCP and HTTP alike: those given back for
//	                                                          redelivery and those the nack dead-lettered (to_dlq, the last attempt, a
//	                                                          poison rule). Summed over the instances: the groups' `failed` figure.
//	spool_messages_dead_lettered_total{topic,group} counter   messages dead-lettered through this process, with the engine's counts: by
//	                                                          a nack (ObserveNack: to the DLQ, on the last attempt, a poison rule), by a
//	                                                          claim that found a lease expired on the max_deliveries-th delivery (when
//	                                                          the subscription's next claim after the deadline runs, on whichever
//	                                                          instance makes it), by a member of this process leaving with leases on
//	                                                          their last attempt, by a rebalance of an ordered group this process
//	                                                          stored that moved partitions with leases on their last attempt
//	                                                          (storage.SubscriptionAssignResult.DeadLettered), and by the embedded
//	                                                          engine's open after a restart, for the leases it lost on their last
//	                                                          attempt (storage.Engine.DLQRecovered, counted once when the broker
//	                                                          starts) (ObserveDeadLettered, wired to broker.Config.OnDeadLettered).
//	                                                          On PostgreSQL: sum() across instances. Every entry, whatever put it
//	                                                          there, is also in spool_subscription_dead_lettered (the DLQ size).
//	spool_messages_expired_total{topic,reason}      counter   messages the retention job of this process removed while a subscription
//	                                                          (ACTIVE, PAUSED or DEAD) had not completed them (ObserveRetention, wired
//	                                                          to broker.Config.OnRetention): the removals invariant 1 requires to count.
//	                                                          reason is the rule that removed them, the first that applies:
//	                                                          max_retention (older than max_retention), zero_subscription (no
//	                                                          subscription held retention, a DEAD one had not completed them, older
//	                                                          than zero_subscription_retention), dead_subscription (every ACTIVE and
//	                                                          PAUSED subscription had completed them, a DEAD one had not, older than
//	                                                          message_retention), size (the topic was above max_messages or max_bytes:
//	                                                          a DEAD subscription, or with size_policy drop_oldest any, had not
//	                                                          completed them), topic_deleted (PostgreSQL: committed transactional
//	                                                          publishes not yet sequenced, removed by a forced topic delete or by the
//	                                                          sequencer of this process; reported with its next retention run).
//	                                                          Expiries of a topic this process has forgotten (deleted: always so
//	                                                          for topic_deleted) count under topic "$deleted".
//	                                                          Completed messages that retention deletes, messages
//	                                                          no subscription needed and expired DLQ entries are not counted. On
//	                                                          PostgreSQL each topic's run is done by one instance: sum() across
//	                                                          instances.
//	spool_zombie_messages_total{topic,group}        counter   messages a subscription holding retention (ACTIVE or PAUSED) gave up
//	                                                          because the retention job of this process force-advanced its ack floor,
//	                                                          which had not moved for longer than the topic's zombie_ttl
//	                                                          (ObserveRetention; the broker logs a WARN naming the group). They are
//	                                                          never delivered to it; not removals (retention deletes them later as
//	                                                          completed). On PostgreSQL: sum() across instances.
//	spool_retention_size_removed_total{topic}       counter   messages the retention job of this process removed because their topic
//	                                                          was above max_messages or max_bytes, oldest first: completed ones, and
//	                                                          with size_policy drop_oldest needed ones (those are also expired with
//	                                                          reason size). On PostgreSQL: sum() across instances.
//	spool_storage_available_bytes                   gauge     bytes available on the file system of the embedded engine's data
//	                                                          directory, statfs at scrape time (RegisterDiskSpace; absent on PostgreSQL).
//	spool_storage_size_bytes                        gauge     size of that file system.
//	spool_wal_dlq_held_bytes                        gauge     bytes of dead-lettered messages the embedded engine keeps in memory
//	                                                          because their DLQ logs could not make their next segment (a full
//	                                                          disk; past 64 MiB the engine stops), read at scrape time
//	                                                          (RegisterWAL; absent on PostgreSQL).
//	spool_wal_open_files                            gauge     segment files the embedded engine holds open, read at scrape time
//	                                                          (RegisterWAL; absent on PostgreSQL).
//	spool_wal_max_open_files                        gauge     its bound, wal.max_open_files.
//	spool_wal_open_files_shed_total                 counter   idle segment files it closed because an open failed for lack of
//	                                                          descriptors (EMFILE, ENFILE) under that bound: the process's other
//	                                                          descriptors (connections) reached ulimit -n.

//	spool_subscriptions_dead_total{topic}           counter   subscriptions the lifecycle job of this process made DEAD (no live member
//	                                                          for their heartbeat timeout) (ObserveLifecycle, wired to
//	                                                          broker.Config.OnLifecycle).
//	spool_subscriptions_resurrected_total{topic}    counter   DEAD subscriptions this process made ACTIVE again: a member attaching (or
//	                                                          its heartbeat), or an admin resume or resurrect.
//	spool_subscriptions_deleted_total{topic}        counter   CANCELLED subscriptions made DELETED after subscription_retention, or at
//	                                                          once by an admin group removal: what remains of them beside the log
//	                                                          line, since they leave every listing.
//	spool_messages_force_completed_total{topic,group} counter messages an admin force-complete completed for a group without the group
//	                                                          processing them (ObserveForceComplete, wired to
//	                                                          broker.Config.OnForceComplete; a topic's force-complete
//	                                                          covers its ephemeral groups, as "$ephemeral").
//	spool_messages_filtered_total{topic,group}      counter   messages completed for a subscription without a delivery because no
//	                                                          member's filter matched them (ObserveFiltered, wired to
//	                                                          broker.Config.OnFiltered; ephemeral groups as "$ephemeral").
//	spool_rebalances_total{topic,group}             counter   rebalances of ordered groups this process stored (ObserveRebalance, wired
//	                                                          to broker.Config.OnRebalance); each incremented the group's generation.
//	spool_rebalance_duration_seconds{topic}         histogram from a rebalance's start to its assignment stored (no debounce).
//	spool_group_generation{topic,group}             gauge     generation of an ordered group as last stored by this process.
//	spool_cleanup_job_runs_total{task}              counter   runs of a cleanup job of this process (broker.CleanupJobs, read at each
//	                                                          scrape): task="retention" (message cleanup) or "subscription_lifecycle"
//	                                                          (dead detection, CANCELLED -> DELETED).
//	spool_cleanup_job_failures_total{task}          counter   failed runs (at 0 from the broker's start, so that increase() sees the
//	                                                          first failure; the alert rules read it).
//	spool_cleanup_job_removed_total{task}           counter   messages (retention) or subscriptions made DEAD or DELETED (lifecycle).
//	spool_cleanup_job_last_duration_seconds{task}   gauge     duration of the last run.
//	spool_cleanup_job_last_success_timestamp_seconds{task} gauge start of the last successful run (Unix time, 0: none).
//	spool_cleanup_job_behind{task}                  gauge     1 when the job falls behind (seed 000's CRITICAL rule: no successful run for 3
//	                                                          intervals, a run longer than its interval, or a backlog that grew at each of
//	                                                          the last 3 runs; /readyz says so in detail).
//	spool_cleanup_job_backlog{task}                 gauge     what the job could remove now and has not, after its last successful run:
//	                                                          retention, messages in whole segments or buckets (storage.RetentionResult.
//	                                                          Backlog; seed 000's cleanupBacklog, WARNING above 1,000,000); lifecycle, 0.
//	spool_backfill_missed_messages_total{reason}    counter   messages groups will not get: "bound" (a backfill range cut to
//	                                                          max_backfill_messages, the newest kept), "skipped" (cancel with skip,
//	                                                          resurrect without backfill); each is also logged (broker.BackfillCounters).
//	spool_backfill_messages_total                   counter   backfill range messages claimed by this process.
//	spool_backfill_failures_total                   counter   backfills this process made FAILED (range claims kept failing; logged).
//	spool_backfill_processed_messages{topic,group}  gauge     done messages of the range of a backfill this instance paces (its members
//	                                                          are here; broker.ActiveBackfills); spool_backfill_total_messages{topic,group}
//	                                                          its size, spool_backfill_rate{topic,group} messages/s measured,
//	                                                          spool_backfill_rate_limit{topic,group} the adaptive claim limit,
//	                                                          spool_backfill_in_progress{topic,group} 1 IN_PROGRESS, 0 held back,
//	                                                          spool_backfill_failed{topic,group} 1 FAILED (until resumed).
//	spool_wal_fsync_duration_seconds                histogram duration of a group-commit round of the embedded engine (ObserveFsync).
//	spool_wal_fsync_records                         histogram records made durable by one round (messages per fsync).
//	spool_connections{protocol}                     gauge     open client connections ("binary", "text", ...).
//	spool_connections_total{protocol}               counter   connections accepted.
//	spool_http_requests_total{route,code}           counter   HTTP requests by route pattern and status code.
//	spool_http_request_duration_seconds{route}      histogram HTTP request duration by route pattern.
//	spool_auth_denied_total{reason}                 counter   requests refused by authentication ("unauthenticated") or
//	                                                          authorization ("forbidden"), TCP and HTTP (ObserveAuthDenied).
//
// # Series of deleted topics and groups
//
// Hook series carry topic and group labels, so they must not outlive their topic or group (each
// would be exported forever, and the series grow with every name ever used). They are deleted on
// every instance (forget.go):
//
//   - a topic's series when the engine notifies the topic deleted (ObserveNotification, registered
//     by assemble.OpenEngine): at once on the instance that deleted it, within the notification
//     delay on the other PostgreSQL instances (NOTIFY, or the engine's postgres.poll_interval
//     poll when a notification is lost); the admin API's delete also calls ForgetTopic;
//   - at every scrape (RegisterBroker), the series of the topics and groups that the scrape's own
//     listings no longer have: groups have no notification, so a group's series go with its
//     subscription (DELETED: an admin removal, or subscription_retention after a cancel, here or
//     on another instance), as its spool_subscription_* series do. "$ephemeral" and a topic's
//     other series go with the topic. A series made after the listings began is left for the
//     next scrape. The sweep that forgets a series runs while that scrape is collected, so the
//     series may be in that scrape and is absent from the next.
//
// Observations of a forgotten topic (a delivery or ack that raced the deletion, expiries reported
// by the next retention run) do not make its series again until the instance learns the topic
// exists again (a notification that it was created, or a scrape's listing; at most an hour): they
// are dropped, except expiries, which count under topic "$deleted" (invariant 1). A topic that is
// deleted and created again under the same name starts its counters at 0 (rate() sees a reset).
// The cost is one lock-free map lookup per observation (per batch of deliveries) and, per
// scrape, sets of the listed topics and groups and one pass over those with series: small
// against the listings themselves at 10,000 topics.
//
// # Seed figures and what is missing
//
// Seed 000's monitoring figures per subscription (state, pending, in flight, dead-lettered,
// members) and per topic (messages, bytes, subscriptions) are the spool_subscription_* and
// spool_topic_* gauges; dead groups detected and subscriptions deleted are the
// spool_subscriptions_*_total counters; the retention job's backlog is spool_cleanup_job_backlog,
// its runs the other spool_cleanup_job_* series, messages it expired
// spool_messages_expired_total; backfill progress is spool_backfill_*. Not exported yet, because
// the broker and engine do not expose them: the age of a subscription's oldest unacked message
// (seed 002's "time lag"), last heartbeat per group (it is in the admin API's subscription
// record), processed counts per group since creation.
package metrics
