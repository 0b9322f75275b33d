//! Value bytes in object storage (object_store): the local filesystem by default, or any
//! S3-compatible store (AWS S3, MinIO, Garage, Ceph, ...) for several instances.
//!
//! Every PUT writes a new blob under a fresh key `<user>/<uuid v7>` and the metadata
//! commit then points the entry at it. So a crash can leave an unreferenced blob
//! (garbage, removed by [`BlobStore::sweep`]) but never an entry pointing at a missing
//! or partial blob: a blob is written to a staging file and renamed into place only
//! when it is complete (by object_store on S3, by `direct_writes` on local disk, which
//! writes large blobs around the page cache).
//!
//! A blob an overwrite or a delete leaves unreferenced is not deleted with its commit:
//! the commit records it as retired, and [`BlobStore::sweep_retired`] deletes it once
//! the grace period (`storage.blob_grace_secs`) has passed. So a copy of the blobs
//! finished within that time after a database snapshot has every value the snapshot
//! points at (an online backup restores), and a reader that fetched an entry just
//! before an overwrite still finds its bytes.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::buffered::BufWriter;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{ClientOptions, GetResultPayload, ObjectStore, ObjectStoreExt, RetryConfig};
use tokio::io::AsyncWriteExt;

use super::BackendOptions;
use super::direct_writes::{DirectWrites, LocalBlobWriter};
use super::metadata::{BlobState, MetadataStore};
use super::read_buffers::ReadBuffers;
use super::url::{BlobsUrl, S3Settings};

/// Bytes buffered before a blob write turns into a multipart upload. Small values are
/// written with one `put`; large ones stream through in parts of this size, so memory
/// per upload stays bounded whatever the value's size. On S3 a part (but the last) must
/// be at least 5 MiB.
const LOCAL_WRITE_BUFFER_BYTES: usize = 256 * 1024;
const S3_WRITE_BUFFER_BYTES: usize = 5 * 1024 * 1024;
/// Bytes read from a local blob at a time when streaming it out.
const LOCAL_READ_BYTES: usize = super::read_buffers::CHUNK_BYTES;

/// Streams the `size` bytes of a local blob file in reads of [`LOCAL_READ_BYTES`].
///
/// object_store would stream it in 8 KiB reads, and `tokio::fs::File` reads into a
/// buffer of its own and copies from there. Here each chunk is one blocking read
/// straight into the buffer that becomes the body frame, the next read starts as soon
/// as a chunk is handed on (so disk and socket work overlap), and the recorded size ends
/// the stream without a last read to find the end. A file shorter than recorded ends
/// the stream with an error (the response is cut, never silently short). The chunks'
/// buffers come from a pool and go back to it once sent (`read_buffers`).
fn read_file(
    file: std::fs::File,
    size: u64,
) -> impl futures_util::Stream<Item = Result<Bytes, BlobError>> + Send + 'static {
    type Pending = tokio::task::JoinHandle<std::io::Result<(std::fs::File, Bytes)>>;
    fn start(mut file: std::fs::File, want: u64) -> Pending {
        tokio::task::spawn_blocking(move || {
            use std::io::Read as _;
            let buffers = ReadBuffers::shared();
            let mut chunk = buffers.take();
            (&mut file).take(want).read_to_end(&mut chunk)?;
            Ok((file, buffers.freeze(chunk)))
        })
    }
    let failed = |e: String| BlobError::Unavailable(format!("reading a blob: {e}"));
    let first = size.min(LOCAL_READ_BYTES as u64);
    let pending = (size > 0).then(|| start(file, first));
    futures_util::stream::try_unfold(
        (pending, first, size - first),
        move |(pending, want, left)| async move {
            let Some(pending) = pending else {
                return Ok(None);
            };
            let (file, chunk) = pending
                .await
                .map_err(|e| failed(e.to_string()))?
                .map_err(|e| failed(e.to_string()))?;
            if (chunk.len() as u64) < want {
                return Err(failed(format!(
                    "the file ends {} bytes before its recorded size",
                    want - chunk.len() as u64 + left
                )));
            }
            let next = left.min(LOCAL_READ_BYTES as u64);
            let pending = (next > 0).then(|| start(file, next));
            Ok(Some((chunk, (pending, next, left - next))))
        },
    )
}

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
    /// The store did not answer, or failed to (connection refused, timeouts, server
    /// errors after the retries, a full disk): the caller may retry later (503).
    #[error("blob store unavailable: {0}")]
    Unavailable(String),
    #[error("blob store: {0}")]
    Store(#[source] object_store::Error),
    #[error("blob store configuration: {0}")]
    Config(String),
    /// A value is not what its entry records (a bug or a damaged store: 500).
    #[error("damaged value: {0}")]
    Damaged(String),
    /// The sweep could not delete a retired blob (the last of them in its pass).
    #[error("deleting retired blob {key}: {source}")]
    Retired {
        key: String,
        #[source]
        source: Box<BlobError>,
    },
}

