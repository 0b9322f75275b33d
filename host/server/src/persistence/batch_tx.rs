//! A group commit's transaction: the procedures of a batch see one another's writes, but
//! the writes that many of them make alike are sent once, at the batch's end.
//!
//! A small PUT is five statements (replay mark, user row, old entry, new entry, usage),
//! each a round trip: to PostgreSQL over the network, or to sqlx's SQLite writer thread
//! and a wake-up back (docs/BENCHMARKS.md "Small PUTs: one statement a PUT": twice the
//! PUT rate on PostgreSQL, 8-16% less CPU a PUT on SQLite). [`BatchTx`] keeps, for the
//! batch:
//!
//! - the user rows it has locked, as the batch has changed them: a second write of a
//!   user reads the row from here (it is locked by this transaction, so nobody else can
//!   have changed it), and its usage is written once, at the end;
//! - the entries written, sent as one multi-row statement at the end (the last write of
//!   a path wins, as it would one by one); a later read of such an entry in the batch
//!   is answered from here;
//! - the retired blobs, and the events (whose cursors must be drawn last).
//!
//! And before the procedures run, their replay marks (each spends its own as its first
//! step, see `Procedure::replay`) are recorded in one statement; each procedure's own
//! `insert_replay_mark` is then answered from what that statement inserted, the first
//! asker of a mark hearing "new" and any later one "seen".
//!
//! Any other step (a delete, a signup, a usage recount...) first sends what is kept
//! and forgets the rows, so it runs on the database as it would without the batch.
//! If sending fails, the batch fails before its commit and each procedure runs again
//! alone (see `group_commit`), so nothing kept here can be lost silently.

use std::collections::{BTreeMap, HashMap, HashSet};

use async_trait::async_trait;
use homeserver_protocol::event::EventKind;

use super::metadata::{
    EntryRecord, NewEvent, ReplayMark, SessionRecord, StoreError, TokenRedemption, UserRecord,
    WriteTx,
};

/// A batch's transaction (see the module's documentation).
pub(super) struct BatchTx {
    inner: Box<dyn WriteTx>,
    /// Rows this transaction has locked, with its own changes.
    users: HashMap<String, UserRecord>,
    /// Usage changed by the batch and not yet written: user → (used bytes, activity).
    usage: BTreeMap<String, (u64, i64)>,
    /// Entries written by the batch and not yet sent, by user and path.
    entries: BTreeMap<String, BTreeMap<String, EntryRecord>>,
    /// Blobs retired by the batch and not yet recorded, by retirement time.
    retired: BTreeMap<i64, Vec<String>>,
    events: Vec<OwnedEvent>,
    /// Marks recorded by [`BatchTx::spend_first`]...
    spent: HashSet<[u8; 32]>,
    /// ...and those of them that were new and nobody has asked for yet.
    fresh: HashSet<[u8; 32]>,
}

impl BatchTx {
    pub(super) fn new(inner: Box<dyn WriteTx>) -> Self {
        Self {
            inner,
            users: HashMap::new(),
            usage: BTreeMap::new(),
            entries: BTreeMap::new(),
            retired: BTreeMap::new(),
            events: Vec::new(),
            spent: HashSet::new(),
            fresh: HashSet::new(),
        }
    }

    /// Records `marks` (those the batch's procedures will spend first) in one step.
    pub(super) async fn spend_first(&mut self, marks: &[ReplayMark]) -> Result<(), StoreError> {
        let mut distinct = Vec::with_capacity(marks.len());
        for mark in marks {
            if self.spent.insert(mark.signature_id) {
                distinct.push(*mark);
            }
        }
        // In one order in every batch: on PostgreSQL an insert of a mark another
        // instance's batch holds waits for it, and two batches must not wait on each
        // other (they take no other lock before this step).
        distinct.sort_unstable_by_key(|mark| mark.signature_id);
        if !distinct.is_empty() {
            let fresh = self.inner.insert_replay_marks(&distinct).await?;
            self.fresh.extend(fresh);
        }
        Ok(())
    }

