-- 0003: invites (`syncd hub invite`, `syncd join`; syncd/hub/invites.py states the rules). An
-- invite is kept by its id with the SHA-256 of its secret, never the secret; redeeming it marks
-- it used and adds its token in one transaction, the invite's row locked FOR UPDATE, so two
-- laptops racing with one invite get one token between them. Times are text as in `tokens`.
CREATE TABLE invites (
    id            text PRIMARY KEY CHECK (id ~ '^[0-9a-f]{12}$'),
    secret_sha256 text NOT NULL CHECK (secret_sha256 ~ '^[0-9a-f]{64}$'),
    name          text NOT NULL,
    role          text NOT NULL CHECK (role IN ('read', 'write')),
    plan          text NOT NULL,
    created_at    text NOT NULL,
    expires_at    text NOT NULL,
    used_at       text,
    revoked_at    text
);
CREATE INDEX invites_name ON invites (name);
