-- 0019: buckets being dropped. Retention removes a bucket from spool.buckets, then detaches and
-- drops its table outside any transaction (DETACH PARTITION CONCURRENTLY, which waits for every
-- transaction older than it). An instance that stopped in between left the table behind for good:
-- unlisted, so no retention run dropped it, and a publish in its time range was refused as
-- "being detached" forever. Now the bucket's row moves here in the transaction that removes it
-- and goes once the table is dropped or attached again; a row whose instance is gone from
-- spool.instances is finished by another instance's retention.
CREATE TABLE spool.bucket_drops (
    name     text COLLATE "C" PRIMARY KEY,
    start_at timestamptz NOT NULL,
    end_at   timestamptz NOT NULL,
    instance uuid NOT NULL
);
