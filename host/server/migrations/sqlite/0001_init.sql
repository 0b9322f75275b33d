-- Users are Ed25519 public keys (z-base-32 text form).
CREATE TABLE users (
    public_key    TEXT PRIMARY KEY NOT NULL,
    created_at    INTEGER NOT NULL,
    -- Sum of the sizes of the user's entries, kept in step with every write.
    used_bytes    INTEGER NOT NULL DEFAULT 0 CHECK (used_bytes >= 0),
    -- Per-user override of the configured quota; NULL = the configured default, 0 = unlimited.
    quota_bytes   INTEGER,
    disabled      INTEGER NOT NULL DEFAULT 0,
    last_activity INTEGER NOT NULL,
    -- The signup token redeemed at signup, in token mode.
    signup_token  TEXT
) STRICT;

-- Signup tokens for signup mode "token"; a token is used at most once.
CREATE TABLE signup_tokens (
    token      TEXT PRIMARY KEY NOT NULL,
    created_at INTEGER NOT NULL,
    used_by    TEXT,
    used_at    INTEGER
) STRICT;

-- One row per stored value; the bytes live in the blob store under blob_key.
CREATE TABLE entries (
    user         TEXT NOT NULL REFERENCES users (public_key),
    path         TEXT NOT NULL,
    blob_key     TEXT NOT NULL,
    size         INTEGER NOT NULL,
    content_hash BLOB NOT NULL,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    PRIMARY KEY (user, path)
) STRICT, WITHOUT ROWID;

CREATE INDEX entries_blob_key ON entries (blob_key);

-- Every committed PUT or DELETE, in commit order. AUTOINCREMENT: cursors never reuse.
CREATE TABLE events (
    cursor       INTEGER PRIMARY KEY AUTOINCREMENT,
    user         TEXT NOT NULL,
    path         TEXT NOT NULL,
    kind         TEXT NOT NULL CHECK (kind IN ('PUT', 'DEL')),
    content_hash BLOB,
    created_at   INTEGER NOT NULL
) STRICT;

CREATE INDEX events_user_cursor ON events (user, cursor);

-- Signatures of accepted state-changing requests, kept for the clock-skew window.
CREATE TABLE seen_signatures (
    signature_id BLOB PRIMARY KEY NOT NULL,
    expires_at   INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

CREATE INDEX seen_signatures_expiry ON seen_signatures (expires_at);
