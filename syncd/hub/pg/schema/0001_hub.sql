-- 0001: everything a hub persists, on PostgreSQL (see syncd/hub/pg/__init__.py for the rules).
-- Text that takes part in ordering (ids, version keys) is COLLATE "C": byte order, which for
-- UTF-8 is code-point order, the order Python's string comparison uses on the laptops.

CREATE TABLE hub_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);
INSERT INTO hub_meta (key, value) VALUES ('store_id', gen_random_uuid()::text);

-- One value per write transaction, drawn when the transaction starts: an identity, not an order.
CREATE SEQUENCE hub_tx;
-- Drawn at commit under the feed lock (hub_feed_mark), so it grows in commit order.
CREATE SEQUENCE hub_feed_seq;

-- The change feed: one mark per committed write transaction. `stamp_ns` is what clients see as
-- `until` (a canonical timestamp); it grows with `seq`, even across hub clocks that disagree.
CREATE TABLE feed_tx (
    tx       bigint PRIMARY KEY,
    seq      bigint NOT NULL UNIQUE,
    stamp_ns bigint NOT NULL UNIQUE,
    rows     integer NOT NULL
);

CREATE TABLE memories (
    id                text COLLATE "C" PRIMARY KEY,
    labels            text,
    realm             text NOT NULL,
    memory_type       text NOT NULL,
    title             text,
    content           text NOT NULL,
    content_preview   text,
    tags              text NOT NULL,
    importance        double precision NOT NULL,
    status            text NOT NULL,
    source_session_id text,
    source_run_id     text,
    created_at        text COLLATE "C",
    updated_at        text COLLATE "C" NOT NULL,
    valid_at          text COLLATE "C",
    invalid_at        text COLLATE "C",
    superseded_by     text,
    provenance        text,
    topic_key         text,
    memory_class      text,
    space             text,
    writer_agent_id   text,
    origin            text COLLATE "C" NOT NULL,
    content_hash      text COLLATE "C" NOT NULL,
    deleted           smallint NOT NULL,
    dedupe_key        text,
    tx                bigint NOT NULL,
    -- The keyword leg: the hub writes the words split by the laptops' own tokeniser (so
    -- "deploy.sh" is found by "deploy", whatever the database's locale); 'simple', no stemming.
    fts               tsvector NOT NULL
);
CREATE INDEX memories_tx ON memories (tx);
CREATE INDEX memories_updated_at ON memories (updated_at, id);
CREATE INDEX memories_fts ON memories USING gin (fts);

CREATE TABLE edges (
    id               text COLLATE "C" PRIMARY KEY,
    src              text COLLATE "C" NOT NULL,
    dst              text COLLATE "C" NOT NULL,
    type             text NOT NULL,
    realm            text,
    target_namespace text,
    props            text,
    created_at       text COLLATE "C" NOT NULL,
    updated_at       text COLLATE "C" NOT NULL,
    origin           text COLLATE "C" NOT NULL,
    content_hash     text COLLATE "C" NOT NULL,
    deleted          smallint NOT NULL,
    tx               bigint NOT NULL
);
CREATE INDEX edges_tx ON edges (tx);
CREATE INDEX edges_src ON edges (src);
CREATE INDEX edges_dst ON edges (dst);
CREATE INDEX edges_created_at ON edges (created_at, id);

-- Float32 little-endian vectors per embedding model. A NULL `vec` is a removed vector, kept so
-- every hub process's in-memory index hears of the removal through the feed.
CREATE TABLE vectors (
    memory_id text COLLATE "C" NOT NULL,
    model     text NOT NULL,
    vec       bytea,
    tx        bigint NOT NULL,
    PRIMARY KEY (memory_id, model)
);
CREATE INDEX vectors_tx ON vectors (tx);

CREATE TABLE counters (
    name  text PRIMARY KEY,
    value bigint NOT NULL
);

CREATE TABLE settings (
    id    smallint PRIMARY KEY CHECK (id = 1),
    value text NOT NULL
);

-- API tokens by SHA-256 of the raw token (the raw value is never stored).
CREATE TABLE tokens (
    sha256     text PRIMARY KEY CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    name       text NOT NULL,
    role       text NOT NULL CHECK (role IN ('read', 'write', 'admin')),
    plan       text NOT NULL,
    created_at text NOT NULL,
    revoked_at text
);
CREATE UNIQUE INDEX tokens_active_name ON tokens (name) WHERE revoked_at IS NULL;

-- The entitlement signing key (PKCS#8 PEM): whoever can read this table can sign
-- entitlements, so the hub's database role is the secret to guard.
CREATE TABLE signing_keys (
    name text PRIMARY KEY,
    pem  text NOT NULL
);

-- Closes a write transaction: takes the feed lock (held until commit, so no transaction that
-- draws a later seq can commit before this one), then draws the seq and a stamp later than
-- every committed one. A VOLATILE function reads with a fresh snapshot per statement, so the
-- last stamp is read after the lock is held.
CREATE FUNCTION hub_feed_mark(p_tx bigint, p_rows integer, p_now_ns bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    last_ns bigint;
    ns bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(7365726, 1);
    SELECT stamp_ns INTO last_ns FROM feed_tx ORDER BY seq DESC LIMIT 1;
    ns := greatest(p_now_ns, coalesce(last_ns + 1, 1));
    INSERT INTO feed_tx (tx, seq, stamp_ns, rows)
        VALUES (p_tx, nextval('hub_feed_seq'), ns, p_rows);
    RETURN ns;
END $$;
