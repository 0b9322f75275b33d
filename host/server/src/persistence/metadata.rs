//! The metadata store boundary: the records it trades in, the [`MetadataStore`] trait
//! every backend implements (SQLite, PostgreSQL), and the contracts they all keep. The
//! store conformance suite (`tests/api/store.rs`) checks each contract on every backend.
//!
//! Writes: a backend provides a [`WriteTx`], a transaction with primitive steps; the
//! write procedures themselves (a PUT's replay mark, user lock, quota rule, entry,
//! usage and event) are written once in [`super::rules`] and reached through
//! [`MetadataWrites`], which no backend can override. So the rules live above the
//! backends, in one place.
//!
//! Contracts every backend keeps:
//! - **Atomic writes.** Everything one procedure does commits together or not at all;
//!   a committed change and its event commit in the same transaction.
//! - **Per-user serialized writes.** [`WriteTx::lock_user`] locks the user's row until
//!   commit, so two writes of one user never interleave (quota checks and usage are
//!   exact); writes of different users may run at the same time.
//! - **Commit-ordered cursors.** Event cursors strictly increase in commit order: once
//!   any reader has seen cursor N (through [`MetadataStore::events`] or
//!   [`MetadataStore::latest_cursor`]), no event at or below N commits later. Gaps are
//!   allowed (a rolled-back transaction may burn a cursor); a gap is never filled later.
//! - **Replay-mark outcomes.** A procedure given a [`ReplayMark`] records it in its own
//!   transaction; if the mark was already there the outcome is `Replayed` and nothing
//!   changes. Every other outcome (applied or refused) commits the mark: a verified
//!   signature is spent once decided, so a refused request cannot succeed on a replay
//!   after the reason for its refusal is gone (space freed, user re-enabled).
//! - **Replaced values are retired, not deleted.** A procedure that leaves a blob
//!   unreferenced (overwrite, DELETE, account deletion) records it with
//!   [`WriteTx::retire_blobs`] in its own transaction; the blob sweep deletes it once the
//!   grace period has passed ([`MetadataStore::retired_blobs`]), then forgets the record.
//!   [`MetadataStore::blob_state`] tells referenced, retired and unknown blobs apart in
//!   one read, so a sweep never mistakes a retired blob for garbage.
//! - **Small values live in their row.** An entry is [`Stored::Inline`] (the bytes in
//!   the entry's row, committed by the same transaction, no blob at all) or
//!   [`Stored::Blob`]; only blobs are retired. Both kinds can be in one store (a store
//!   from before inline values has only blobs; `storage.inline_max_bytes` decides new
//!   writes).
//! - **Failures are typed.** [`StoreError::Unavailable`] means the backend cannot be
//!   reached or is overloaded (the caller may retry: 503); anything else is
//!   [`StoreError::Internal`] (500).

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::future::BoxFuture;
use homeserver_protocol::event::EventKind;
use tokio::sync::Notify;

use super::rules;

/// A user row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserRecord {
    pub public_key: String,
    pub created_at: i64,
    pub used_bytes: u64,
    /// Per-user override: None = configured default, Some(0) = unlimited.
    pub quota_bytes: Option<u64>,
    pub disabled: bool,
    pub last_activity: i64,
}

/// Where an entry's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// In the blob store under this key.
    Blob(String),
    /// In the entry's row (values up to `storage.inline_max_bytes` when written).
    Inline(bytes::Bytes),
}

impl Stored {
    /// The blob key, for a value in the blob store.
    pub fn blob_key(&self) -> Option<&str> {
        match self {
            Self::Blob(key) => Some(key),
            Self::Inline(_) => None,
        }
    }

    /// The blob key, for a value in the blob store.
    pub fn into_blob_key(self) -> Option<String> {
        match self {
            Self::Blob(key) => Some(key),
            Self::Inline(_) => None,
        }
    }
}

