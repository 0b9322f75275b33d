//! Value bytes in object storage (object_store: the local filesystem by default).
//!
//! Every PUT writes a new blob under a fresh key `<user>/<uuid v7>` and the metadata
//! commit then points the entry at it; the replaced blob is deleted after the commit.
//! So a crash can leave an unreferenced blob (garbage, removed by [`BlobStore::sweep`])
//! but never an entry pointing at a missing or partial blob: object_store writes a blob
//! to a staging file and renames it into place only when it is complete.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use object_store::buffered::BufWriter;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::io::AsyncWriteExt;

use super::metadata::MetadataStore;
use super::url::BlobsUrl;

/// Bytes buffered before a blob write turns into a multipart upload. Small values are
/// written with one `put`; large ones stream through in chunks of this size, so memory
/// per upload stays bounded whatever the value's size.
const WRITE_BUFFER_BYTES: usize = 256 * 1024;

/// Values up to this size are kept in memory after a read. A blob's bytes never change
/// under its key, so the cache can never serve stale bytes.
const CACHED_BLOB_MAX_BYTES: u64 = 64 * 1024;
/// Memory the blob cache may use.
const BLOB_CACHE_BYTES: u64 = 64 * 1024 * 1024;

#[derive(Clone)]
struct BlobWeighter;

impl quick_cache::Weighter<String, Bytes> for BlobWeighter {
    fn weight(&self, key: &String, value: &Bytes) -> u64 {
        (key.len() + value.len()) as u64 + 64
    }
}

type BlobCache = quick_cache::sync::Cache<String, Bytes, BlobWeighter>;

#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error("blob not found: {0}")]
    NotFound(String),
    #[error("blob store: {0}")]
    Store(#[from] object_store::Error),
    #[error("blob store configuration: {0}")]
    Config(String),
}

fn map_err(e: object_store::Error) -> BlobError {
    match e {
        object_store::Error::NotFound { path, .. } => BlobError::NotFound(path),
        other => BlobError::Store(other),
    }
}

#[derive(Clone)]
pub struct BlobStore {
    store: Arc<dyn ObjectStore>,
    /// Set for the local filesystem backend: where its staging files may be left.
    local_root: Option<PathBuf>,
    small: Arc<BlobCache>,
}

impl BlobStore {
    /// Opens the store named by `url` (`file://DIR`, created if missing).
    pub fn open(url: &BlobsUrl) -> Result<Self, BlobError> {
        let BlobsUrl::File(dir) = url;
        std::fs::create_dir_all(dir)
            .map_err(|e| BlobError::Config(format!("creating {}: {e}", dir.display())))?;
        let root = std::fs::canonicalize(dir)
            .map_err(|e| BlobError::Config(format!("opening {}: {e}", dir.display())))?;
        // fsync: a blob is on disk before the entry that points at it commits.
        let store = LocalFileSystem::new_with_prefix(&root)?
            .with_automatic_cleanup(true)
            .with_fsync(true);
        Ok(Self {
            store: Arc::new(store),
            local_root: Some(root),
            small: Arc::new(BlobCache::with_weighter(
                (BLOB_CACHE_BYTES / 1024) as usize,
                BLOB_CACHE_BYTES,
                BlobWeighter,
            )),
        })
    }

    /// A fresh key for a new value of `user`. UUID v7 keys sort by creation time.
    pub fn new_key(user: &str) -> String {
        format!("{user}/{}", uuid::Uuid::now_v7())
    }

    pub fn writer(&self, key: &str) -> BlobWriter {
        BlobWriter {
            inner: BufWriter::with_capacity(
                Arc::clone(&self.store),
                Path::from(key),
                WRITE_BUFFER_BYTES,
            ),
            finished: false,
        }
    }

