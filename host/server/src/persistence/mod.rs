//! Persistence: the only layer that knows sqlx, object_store and which backends exist.
//!
//! - [`metadata`]: the [`MetadataStore`] boundary (users, entries, events, replay marks),
//!   the records it trades in and the contracts every backend keeps.
//! - [`rules`]: the rules of every write (quota, replay marks, events), written once
//!   above the backends.
//! - [`sql`]: the metadata store on SQLite (embedded) or PostgreSQL (shared by several
//!   instances), one implementation with a small dialect; [`sqlite`]: SQLite's file
//!   tools (snapshots for backups).
//! - [`front`]: what callers talk to: a deadline on every metadata operation and
//!   [`group_commit`] of concurrent writes, whatever the backend; a batch's writes go
//!   through a `batch_tx`, which sends what they write alike once.
//! - [`blobs`]: value bytes in object storage (local filesystem by default); its large
//!   local reads go into the buffers of `read_buffers`, used again once sent.
//! - [`url`]: the typed storage URLs of the configuration, secrets redacted.
//! - [`local_lock`]: one process per local database and blob folder.
//!
//! Routes, services and the app never name a backend: they open stores through
//! [`open_metadata`] and [`BlobStore::open`] from the URLs in the configuration.

mod batch_tx;
pub mod blobs;
mod direct_writes;
pub mod front;
pub mod group_commit;
pub mod local_lock;
pub mod metadata;
mod read_buffers;
pub mod rules;
pub mod sql;
pub mod sqlite;
pub mod url;
pub mod values;

use std::sync::Arc;
use std::time::Duration;

pub use blobs::{BlobError, BlobMeta, BlobStore, BlobWriter};
pub use local_lock::{LocalStorageLock, LockError, lock_local_storage};
pub use metadata::{MetadataStore, MetadataWrites, StoreError};
pub use url::{BlobsUrl, DatabaseUrl, S3Settings, Secret};
pub use values::{ValueBytes, ValueWriter, read_value};

/// Refuses a database that holds a migration `migrator` does not know (`applied`: the
/// versions its `_sqlx_migrations` records): a newer homeserver migrated it, and this
/// one must not write to a schema it does not understand (docs/upgrade.md).
fn refuse_newer_schema(
    applied: &[i64],
    migrator: &sqlx::migrate::Migrator,
) -> Result<(), StoreError> {
    let known = migrator.iter().map(|m| m.version).max().unwrap_or(0);
    let unknown = applied
        .iter()
        .any(|v| !migrator.iter().any(|m| m.version == *v));
    if unknown {
        return Err(StoreError::NewerSchema {
            database: applied.iter().copied().max().unwrap_or(0),
            known,
        });
    }
    Ok(())
}

/// How to reach a backend: the same settings for every one.
#[derive(Debug, Clone, Copy)]
pub struct BackendOptions {
    /// Connections a server keeps to a shared database (PostgreSQL).
    pub max_connections: u32,
    /// Every store operation ends within this (503 past it): see [`front`].
    pub timeout: Duration,
    /// Commit concurrent writes together ([`group_commit`]).
    pub group_commit: bool,
}

impl Default for BackendOptions {
    fn default() -> Self {
        Self {
            max_connections: 16,
            timeout: Duration::from_secs(5),
            group_commit: true,
        }
    }
}

/// Opens (creating and migrating as needed) the metadata database `url` names, with a
/// deadline on every operation.
pub async fn open_metadata(
    url: &DatabaseUrl,
    options: &BackendOptions,
) -> Result<Arc<dyn MetadataStore>, StoreError> {
    let store: Arc<dyn MetadataStore> = Arc::new(sql::SqlStore::open(url, options).await.map_err(
        |e| match e {
            // Say which database could not be reached (the URL without secrets).
            StoreError::Unavailable(m) => StoreError::Unavailable(format!("{url}: {m}")),
            StoreError::Database {
                unavailable: true,
                source,
            } => StoreError::Unavailable(format!("{url}: {source}")),
            other => other,
        },
    )?);
    Ok(Arc::new(front::StoreFront::new(
        store,
        options.timeout,
        options.group_commit,
    )))
}
