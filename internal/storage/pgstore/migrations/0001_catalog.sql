-- 0001: catalog and message log. Every name is qualified with the schema "spool", which the
-- migrator replaces with the configured schema. Names (topics, groups, patterns) use COLLATE "C":
-- byte-wise order, as in Go.

-- settings holds store-wide constants every broker instance must agree on (bucket width).
CREATE TABLE spool.settings (
    key   text COLLATE "C" PRIMARY KEY,
    value text NOT NULL
);

-- instances are the broker processes using the store. heartbeat_at is refreshed by each instance;
-- ephemeral subscriptions of an instance whose heartbeat is stale are removed by maintenance.
CREATE TABLE spool.instances (
    id           uuid PRIMARY KEY,
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL
);

-- topics: id is never reused, so the messages of a deleted topic (left to be dropped with their
-- buckets) never mix with those of a new topic of the same name.
CREATE TABLE spool.topics (
    id         bigserial PRIMARY KEY,
    name       text COLLATE "C" NOT NULL UNIQUE,
    config     jsonb NOT NULL,
    created_at timestamptz NOT NULL
);

-- partitions: one row per topic partition. Its row lock orders publishers: a publishing
-- transaction takes offsets next_offset .. next_offset+n-1 with UPDATE ... RETURNING and holds the
-- lock until it commits, so offsets become visible in order (no commit-order gaps).
-- low_offset is the first retained offset (retention advances it, then drops whole buckets);
-- low_published_at is the published_at of the message at low_offset (NULL when the partition holds
-- no retained message): a bucket older than every partition's low_published_at holds nothing
-- retained. last_published_at keeps published_at non-decreasing across broker instances.
CREATE TABLE spool.partitions (
    topic_id          bigint NOT NULL REFERENCES spool.topics (id) ON DELETE CASCADE,
    partition         int NOT NULL,
    next_offset       bigint NOT NULL DEFAULT 0,
    low_offset        bigint NOT NULL DEFAULT 0,
    low_published_at  timestamptz,
    last_published_at timestamptz,
    bytes             bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (topic_id, partition)
) WITH (fillfactor = 50);

-- messages: append-only, range-partitioned by published_at into buckets (spool.buckets) that
-- retention drops whole. No UPDATE or DELETE ever touches it on the hot path.
CREATE TABLE spool.messages (
    topic_id     bigint NOT NULL,
    partition    int NOT NULL,
    "offset"     bigint NOT NULL,
    published_at timestamptz NOT NULL,
    key          bytea,
    headers      jsonb,
    payload      bytea NOT NULL,
    producer_id  text,
    not_before   timestamptz,
    expires_at   timestamptz,
    size         int NOT NULL
) PARTITION BY RANGE (published_at);

CREATE INDEX messages_position ON spool.messages (topic_id, partition, "offset");

-- buckets lists the attached partitions of spool.messages: [start_at, end_at).
CREATE TABLE spool.buckets (
    name     text COLLATE "C" PRIMARY KEY,
    start_at timestamptz NOT NULL UNIQUE,
    end_at   timestamptz NOT NULL
);

-- subscriptions: id never reused. Ephemeral subscriptions belong to one broker instance (owner).
CREATE TABLE spool.subscriptions (
    id         bigserial PRIMARY KEY,
    topic_id   bigint NOT NULL REFERENCES spool.topics (id) ON DELETE CASCADE,
    topic      text COLLATE "C" NOT NULL,
    group_name text COLLATE "C" NOT NULL,
    pattern    text COLLATE "C" NOT NULL DEFAULT '',
    ephemeral  boolean NOT NULL DEFAULT false,
    owner      uuid,
    state      text NOT NULL,
    start      jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);

CREATE INDEX subscriptions_topic ON spool.subscriptions (topic_id);
CREATE INDEX subscriptions_group ON spool.subscriptions (topic, group_name, id);
-- A group has at most one subscription per topic that is not CANCELLED or DELETED (a cancelled
-- group may subscribe again). SubscriptionCreate, TopicUpdate and TopicCreate rely on it: a unique
-- violation is storage.ErrSubscriptionExists.
CREATE UNIQUE INDEX subscriptions_live_group ON spool.subscriptions (topic_id, group_name)
    WHERE state IN ('ACTIVE', 'PAUSED', 'DEAD');
-- Close and maintenance remove the ephemeral subscriptions of one instance.
CREATE INDEX subscriptions_owner ON spool.subscriptions (owner) WHERE ephemeral;

-- sub_partitions: a subscription's position in one partition. Every offset below ack_floor is
-- done; cursor is the next offset never delivered. Claims and acks lock these rows (FOR UPDATE),
-- which is what makes competing members on different broker instances take turns. Updated once
-- per claim or ack batch (HOT updates: no indexed column changes). Only subscriptions with delivery
-- state (ACTIVE, PAUSED, DEAD) have rows, one per topic partition: TopicUpdate adds the rows of new
-- partitions (from offset 0); SubscriptionUpdate to CANCELLED and SubscriptionDelete delete them
-- (delivery rows go with them by ON DELETE CASCADE).
CREATE TABLE spool.sub_partitions (
    sub_id    bigint NOT NULL REFERENCES spool.subscriptions (id) ON DELETE CASCADE,
    partition int NOT NULL,
    ack_floor bigint NOT NULL,
    cursor    bigint NOT NULL,
    PRIMARY KEY (sub_id, partition)
) WITH (fillfactor = 50);

-- bindings: durable groups on topic patterns.
CREATE TABLE spool.bindings (
    group_name text COLLATE "C" NOT NULL,
    pattern    text COLLATE "C" NOT NULL,
    start      jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (group_name, pattern)
);
