-- 0002: delivery state (leases, redeliveries, out-of-order acks) and dead-letter queues.
-- Owned by deliveries.go / dlq.go; see doc.go for the design.

-- deliveries: the sparse delivery state of a subscription partition, one row per group of offsets
-- that share a state, an attempt count, a member and a due time: typically one row per claim batch
-- per partition. The state of an offset of the partition is:
--   * below sub_partitions.ack_floor: done;
--   * in [ack_floor, cursor): leased or waiting if a row lists it, done (acked, dead-lettered,
--     expired undelivered) otherwise;
--   * at or above cursor: never delivered, unless an 'acked' row lists it (acked before its
--     delivery; the cursor skips it).
-- state 'leased': member holds the offsets until due (the lease deadline, exclusive); 'waiting':
-- they are claimable again when due is reached (redelivery backoff, nack delay, NotBefore; member is
-- the member of the last delivery, attempt 0 for a NotBefore wait); 'acked': offsets at or above the
-- cursor that are done. Rows are disjoint; lo is the row's lowest offset (offsets sorted), so
-- least(cursor, min(lo)) is the partition's ack floor. Claims insert rows, acks shrink and delete
-- them, nacks and extends of a part of a row split it: a row is never written per message.
CREATE TABLE spool.deliveries (
    sub_id    bigint NOT NULL,
    partition int NOT NULL,
    lo        bigint NOT NULL,
    offsets   bigint[] NOT NULL,
    state     text NOT NULL CHECK (state IN ('leased', 'waiting', 'acked')),
    attempt   int NOT NULL,
    member    text NOT NULL DEFAULT '',
    due       timestamptz NOT NULL,
    PRIMARY KEY (sub_id, partition, lo),
    FOREIGN KEY (sub_id, partition) REFERENCES spool.sub_partitions (sub_id, partition) ON DELETE CASCADE
) WITH (fillfactor = 70);

-- dlq_ids numbers DLQ entries. A subscription's dead-lettering runs under its sub_partitions locks,
-- so its entries get increasing IDs in commit order.
CREATE SEQUENCE spool.dlq_ids;

-- dlq: dead-lettered messages, each with a copy of the message so that retention of the log never
-- removes it. An entry replayed by DLQReplay stays here (the copy is what is delivered again) with
-- replay set ('waiting' or 'leased', like spool.deliveries.state) until it is acked (deleted) or
-- dead-lettered again (a new id, replay NULL). Only rows with replay NULL are in the DLQ. The
-- entries belong to the subscription partition of their message: dropping a subscription's
-- delivery state (CANCELLED, deleted, its topic deleted) drops its DLQ, and the foreign key check
-- only locks a row the delivery operation holds already.
CREATE TABLE spool.dlq (
    sub_id         bigint NOT NULL,
    id             bigint NOT NULL,
    topic_id       bigint NOT NULL,
    partition      int NOT NULL,
    "offset"       bigint NOT NULL,
    published_at   timestamptz NOT NULL,
    key            bytea,
    headers        jsonb,
    payload        bytea NOT NULL,
    producer_id    text,
    not_before     timestamptz,
    expires_at     timestamptz,
    reason         text NOT NULL,
    attempts       int NOT NULL,
    last_error     text NOT NULL DEFAULT '',
    dead_at        timestamptz NOT NULL,
    replay         text CHECK (replay IN ('leased', 'waiting')),
    replay_attempt int NOT NULL DEFAULT 0,
    replay_member  text NOT NULL DEFAULT '',
    replay_due     timestamptz,
    PRIMARY KEY (sub_id, id),
    FOREIGN KEY (sub_id, partition) REFERENCES spool.sub_partitions (sub_id, partition) ON DELETE CASCADE
);

CREATE INDEX dlq_expiry ON spool.dlq (topic_id, dead_at) WHERE replay IS NULL;
