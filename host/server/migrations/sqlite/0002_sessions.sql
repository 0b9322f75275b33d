-- Capability-limited sessions. Only the SHA-256 of a token is stored. Expired rows are
-- kept for a week so that their token answers `expired_session`, not `invalid_signature`.
CREATE TABLE sessions (
    token_hash   BLOB PRIMARY KEY NOT NULL,
    user         TEXT NOT NULL REFERENCES users (public_key),
    -- JSON array of capability strings, e.g. ["read:/pub/", "write:/pub/app/"].
    capabilities TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

CREATE INDEX sessions_user ON sessions (user);
CREATE INDEX sessions_expiry ON sessions (expires_at);
