-- 0010: poison rules (seed 002 ACK-9, storage.PoisonRules). deliveries.failures is the failure
-- history (JSON array of {"m": member, "r": reason, "t": unix ns}, the last 5) that the offsets
-- of a row share, kept while the topic has a poison rule on; NULL otherwise. dlq.rule is the rule
-- that dead-lettered an entry ('' for none); dlq.failures its history when it died, or, while the
-- entry is replayed, the replayed copy's history. Existing rows get NULL and ''.
ALTER TABLE spool.deliveries ADD COLUMN failures jsonb;
ALTER TABLE spool.dlq
    ADD COLUMN rule text NOT NULL DEFAULT '',
    ADD COLUMN failures jsonb;