/// An entry row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryRecord {
    pub path: String,
    pub stored: Stored,
    pub size: u64,
    pub content_hash: [u8; 32],
    pub created_at: i64,
    pub updated_at: i64,
}

/// An entry as a listing shows it (no value, nor where it is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedEntry {
    pub path: String,
    pub size: u64,
    pub content_hash: [u8; 32],
    pub created_at: i64,
    pub updated_at: i64,
}

/// What a store needs to know to decide a write before the body is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteContext {
    pub user: Option<UserRecord>,
    /// Size of the entry the write would replace.
    pub existing_size: Option<u64>,
}

/// A signature to remember so that it is refused if seen again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayMark {
    pub signature_id: [u8; 32],
    pub expires_at: i64,
}

/// A PUT ready to commit: the value is complete, in the blob store or in memory.
#[derive(Debug, Clone)]
pub struct NewEntry<'a> {
    pub user: &'a str,
    pub path: &'a str,
    pub stored: Stored,
    pub size: u64,
    pub content_hash: [u8; 32],
    pub now: i64,
    /// The configured default quota (0 = unlimited); a user's own override wins.
    pub default_quota: u64,
}

/// A write that would take a user over their quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaExceeded {
    /// Bytes the user stores now.
    pub used: u64,
    /// The quota in force.
    pub quota: u64,
    /// Bytes the write adds: its size minus the size of the value it replaces.
    pub needed: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    Committed {
        created_at: i64,
        /// The blob the entry pointed at before, now unreferenced (retired in the same
        /// transaction; the sweep deletes it after the grace period).
        replaced_blob: Option<String>,
    },
    QuotaExceeded(QuotaExceeded),
    Replayed,
    UnknownUser,
    Disabled,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// The deleted value's blob (retired by the commit), unless it was inline.
    Deleted {
        blob_key: Option<String>,
    },
    NotFound,
    Replayed,
    UnknownUser,
    Disabled,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignupOutcome {
    Created { created_at: i64 },
    AlreadyExists { created_at: i64 },
    Replayed,
    TokenUnknown,
    TokenUsed,
}

/// What the metadata says of a blob key (one consistent read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobState {
    /// An entry points at it.
    Referenced,
    /// Unreferenced since `retired_at` (Unix seconds) by an overwrite or a delete; kept
    /// until the grace period has passed.
    Retired { retired_at: i64 },
    /// Neither: garbage (an upload whose commit never happened), or an upload in flight.
    Unknown,
}

/// What redeeming a signup token found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRedemption {
    Redeemed,
    Used,
    Unknown,
}

/// A key range of one user's entries, bounds exclusive, in path order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryRange<'a> {
    pub user: &'a str,
    pub after: &'a str,
    pub before: &'a str,
    pub descending: bool,
    pub limit: u32,
}

/// An event row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    pub cursor: u64,
    pub user: String,
    pub path: String,
    pub kind: EventKind,
    pub content_hash: Option<[u8; 32]>,
    /// Unix seconds of the commit.
    pub created_at: i64,
}

/// An event to append; the store assigns its cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent<'a> {
    pub user: &'a str,
    pub path: &'a str,
    pub kind: EventKind,
    pub content_hash: Option<[u8; 32]>,
    pub created_at: i64,
}

/// One user of an event query and that user's own cursor bound (exclusive; 0 = none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserCursor {
    pub user: String,
    pub cursor: u64,
}

/// Events in ascending cursor order within `(after, up_to]`.
#[derive(Debug, Clone)]
pub struct EventQuery<'a> {
    /// Only these users, each only above its own cursor; empty = every user.
    pub users: &'a [UserCursor],
    pub after: u64,
    pub up_to: u64,
    /// Only paths starting with this.
    pub path_prefix: Option<&'a str>,
    pub limit: u32,
}

/// Events in descending cursor order below `before` (exclusive).
#[derive(Debug, Clone)]
pub struct ReverseEventQuery<'a> {
    /// Each user only below its own cursor when that is not 0.
    pub users: &'a [UserCursor],
    pub before: u64,
    pub path_prefix: Option<&'a str>,
    pub limit: u32,
}

