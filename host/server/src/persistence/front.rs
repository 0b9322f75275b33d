//! The store front: what every caller of a metadata store talks to, whatever the
//! backend. It adds two things to the backend below it: a deadline on every operation,
//! and group commit of the rule-bearing writes (`group_commit`).
//!
//! Deadlines:
//! A database that is down usually fails fast (connection refused), but one that is
//! unreachable (a network partition, a host that stopped answering) leaves a query
//! waiting for TCP to give up, minutes later. Server-side statement timeouts cannot help
//! then. So every call through the boundary is bounded here by `storage.timeout_secs`:
//! past it the caller gets [`StoreError::Unavailable`] (a 503) and the request ends;
//! the dropped query's connection is discarded by the pool, and later calls reconnect
//! when the database is back. A transaction cut off this way is rolled back, so a
//! deadline never leaves a partial write.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;

use super::group_commit::CommitQueue;
use super::metadata::{
    BlobState, EntryRange, EntryRecord, EventQuery, EventRecord, ListedEntry, MetadataStore,
    NewEvent, Procedure, ProcedureOutput, ReplayMark, ReverseEventQuery, SessionRecord,
    SignupTokenRecord, SignupTokenRow, StoreError, StoreStats, TokenRedemption, UserRecord,
    WriteContext, WriteTx, run_alone,
};

/// Runs `operation` with a deadline.
async fn within<T>(
    deadline: Duration,
    backend: &'static str,
    operation: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(deadline, operation).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::Unavailable(format!(
            "{backend} did not answer within {} ms",
            deadline.as_millis()
        ))),
    }
}

/// A metadata store whose every operation ends within a deadline, and whose
/// rule-bearing writes are committed in groups.
pub struct StoreFront {
    inner: Arc<dyn MetadataStore>,
    deadline: Duration,
    /// Runs procedures in batches on `inner` (None: each in its own transaction).
    commits: Option<CommitQueue>,
}

impl StoreFront {
    /// Wraps `inner`; with `group_commit`, starts its writer task (on the current
    /// runtime).
    pub fn new(inner: Arc<dyn MetadataStore>, deadline: Duration, group_commit: bool) -> Self {
        let commits = group_commit.then(|| {
            CommitQueue::new(Arc::new(Self {
                inner: inner.clone(),
                deadline,
                commits: None,
            }))
        });
        Self {
            inner,
            deadline,
            commits,
        }
    }
}

/// Implements `$trait` for `$type`: the methods given as they are, and each delegated
/// `fn name(args) -> T` as a call of the inner store's method within the deadline. (The
/// impl is generated whole so that `async_trait` sees the expanded methods.)
macro_rules! impl_with_deadline {
    (
        impl $trait:ident for $type:ty { $($own:item)* }
        delegate($self_:ident) { $( fn $name:ident($($arg:ident : $ty:ty),*) -> $out:ty; )* }
    ) => {
        #[async_trait]
        impl $trait for $type {
            $($own)*
            $(
                async fn $name(&$self_ $(, $arg: $ty)*) -> Result<$out, StoreError> {
                    within($self_.deadline, $self_.inner.backend(), $self_.inner.$name($($arg),*))
                        .await
                }
            )*
        }
    };
    (
        impl $trait:ident for $type:ty { $($own:item)* }
        delegate_mut($self_:ident) { $( fn $name:ident($($arg:ident : $ty:ty),*) -> $out:ty; )* }
    ) => {
        #[async_trait]
        impl $trait for $type {
            $($own)*
            $(
                async fn $name(&mut $self_ $(, $arg: $ty)*) -> Result<$out, StoreError> {
                    within($self_.deadline, $self_.backend, $self_.inner.$name($($arg),*)).await
                }
            )*
        }
    };
}

