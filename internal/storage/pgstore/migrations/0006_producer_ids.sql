-- 0006: producer de-duplication (storage.Engine.MessagesAppend, topic setting dedup_window).
--
-- producer_ids remembers, per topic, the producer ids of the messages published within the
-- topic's dedup_window: the position of the message stored with the id, and when the id expires
-- (publish time + the window at that time). A publish claims its ids in the transaction that
-- stores the messages, before it takes offsets:
--   INSERT ... ON CONFLICT (topic_id, producer_id) DO UPDATE ... WHERE expires_at <= now
-- inserts a new id, or takes over an expired one; an id that is not expired is a duplicate, and
-- its row gives the original position. A concurrent publish of the same id waits on the row until
-- the first one commits (or rolls back, then it stores the message itself), so exactly one copy is
-- stored. A claimed row holds partition -1 until the same transaction's offsets are known and it
-- is updated with the position (a HOT update: no indexed column changes). The id is durable with
-- the message, so a broker crash between the commit and the answer still de-duplicates the retry.
-- Maintenance deletes expired rows (producer_ids_expiry); no foreign key, so the publish path pays
-- no check per row: rows of a deleted topic (ids are never reused) expire like the others.
CREATE TABLE spool.producer_ids (
    topic_id     bigint NOT NULL,
    producer_id  text COLLATE "C" NOT NULL,
    expires_at   timestamptz NOT NULL,
    partition    int NOT NULL,
    "offset"     bigint NOT NULL,
    published_at timestamptz NOT NULL,
    PRIMARY KEY (topic_id, producer_id)
) WITH (fillfactor = 70);

CREATE INDEX producer_ids_expiry ON spool.producer_ids (expires_at);

