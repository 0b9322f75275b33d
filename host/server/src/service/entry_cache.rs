//! A cache of entry metadata for the read path, so a hot GET costs no database round
//! trip. Only for a store this process owns (SQLite): on a shared store (PostgreSQL)
//! it is disabled, see [`EntryCache::disabled`].
//!
//! Consistency: every committed write invalidates its key (this process's writes before
//! they answer, so a writer always reads its own write; every write, from any instance,
//! when the event tailer sees it). A read that misses may race a write: it notes the
//! invalidation epoch before reading the database and, after inserting, removes its
//! insert again if any invalidation happened meanwhile, so a stale row never stays.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use homeserver_protocol::PublicKey;
use quick_cache::sync::Cache;

use crate::persistence::metadata::{EntryRecord, Stored};

/// Memory the cache may use, weighed by [`EntryWeighter`]: about 300,000 entries of
/// values in the blob store, or fewer with their small values kept in their rows (a hot
/// small value is then served from here, with no read at all).
const CAPACITY_BYTES: u64 = 64 * 1024 * 1024;

/// The entries the cache's table is sized for: an entry of a value in the blob store
/// weighs ~250 bytes, one with a small value more; sizing the table for 250-byte
/// entries would hold ~4 MiB of it from the start for a cache that is mostly empty.
fn expected_entries(bytes: u64) -> usize {
    usize::try_from(bytes / 640).unwrap_or(usize::MAX).max(1)
}

/// An entry's weight: its key, its record and an inline value's bytes.
#[derive(Clone)]
struct EntryWeighter;

impl quick_cache::Weighter<EntryKey, Arc<EntryRecord>> for EntryWeighter {
    fn weight(&self, key: &EntryKey, record: &Arc<EntryRecord>) -> u64 {
        let stored = match &record.stored {
            Stored::Blob(key) => key.len(),
            Stored::Inline(bytes) => bytes.len(),
        };
        (key.user.len() + key.path.len() + record.path.len() + stored) as u64 + 128
    }
}

/// What an entry is cached under: its user's key (the 32 bytes, so a read needs no
/// z-base-32 text of it) and its path.
#[derive(Hash, PartialEq, Eq)]
struct EntryKey {
    user: [u8; 32],
    path: Box<str>,
}

/// An [`EntryKey`] borrowed from the request, for lookups: a hit copies nothing. Its
/// fields hash as the owned key's do (`[u8; 32]` and `&[u8; 32]`, `str` and `Box<str>`
/// hash alike).
#[derive(Hash)]
struct EntryKeyRef<'a> {
    user: &'a [u8; 32],
    path: &'a str,
}

impl<'a> EntryKeyRef<'a> {
    fn new(user: &'a PublicKey, path: &'a str) -> Self {
        Self {
            user: user.as_bytes(),
            path,
        }
    }
}

impl quick_cache::Equivalent<EntryKey> for EntryKeyRef<'_> {
    fn equivalent(&self, key: &EntryKey) -> bool {
        *self.user == key.user && self.path == &*key.path
    }
}

pub struct EntryCache {
    /// Shared records: a hit costs a reference count, not a copy of the path and key.
    entries: Cache<EntryKey, Arc<EntryRecord>, EntryWeighter>,
    epoch: AtomicU64,
    /// False on a store shared by several instances: another instance's write is only
    /// seen by this one's tailer some time after it was acknowledged, so a cached row
    /// could be stale for a read that comes right after. Such stores are read every
    /// time (blob bytes, immutable under their key, stay cached in the blob store).
    enabled: bool,
}

/// Proof of when a read started, for [`EntryCache::insert`].
#[derive(Debug, Clone, Copy)]
pub struct ReadTicket(u64);

impl Default for EntryCache {
    fn default() -> Self {
        Self::new(CAPACITY_BYTES)
    }
}

impl EntryCache {
    /// A cache of at most `bytes` (by [`EntryWeighter`]'s measure).
    pub fn new(bytes: u64) -> Self {
        Self {
            entries: Cache::with_weighter(expected_entries(bytes), bytes.max(1), EntryWeighter),
            epoch: AtomicU64::new(0),
            enabled: true,
        }
    }

    /// A cache that never holds anything (for stores shared by several instances).
    pub fn disabled() -> Self {
        Self {
            entries: Cache::with_weighter(1, 1, EntryWeighter),
            epoch: AtomicU64::new(0),
            enabled: false,
        }
    }