    /// Sends everything kept, events last, and hands back the transaction to commit.
    pub(super) async fn finish(mut self) -> Result<Box<dyn WriteTx>, StoreError> {
        self.send_kept().await?;
        let events: Vec<NewEvent<'_>> = self.events.iter().map(OwnedEvent::borrowed).collect();
        self.inner.append_events(&events).await?;
        Ok(self.inner)
    }

    /// Writes the kept entries, usage and retired blobs (not the events).
    async fn send_kept(&mut self) -> Result<(), StoreError> {
        if !self.entries.is_empty() {
            let entries: Vec<(&str, &EntryRecord)> = self
                .entries
                .iter()
                .flat_map(|(user, entries)| entries.values().map(|e| (user.as_str(), e)))
                .collect();
            self.inner.put_entries(&entries).await?;
            self.entries.clear();
        }
        for (user, (used_bytes, last_activity)) in std::mem::take(&mut self.usage) {
            self.inner
                .set_usage(&user, used_bytes, last_activity)
                .await?;
        }
        for (at, keys) in std::mem::take(&mut self.retired) {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            self.inner.retire_blobs(&keys, at).await?;
        }
        Ok(())
    }

    /// Before a step this type does not keep: the database must hold everything, and
    /// the rows kept may change under that step.
    async fn settle(&mut self) -> Result<(), StoreError> {
        self.send_kept().await?;
        self.users.clear();
        Ok(())
    }
}

#[async_trait]
impl WriteTx for BatchTx {
    async fn insert_replay_mark(&mut self, mark: ReplayMark) -> Result<bool, StoreError> {
        if self.spent.contains(&mark.signature_id) {
            return Ok(self.fresh.remove(&mark.signature_id));
        }
        self.inner.insert_replay_mark(mark).await
    }

    async fn insert_replay_marks(
        &mut self,
        marks: &[ReplayMark],
    ) -> Result<Vec<[u8; 32]>, StoreError> {
        let mut fresh = Vec::new();
        for mark in marks {
            if self.insert_replay_mark(*mark).await? {
                fresh.push(mark.signature_id);
            }
        }
        Ok(fresh)
    }

    async fn lock_user(&mut self, public_key: &str) -> Result<Option<UserRecord>, StoreError> {
        if let Some(user) = self.users.get(public_key) {
            return Ok(Some(user.clone()));
        }
        let user = self.inner.lock_user(public_key).await?;
        if let Some(user) = &user {
            self.users.insert(public_key.to_owned(), user.clone());
        }
        Ok(user)
    }

    async fn insert_user(
        &mut self,
        public_key: &str,
        now: i64,
        signup_token: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.settle().await?;
        self.inner.insert_user(public_key, now, signup_token).await
    }

    async fn delete_user(&mut self, public_key: &str) -> Result<(), StoreError> {
        self.settle().await?;
        self.inner.delete_user(public_key).await
    }

    async fn set_usage(
        &mut self,
        public_key: &str,
        used_bytes: u64,
        last_activity: i64,
    ) -> Result<(), StoreError> {
        let Some(user) = self.users.get_mut(public_key) else {
            // Not a row this batch holds: nothing would read the kept figure.
            return self
                .inner
                .set_usage(public_key, used_bytes, last_activity)
                .await;
        };
        user.used_bytes = used_bytes;
        user.last_activity = last_activity;
        self.usage
            .insert(public_key.to_owned(), (used_bytes, last_activity));
        Ok(())
    }

    async fn redeem_signup_token(
        &mut self,
        token: &str,
        public_key: &str,
        now: i64,
    ) -> Result<TokenRedemption, StoreError> {
        // Its own table, which nothing here keeps.
        self.inner.redeem_signup_token(token, public_key, now).await
    }

    async fn entry(&mut self, user: &str, path: &str) -> Result<Option<EntryRecord>, StoreError> {
        if let Some(entry) = self.entries.get(user).and_then(|kept| kept.get(path)) {
            return Ok(Some(entry.clone()));
        }
        self.inner.entry(user, path).await
    }

    async fn put_entry(&mut self, user: &str, entry: &EntryRecord) -> Result<(), StoreError> {
        self.entries
            .entry(user.to_owned())
            .or_default()
            .insert(entry.path.clone(), entry.clone());
        Ok(())
    }

