-- Small values live in their entry's row: blob_key is '' and the bytes are here (NULL
-- for a value in the blob store). Listings select the other columns only.
ALTER TABLE entries ADD COLUMN inline_value BLOB;