    /// Streams a blob's bytes; `size` is the size the metadata records. Small blobs are
    /// served from memory when hot.
    pub async fn get(
        &self,
        key: &str,
        size: u64,
    ) -> Result<BoxStream<'static, Result<Bytes, BlobError>>, BlobError> {
        if size <= CACHED_BLOB_MAX_BYTES {
            if let Some(bytes) = self.small.get(key) {
                return Ok(futures_util::stream::once(async move { Ok(bytes) }).boxed());
            }
            let result = self.store.get(&Path::from(key)).await.map_err(map_err)?;
            let bytes = result.bytes().await.map_err(map_err)?;
            self.small.insert(key.to_owned(), bytes.clone());
            return Ok(futures_util::stream::once(async move { Ok(bytes) }).boxed());
        }
        let result = self.store.get(&Path::from(key)).await.map_err(map_err)?;
        Ok(result.into_stream().map_err(map_err).boxed())
    }

    pub async fn delete(&self, key: &str) -> Result<(), BlobError> {
        self.small.remove(key);
        match self.store.delete(&Path::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes what a crash can leave behind: blobs no entry points at (older than
    /// `min_age`, so uploads still in flight elsewhere are spared) and, on the local
    /// filesystem, staging files of interrupted uploads. Returns how many it removed.
    pub async fn sweep(
        &self,
        metadata: &dyn MetadataStore,
        min_age: Duration,
    ) -> Result<u64, BlobError> {
        let mut removed = 0;
        if let Some(root) = &self.local_root {
            let root = root.clone();
            removed += tokio::task::spawn_blocking(move || remove_staging_files(&root, min_age))
                .await
                .map_err(|e| BlobError::Config(e.to_string()))?;
        }
        let cutoff = chrono_cutoff(min_age);
        let mut listing = self.store.list(None);
        while let Some(meta) = listing.next().await {
            let meta = meta?;
            if meta.last_modified.timestamp() > cutoff {
                continue;
            }
            let key = meta.location.to_string();
            match metadata.blob_referenced(&key).await {
                Ok(true) => {}
                Ok(false) => {
                    self.delete(&key).await?;
                    removed += 1;
                }
                Err(e) => return Err(BlobError::Config(e.to_string())),
            }
        }
        Ok(removed)
    }
}

fn chrono_cutoff(min_age: Duration) -> i64 {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(now.saturating_sub(min_age).as_secs()).unwrap_or(i64::MAX)
}

/// Deletes `<name>#<digits>` staging files (our keys never contain `#`).
fn remove_staging_files(dir: &FsPath, min_age: Duration) -> u64 {
    let Ok(read) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for item in read.flatten() {
        let path = item.path();
        let Ok(kind) = item.file_type() else { continue };
        if kind.is_dir() {
            removed += remove_staging_files(&path, min_age);
            continue;
        }
        let name = item.file_name();
        let is_staging =
            name.to_str()
                .and_then(|n| n.rsplit_once('#'))
                .is_some_and(|(_, suffix)| {
                    !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit())
                });
        let old_enough = item
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= min_age);
        if is_staging && old_enough && std::fs::remove_file(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Writes one blob. Call [`BlobWriter::finish`] to make it visible, or
/// [`BlobWriter::abort`] to drop it; a writer dropped without either leaves at most a
/// staging file that [`BlobStore::sweep`] removes.
pub struct BlobWriter {
    inner: BufWriter,
    finished: bool,
}

impl BlobWriter {
    pub async fn write(&mut self, chunk: Bytes) -> Result<(), BlobError> {
        self.inner.put(chunk).await.map_err(map_err)
    }

    /// Completes the blob: after this returns it is durable and readable under its key.
    pub async fn finish(mut self) -> Result<(), BlobError> {
        self.finished = true;
        self.inner
            .shutdown()
            .await
            .map_err(|e| BlobError::Config(format!("completing blob write: {e}")))
    }

    pub async fn abort(mut self) {
        if !self.finished {
            self.finished = true;
            let _ = self.inner.abort().await;
        }
    }
}