    async fn put_entries(&mut self, entries: &[(&str, &EntryRecord)]) -> Result<(), StoreError> {
        for (user, entry) in entries {
            self.put_entry(user, entry).await?;
        }
        Ok(())
    }

    async fn remove_entry(
        &mut self,
        user: &str,
        path: &str,
    ) -> Result<Option<EntryRecord>, StoreError> {
        self.settle().await?;
        self.inner.remove_entry(user, path).await
    }

    async fn remove_all_entries(&mut self, user: &str) -> Result<Vec<EntryRecord>, StoreError> {
        self.settle().await?;
        self.inner.remove_all_entries(user).await
    }

    async fn insert_session(&mut self, session: &SessionRecord) -> Result<(), StoreError> {
        // Its own table, which nothing here keeps.
        self.inner.insert_session(session).await
    }

    async fn sum_entry_sizes(&mut self, user: &str) -> Result<u64, StoreError> {
        self.settle().await?;
        self.inner.sum_entry_sizes(user).await
    }

    async fn retire_blobs(&mut self, blob_keys: &[&str], at: i64) -> Result<(), StoreError> {
        self.retired
            .entry(at)
            .or_default()
            .extend(blob_keys.iter().map(|k| (*k).to_owned()));
        Ok(())
    }

    async fn append_events(&mut self, events: &[NewEvent<'_>]) -> Result<(), StoreError> {
        self.events.extend(events.iter().map(OwnedEvent::of));
        Ok(())
    }

    async fn commit(self: Box<Self>) -> Result<(), StoreError> {
        // `group_commit` commits what `finish` hands back; this is for any other caller.
        self.finish().await?.commit().await
    }
}

/// An event kept until the batch's end.
struct OwnedEvent {
    user: String,
    path: String,
    kind: EventKind,
    content_hash: Option<[u8; 32]>,
    created_at: i64,
}

impl OwnedEvent {
    fn of(event: &NewEvent<'_>) -> Self {
        Self {
            user: event.user.to_owned(),
            path: event.path.to_owned(),
            kind: event.kind,
            content_hash: event.content_hash,
            created_at: event.created_at,
        }
    }

    fn borrowed(&self) -> NewEvent<'_> {
        NewEvent {
            user: &self.user,
            path: &self.path,
            kind: self.kind,
            content_hash: self.content_hash,
            created_at: self.created_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures_util::future::BoxFuture;

    use super::*;
    use crate::persistence::metadata::{EntryRange, EventQuery, MetadataStore, NewEntry, Stored};
    use crate::persistence::rules;
    use crate::persistence::sql::SqlStore;
    use crate::persistence::{BackendOptions, DatabaseUrl};

    type Step = Box<dyn for<'t> Fn(&'t mut dyn WriteTx) -> BoxFuture<'t, String>>;

    fn mark(n: u8) -> ReplayMark {
        ReplayMark {
            signature_id: [n; 32],
            expires_at: i64::MAX,
        }
    }

    fn put(user: &'static str, path: &'static str, size: u64, blob: Option<&'static str>) -> Step {
        put_signed(user, path, size, blob, None)
    }

    fn put_signed(
        user: &'static str,
        path: &'static str,
        size: u64,
        blob: Option<&'static str>,
        replay: Option<u8>,
    ) -> Step {
        Box::new(move |tx| {
            Box::pin(async move {
                let stored = match blob {
                    Some(key) => Stored::Blob(key.into()),
                    None => Stored::Inline(vec![7; size as usize].into()),
                };
                let entry = NewEntry {
                    user,
                    path,
                    stored,
                    size,
                    content_hash: [size as u8; 32],
                    now: 1_000 + size as i64,
                    default_quota: 250,
                };
                format!("{:?}", rules::put(tx, &entry, replay.map(mark)).await)
            })
        })
    }