/// A session row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    pub token_hash: [u8; 32],
    pub user: String,
    pub capabilities: Vec<String>,
    pub created_at: i64,
    pub expires_at: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateSessionOutcome {
    Created,
    Replayed,
    UnknownUser,
    Disabled,
}

/// A signup token row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignupTokenRecord {
    pub created_at: i64,
    pub used: bool,
}

/// A signup token row, whole (for copying a deployment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignupTokenRow {
    pub token: String,
    pub created_at: i64,
    pub used_by: Option<String>,
    pub used_at: Option<i64>,
}

/// Server-wide counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreStats {
    pub users: u64,
    pub total_storage: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached or is overloaded (a 503 for the caller).
    #[error("metadata store unavailable: {0}")]
    Unavailable(String),
    /// Anything else (a 500 for the caller; the cause is logged, not sent).
    #[error("metadata store error: {0}")]
    Internal(String),
    /// The database was migrated by a newer homeserver: it holds a migration this binary
    /// does not know. Nothing is written to it.
    #[error(
        "the database has schema version {database} (migrated by a newer homeserver); \
         this homeserver {} knows schema versions up to {known}: run that newer version, \
         or restore the backup taken before the upgrade (docs/upgrade.md)",
        env!("CARGO_PKG_VERSION")
    )]
    NewerSchema { database: i64, known: i64 },
    /// The database driver's error, kept whole as the source (what a 500's log shows,
    /// and what a caller can inspect); `unavailable` classifies it as one of the two
    /// above.
    #[error("metadata store {}: {source}", if *.unavailable { "unavailable" } else { "error" })]
    Database {
        unavailable: bool,
        source: sqlx::Error,
    },
}

impl StoreError {
    /// A driver error, classified.
    pub fn database(source: sqlx::Error, unavailable: bool) -> Self {
        StoreError::Database {
            unavailable,
            source,
        }
    }

    /// Whether the caller may retry later (503) rather than having hit a bug (500).
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Unavailable(_) => true,
            StoreError::Internal(_) | StoreError::NewerSchema { .. } => false,
            StoreError::Database { unavailable, .. } => *unavailable,
        }
    }
}

/// What a [`Procedure`] answers, type-erased (each procedure's own outcome type).
pub type ProcedureOutput = Box<dyn Any + Send>;

/// The function of a [`Procedure`]: runs its steps in the transaction it is given.
pub type ProcedureFn = dyn for<'t> Fn(&'t mut dyn WriteTx) -> BoxFuture<'t, Result<ProcedureOutput, StoreError>>
    + Send
    + Sync;

/// One rule-bearing write (a procedure of [`super::rules`] with its inputs), ready to run
/// in a transaction: what [`MetadataWrites`] hands to [`MetadataStore::run_procedure`].
/// A store may run several in one transaction (group commit), since a procedure never
/// needs a rollback; it may also run one again alone (after its batch failed), so a
/// procedure owns its inputs and can run more than once.
#[derive(Clone)]
pub struct Procedure {
    /// The user whose row it locks (empty: none). A batch runs its procedures ordered by
    /// this key (arrival order within a key), so concurrent batches take row locks in
    /// one order and cannot deadlock.
    pub lock_key: String,
    /// The replay mark `run` spends as its first step, when it has one (every procedure
    /// of `rules` spends first): a batch records its procedures' marks in one statement
    /// before running them (see `batch_tx`).
    pub replay: Option<ReplayMark>,
    pub run: Arc<ProcedureFn>,
}

