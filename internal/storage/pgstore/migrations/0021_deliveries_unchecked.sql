-- 0021: delivery rows without a foreign key check per insert.
-- A claim inserts its delivery rows while it holds their sub_partitions rows FOR UPDATE (the one
-- insert of spool.deliveries, deliveries.go queueSave, follows the load that locks them), so the
-- row a delivery row names exists and cannot go before the claim commits. The foreign key checked
-- that again for every row inserted (a SELECT ... FOR KEY SHARE through SPI): half of that insert's
-- execution and about a tenth of the database's statement time in a 16-group fan-out. What it did
-- besides is kept by a trigger: the delivery rows of a subscription partition go with it, also when
-- a subscription or topic is deleted (the cascade to sub_partitions fires it).
ALTER TABLE spool.deliveries DROP CONSTRAINT deliveries_sub_id_partition_fkey;

CREATE FUNCTION spool.sub_partition_gone() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
BEGIN
    DELETE FROM spool.deliveries WHERE sub_id = OLD.sub_id AND partition = OLD.partition;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER sub_partition_gone AFTER DELETE ON spool.sub_partitions
    FOR EACH ROW EXECUTE FUNCTION spool.sub_partition_gone();