impl_with_deadline! {
    impl MetadataStore for StoreFront {
        fn backend(&self) -> &'static str {
            self.inner.backend()
        }

        fn shared(&self) -> bool {
            self.inner.shared()
        }

        fn remote_commits(&self) -> Option<Arc<Notify>> {
            self.inner.remote_commits()
        }

        async fn run_procedure(&self, procedure: Procedure) -> Result<ProcedureOutput, StoreError> {
            match &self.commits {
                Some(queue) => queue.submit(procedure).await,
                None => run_alone(self, &procedure).await,
            }
        }

        async fn begin_write(&self) -> Result<Box<dyn WriteTx>, StoreError> {
            let tx = within(self.deadline, self.backend(), self.inner.begin_write()).await?;
            Ok(Box::new(TxWithDeadline {
                inner: tx,
                deadline: self.deadline,
                backend: self.backend(),
            }))
        }

        async fn close(&self) {
            self.inner.close().await;
        }
    }
    delegate(self) {
        fn ping() -> ();
        fn user(public_key: &str) -> Option<UserRecord>;
        fn write_context(user: &str, path: &str) -> WriteContext;
        fn entry(user: &str, path: &str) -> Option<EntryRecord>;
        fn entries(range: EntryRange<'_>) -> Vec<EntryRecord>;
        fn listing(range: EntryRange<'_>) -> Vec<ListedEntry>;
        fn blob_referenced(blob_key: &str) -> bool;
        fn blob_state(blob_key: &str) -> BlobState;
        fn retired_blobs(retired_before: i64, limit: u32) -> Vec<String>;
        fn forget_retired_blobs(blob_keys: &[String]) -> u64;
        fn take_lease(name: &str, holder: &str, now: i64, expires_at: i64) -> bool;
        fn release_lease(name: &str, holder: &str) -> ();
        fn session(token_hash: &[u8; 32]) -> Option<SessionRecord>;
        fn delete_session(token_hash: &[u8; 32]) -> bool;
        fn active_sessions(now: i64) -> u64;
        fn purge_sessions(before: i64) -> u64;
        fn purge_replay_marks(now: i64) -> u64;
        fn latest_cursor() -> u64;
        fn events(query: EventQuery<'_>) -> Vec<EventRecord>;
        fn events_reverse(query: ReverseEventQuery<'_>) -> Vec<EventRecord>;
        fn create_signup_token(token: &str, now: i64) -> bool;
        fn signup_token(token: &str) -> Option<SignupTokenRecord>;
        fn stats() -> StoreStats;
        fn set_user_disabled(user: &str, disabled: bool) -> bool;
        fn set_user_quota(user: &str, quota: Option<u64>) -> bool;
        fn users_after(after: &str, limit: u32) -> Vec<UserRecord>;
        fn signup_tokens_after(after: &str, limit: u32) -> Vec<SignupTokenRow>;
        fn sessions_after(after: &[u8; 32], limit: u32) -> Vec<SessionRecord>;
        fn copy_users(users: &[UserRecord]) -> ();
        fn copy_entries(user: &str, entries: &[EntryRecord]) -> ();
        fn copy_events(events: &[EventRecord]) -> ();
        fn copy_signup_tokens(tokens: &[SignupTokenRow]) -> ();
        fn copy_sessions(sessions: &[SessionRecord]) -> ();
        fn put_pkarr_packet(user: &str, timestamp: i64, packet: &[u8]) -> bool;
        fn pkarr_packets_after(after: &str, limit: u32) -> Vec<(String, Vec<u8>)>;
    }
}

/// A transaction whose every step ends within the deadline (a step cut off drops the
/// transaction, which rolls it back).
struct TxWithDeadline {
    inner: Box<dyn WriteTx>,
    deadline: Duration,
    backend: &'static str,
}

impl_with_deadline! {
    impl WriteTx for TxWithDeadline {
        async fn commit(self: Box<Self>) -> Result<(), StoreError> {
            let backend = self.backend;
            within(self.deadline, backend, self.inner.commit()).await
        }
    }
    delegate_mut(self) {
        fn insert_replay_mark(mark: ReplayMark) -> bool;
        fn insert_replay_marks(marks: &[ReplayMark]) -> Vec<[u8; 32]>;
        fn lock_user(public_key: &str) -> Option<UserRecord>;
        fn insert_user(public_key: &str, now: i64, signup_token: Option<&str>) -> bool;
        fn delete_user(public_key: &str) -> ();
        fn set_usage(public_key: &str, used_bytes: u64, last_activity: i64) -> ();
        fn redeem_signup_token(token: &str, public_key: &str, now: i64) -> TokenRedemption;
        fn entry(user: &str, path: &str) -> Option<EntryRecord>;
        fn put_entries(entries: &[(&str, &EntryRecord)]) -> ();
        fn remove_entry(user: &str, path: &str) -> Option<EntryRecord>;
        fn remove_all_entries(user: &str) -> Vec<EntryRecord>;
        fn insert_session(session: &SessionRecord) -> ();
        fn sum_entry_sizes(user: &str) -> u64;
        fn retire_blobs(blob_keys: &[&str], at: i64) -> ();
        fn append_events(events: &[NewEvent<'_>]) -> ();
    }
}