-- spool.publish de-duplicates too; it now also returns duplicate (true: nothing was stored, the
-- position is the earlier message's). Callers that select partition, "offset" and published_at by
-- name are unaffected. The return type changes, so the function is dropped and created again.
DROP FUNCTION spool.publish(text, bytea, bytea, jsonb, int, text, timestamptz, timestamptz);

CREATE FUNCTION spool.publish(
    topic        text,
    payload      bytea,
    key          bytea DEFAULT NULL,
    headers      jsonb DEFAULT NULL,
    to_partition int DEFAULT NULL,
    producer_id  text DEFAULT NULL,
    not_before   timestamptz DEFAULT NULL,
    expires_at   timestamptz DEFAULT NULL)
RETURNS TABLE (partition int, "offset" bigint, published_at timestamptz, duplicate boolean)
LANGUAGE plpgsql
AS $fn$
#variable_conflict use_variable
DECLARE
    v_topic_id bigint;
    v_config   jsonb;
    v_parts    int;
    v_max      bigint;
    v_size     bigint;
    v_part     int;
    v_hash     bigint;
    v_headers  jsonb;
    v_at       timestamptz;
    v_offset   bigint;
    v_width    bigint;
    v_start    timestamptz;
    v_name     text;
    v_schema   text;
    v_now      timestamptz;
    v_claimed  boolean := false;
    i          int;
BEGIN
    IF publish.topic IS NULL THEN
        RAISE EXCEPTION 'spool.publish: topic must not be NULL' USING ERRCODE = '22023';
    END IF;
    SELECT t.id, t.config INTO v_topic_id, v_config FROM spool.topics t WHERE t.name = publish.topic FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'spool.publish: topic "%" not found', publish.topic USING ERRCODE = 'P0002';
    END IF;
    v_parts := coalesce(nullif((v_config->>'partitions')::int, 0), 1);
    v_max := coalesce(nullif((v_config->>'max_message_bytes')::bigint, 0), 1048576);

    v_headers := publish.headers;
    IF v_headers IS NOT NULL THEN
        IF jsonb_typeof(v_headers) <> 'object' THEN
            RAISE EXCEPTION 'spool.publish: headers must be a JSON object of strings, got %', jsonb_typeof(v_headers)
                USING ERRCODE = '22023';
        END IF;
        IF EXISTS (SELECT 1 FROM jsonb_each(v_headers) h WHERE jsonb_typeof(h.value) <> 'string') THEN
            RAISE EXCEPTION 'spool.publish: header values must be strings' USING ERRCODE = '22023';
        END IF;
        IF v_headers = '{}'::jsonb THEN
            v_headers := NULL;
        END IF;
    END IF;
    v_size := coalesce(octet_length(publish.key), 0) + coalesce(octet_length(publish.payload), 0)
        + coalesce((SELECT sum(octet_length(h.key) + octet_length(h.value)) FROM jsonb_each_text(v_headers) h), 0);
    IF v_size > v_max THEN
        RAISE EXCEPTION 'spool.publish: message is % bytes, topic "%" allows %', v_size, publish.topic, v_max
            USING ERRCODE = '54000';
    END IF;
    IF octet_length(publish.producer_id) > 1024 THEN
        RAISE EXCEPTION 'spool.publish: producer id is % bytes, at most 1024 allowed', octet_length(publish.producer_id)
            USING ERRCODE = '22023';
    END IF;

    IF publish.to_partition IS NOT NULL THEN
        IF publish.to_partition < 0 OR publish.to_partition >= v_parts THEN
            RAISE EXCEPTION 'spool.publish: partition % out of range, topic "%" has %', publish.to_partition, publish.topic, v_parts
                USING ERRCODE = '22023';
        END IF;
        v_part := publish.to_partition;
    ELSIF coalesce(octet_length(publish.key), 0) > 0 THEN
        -- FNV-1a 32 of the key, modulo the partition count (storage.PartitionForKey).
        v_hash := 2166136261;
        FOR i IN 0 .. octet_length(publish.key) - 1 LOOP
            v_hash := ((v_hash # get_byte(publish.key, i)) * 16777619) & 4294967295;
        END LOOP;
        v_part := (v_hash % v_parts)::int;
    ELSE
        v_part := floor(random() * v_parts)::int;
    END IF;

    IF v_config->>'semantics' = 'PUB_SUB' AND coalesce((v_config->>'block_writes_on_zero_subscriptions')::boolean, false)
        AND NOT EXISTS (SELECT 1 FROM spool.subscriptions s WHERE s.topic_id = v_topic_id AND s.state = 'ACTIVE') THEN
        RAISE EXCEPTION 'spool.publish: topic "%" has no active subscription and blocks writes', publish.topic
            USING ERRCODE = '55000';
    END IF;

    -- De-duplication: claim the producer id, or answer the position of the message stored with it
    -- within the topic's dedup_window (nanoseconds in the config; default 2 min).
    IF coalesce(publish.producer_id, '') <> '' THEN
        v_now := clock_timestamp();
        INSERT INTO spool.producer_ids AS d (topic_id, producer_id, expires_at, partition, "offset", published_at)
        VALUES (v_topic_id, publish.producer_id,
            v_now + coalesce(nullif((v_config->>'dedup_window')::bigint, 0), 120000000000) / 1000 * interval '1 microsecond',
            -1, -1, v_now)
        -- (The constraint by name: producer_id and partition are also names of this function's
        -- parameters and columns, which would take their place in a column list.)
        ON CONFLICT ON CONSTRAINT producer_ids_pkey DO UPDATE
            SET expires_at = excluded.expires_at, partition = -1, "offset" = -1, published_at = excluded.published_at
            WHERE d.expires_at <= v_now
        RETURNING true INTO v_claimed;
        IF NOT FOUND THEN
            SELECT d.partition, d."offset", d.published_at INTO v_part, v_offset, v_at
            FROM spool.producer_ids d WHERE d.topic_id = v_topic_id AND d.producer_id = publish.producer_id;
            partition := v_part;
            "offset" := v_offset;
            published_at := v_at;
            duplicate := true;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;

    -- Take the offset; the row lock is held until the caller's transaction ends.
    UPDATE spool.partitions p SET
        next_offset = p.next_offset + 1,
        last_published_at = greatest(p.last_published_at, clock_timestamp()),
        low_published_at = coalesce(p.low_published_at, greatest(p.last_published_at, clock_timestamp())),
        bytes = p.bytes + v_size + 64
    WHERE p.topic_id = v_topic_id AND p.partition = v_part
    RETURNING p.next_offset - 1, p.last_published_at INTO v_offset, v_at;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'spool.publish: topic "%" has no partition % row', publish.topic, v_part USING ERRCODE = 'P0002';
    END IF;

    -- The bucket of v_at must exist.
    SELECT s.value::bigint INTO v_width FROM spool.settings s WHERE s.key = 'bucket_seconds';
    v_start := to_timestamp(floor(extract(epoch FROM v_at) / v_width) * v_width);
    IF NOT EXISTS (SELECT 1 FROM spool.buckets b WHERE b.start_at = v_start) THEN
        PERFORM 1 FROM spool.settings s WHERE s.key = 'bucket_seconds' FOR UPDATE; -- the bucket lock
        IF NOT EXISTS (SELECT 1 FROM spool.buckets b WHERE b.start_at = v_start) THEN
            SELECT n.nspname INTO v_schema FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE c.oid = 'spool.settings'::regclass;
            v_name := 'messages_' || to_char(v_start AT TIME ZONE 'UTC', 'YYYYMMDD"t"HH24MISS');
            EXECUTE format('CREATE TABLE %I.%I (LIKE %I.messages INCLUDING ALL)', v_schema, v_name, v_schema);
            EXECUTE format('ALTER TABLE %I.messages ATTACH PARTITION %I.%I FOR VALUES FROM (%L) TO (%L)',
                v_schema, v_schema, v_name, v_start, v_start + make_interval(secs => v_width));
            INSERT INTO spool.buckets (name, start_at, end_at) VALUES (v_name, v_start, v_start + make_interval(secs => v_width));
        END IF;
    END IF;

    INSERT INTO spool.messages (topic_id, partition, "offset", published_at, key, headers, payload, producer_id,
        not_before, expires_at, size)
    VALUES (v_topic_id, v_part, v_offset, v_at, publish.key, v_headers, coalesce(publish.payload, ''::bytea),
        nullif(publish.producer_id, ''), publish.not_before, publish.expires_at, v_size);

    IF v_claimed THEN
        UPDATE spool.producer_ids d SET partition = v_part, "offset" = v_offset, published_at = v_at
        WHERE d.topic_id = v_topic_id AND d.producer_id = publish.producer_id;
    END IF;

    -- Instance id "0" is nobody's: every broker instance, the publisher's own included, wakes.
    SELECT n.nspname INTO v_schema FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = 'spool.settings'::regclass;
    PERFORM pg_notify(v_schema, '0:1:' || publish.topic);

    partition := v_part;
    "offset" := v_offset;
    published_at := v_at;
    duplicate := false;
    RETURN NEXT;
END
$fn$;

COMMENT ON FUNCTION spool.publish(text, bytea, bytea, jsonb, int, text, timestamptz, timestamptz) IS
    'Publish one message inside the caller''s transaction, de-duplicated by producer_id within the topic''s dedup_window; returns (partition, offset, published_at, duplicate). See migrations/0003_publish.sql and 0006_producer_ids.sql.';
