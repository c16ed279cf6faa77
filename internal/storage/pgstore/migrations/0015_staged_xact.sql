-- 0015: per-key batches for transactional publishes (issue 17 item 4). spool.staged.xact is the
-- staging transaction's id, so that the sequencer keeps one transaction's staged messages of a
-- partition consecutive and links its runs of one key (storage.LinkRuns): the messages of one
-- key that one transaction publishes are not split between batches, unless its rows of the
-- partition are taken by two sequencing transactions (the oldest 4,096 staged rows, 8 MiB: the
-- run is then split at that cut). The default fills it in
-- every insert (PublishTx, pgpublish, spool.publish) without changing them. Rows staged before
-- get the migration's id (they are sequenced as one transaction: harmless, spool.staged holds
-- only what waits for the next sequencing transaction).
ALTER TABLE spool.staged ADD COLUMN xact xid8 NOT NULL DEFAULT pg_current_xact_id();
