-- 0005: the replayed DLQ entries of a subscription (spool.dlq rows with replay set), found without
-- reading the subscription's whole DLQ. Every delivery transaction loads some of them
-- (loadReplayedSQL: the leased ones, the waiting ones due first, and those at the positions its
-- acks, nacks and extends name) and SubscriptionStats counts them; through the primary key, a DLQ
-- of a million entries cost every claim and ack of its subscription a read of a million rows,
-- and a replay of that DLQ made a million replayed entries that every transaction read. The
-- entries in the DLQ (replay NULL) are not in these indexes, so dead-lettering does not maintain
-- them. (Built inside the migration's transaction: writes to spool.dlq wait until they are
-- built.)
CREATE INDEX dlq_replay_due ON spool.dlq (sub_id, replay, replay_due, id) WHERE replay IS NOT NULL;
CREATE INDEX dlq_replay_pos ON spool.dlq (sub_id, partition, "offset") WHERE replay IS NOT NULL;
