-- The homeserver's metadata on PostgreSQL: the same tables as the SQLite backend.
-- Text that is compared or ordered (keys, paths) uses the "C" collation: listings and
-- event path filters are bytewise, as on SQLite, whatever the database's locale.

-- Users are Ed25519 public keys (z-base-32 text form).
CREATE TABLE users (
    public_key    TEXT COLLATE "C" PRIMARY KEY,
    created_at    BIGINT NOT NULL,
    -- Sum of the sizes of the user's entries, kept in step with every write.
    used_bytes    BIGINT NOT NULL DEFAULT 0 CHECK (used_bytes >= 0),
    -- Per-user override of the configured quota; NULL = the configured default, 0 = unlimited.
    quota_bytes   BIGINT,
    disabled      BOOLEAN NOT NULL DEFAULT FALSE,
    last_activity BIGINT NOT NULL,
    -- The signup token redeemed at signup, in token mode.
    signup_token  TEXT
);

-- Signup tokens for signup mode "token"; a token is used at most once.
CREATE TABLE signup_tokens (
    token      TEXT COLLATE "C" PRIMARY KEY,
    created_at BIGINT NOT NULL,
    used_by    TEXT,
    used_at    BIGINT
);

-- One row per stored value; the bytes live in the blob store under blob_key.
CREATE TABLE entries (
    owner        TEXT COLLATE "C" NOT NULL REFERENCES users (public_key),
    path         TEXT COLLATE "C" NOT NULL,
    blob_key     TEXT COLLATE "C" NOT NULL,
    size         BIGINT NOT NULL,
    content_hash BYTEA NOT NULL,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL,
    PRIMARY KEY (owner, path)
);

CREATE INDEX entries_blob_key ON entries (blob_key);

-- Every committed PUT or DELETE, in commit order. Cursors come from the identity while
-- the inserting transaction holds the events advisory lock until its commit, so they are
-- handed out in commit order: a reader never sees a smaller cursor appear later.
CREATE TABLE events (
    cursor       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner        TEXT COLLATE "C" NOT NULL,
    path         TEXT COLLATE "C" NOT NULL,
    kind         TEXT NOT NULL CHECK (kind IN ('PUT', 'DEL')),
    content_hash BYTEA,
    created_at   BIGINT NOT NULL
);

CREATE INDEX events_owner_cursor ON events (owner, cursor);

-- Signatures of accepted state-changing requests, kept for the clock-skew window.
CREATE TABLE seen_signatures (
    signature_id BYTEA PRIMARY KEY,
    expires_at   BIGINT NOT NULL
);

CREATE INDEX seen_signatures_expiry ON seen_signatures (expires_at);

-- Capability-limited sessions. Only the SHA-256 of a token is stored. Expired rows are
-- kept for a week so that their token answers `expired_session`, not `invalid_signature`.
CREATE TABLE sessions (
    token_hash   BYTEA PRIMARY KEY,
    owner        TEXT COLLATE "C" NOT NULL REFERENCES users (public_key),
    -- JSON array of capability strings, e.g. ["read:/pub/", "write:/pub/app/"].
    capabilities TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL
);

CREATE INDEX sessions_owner ON sessions (owner);
CREATE INDEX sessions_expiry ON sessions (expires_at);
