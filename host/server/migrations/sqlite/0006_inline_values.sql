-- Small values live in their entry's row: blob_key is '' and the bytes are here (NULL
-- for a value in the blob store). Added last, so a row's other columns stay in its
-- first page and listings do not read the values (they spill to overflow pages).
ALTER TABLE entries ADD COLUMN inline_value BLOB;