impl Procedure {
    /// A procedure answering `T`.
    pub fn new<T, F>(lock_key: impl Into<String>, run: F) -> Self
    where
        T: Send + 'static,
        F: for<'t> Fn(&'t mut dyn WriteTx) -> BoxFuture<'t, Result<T, StoreError>>
            + Send
            + Sync
            + 'static,
    {
        Self {
            lock_key: lock_key.into(),
            replay: None,
            run: Arc::new(move |tx| {
                let future = run(tx);
                Box::pin(async move { future.await.map(|o| Box::new(o) as ProcedureOutput) })
            }),
        }
    }

    /// Declares the replay mark the procedure spends first (see [`Procedure::replay`]).
    pub fn spending(mut self, mark: Option<ReplayMark>) -> Self {
        self.replay = mark;
        self
    }
}

impl std::fmt::Debug for Procedure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Procedure")
            .field("lock_key", &self.lock_key)
            .finish_non_exhaustive()
    }
}

/// Runs `procedure` in a transaction of its own.
pub async fn run_alone(
    store: &(impl MetadataStore + ?Sized),
    procedure: &Procedure,
) -> Result<ProcedureOutput, StoreError> {
    let mut tx = store.begin_write().await?;
    let output = (procedure.run)(tx.as_mut()).await?;
    tx.commit().await?;
    Ok(output)
}

/// One write transaction: the primitive steps the procedures in [`super::rules`] are
/// made of. Dropping it without [`commit`](WriteTx::commit) rolls it back.
#[async_trait]
pub trait WriteTx: Send {
    /// Records a replay mark; false (and no change) when the signature is already there.
    async fn insert_replay_mark(&mut self, mark: ReplayMark) -> Result<bool, StoreError>;

    /// Records several replay marks in one step (no two alike); answers the signatures
    /// that were not there before.
    async fn insert_replay_marks(
        &mut self,
        marks: &[ReplayMark],
    ) -> Result<Vec<[u8; 32]>, StoreError>;

    /// Reads a user's row and locks it against other writers until commit.
    async fn lock_user(&mut self, public_key: &str) -> Result<Option<UserRecord>, StoreError>;

    /// Creates a user; false (and no change) when the key exists already. Waits for a
    /// concurrent transaction creating the same key to end.
    async fn insert_user(
        &mut self,
        public_key: &str,
        now: i64,
        signup_token: Option<&str>,
    ) -> Result<bool, StoreError>;

    /// Deletes a user row and the user's sessions (entries must be gone already).
    async fn delete_user(&mut self, public_key: &str) -> Result<(), StoreError>;

    /// Sets a user's usage and last activity.
    async fn set_usage(
        &mut self,
        public_key: &str,
        used_bytes: u64,
        last_activity: i64,
    ) -> Result<(), StoreError>;

    /// Marks an unused token used by `public_key`.
    async fn redeem_signup_token(
        &mut self,
        token: &str,
        public_key: &str,
        now: i64,
    ) -> Result<TokenRedemption, StoreError>;

    async fn entry(&mut self, user: &str, path: &str) -> Result<Option<EntryRecord>, StoreError>;

    /// Inserts or replaces an entry.
    async fn put_entry(&mut self, user: &str, entry: &EntryRecord) -> Result<(), StoreError> {
        self.put_entries(&[(user, entry)]).await
    }

    /// Inserts or replaces entries of any users in one step, as many `put_entry` would;
    /// no two may have the same user and path.
    async fn put_entries(&mut self, entries: &[(&str, &EntryRecord)]) -> Result<(), StoreError>;

    /// Removes an entry, returning what it was.
    async fn remove_entry(
        &mut self,
        user: &str,
        path: &str,
    ) -> Result<Option<EntryRecord>, StoreError>;

    /// Removes every entry of a user, returning them in path order.
    async fn remove_all_entries(&mut self, user: &str) -> Result<Vec<EntryRecord>, StoreError>;

    async fn insert_session(&mut self, session: &SessionRecord) -> Result<(), StoreError>;

    /// The sum of the sizes of a user's entries (what `used_bytes` must equal).
    async fn sum_entry_sizes(&mut self, user: &str) -> Result<u64, StoreError>;

