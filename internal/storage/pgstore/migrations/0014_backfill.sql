-- 0014: subscription backfill (issue 18). max_backfill is the subscription's
-- max_backfill_messages (0: the default, -1: unlimited); backfill is its current range
-- (storage.Backfill as JSON: state, per-partition start and end, total, skipped), NULL when it
-- never had one. Progress is not stored: it is the ack floors' distance into the range, so the
-- floors committed with each ack are the checkpoint.
ALTER TABLE spool.subscriptions
    ADD COLUMN max_backfill bigint NOT NULL DEFAULT 0 CHECK (max_backfill >= -1),
    ADD COLUMN backfill jsonb;
