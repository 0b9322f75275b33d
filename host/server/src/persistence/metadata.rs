//! The metadata store boundary. Every state change that must be atomic happens inside
//! one call here (one transaction): a PUT's entry row, the owner's usage, the quota check,
//! the replay mark and the event row commit together or not at all.

use async_trait::async_trait;
use homeserver_protocol::event::EventKind;

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

/// An entry row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryRecord {
    pub path: String,
    pub blob_key: String,
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

/// A PUT ready to commit: the value is already complete in the blob store.
#[derive(Debug, Clone)]
pub struct NewEntry<'a> {
    pub user: &'a str,
    pub path: &'a str,
    pub blob_key: &'a str,
    pub size: u64,
    pub content_hash: [u8; 32],
    pub now: i64,
    /// The configured default quota (0 = unlimited); a user's own override wins.
    pub default_quota: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    Committed {
        created_at: i64,
        /// The blob the entry pointed at before, now unreferenced.
        replaced_blob: Option<String>,
    },
    QuotaExceeded {
        used: u64,
        quota: u64,
    },
    Replayed,
    UnknownUser,
    Disabled,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteOutcome {
    Deleted { blob_key: String },
    NotFound,
    Replayed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignupOutcome {
    Created { created_at: i64 },
    AlreadyExists { created_at: i64 },
    Replayed,
    TokenUnknown,
    TokenUsed,
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
}

#[async_trait]
pub trait MetadataStore: Send + Sync + 'static {
    async fn user(&self, public_key: &str) -> Result<Option<UserRecord>, StoreError>;

    /// Signs a user up (idempotent for an existing user), redeeming `token` if given.
    async fn sign_up(
        &self,
        public_key: &str,
        token: Option<&str>,
        now: i64,
        replay: ReplayMark,
    ) -> Result<SignupOutcome, StoreError>;

    async fn write_context(&self, user: &str, path: &str) -> Result<WriteContext, StoreError>;

    async fn entry(&self, user: &str, path: &str) -> Result<Option<EntryRecord>, StoreError>;

    /// Entries within a range, at most `limit`.
    async fn entries(&self, range: EntryRange<'_>) -> Result<Vec<EntryRecord>, StoreError>;

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

    /// Whether any entry points at this blob.
    async fn blob_referenced(&self, blob_key: &str) -> Result<bool, StoreError>;

    /// Stores a session minted by a signed request (its replay mark commits with it).
    async fn create_session(
        &self,
        session: &SessionRecord,
        replay: ReplayMark,
    ) -> Result<CreateSessionOutcome, StoreError>;

    async fn session(&self, token_hash: &[u8; 32]) -> Result<Option<SessionRecord>, StoreError>;

    /// Revokes a session; false when there was none.
    async fn delete_session(&self, token_hash: &[u8; 32]) -> Result<bool, StoreError>;

    /// Sessions not yet expired at `now`.
    async fn active_sessions(&self, now: i64) -> Result<u64, StoreError>;

    /// Forgets sessions that expired before `before`.
    async fn purge_sessions(&self, before: i64) -> Result<u64, StoreError>;

    /// Records the signature of a verified request that was refused, so it cannot be
    /// replayed later when the refusal no longer applies. False when already seen.
    async fn mark_signature(&self, mark: ReplayMark) -> Result<bool, StoreError>;

    /// Forgets replay marks that expired before `now`.
    async fn purge_replay_marks(&self, now: i64) -> Result<u64, StoreError>;

    /// Latest event cursor (0 when there is none).
    async fn latest_cursor(&self) -> Result<u64, StoreError>;

    async fn events(&self, query: EventQuery<'_>) -> Result<Vec<EventRecord>, StoreError>;

    /// Stores a new signup token; false when it exists already.
    async fn create_signup_token(&self, token: &str, now: i64) -> Result<bool, StoreError>;

    async fn signup_token(&self, token: &str) -> Result<Option<SignupTokenRecord>, StoreError>;

    async fn stats(&self) -> Result<StoreStats, StoreError>;

    /// Disables or enables a user; false when the user is unknown.
    async fn set_user_disabled(&self, user: &str, disabled: bool) -> Result<bool, StoreError>;

    /// Sets a user's quota override (None = the configured default); false when unknown.
    async fn set_user_quota(&self, user: &str, quota: Option<u64>) -> Result<bool, StoreError>;

    /// Deletes a user with all entries in one transaction, writing a DEL event per
    /// entry. Returns the blob keys to delete, or None when the user is unknown.
    async fn delete_account(&self, user: &str, now: i64)
    -> Result<Option<Vec<String>>, StoreError>;

    async fn events_reverse(
        &self,
        query: ReverseEventQuery<'_>,
    ) -> Result<Vec<EventRecord>, StoreError>;
}
