-- 0012: completion records of refcount topics (completion_tracking refcount, issue 18 item 4).
-- One row per (subscription, partition, run of offsets [lo, hi)): an ack or a dead-lettering is a
-- one-offset row written in the delivery transaction that made it (state 'acked' or
-- 'dead_lettered', at = that transaction's time); a subscription back from DEAD that skips the
-- messages completed while it was away writes one 'removed' row for the range its ack floor
-- passed (at = when it became DEAD; acked rows inside it take precedence), and the runs above it
-- that the others had completed out of order; a new subscription records such runs 'excluded'
-- (not in its set). The first record of an offset stays (ON CONFLICT DO NOTHING). Retention
-- deletes the rows below each partition's low_offset; the rows go with their topic. Watermark
-- topics write none.
CREATE TABLE spool.completions (
    sub_id    bigint NOT NULL,
    topic_id  bigint NOT NULL REFERENCES spool.topics (id) ON DELETE CASCADE,
    partition int NOT NULL,
    lo        bigint NOT NULL,
    hi        bigint NOT NULL CHECK (hi > lo),
    state     text NOT NULL CHECK (state IN ('acked', 'dead_lettered', 'removed', 'excluded')),
    at        timestamptz NOT NULL,
    PRIMARY KEY (sub_id, partition, lo)
);
CREATE INDEX completions_topic ON spool.completions (topic_id, partition, hi);
