//! Persistence: the only layer that knows sqlx and object_store.
//!
//! - [`metadata`]: the [`MetadataStore`] boundary (users, entries, events, replay marks)
//!   and the records it trades in.
//! - [`sqlite`]: the embedded SQLite implementation.
//! - [`blobs`]: value bytes in object storage (local filesystem by default).

pub mod blobs;
pub mod metadata;
pub mod sqlite;

pub use blobs::{BlobError, BlobStore, BlobWriter};
pub use metadata::{MetadataStore, StoreError};
