-- 0002: the hub page's browser sessions (POST /ui/login), shared by every hub process: the
-- balancing proxy may send a browser's next request to any of them (syncd/hub/store.py states
-- the rules). A session is kept by the SHA-256 of its cookie's id, never the id, and belongs to
-- a token by the token's SHA-256: the hub looks the token up again on every request, so a
-- revoked token's sessions are refused. Adding a session deletes the expired ones and the
-- oldest of that token's own beyond its cap, never another token's.
CREATE TABLE page_sessions (
    sid_sha256   text PRIMARY KEY CHECK (sid_sha256 ~ '^[0-9a-f]{64}$'),
    token_sha256 text NOT NULL REFERENCES tokens (sha256) ON DELETE CASCADE,
    csrf         text NOT NULL,
    expires_ns   bigint NOT NULL,
    -- sign-in order: a token over its cap loses its lowest
    seq          bigint GENERATED ALWAYS AS IDENTITY
);
CREATE INDEX page_sessions_token ON page_sessions (token_sha256, seq);
CREATE INDEX page_sessions_expires ON page_sessions (expires_ns);