impl BlobError {
    /// Whether the caller may retry later (503) rather than having hit a bug (500).
    pub fn is_unavailable(&self) -> bool {
        match self {
            BlobError::Unavailable(_) => true,
            BlobError::Retired { source, .. } => source.is_unavailable(),
            _ => false,
        }
    }
}

fn map_err(e: object_store::Error) -> BlobError {
    match e {
        object_store::Error::NotFound { path, .. } => BlobError::NotFound(path),
        // Transport and server-side failures (object_store's retries already ran).
        e @ object_store::Error::Generic { .. } => BlobError::Unavailable(e.to_string()),
        other => BlobError::Store(other),
    }
}

/// An I/O error from object_store's buffered writer, which wraps the store's own error.
fn map_io_err(e: std::io::Error) -> BlobError {
    match e
        .into_inner()
        .map(|inner| inner.downcast::<object_store::Error>())
    {
        Some(Ok(store_error)) => map_err(*store_error),
        Some(Err(other)) => BlobError::Unavailable(other.to_string()),
        None => BlobError::Unavailable("I/O error completing a blob write".into()),
    }
}

#[derive(Clone)]
pub struct BlobStore {
    store: Arc<dyn ObjectStore>,
    backend: &'static str,
    /// Set for the local filesystem backend: where its staging files may be left.
    local_root: Option<PathBuf>,
    /// The local backend, for the files its blobs are written to (`direct_writes`).
    local: Option<Arc<LocalFileSystem>>,
    /// Whether the local backend's folder takes direct writes.
    direct: DirectWrites,
    write_buffer: usize,
    small: Arc<BlobCache>,
    /// How long [`BlobStore::ping`] waits for an answer (the storage timeout).
    ping_timeout: Duration,
}

impl BlobStore {
    /// Opens the store named by `url`: `file://DIR` (created if missing), or
    /// `s3://BUCKET[/PREFIX]` reached with `s3`. Every request to a remote store ends
    /// within `options.timeout` (connecting, or waiting for the next bytes), after a
    /// few quick retries, so a store that is down answers 503 instead of hanging.
    pub fn open(
        url: &BlobsUrl,
        s3: &S3Settings,
        options: &BackendOptions,
    ) -> Result<Self, BlobError> {
        let mut local = None;
        let (store, local_root, write_buffer): (Arc<dyn ObjectStore>, _, _) = match url {
            BlobsUrl::File(dir) => {
                std::fs::create_dir_all(dir)
                    .map_err(|e| BlobError::Config(format!("creating {}: {e}", dir.display())))?;
                let root = std::fs::canonicalize(dir)
                    .map_err(|e| BlobError::Config(format!("opening {}: {e}", dir.display())))?;
                // fsync: a blob is on disk before the entry that points at it commits.
                let store = LocalFileSystem::new_with_prefix(&root)
                    .map_err(map_err)?
                    .with_automatic_cleanup(true)
                    .with_fsync(true);
                let store = Arc::new(store);
                local = Some(store.clone());
                (store, Some(root), LOCAL_WRITE_BUFFER_BYTES)
            }
            BlobsUrl::S3 { bucket, prefix } => {
                let store = open_s3(bucket, s3, options)?;
                let store: Arc<dyn ObjectStore> = match prefix {
                    Some(prefix) => Arc::new(PrefixStore::new(store, prefix.as_str())),
                    None => Arc::new(store),
                };
                (store, None, S3_WRITE_BUFFER_BYTES)
            }
        };
        Ok(Self {
            store,
            backend: url.backend(),
            local_root,
            local,
            direct: DirectWrites::new(true),
            write_buffer,
            ping_timeout: options.timeout,
            small: Arc::new(BlobCache::with_weighter(
                (BLOB_CACHE_BYTES / 1024) as usize,
                BLOB_CACHE_BYTES,
                BlobWeighter,
            )),
        })
    }

