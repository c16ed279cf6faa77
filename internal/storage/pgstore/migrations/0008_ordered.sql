-- 0008: ordered groups (storage.ModeOrdered, issue 17 item 3).
--
-- subscriptions.ordering holds the settings of an ORDERED subscription
-- ({"max_in_flight_per_partition": n, "strategy": s}); NULL for a shared one. It never changes.
--
-- sub_assignments holds the current partition assignment of an ORDERED subscription and its
-- generation (JSON storage.Assignment: members, partitions, the generation from which each
-- partition's owner owns it). SubscriptionAssign replaces it with a compare-and-set the database
-- enforces, so broker instances agree:
--   INSERT ... ON CONFLICT (sub_id) DO UPDATE ... WHERE sub_assignments.generation = <expected>
-- which changes no row (ErrStaleGeneration) when another instance assigned first. It runs under
-- the subscription's sub_partitions locks, like every delivery operation: a claim, ack, nack or
-- extend reads the assignment after taking them, so it is fenced by the assignment in force.
ALTER TABLE spool.subscriptions ADD COLUMN ordering jsonb;

CREATE TABLE spool.sub_assignments (
    sub_id     bigint PRIMARY KEY REFERENCES spool.subscriptions (id) ON DELETE CASCADE,
    generation bigint NOT NULL CHECK (generation > 0),
    assignment jsonb NOT NULL
);
