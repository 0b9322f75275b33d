//! Persistence: the only layer that knows sqlx, object_store and which backends exist.
//!
//! - [`metadata`]: the [`MetadataStore`] boundary (users, entries, events, replay marks),
//!   the records it trades in and the contracts every backend keeps.
//! - [`rules`]: the rules of every write (quota, replay marks, events), written once
//!   above the backends.
//! - [`sqlite`]: the embedded SQLite backend.
//! - [`blobs`]: value bytes in object storage (local filesystem by default).
//! - [`url`]: the typed storage URLs of the configuration, secrets redacted.
//!
//! Routes, services and the app never name a backend: they open stores through
//! [`open_metadata`] and [`BlobStore::open`] from the URLs in the configuration.

pub mod blobs;
pub mod metadata;
pub mod rules;
pub mod sqlite;
pub mod url;

use std::sync::Arc;

pub use blobs::{BlobError, BlobStore, BlobWriter};
pub use metadata::{MetadataStore, MetadataWrites, StoreError};
pub use url::{BlobsUrl, DatabaseUrl};

/// Opens (creating and migrating as needed) the metadata database `url` names.
pub async fn open_metadata(url: &DatabaseUrl) -> Result<Arc<dyn MetadataStore>, StoreError> {
    match url {
        DatabaseUrl::Sqlite(_) => Ok(Arc::new(
            sqlite::SqliteStore::open(url.expose_secret()).await?,
        )),
        DatabaseUrl::Postgres(_) => Err(StoreError::Internal(format!(
            "{url}: PostgreSQL is not supported by this build"
        ))),
    }
}