    /// Records blobs this transaction made unreferenced, retired at `at` (Unix seconds):
    /// the sweep deletes them once the grace period has passed.
    async fn retire_blobs(&mut self, blob_keys: &[&str], at: i64) -> Result<(), StoreError>;

    /// Appends events in the given order, assigning cursors in commit order. Call it as
    /// the transaction's last step: a backend shared by several instances serializes
    /// cursor assignment from here until commit.
    async fn append_events(&mut self, events: &[NewEvent<'_>]) -> Result<(), StoreError>;

    async fn commit(self: Box<Self>) -> Result<(), StoreError>;
}

/// What a metadata backend provides: reads, single-statement writes that need no rule,
/// and [`WriteTx`] transactions for the rule-bearing writes of [`MetadataWrites`].
#[async_trait]
pub trait MetadataStore: Send + Sync + 'static {
    /// The backend's name (`sqlite`, `postgres`), for logs and stats.
    fn backend(&self) -> &'static str;

    /// Whether several server instances may share this store. Then a process must not
    /// trust what it cached from the store (another instance may have changed it since).
    fn shared(&self) -> bool {
        false
    }

    /// Woken when another instance may have committed events (PostgreSQL NOTIFY), so the
    /// event tailer need not poll; None when this process is the only writer (its own
    /// commits are announced in-process).
    fn remote_commits(&self) -> Option<Arc<Notify>> {
        None
    }

    /// Checks that the store answers (health and `/admin/stats`).
    async fn ping(&self) -> Result<(), StoreError>;

    /// Starts a write transaction.
    async fn begin_write(&self) -> Result<Box<dyn WriteTx>, StoreError>;

    /// Runs a rule-bearing write and commits it. By default in a transaction of its
    /// own; a store may batch concurrent procedures into one transaction (group commit,
    /// [`super::group_commit`]) as long as each caller gets its own procedure's outcome
    /// and nothing it answered is lost.
    async fn run_procedure(&self, procedure: Procedure) -> Result<ProcedureOutput, StoreError> {
        run_alone(self, &procedure).await
    }

    /// Closes connections, letting statements in flight finish (graceful shutdown).
    async fn close(&self) {}

    async fn user(&self, public_key: &str) -> Result<Option<UserRecord>, StoreError>;

    async fn write_context(&self, user: &str, path: &str) -> Result<WriteContext, StoreError>;

    async fn entry(&self, user: &str, path: &str) -> Result<Option<EntryRecord>, StoreError>;

    /// Entries within a range, at most `limit`.
    async fn entries(&self, range: EntryRange<'_>) -> Result<Vec<EntryRecord>, StoreError>;

    /// What a listing shows of the entries within a range, at most `limit`: as
    /// [`Self::entries`] without reading their values (a page of small values kept in
    /// their rows would otherwise be read whole, up to `limit` x `inline_max_bytes`).
    async fn listing(&self, range: EntryRange<'_>) -> Result<Vec<ListedEntry>, StoreError>;

    /// Whether any entry points at this blob.
    async fn blob_referenced(&self, blob_key: &str) -> Result<bool, StoreError>;

    /// Whether the blob is referenced, retired or unknown, read at one moment (an
    /// overwrite commits both the new reference and the retirement of the old blob).
    async fn blob_state(&self, blob_key: &str) -> Result<BlobState, StoreError>;

    /// Retired blobs whose `retired_at` is at or before `retired_before`, oldest first,
    /// at most `limit`.
    async fn retired_blobs(
        &self,
        retired_before: i64,
        limit: u32,
    ) -> Result<Vec<String>, StoreError>;

    /// Forgets retirement records (after their blobs were deleted); how many went.
    async fn forget_retired_blobs(&self, blob_keys: &[String]) -> Result<u64, StoreError>;

    /// Takes (or renews) the lease `name` for `holder` until `expires_at`, if it is free,
    /// expired at `now`, or `holder`'s already; true when `holder` holds it now. Work
    /// that several instances could do, one at a time (the blob sweep).
    async fn take_lease(
        &self,
        name: &str,
        holder: &str,
        now: i64,
        expires_at: i64,
    ) -> Result<bool, StoreError>;

    /// Gives the lease up if `holder` holds it.
    async fn release_lease(&self, name: &str, holder: &str) -> Result<(), StoreError>;

    async fn session(&self, token_hash: &[u8; 32]) -> Result<Option<SessionRecord>, StoreError>;

    /// Revokes a session; false when there was none.
    async fn delete_session(&self, token_hash: &[u8; 32]) -> Result<bool, StoreError>;

    /// Sessions not yet expired at `now`.
    async fn active_sessions(&self, now: i64) -> Result<u64, StoreError>;

    /// Forgets sessions that expired before `before`.
    async fn purge_sessions(&self, before: i64) -> Result<u64, StoreError>;

    /// Forgets replay marks that expired before `now`.
    async fn purge_replay_marks(&self, now: i64) -> Result<u64, StoreError>;

    /// Latest event cursor (0 when there is none).
    async fn latest_cursor(&self) -> Result<u64, StoreError>;

    async fn events(&self, query: EventQuery<'_>) -> Result<Vec<EventRecord>, StoreError>;

    async fn events_reverse(
        &self,
        query: ReverseEventQuery<'_>,
    ) -> Result<Vec<EventRecord>, StoreError>;

    /// Stores a new signup token; false when it exists already.
    async fn create_signup_token(&self, token: &str, now: i64) -> Result<bool, StoreError>;

    async fn signup_token(&self, token: &str) -> Result<Option<SignupTokenRecord>, StoreError>;

    async fn stats(&self) -> Result<StoreStats, StoreError>;

    /// Disables or enables a user; false when the user is unknown.
    async fn set_user_disabled(&self, user: &str, disabled: bool) -> Result<bool, StoreError>;

    /// Sets a user's quota override (None = the configured default); false when unknown.
    async fn set_user_quota(&self, user: &str, quota: Option<u64>) -> Result<bool, StoreError>;

    /// Users whose key sorts after `after` (bytewise), in key order, at most `limit`:
    /// a walk over every user (export, fsck, moving between backends).
    async fn users_after(&self, after: &str, limit: u32) -> Result<Vec<UserRecord>, StoreError>;

    /// Signup tokens after `after`, in token order, at most `limit`.
    async fn signup_tokens_after(
        &self,
        after: &str,
        limit: u32,
    ) -> Result<Vec<SignupTokenRow>, StoreError>;

    /// Sessions whose token hash sorts after `after`, in that order, at most `limit`.
    async fn sessions_after(
        &self,
        after: &[u8; 32],
        limit: u32,
    ) -> Result<Vec<SessionRecord>, StoreError>;

    // Copying a deployment to another backend (`homeserver migrate`): rows are written
    // as they are, no rule runs (each was applied when the row was first written), and
    // every copy is an upsert, so an interrupted copy can simply run again.

    /// Inserts or replaces users, every field included.
    async fn copy_users(&self, users: &[UserRecord]) -> Result<(), StoreError>;

    /// Inserts or replaces entries of `user` (the user must exist).
    async fn copy_entries(&self, user: &str, entries: &[EntryRecord]) -> Result<(), StoreError>;

    /// Inserts events with their cursors (those already there are left as they are);
    /// later appends continue above the largest cursor.
    async fn copy_events(&self, events: &[EventRecord]) -> Result<(), StoreError>;

    async fn copy_signup_tokens(&self, tokens: &[SignupTokenRow]) -> Result<(), StoreError>;

    /// Inserts sessions (their users must exist); those already there are left.
    async fn copy_sessions(&self, sessions: &[SessionRecord]) -> Result<(), StoreError>;

    /// Stores `user`'s pkarr packet (relay payload) unless the stored one is as new or
    /// newer; true when stored. The user must exist; the packet goes with the user.
    async fn put_pkarr_packet(
        &self,
        user: &str,
        timestamp: i64,
        packet: &[u8],
    ) -> Result<bool, StoreError>;

    /// Stored pkarr packets of the users whose key sorts after `after`, in key order,
    /// at most `limit`: (user, packet).
    async fn pkarr_packets_after(
        &self,
        after: &str,
        limit: u32,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError>;
}

/// The rule-bearing writes, the same for every backend: each runs one procedure of
/// [`super::rules`] in one [`WriteTx`] and commits whatever the outcome (see the
/// replay-mark contract above). Implemented once for every [`MetadataStore`].
#[async_trait]
pub trait MetadataWrites {
    /// Signs a user up (idempotent for an existing user), redeeming `token` if given.
    async fn sign_up(
        &self,
        public_key: &str,
        token: Option<&str>,
        now: i64,
        replay: ReplayMark,
    ) -> Result<SignupOutcome, StoreError>;

    /// Commits a PUT: replay mark (signed requests), quota-checked usage update, entry
    /// upsert and PUT event.
    async fn commit_put(
        &self,
        entry: NewEntry<'_>,
        replay: Option<ReplayMark>,
    ) -> Result<PutOutcome, StoreError>;

    /// Commits a DELETE: replay mark (signed requests), entry removal, usage update and
    /// DEL event.
    async fn commit_delete(
        &self,
        user: &str,
        path: &str,
        now: i64,
        replay: Option<ReplayMark>,
    ) -> Result<DeleteOutcome, StoreError>;

    /// Stores a session minted by a signed request (its replay mark commits with it).
    async fn create_session(
        &self,
        session: &SessionRecord,
        replay: ReplayMark,
    ) -> Result<CreateSessionOutcome, StoreError>;

    /// Records the signature of a verified request that was refused before reaching a
    /// procedure, so it cannot be replayed later. False when already seen.
    async fn mark_signature(&self, mark: ReplayMark) -> Result<bool, StoreError>;

    /// Deletes a user with all entries, writing a DEL event per entry (path order) and
    /// retiring their blobs. Returns where each entry's value was (path order), or None
    /// when the user is unknown.
    async fn delete_account(&self, user: &str, now: i64)
    -> Result<Option<Vec<Stored>>, StoreError>;

    /// Repair (fsck): removes the entry at `path` if it still points at `blob_key`, with
    /// its usage and a DEL event. False when it changed or went meanwhile.
    async fn remove_entry_if_blob(
        &self,
        user: &str,
        path: &str,
        blob_key: &str,
        now: i64,
    ) -> Result<bool, StoreError>;

    /// Repair (fsck): sets a user's usage to the sum of their entries' sizes; returns
    /// (before, after), or None when the user is unknown.
    async fn recompute_usage(&self, user: &str) -> Result<Option<(u64, u64)>, StoreError>;
}

/// Runs `procedure` in a fresh transaction and commits it.
macro_rules! in_transaction {
    ($store:expr, |$tx:ident| $procedure:expr) => {{
        let mut $tx = $store.begin_write().await?;
        let outcome = $procedure.await?;
        $tx.commit().await?;
        Ok(outcome)
    }};
}

/// Runs a procedure through the store (which may batch it) and takes its outcome back.
async fn through<S, T>(store: &S, procedure: Procedure) -> Result<T, StoreError>
where
    S: MetadataStore + ?Sized,
    T: 'static,
{
    let output = store.run_procedure(procedure).await?;
    output
        .downcast::<T>()
        .map(|o| *o)
        .map_err(|_| StoreError::Internal("a write procedure answered the wrong type".into()))
}

/// A [`NewEntry`] that owns its text (a [`Procedure`] keeps its inputs).
#[derive(Debug, Clone)]
struct OwnedNewEntry {
    user: String,
    path: String,
    stored: Stored,
    size: u64,
    content_hash: [u8; 32],
    now: i64,
    default_quota: u64,
}

impl OwnedNewEntry {
    fn of(e: &NewEntry<'_>) -> Self {
        Self {
            user: e.user.to_owned(),
            path: e.path.to_owned(),
            stored: e.stored.clone(),
            size: e.size,
            content_hash: e.content_hash,
            now: e.now,
            default_quota: e.default_quota,
        }
    }

    fn borrowed(&self) -> NewEntry<'_> {
        NewEntry {
            user: &self.user,
            path: &self.path,
            stored: self.stored.clone(),
            size: self.size,
            content_hash: self.content_hash,
            now: self.now,
            default_quota: self.default_quota,
        }
    }
}

// The frequent writes (signup, PUT, DELETE, sessions, replay marks) go through
// `run_procedure`, so a store can commit many of them together; the rare, long ones
// (account deletion, repairs) keep a transaction of their own.
#[async_trait]
impl<S: MetadataStore + ?Sized> MetadataWrites for S {
    async fn sign_up(
        &self,
        public_key: &str,
        token: Option<&str>,
        now: i64,
        replay: ReplayMark,
    ) -> Result<SignupOutcome, StoreError> {
        let (key, token) = (public_key.to_owned(), token.map(str::to_owned));
        through(
            self,
            Procedure::new(public_key, move |tx| {
                let (key, token) = (key.clone(), token.clone());
                Box::pin(
                    async move { rules::sign_up(tx, &key, token.as_deref(), now, replay).await },
                )
            })
            .spending(Some(replay)),
        )
        .await
    }

    async fn commit_put(
        &self,
        entry: NewEntry<'_>,
        replay: Option<ReplayMark>,
    ) -> Result<PutOutcome, StoreError> {
        let entry = OwnedNewEntry::of(&entry);
        through(
            self,
            Procedure::new(entry.user.clone(), move |tx| {
                let entry = entry.clone();
                Box::pin(async move { rules::put(tx, &entry.borrowed(), replay).await })
            })
            .spending(replay),
        )
        .await
    }

    async fn commit_delete(
        &self,
        user: &str,
        path: &str,
        now: i64,
        replay: Option<ReplayMark>,
    ) -> Result<DeleteOutcome, StoreError> {
        let (owner, path) = (user.to_owned(), path.to_owned());
        through(
            self,
            Procedure::new(user, move |tx| {
                let (owner, path) = (owner.clone(), path.clone());
                Box::pin(async move { rules::delete(tx, &owner, &path, now, replay).await })
            })
            .spending(replay),
        )
        .await
    }

    async fn create_session(
        &self,
        session: &SessionRecord,
        replay: ReplayMark,
    ) -> Result<CreateSessionOutcome, StoreError> {
        let session = session.clone();
        through(
            self,
            Procedure::new(session.user.clone(), move |tx| {
                let session = session.clone();
                Box::pin(async move { rules::create_session(tx, &session, replay).await })
            })
            .spending(Some(replay)),
        )
        .await
    }

    async fn mark_signature(&self, mark: ReplayMark) -> Result<bool, StoreError> {
        through(
            self,
            Procedure::new("", move |tx| {
                Box::pin(async move { tx.insert_replay_mark(mark).await })
            })
            .spending(Some(mark)),
        )
        .await
    }

    async fn delete_account(
        &self,
        user: &str,
        now: i64,
    ) -> Result<Option<Vec<Stored>>, StoreError> {
        in_transaction!(self, |tx| rules::delete_account(tx.as_mut(), user, now))
    }

    async fn remove_entry_if_blob(
        &self,
        user: &str,
        path: &str,
        blob_key: &str,
        now: i64,
    ) -> Result<bool, StoreError> {
        in_transaction!(self, |tx| rules::remove_entry_if_blob(
            tx.as_mut(),
            user,
            path,
            blob_key,
            now
        ))
    }

    async fn recompute_usage(&self, user: &str) -> Result<Option<(u64, u64)>, StoreError> {
        in_transaction!(self, |tx| rules::recompute_usage(tx.as_mut(), user))
    }
}
