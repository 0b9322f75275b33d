-- Exactly once across processes (docs/bot.md "Exactly once").

-- The fencing token of the leader lease: a leader raises it to its own token when it
-- takes the lease, and every write of the leader's stages checks that it is still its
-- own, so a process that lost the lease (frozen past it) changes nothing.
CREATE TABLE fences (
    name       TEXT PRIMARY KEY,
    token      BIGINT NOT NULL,
    holder     TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);

-- When a mention's status last changed (`pkbot redrive --older-than`).
ALTER TABLE mentions ADD COLUMN updated_at BIGINT;
UPDATE mentions SET updated_at = COALESCE(processed_at, received_at);
CREATE INDEX mentions_status_updated ON mentions (status, updated_at);

-- At most one successful execution per mention and action: a second run that
-- finishes (a worker that froze past its claim) is recorded as superseded. Doubles an
-- earlier version left are superseded here, the oldest success kept.
UPDATE action_executions SET status = 'failed',
    error_details = 'superseded: another run of this action succeeded first'
WHERE status = 'success' AND id NOT IN (
    SELECT MIN(id) FROM action_executions WHERE status = 'success'
    GROUP BY mention_id, action_type);
CREATE UNIQUE INDEX action_executions_one_success
    ON action_executions (mention_id, action_type) WHERE status = 'success';

-- Which mention a dead letter is about, and its entry in dead-letter.v1 (Redis bus).
ALTER TABLE dead_letters ADD COLUMN mention_id TEXT;
ALTER TABLE dead_letters ADD COLUMN bus_id TEXT;

