-- 0011: member liveness of ordered groups (Engine.SubscriptionMembersRenew). Each broker
-- instance renews a row per member of an ORDERED subscription connected to it, expires_at being
-- the database clock's now() plus the TTL (the broker's member session timeout); a member without
-- a row, or past its expires_at, counts as gone, and a surviving instance's rebalance leaves it
-- out of the assignment (sub_assignments), so the partitions of a crashed instance's members get
-- new owners. Expired rows are deleted by the renewals of their subscription (FOR UPDATE SKIP
-- LOCKED: a renewal never waits for another's deletion), all of a subscription's with it.
CREATE TABLE spool.sub_members (
    sub_id     bigint NOT NULL REFERENCES spool.subscriptions (id) ON DELETE CASCADE,
    member     text NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (sub_id, member)
);
