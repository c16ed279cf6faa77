-- 0020: transactional publishes notify the sequencers only while none is awake.
--
-- A NOTIFY takes a database-wide lock when its transaction commits and holds it through the
-- commit's WAL flush, so every application transaction that published (spool.publish, PublishTx)
-- committed one after the other, across the whole database: 10 sessions publishing one message
-- per transaction did 2.3-2.5k transactions/s with it and 4.8-5.0k without (2026-11-27, PostgreSQL
-- 15, fdatasync ~55 us; a slower disk makes the gap wider). Now a broker instance whose sequencer
-- took staged messages looks for more every few milliseconds for a while and says until when in
-- settings.sequencer_awake_until (seconds since the epoch, by the database clock); a publish
-- notifies only past that time. The function is 0007's but for that test.
INSERT INTO spool.settings (key, value) VALUES ('sequencer_awake_until', '0') ON CONFLICT (key) DO NOTHING;

CREATE OR REPLACE FUNCTION spool.publish(
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

    -- De-duplication: claim the producer id (with the message's partition and offset -1 until
    -- the sequencer stores it), or answer the position of the message stored or staged with it
    -- within the topic's dedup_window (nanoseconds in the config; default 2 min).
    IF coalesce(publish.producer_id, '') <> '' THEN
        v_now := clock_timestamp();
        INSERT INTO spool.producer_ids AS d (topic_id, producer_id, expires_at, partition, "offset", published_at)
        VALUES (v_topic_id, publish.producer_id,
            v_now + coalesce(nullif((v_config->>'dedup_window')::bigint, 0), 120000000000) / 1000 * interval '1 microsecond',
            v_part, -1, v_now)
        -- (The constraint by name: producer_id and partition are also names of this function's
        -- parameters and columns, which would take their place in a column list.)
        ON CONFLICT ON CONSTRAINT producer_ids_pkey DO UPDATE
            SET expires_at = excluded.expires_at, partition = excluded.partition, "offset" = -1, published_at = excluded.published_at
            WHERE d.expires_at <= v_now
        RETURNING true INTO v_claimed;
        IF NOT FOUND THEN
            SELECT d.partition, d."offset", d.published_at INTO v_part, v_offset, v_at
            FROM spool.producer_ids d WHERE d.topic_id = v_topic_id AND d.producer_id = publish.producer_id;
            partition := v_part;
            "offset" := nullif(v_offset, -1);
            published_at := CASE WHEN v_offset >= 0 THEN v_at END;
            duplicate := true;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;

    -- Stage the message: no offset yet, no lock that other publishers wait for.
    INSERT INTO spool.staged (topic_id, partition, key, headers, payload, producer_id, not_before, expires_at, size)
    VALUES (v_topic_id, v_part, publish.key, v_headers, coalesce(publish.payload, ''::bytea),
        nullif(publish.producer_id, ''), publish.not_before, publish.expires_at, v_size);

    -- Wake the sequencers of every broker instance when the caller commits, unless one is
    -- looking for staged messages every few milliseconds anyway (see the top of this file).
    IF coalesce((SELECT s.value::double precision FROM spool.settings s WHERE s.key = 'sequencer_awake_until'), 0)
            < extract(epoch FROM clock_timestamp()) THEN
        SELECT n.nspname INTO v_schema FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE c.oid = 'spool.settings'::regclass;
        PERFORM pg_notify(v_schema, 'staged');
    END IF;

    partition := v_part;
    "offset" := NULL;
    published_at := NULL;
    duplicate := false;
    RETURN NEXT;
END
$fn$;

COMMENT ON FUNCTION spool.publish(text, bytea, bytea, jsonb, int, text, timestamptz, timestamptz) IS
    'Stage one message inside the caller''s transaction (sequenced into the log after the commit), de-duplicated by producer_id within the topic''s dedup_window; returns (partition, offset NULL, published_at NULL, duplicate). See migrations/0007_staged.sql and 0020_quiet_staging.sql.';
