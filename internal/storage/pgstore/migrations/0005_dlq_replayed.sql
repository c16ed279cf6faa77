-- 0005: the replayed DLQ entries of a subscription (spool.dlq rows with replay set), which every
-- delivery operation loads (loadState) and SubscriptionStats counts, found without reading the
-- subscription's whole DLQ: through the primary key, a DLQ of a million entries cost every claim
-- and ack of its subscription a read of a million rows. Replayed entries are few (DLQReplay sets
-- them, their ack or a new dead-lettering takes them out), and the entries in the DLQ (replay
-- NULL) are not in this index, so dead-lettering does not maintain it. (Built inside the
-- migration's transaction: writes to spool.dlq wait until it is built.)
CREATE INDEX dlq_replayed ON spool.dlq (sub_id, id) WHERE replay IS NOT NULL;