    /// The backend's name (`file`, `s3`), for logs and stats.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Checks that the store answers (readiness and `/admin/stats`), within the storage
    /// timeout: the client's retries alone could take longer.
    pub async fn ping(&self) -> Result<(), BlobError> {
        tokio::time::timeout(self.ping_timeout, self.ping_once())
            .await
            .unwrap_or_else(|_| {
                Err(BlobError::Unavailable(format!(
                    "{} did not answer within {} ms",
                    self.backend,
                    self.ping_timeout.as_millis()
                )))
            })
    }

    async fn ping_once(&self) -> Result<(), BlobError> {
        if let Some(root) = &self.local_root {
            return tokio::fs::metadata(root)
                .await
                .map(|_| ())
                .map_err(|e| BlobError::Config(format!("{}: {e}", root.display())));
        }
        // Any answer, "not found" included, means the store is reachable.
        match self.store.head(&Path::from("homeserver-ping")).await {
            Ok(_) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(map_err(e)),
        }
    }

    /// A fresh key for a new value of `user`. UUID v7 keys sort by creation time.
    pub fn new_key(user: &str) -> String {
        format!("{user}/{}", uuid::Uuid::now_v7())
    }

    pub fn writer(&self, key: &str) -> BlobWriter {
        let path = Path::from(key);
        // The file object_store reads the blob from (a key it cannot map fails there).
        let file = self.local.as_ref().map(|l| l.path_to_filesystem(&path));
        let inner = match file {
            // Written by hand, around the page cache; published as object_store does.
            Some(Ok(file)) => Writer::Local(LocalBlobWriter::new(
                file,
                self.direct.clone(),
                ReadBuffers::shared(),
            )),
            _ => Writer::Store(BufWriter::with_capacity(
                Arc::clone(&self.store),
                path,
                self.write_buffer,
            )),
        };
        BlobWriter {
            inner,
            key: key.to_owned(),
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
        match result.payload {
            GetResultPayload::File(file, _) => Ok(read_file(file, size).boxed()),
            GetResultPayload::Stream(stream) => Ok(stream.map_err(map_err).boxed()),
        }
    }

    /// The size of the blob at `key`, or None when there is none.
    pub async fn size_of(&self, key: &str) -> Result<Option<u64>, BlobError> {
        match self.store.head(&Path::from(key)).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(map_err(e)),
        }
    }