    /// Writes of every kind, several of one user and of one path, a quota refusal that
    /// only the batch's earlier writes cause, a replay within the batch, steps that
    /// settle what is kept (delete, recount) and writes after them.
    fn steps() -> Vec<Step> {
        vec![
            Box::new(|tx| {
                Box::pin(async move {
                    format!("{:?}", rules::sign_up(tx, "alice", None, 10, mark(1)).await)
                })
            }),
            Box::new(|tx| {
                Box::pin(async move {
                    format!("{:?}", rules::sign_up(tx, "bob", None, 11, mark(2)).await)
                })
            }),
            put("alice", "/pub/a", 100, Some("blob-1")),
            put("alice", "/pub/b", 100, None),
            put("alice", "/pub/a", 120, Some("blob-2")),
            put("alice", "/pub/c", 50, None),
            put_signed("bob", "/pub/a", 10, None, Some(3)),
            put_signed("bob", "/pub/x", 10, None, Some(3)),
            Box::new(|tx| {
                Box::pin(async move {
                    format!(
                        "{:?}",
                        rules::delete(tx, "alice", "/pub/b", 1_200, Some(mark(4))).await
                    )
                })
            }),
            put("alice", "/pub/c", 50, None),
            Box::new(|tx| {
                Box::pin(async move { format!("{:?}", rules::recompute_usage(tx, "alice").await) })
            }),
            put("alice", "/pub/a", 1, Some("blob-3")),
            put("bob", "/pub/a", 12, None),
            put("carol", "/pub/a", 1, None),
        ]
    }

    async fn store() -> (tempfile::TempDir, Arc<dyn MetadataStore>) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/hs.db", dir.path().display());
        let url = DatabaseUrl::parse(&url).unwrap();
        let store = SqlStore::open(&url, &BackendOptions::default())
            .await
            .unwrap();
        (dir, Arc::new(store))
    }

    /// Everything a write can change, as text to compare.
    async fn state(store: &dyn MetadataStore) -> String {
        let mut text = String::new();
        for user in store.users_after("", 100).await.unwrap() {
            let entries = store
                .entries(EntryRange {
                    user: &user.public_key,
                    after: "",
                    before: "\u{10FFFF}",
                    descending: false,
                    limit: 100,
                })
                .await
                .unwrap();
            text += &format!("{user:?}\n{entries:?}\n");
        }
        let events = store
            .events(EventQuery {
                users: &[],
                after: 0,
                up_to: u64::MAX,
                path_prefix: None,
                limit: 100,
            })
            .await
            .unwrap();
        let retired = store.retired_blobs(i64::MAX, 100).await.unwrap();
        text + &format!("{events:?}\n{retired:?}")
    }

    #[tokio::test]
    async fn a_batch_ends_as_its_writes_one_by_one() {
        let (_one_dir, one_by_one) = store().await;
        let (_batch_dir, batched) = store().await;
        let mut alone = Vec::new();
        for step in steps() {
            let mut tx = one_by_one.begin_write().await.unwrap();
            alone.push(step(tx.as_mut()).await);
            tx.commit().await.unwrap();
        }
        let mut together = Vec::new();
        let mut tx = BatchTx::new(batched.begin_write().await.unwrap());
        // As `group_commit` declares them (mark 4, of the delete, left to its step).
        let declared = [mark(1), mark(2), mark(3), mark(3)];
        tx.spend_first(&declared).await.unwrap();
        for step in steps() {
            together.push(step(&mut tx).await);
        }
        tx.finish().await.unwrap().commit().await.unwrap();

        assert_eq!(together, alone, "each write's outcome");
        let (after_alone, after_batch) = (state(&*one_by_one).await, state(&*batched).await);
        assert_eq!(after_batch, after_alone, "what is stored");
        // The steps meant what they say: a refusal caused by the batch's own writes, a
        // replay within it, a blob retired by an overwrite in it.
        assert!(alone[5].contains("QuotaExceeded"), "{}", alone[5]);
        assert_eq!(alone[7], "Ok(Replayed)");
        assert!(after_alone.contains("blob-1"), "{after_alone}");
        for store in [&one_by_one, &batched] {
            let mut tx = store.begin_write().await.unwrap();
            for n in 1..=4 {
                assert!(!tx.insert_replay_mark(mark(n)).await.unwrap(), "mark {n}");
            }
            assert!(tx.insert_replay_mark(mark(5)).await.unwrap());
        }
    }
}
