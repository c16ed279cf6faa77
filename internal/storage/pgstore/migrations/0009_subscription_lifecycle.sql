-- 0009: subscription lifecycle (seed 000). heartbeat_timeout_ms is how long an ACTIVE
-- subscription may go without a heartbeat (a live member on some broker instance) before
-- SubscriptionsMaintain makes it DEAD; last_heartbeat_at is the last heartbeat, written with the
-- database clock (now()) so that instances with skewed clocks agree. Existing subscriptions get
-- the default timeout and a heartbeat at the migration. The partial indexes keep the two
-- maintenance scans (ACTIVE past their timeout, CANCELLED past subscription_retention) off the
-- DELETED rows, which accumulate.
ALTER TABLE spool.subscriptions
    ADD COLUMN heartbeat_timeout_ms bigint NOT NULL DEFAULT 300000 CHECK (heartbeat_timeout_ms > 0),
    ADD COLUMN last_heartbeat_at timestamptz NOT NULL DEFAULT now();
CREATE INDEX subscriptions_heartbeat ON spool.subscriptions (last_heartbeat_at) WHERE state = 'ACTIVE';
CREATE INDEX subscriptions_cancelled ON spool.subscriptions (updated_at) WHERE state = 'CANCELLED';
-- sub_partitions.start_offset: the offset the subscription's start position resolved to in the
-- partition (0 for a partition added later). SubscriptionConfigure changes a start position only
-- while ack_floor and cursor are still there (no progress). NULL for rows made before this
-- migration: unknown, counted as progress.
ALTER TABLE spool.sub_partitions ADD COLUMN start_offset bigint;
ALTER TABLE spool.sub_partitions ALTER COLUMN start_offset SET DEFAULT 0;