    pub fn get(&self, user: &PublicKey, path: &str) -> Option<Arc<EntryRecord>> {
        if !self.enabled {
            return None;
        }
        self.entries.get(&EntryKeyRef::new(user, path))
    }

    /// Take before reading the database.
    pub fn ticket(&self) -> ReadTicket {
        ReadTicket(self.epoch.load(Ordering::SeqCst))
    }

    /// Caches what a read found, unless a write may have changed it since `ticket`.
    pub fn insert(
        &self,
        ticket: ReadTicket,
        user: &PublicKey,
        path: &str,
        record: Arc<EntryRecord>,
    ) {
        if !self.enabled {
            return;
        }
        if self.epoch.load(Ordering::SeqCst) != ticket.0 {
            return;
        }
        let key = EntryKey {
            user: *user.as_bytes(),
            path: path.into(),
        };
        self.entries.insert(key, record);
        // An invalidation between the check and the insert would be lost: undo.
        if self.epoch.load(Ordering::SeqCst) != ticket.0 {
            self.entries.remove(&EntryKeyRef::new(user, path));
        }
    }

    pub fn invalidate(&self, user: &PublicKey, path: &str) {
        self.forget(user.as_bytes(), path);
    }

    /// [`invalidate`](Self::invalidate) for a user named by its z-base-32 text (as
    /// writes and events name it). Only the text's bytes are decoded (parsing a key
    /// also checks its curve point, ~10 µs, for every event the tailer sees); a stored
    /// name is a key's one canonical text, so they are the bytes its reads look up. A
    /// name that does not decode drops everything rather than leave a row stale.
    pub fn invalidate_named(&self, user: &str, path: &str) {
        if !self.enabled {
            return;
        }
        let bytes = z32::decode(user.as_bytes())
            .ok()
            .and_then(|bytes| <[u8; 32]>::try_from(bytes.get(..32)?).ok());
        match bytes {
            Some(user) => self.forget(&user, path),
            None => self.clear(),
        }
    }

    /// The one invalidation: the epoch moves first (a read in flight then cannot cache
    /// what it found), then the entry goes.
    fn forget(&self, user: &[u8; 32], path: &str) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.entries.remove(&EntryKeyRef { user, path });
    }

    /// Drops everything (an account deletion, or events missed).
    pub fn clear(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(size: u64) -> Arc<EntryRecord> {
        Arc::new(EntryRecord {
            path: "/pub/a".into(),
            stored: Stored::Blob("k".into()),
            size,
            content_hash: [0; 32],
            created_at: 0,
            updated_at: 0,
        })
    }

    fn u() -> PublicKey {
        homeserver_protocol::Keypair::from_seed(&[7; 32]).public_key()
    }

    #[test]
    fn insert_get_invalidate() {
        let c = EntryCache::new(10_000);
        let t = c.ticket();
        c.insert(t, &u(), "/pub/a", record(1));
        assert_eq!(c.get(&u(), "/pub/a").map(|r| r.size), Some(1));
        c.invalidate(&u(), "/pub/a");
        assert!(c.get(&u(), "/pub/a").is_none());
        // Named by its text, as writes and events name it.
        c.insert(c.ticket(), &u(), "/pub/a", record(2));
        let other = homeserver_protocol::Keypair::from_seed(&[8; 32]).public_key();
        c.insert(c.ticket(), &other, "/pub/a", record(3));
        c.invalidate_named(&u().to_z32(), "/pub/a");
        assert!(c.get(&u(), "/pub/a").is_none());
        assert_eq!(c.get(&other, "/pub/a").map(|r| r.size), Some(3));
        c.invalidate_named("not a key", "/pub/a");
        assert!(
            c.get(&other, "/pub/a").is_none(),
            "an odd name drops everything"
        );
    }

    #[test]
    fn a_read_that_raced_a_write_is_not_cached() {
        let c = EntryCache::new(10_000);
        let t = c.ticket();
        // A write commits and invalidates while the read is in flight.
        c.invalidate(&u(), "/pub/a");
        c.insert(t, &u(), "/pub/a", record(1));
        assert!(c.get(&u(), "/pub/a").is_none());
        // Any write anywhere blocks the stale insert (conservative).
        let t = c.ticket();
        c.invalidate(&u(), "/pub/other");
        c.insert(t, &u(), "/pub/a", record(1));
        assert!(c.get(&u(), "/pub/a").is_none());
    }
}
