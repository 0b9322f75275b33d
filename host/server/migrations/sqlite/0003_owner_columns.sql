-- `user` is a reserved word in PostgreSQL (and a function in standard SQL): both
-- backends call the column that names a row's user `owner`.
ALTER TABLE entries RENAME COLUMN user TO owner;
ALTER TABLE events RENAME COLUMN user TO owner;
ALTER TABLE sessions RENAME COLUMN user TO owner;

DROP INDEX events_user_cursor;
CREATE INDEX events_owner_cursor ON events (owner, cursor);
DROP INDEX sessions_user;
CREATE INDEX sessions_owner ON sessions (owner);