    /// Every blob whose key starts with `prefix` (all when None), in no set order.
    pub fn list(&self, prefix: Option<&str>) -> BoxStream<'static, Result<BlobMeta, BlobError>> {
        let prefix = prefix.map(Path::from);
        self.store
            .list(prefix.as_ref())
            .map(|meta| {
                let meta = meta.map_err(map_err)?;
                Ok(BlobMeta {
                    key: meta.location.to_string(),
                    size: meta.size,
                    modified: meta.last_modified.timestamp(),
                })
            })
            .boxed()
    }

    /// Writes a whole blob at once (tools and tests; the API streams with `writer`).
    pub async fn put_bytes(&self, key: &str, bytes: Bytes) -> Result<(), BlobError> {
        let mut writer = self.writer(key);
        writer.write(bytes).await?;
        writer.finish().await
    }

    pub async fn delete(&self, key: &str) -> Result<(), BlobError> {
        // No blob has an empty key (`new_key`); an empty key is an inline value's mark,
        // which a 0.1.0 instance running beside this version may have retired as a
        // blob: there is nothing to delete (and on S3 it would name the bucket's root).
        if key.is_empty() {
            return Ok(());
        }
        self.small.remove(key);
        match self.store.delete(&Path::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(map_err(e)),
        }
    }

    /// Deletes the retired blobs whose grace period has passed, then forgets their
    /// records, a page at a time. A crash between the two leaves records whose blobs are
    /// gone: the next pass deletes nothing for them (a missing blob is no error) and
    /// forgets them. A blob that cannot be deleted keeps its record and does not hold up
    /// the others: the pass goes on with the rest, then answers the last such error (the
    /// next pass tries that blob again). Returns how many records it forgot.
    pub async fn sweep_retired(
        &self,
        metadata: &dyn MetadataStore,
        grace: Duration,
    ) -> Result<u64, BlobError> {
        let before = chrono_cutoff(grace);
        let mut forgotten = 0;
        loop {
            let keys = metadata
                .retired_blobs(before, RETIRED_PAGE)
                .await
                .map_err(metadata_error)?;
            let mut deleted = Vec::with_capacity(keys.len());
            let mut failed = None;
            for key in keys {
                // Keys are never reused, so a retired blob is never referenced again;
                // checked all the same (an operator's repair could have re-pointed one).
                let state = metadata.blob_state(&key).await.map_err(metadata_error)?;
                if state != BlobState::Referenced
                    && let Err(e) = self.delete(&key).await
                {
                    failed = Some(BlobError::Retired {
                        key,
                        source: Box::new(e),
                    });
                    continue;
                }
                deleted.push(key);
            }
            // Oldest first: blobs that failed come back at the head of the next page, so a
            // page with nothing else in it is the end of this pass.
            if deleted.is_empty() {
                return match failed {
                    None => Ok(forgotten),
                    Some(failed) => Err(failed),
                };
            }
            forgotten += metadata
                .forget_retired_blobs(&deleted)
                .await
                .map_err(metadata_error)?;
        }
    }

    /// Removes what a crash can leave behind: blobs no entry points at and that are not
    /// retired (older than `min_age`, so uploads still in flight elsewhere are spared)
    /// and, on the local filesystem, staging files of interrupted uploads. Retired
    /// blobs are [`BlobStore::sweep_retired`]'s. Returns how many it removed.
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
        let mut listing = self.list(None);
        while let Some(meta) = listing.next().await {
            let meta = meta?;
            if meta.modified > cutoff {
                continue;
            }
            let key = meta.key;
            // Referenced and retired in one read: an overwrite commits both at once.
            if metadata.blob_state(&key).await.map_err(metadata_error)? == BlobState::Unknown {
                self.delete(&key).await?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// The file the local backend keeps blob `key` in, under its folder `root` (for tools
/// that copy a `file://` store as files: backups and restores).
pub fn local_blob_file(root: &FsPath, key: &str) -> PathBuf {
    key.split('/')
        .fold(root.to_owned(), |path, segment| path.join(segment))
}

/// An S3 client: settings from `[s3]`, then the AWS environment variables. Public for
/// conformance tests and tools that need the raw client.
pub fn open_s3(
    bucket: &str,
    s3: &S3Settings,
    options: &BackendOptions,
) -> Result<AmazonS3, BlobError> {
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
    if !s3.endpoint.is_empty() {
        builder = builder.with_endpoint(&s3.endpoint);
    }
    if !s3.region.is_empty() {
        builder = builder.with_region(&s3.region);
    }
    if s3.path_style {
        builder = builder.with_virtual_hosted_style_request(false);
    }
    if s3.allow_http {
        builder = builder.with_allow_http(true);
    }
    if !s3.access_key_id.is_empty() {
        builder = builder.with_access_key_id(&s3.access_key_id);
    }
    if !s3.secret_access_key.is_empty() {
        builder = builder.with_secret_access_key(s3.secret_access_key.expose());
    }
    let client = ClientOptions::new()
        .with_allow_http(s3.allow_http)
        .with_connect_timeout(options.timeout)
        // Between two reads, not for a whole body: a large value on a slow link is
        // fine, a store that stopped answering is not.
        .with_read_timeout(options.timeout)
        .with_timeout_disabled();
    let retry = RetryConfig {
        max_retries: 3,
        retry_timeout: options.timeout,
        ..RetryConfig::default()
    };
    builder
        .with_client_options(client)
        .with_retry(retry)
        .build()
        .map_err(|e| BlobError::Config(format!("S3 bucket {bucket}: {e}")))
}

/// Retirement records handled at a time by [`BlobStore::sweep_retired`].
const RETIRED_PAGE: u32 = 500;

/// A metadata error met by a sweep (which answers in blob-store terms).
fn metadata_error(e: super::StoreError) -> BlobError {
    if e.is_unavailable() {
        BlobError::Unavailable(format!("metadata: {e}"))
    } else {
        BlobError::Config(format!("metadata: {e}"))
    }
}

fn chrono_cutoff(min_age: Duration) -> i64 {
    let now = homeserver_protocol::clock::since_epoch();
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

/// A stored blob, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobMeta {
    pub key: String,
    pub size: u64,
    /// Last modified, Unix seconds.
    pub modified: i64,
}

/// Writes one blob. Call [`BlobWriter::finish`] to make it visible, or
/// [`BlobWriter::abort`] to drop it; a writer dropped without either leaves at most a
/// staging file that [`BlobStore::sweep`] removes.
pub struct BlobWriter {
    inner: Writer,
    key: String,
}

enum Writer {
    /// The local backend's (`direct_writes`).
    Local(LocalBlobWriter),
    /// object_store's, for S3.
    Store(BufWriter),
}

impl BlobWriter {
    pub async fn write(&mut self, chunk: Bytes) -> Result<(), BlobError> {
        match &mut self.inner {
            Writer::Local(local) => local
                .write(chunk)
                .await
                .map_err(|e| local_error(&self.key, e)),
            Writer::Store(store) => store.put(chunk).await.map_err(map_err),
        }
    }

    /// Completes the blob: after this returns it is durable and readable under its key.
    pub async fn finish(self) -> Result<(), BlobError> {
        match self.inner {
            Writer::Local(local) => local.finish().await.map_err(|e| local_error(&self.key, e)),
            Writer::Store(mut store) => store.shutdown().await.map_err(map_io_err),
        }
    }

    pub async fn abort(self) {
        match self.inner {
            Writer::Local(local) => local.abort().await,
            Writer::Store(mut store) => {
                let _ = store.abort().await;
            }
        }
    }
}

/// A local write that failed: the disk is full, gone or read-only, which a later try
/// may not meet (503), as object_store's errors are taken.
fn local_error(key: &str, e: std::io::Error) -> BlobError {
    BlobError::Unavailable(format!("writing blob {key}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(bytes: &[u8]) -> (tempfile::NamedTempFile, std::fs::File) {
        let mut named = tempfile::NamedTempFile::new().expect("temp file");
        std::io::Write::write_all(&mut named, bytes).expect("write");
        let file = std::fs::File::open(named.path()).expect("open");
        (named, file)
    }

    #[tokio::test]
    async fn a_file_streams_whole_in_chunks_of_the_read_size() {
        let value: Vec<u8> = (0..3 * LOCAL_READ_BYTES + 17)
            .map(|i| (i % 251) as u8)
            .collect();
        let (_named, file) = file_of(&value);
        let chunks: Vec<Bytes> = read_file(file, value.len() as u64)
            .try_collect()
            .await
            .expect("read");
        let sizes: Vec<usize> = chunks.iter().map(Bytes::len).collect();
        assert_eq!(
            sizes,
            [LOCAL_READ_BYTES, LOCAL_READ_BYTES, LOCAL_READ_BYTES, 17]
        );
        assert!(chunks.concat() == value, "the bytes come back in order");
        drop(chunks);
        // The chunks' buffers were the pool's and went back: a second read reuses them.
        let (_named, file) = file_of(&value);
        let again: Vec<Bytes> = read_file(file, value.len() as u64)
            .try_collect()
            .await
            .expect("read");
        assert!(again.concat() == value);
    }

    #[tokio::test]
    async fn a_file_shorter_than_recorded_ends_with_an_error() {
        let (_named, file) = file_of(&[7; 1000]);
        let read: Result<Vec<Bytes>, _> = read_file(file, 1500).try_collect().await;
        let error = read.expect_err("a short file is an error, not a short body");
        assert!(error.to_string().contains("500 bytes before"), "{error}");
    }
}
