-- Blobs an overwrite, a DELETE or an account deletion made unreferenced, recorded in the
-- transaction that did it. The sweep deletes a blob only once `storage.blob_grace_secs`
-- have passed since `retired_at`, so a database snapshot plus a blob copy finished within
-- that time still has every value the snapshot points at. The row goes after its blob.
CREATE TABLE retired_blobs (
    blob_key   TEXT COLLATE "C" PRIMARY KEY,
    retired_at BIGINT NOT NULL
);

CREATE INDEX retired_blobs_retired_at ON retired_blobs (retired_at);

-- Work one instance does at a time (the blob sweep): the holder of a named lease until
-- it expires, whichever instance that is.
CREATE TABLE leases (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    expires_at BIGINT NOT NULL
);
