-- 0018: appends planned from a remembered topic are checked under the partition rows' lock.
-- A broker instance plans its appends from the topic configuration it read last (planAppend). Until
-- 0018 each such append locked the topic row FOR SHARE in its pipeline to check that the
-- configuration had not changed: a lock written into the topic row by every append (a multixact
-- when two of them overlap, as a lane's transactions do). Now each change of a topic's config
-- bumps topics.gen and copies it into the topic's partition rows, and the append's UPDATE of a
-- partition row (the lock every append takes anyway) requires the gen it planned with: a change
-- waits for the appends that hold a partition row, and an append that gets the row after a change
-- finds another gen, writes nothing (its INSERT takes only rows of the planned gen) and plans
-- again. A trigger does it so that every writer of a topic's config (older binaries, an
-- operator's SQL) bumps it.
ALTER TABLE spool.topics ADD COLUMN gen bigint NOT NULL DEFAULT 0;
ALTER TABLE spool.partitions ADD COLUMN gen bigint NOT NULL DEFAULT 0;

CREATE FUNCTION spool.topic_gen_bump() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
BEGIN
    NEW.gen := OLD.gen + 1;
    -- In partition order, as appends lock them: no deadlock with an append of several partitions,
    -- which then sees either the old gen on all its rows or the new one on all.
    PERFORM 1 FROM spool.partitions WHERE topic_id = NEW.id ORDER BY partition FOR UPDATE;
    UPDATE spool.partitions SET gen = NEW.gen WHERE topic_id = NEW.id;
    RETURN NEW;
END
$fn$;

CREATE TRIGGER topic_gen_bump BEFORE UPDATE OF config ON spool.topics
    FOR EACH ROW EXECUTE FUNCTION spool.topic_gen_bump();
