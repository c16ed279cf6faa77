-- 0013: per-key transactional batches (issue 17 item 4, storage.Message.Linked). messages.linked
-- marks a message after which a batch must not end: the next offset of its partition was written
-- by the same broker append and a key of that append's messages in the partition so far comes
-- again (storage.LinkRuns). Existing rows, and messages staged by transactional publishes
-- (spool.publish, PublishTx: each staged message is its own publish for batching), get false.
-- A constant default: PostgreSQL adds the column without rewriting the table; buckets created
-- later copy it (CREATE TABLE ... LIKE spool.messages).
ALTER TABLE spool.messages ADD COLUMN linked boolean NOT NULL DEFAULT false;
