-- 0016: member filters with several broker instances (SubscriptionMembersRenew). The liveness
-- rows of 0011 now cover members of shared subscriptions too, and say which broker instance
-- renews them and the member's filter ('' for none): an instance completes a message as
-- filtered only when no live member of any instance wants it (docs/storage.md). Member IDs are
-- unique per broker instance only (clients choose them), so a row is keyed by its instance too:
-- two instances' members of one ID keep a row each (an ordered group's member counts live while
-- either row is).
ALTER TABLE spool.sub_members
    ADD COLUMN instance text NOT NULL DEFAULT '',
    ADD COLUMN filter text NOT NULL DEFAULT '',
    DROP CONSTRAINT sub_members_pkey,
    ADD PRIMARY KEY (sub_id, instance, member);
