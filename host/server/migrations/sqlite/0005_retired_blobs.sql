-- Blobs an overwrite, a DELETE or an account deletion made unreferenced, recorded in the
-- transaction that did it. The sweep deletes a blob only once `storage.blob_grace_secs`
-- have passed since `retired_at`, so a database snapshot plus a blob copy finished within
-- that time still has every value the snapshot points at. The row goes after its blob.
CREATE TABLE retired_blobs (
    blob_key   TEXT PRIMARY KEY NOT NULL,
    retired_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

CREATE INDEX retired_blobs_retired_at ON retired_blobs (retired_at);

-- Work one instance does at a time (the blob sweep): the holder of a named lease until
-- it expires. On SQLite there is one process, but the rule is the same on both backends.
CREATE TABLE leases (
    name       TEXT PRIMARY KEY NOT NULL,
    holder     TEXT NOT NULL,
    expires_at INTEGER NOT NULL
) STRICT;
