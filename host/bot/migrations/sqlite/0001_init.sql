-- The bot's records (the spec's tables), its own bookkeeping, and the embedded index.
-- Times are Unix seconds unless a name says otherwise.

-- One row per mention of the bot: a post that names it. id = '<author z32>:<post id>'.
CREATE TABLE mentions (
    id           TEXT PRIMARY KEY,
    author_pubky TEXT NOT NULL,
    post_id      TEXT NOT NULL,
    -- pubky://<author>/pub/pubky.app/posts/<post id>
    post_uri     TEXT NOT NULL,
    content      TEXT NOT NULL,
    -- The post the mention replies to, if any (the thread it is in).
    parent_uri   TEXT,
    -- When the post was made (from its id), and when the bot took it in.
    posted_at    INTEGER NOT NULL,
    received_at  INTEGER NOT NULL,
    processed_at INTEGER,
    status       TEXT NOT NULL DEFAULT 'pending'
                 CHECK (status IN ('pending', 'processing', 'completed', 'failed', 'skipped_old')),
    -- Why a mention failed or was answered with nothing.
    error        TEXT
);
CREATE INDEX mentions_status ON mentions (status);
CREATE INDEX mentions_author ON mentions (author_pubky, received_at);

-- How the router classified a mention: one decision per mention.
CREATE TABLE routing_decisions (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    mention_id  TEXT NOT NULL UNIQUE REFERENCES mentions (id),
    method      TEXT NOT NULL CHECK (method IN ('heuristic', 'llm')),
    -- summary, factcheck, or none (nothing to do: opted out, rate limited, unclear...)
    action_type TEXT NOT NULL,
    -- The AI classifier's confidence (method llm only).
    confidence  REAL,
    reasoning   TEXT NOT NULL,
    -- A notice the router answers with instead of an action (opt-out confirmed, slow
    -- down), if any.
    notice      TEXT,
    -- What the decision changes besides: opt_out, opt_in, rate_notice (applied after the
    -- decision is stored, and again if the mention is routed again after a crash).
    effect      TEXT,
    -- The root of the thread the mention is in (the per-thread reply cap counts the
    -- decisions that answer in it).
    thread_root TEXT,
    created_at  INTEGER NOT NULL
);
CREATE INDEX routing_decisions_thread ON routing_decisions (thread_root);

-- Each run of an action for a mention.
CREATE TABLE action_executions (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    mention_id    TEXT NOT NULL REFERENCES mentions (id),
    action_type   TEXT NOT NULL,
    status        TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'success', 'failed')),
    duration_ms   INTEGER,
    tokens_used   INTEGER NOT NULL DEFAULT 0,
    error_details TEXT,
    -- The reply the action produced (success only).
    reply         TEXT,
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER
);
CREATE INDEX action_executions_mention ON action_executions (mention_id, action_type);

-- What an execution produced: summary, evidence, sources (JSON documents).
CREATE TABLE artifacts (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    action_execution_id INTEGER NOT NULL REFERENCES action_executions (id),
    artifact_type       TEXT NOT NULL CHECK (artifact_type IN ('summary', 'evidence', 'sources')),
    content             TEXT NOT NULL,
    created_at          INTEGER NOT NULL
);

-- The bot's reply to a mention: at most one. The row is written (with its post id)
-- before the post is published, so a restart publishes the same post again rather
-- than a second one; published_at is set once the homeserver has it.
CREATE TABLE replies (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    mention_id   TEXT NOT NULL UNIQUE REFERENCES mentions (id),
    post_id      TEXT NOT NULL,
    content      TEXT NOT NULL,
    -- The root of the thread the reply is in (per-thread reply cap).
    thread_root  TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    published_at INTEGER
);
CREATE INDEX replies_thread ON replies (thread_root);

-- Messages no stage could process, with why (`dead-letter.v1`, kept for inspection).
CREATE TABLE dead_letters (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    stream     TEXT NOT NULL,
    payload    TEXT NOT NULL,
    reason     TEXT NOT NULL,
    created_at INTEGER NOT NULL
);

-- Idempotency keys (mention:{id}, route:{id}, action:{type}:{id}) with their lifetime.
CREATE TABLE idempotency_keys (
    key        TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);

-- Where each reader stopped (the poller in the index, the index in the event feed).
CREATE TABLE positions (
    name       TEXT PRIMARY KEY,
    position   TEXT NOT NULL,
    updated_at INTEGER NOT NULL
);

-- Users who asked the bot to stop replying to them.
CREATE TABLE opt_outs (
    author_pubky TEXT PRIMARY KEY,
    since        INTEGER NOT NULL
);

-- "Slow down" notices sent, so each user gets at most one per rate-limit window.
CREATE TABLE rate_notices (
    author_pubky TEXT NOT NULL,
    sent_at      INTEGER NOT NULL
);
CREATE INDEX rate_notices_author ON rate_notices (author_pubky, sent_at);

-- The embedded index: every pubky.app post seen in the homeserver's event feed.
CREATE TABLE index_posts (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    uri         TEXT NOT NULL UNIQUE,
    author      TEXT NOT NULL,
    post_id     TEXT NOT NULL,
    content     TEXT NOT NULL,
    kind        TEXT NOT NULL,
    parent_uri  TEXT,
    -- Whether the content names the bot.
    mentions_bot INTEGER NOT NULL DEFAULT 0,
    deleted     INTEGER NOT NULL DEFAULT 0,
    indexed_at  INTEGER NOT NULL
);
CREATE INDEX index_posts_parent ON index_posts (parent_uri);
CREATE INDEX index_posts_mentions ON index_posts (mentions_bot, seq);
