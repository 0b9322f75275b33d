//! Entries: PUT, GET, DELETE and listing, with the size limit and per-user quota.
//!
//! The write path: every check that needs no body first (credentials' shape and age, the
//! signature itself when the body's digest was declared, registration, declared size,
//! quota; the last two are left to the commit for a body declared small enough for its
//! entry's row), then the body streams into its value (kept in memory for the entry's row up
//! to `storage.inline_max_bytes`, a new blob past it: `persistence::values`) while it
//! is hashed (SHA-256 for the signature, BLAKE3 for the content hash) and counted (a
//! signed body without a declared digest is held in memory until its signature is
//! checked, never written before), then one metadata transaction commits entry (with a
//! small value), usage, replay mark and event. A replaced blob is retired by that same
//! transaction and deleted by the sweep once the grace period has passed
//! (`persistence::blobs`): a backup or a reader may still need it.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use homeserver_protocol::event::encode_content_hash;
use homeserver_protocol::wire::{AccountInfo, DeleteResult, ListEntry, ListResult, PutResult};
use homeserver_protocol::{BodyHash, PublicKey, StoragePath};
use sha2::{Digest, Sha256};

use super::access::{WriteGrant, Writer};
use super::auth;
use super::entry_cache::EntryCache;
use super::events::EventHub;
use super::upload_staging::{StagedBody, UploadStaging};
use super::visibility::PublicFilter;
use super::{ServiceError, now_secs};
use crate::persistence::blobs::BlobError;
use crate::persistence::metadata::EntryRecord;
use crate::persistence::metadata::{
    DeleteOutcome, EntryRange, NewEntry, PutOutcome, QuotaExceeded,
};
use crate::persistence::rules::check_quota;
use crate::persistence::{
    BlobStore, MetadataStore, MetadataWrites, ValueBytes, ValueWriter, read_value,
};

/// One stored value as routes see it: what its response headers say. Where its bytes
/// live (the blob key) stays inside the service; [`StorageService::open`] reads them.
#[derive(Debug, Clone)]
pub struct Entry(Arc<EntryRecord>);

impl Entry {
    pub fn size(&self) -> u64 {
        self.0.size
    }

    pub fn content_hash(&self) -> &[u8; 32] {
        &self.0.content_hash
    }

    /// Unix seconds of the last write.
    pub fn updated_at(&self) -> i64 {
        self.0.updated_at
    }
}

/// Limits of the storage API.
#[derive(Debug, Clone, Copy)]
pub struct StorageLimits {
    pub max_value_bytes: u64,
    /// Default per-user quota; 0 = unlimited.
    pub quota_bytes: u64,
    /// An upload that sends nothing for this long is dropped.
    pub body_idle_timeout: std::time::Duration,
    /// An upload not complete this long after its body started is dropped, however
    /// steadily it trickles (it holds a connection and, for S3, an open multipart
    /// upload; the blob sweep spares blobs younger than this).
    pub upload_timeout: std::time::Duration,
    /// Memory all uploads whose signature is not proven yet may hold at once.
    pub unproven_upload_memory_bytes: usize,
    /// Values up to this size live in their entry's row, larger ones in the blob store
    /// (`persistence::values`); 0 puts every value in the blob store.
    pub inline_max_bytes: u64,
}

/// Listing page size when none is asked for, and the largest allowed.
pub use homeserver_protocol::query::DEFAULT_LIST_LIMIT;
pub use homeserver_protocol::query::MAX_LIST_LIMIT;

/// One byte above every character allowed in a path: `prefix + "{"` bounds a subtree.
const ABOVE_PATH_CHARS: char = '{';

#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    pub limit: Option<u32>,
    pub cursor: Option<String>,
    pub reverse: bool,
    pub shallow: bool,
}

/// An error reading the request body (client went away, malformed chunking).
#[derive(Debug, thiserror::Error)]
#[error("reading the request body: {0}")]
pub struct BodyError(pub String);

#[derive(Clone)]
pub struct StorageService {
    metadata: Arc<dyn MetadataStore>,
    blobs: BlobStore,
    limits: StorageLimits,
    events: Arc<EventHub>,
    entry_cache: Arc<EntryCache>,
    staging: UploadStaging,
}

/// The outcome of streaming a body somewhere.
struct Streamed {
    size: u64,
    sha256: BodyHash,
    blake3: [u8; 32],
}

impl StorageService {
    pub fn new(
        metadata: Arc<dyn MetadataStore>,
        blobs: BlobStore,
        limits: StorageLimits,
        events: Arc<EventHub>,
        entry_cache: Arc<EntryCache>,
    ) -> Self {
        Self {
            metadata,
            blobs,
            staging: UploadStaging::new(limits.unproven_upload_memory_bytes),
            limits,
            events,
            entry_cache,
        }
    }

    pub fn limits(&self) -> StorageLimits {
        self.limits
    }

    /// The account of `user` as its owner sees it (`GET /account`): usage, the quota in
    /// force and the value size limit. 404 when the key never signed up.
    pub async fn account(&self, user: &PublicKey) -> Result<AccountInfo, ServiceError> {
        let record = self.metadata.user(&user.to_z32()).await?.ok_or_else(|| {
            ServiceError::NotFound(format!(
                "no account for {user} on this homeserver: sign up first (POST /signup)"
            ))
        })?;
        Ok(AccountInfo {
            quota_bytes: record.quota_bytes.unwrap_or(self.limits.quota_bytes),
            public_key: record.public_key,
            created_at: record.created_at,
            used_bytes: record.used_bytes,
            max_value_bytes: self.limits.max_value_bytes,
            disabled: record.disabled,
        })
    }

    /// Memory held now by uploads whose signature is not checked yet.
    pub fn unproven_upload_bytes(&self) -> usize {
        self.staging.in_use()
    }

    /// Stores a value. `declared_len` is the Content-Length and `declared_sha256` the
    /// body's SHA-256 from `Content-Digest`, when the client sent them.
    ///
    /// Nothing a request sends is written before its writer is proven: a session was
    /// resolved by access control; a signed request is proven at once against a declared
    /// digest, and otherwise after its body was read into bounded memory (see
    /// `upload_staging`). Checks answer in the contract's order: credentials (401),
    /// permission (403), size (413), quota (507).
    pub async fn put<S>(
        &self,
        grant: WriteGrant<'_>,
        path: &StoragePath,
        declared_len: Option<u64>,
        declared_sha256: Option<BodyHash>,
        body: S,
    ) -> Result<PutResult, ServiceError>
    where
        S: Stream<Item = Result<Bytes, BodyError>> + Send + Unpin,
    {
        let max = self.limits.max_value_bytes;
        let too_large = declared_len.is_some_and(|len| len > max);
        let WriteGrant { writer, refusal } = grant;
        let mut proven = !matches!(writer, Writer::Signed { .. });
        if let Writer::Signed { header, target } = &writer {
            match &declared_sha256 {
                Some(declared) => {
                    auth::verify(header, target, declared)?;
                    proven = true;
                }
                // Refused before reading: a signature cannot be checked without the
                // body, and the answer reveals nothing about the account.
                None if too_large => return Err(ServiceError::PayloadTooLarge { limit: max }),
                None => {}
            }
        }
        let user = writer.user();
        let refusal = match refusal {
            Some(r) => Some(r),
            None if self.checked_at_commit(declared_len, too_large) => None,
            None => self.write_refusal(&user, path, declared_len).await?,
        };
        let refusal = match refusal {
            // Size comes before quota.
            Some(ServiceError::QuotaExceeded { .. }) | None if too_large => {
                Some(ServiceError::PayloadTooLarge { limit: max })
            }
            other => other,
        };
        if let Some(refusal) = refusal {
            if let Writer::Signed { header, target } = &writer {
                if !proven {
                    // Hash the body without keeping it, so a forged request still gets
                    // 401 (credentials come before permission and quota).
                    let streamed = stream_into(body, &self.limits, Sink::Discard).await?;
                    auth::verify(header, target, &streamed.sha256)?;
                }
                // Remember the signature, so the refused request cannot succeed on a
                // replay later; a replay is told so (401) as the commit tells it.
                if !self
                    .metadata
                    .mark_signature(auth::replay_mark(header))
                    .await?
                {
                    return Err(auth::replayed());
                }
            }
            return Err(refusal);
        }

        let mut value = ValueWriter::new(
            &self.blobs,
            &user,
            self.limits.inline_max_bytes,
            declared_len,
        );
        let streamed = if proven {
            stream_into(body, &self.limits, Sink::Value(&mut value)).await
        } else {
            self.prove_then_write(&writer, body, &mut value).await
        };
        let streamed = match streamed {
            Ok(s) if declared_sha256.is_some_and(|d| d != s.sha256) => Err(
                ServiceError::BadRequest("the body does not match its Content-Digest".into()),
            ),
            other => other,
        };
        let streamed = match streamed {
            Ok(s) => s,
            Err(e) => {
                value.abort().await;
                return Err(e);
            }
        };
        let stored = value.finish().await?;
        let replay = match &writer {
            Writer::Signed { header, .. } => Some(auth::replay_mark(header)),
            Writer::Session(_) => None,
        };

        let now = now_secs();
        let outcome = self
            .metadata
            .commit_put(
                NewEntry {
                    user: &user,
                    path: path.as_str(),
                    stored: stored.clone(),
                    size: streamed.size,
                    content_hash: streamed.blake3,
                    now,
                    default_quota: self.limits.quota_bytes,
                },
                replay,
            )
            .await;
        let error = match outcome {
            Ok(PutOutcome::Committed {
                created_at,
                // The replaced blob was retired by the commit: the sweep deletes it.
                replaced_blob: _,
            }) => {
                self.entry_cache.invalidate_named(&user, path.as_str());
                self.events.committed();
                return Ok(PutResult {
                    path: path.to_string(),
                    size: streamed.size,
                    created_at,
                });
            }
            Ok(PutOutcome::QuotaExceeded(exceeded)) => quota_exceeded(exceeded),
            Ok(PutOutcome::Replayed) => auth::replayed(),
            Ok(PutOutcome::UnknownUser) => not_signed_up(),
            Ok(PutOutcome::Disabled) => disabled(),
            Err(e) => {
                // The commit may have happened all the same (its answer lost in
                // transit, a deadline passed while the database was committing), and
                // may become visible only later: a blob is left to the sweep, which
                // deletes it only if no entry points at it once it is old.
                if let Some(key) = stored.blob_key() {
                    tracing::debug!(blob = %key, error = %e, "a PUT's commit failed; its blob is left to the sweep");
                }
                return Err(e.into());
            }
        };
        // Nothing points at a new blob, nor ever did: drop it now (a crash here leaves
        // it to the sweep).
        if let Some(key) = stored.into_blob_key() {
            self.delete_unused_blob(key);
        }
        Err(error)
    }

    /// A signed body without a declared digest: held in memory until the signature is
    /// checked against it, and only then written to the value.
    async fn prove_then_write<S>(
        &self,
        writer: &Writer<'_>,
        body: S,
        value: &mut ValueWriter,
    ) -> Result<Streamed, ServiceError>
    where
        S: Stream<Item = Result<Bytes, BodyError>> + Send + Unpin,
    {
        let mut staged = self.staging.stage();
        let streamed = stream_into(body, &self.limits, Sink::Memory(&mut staged)).await?;
        if let Writer::Signed { header, target } = writer {
            auth::verify(header, target, &streamed.sha256)?;
        }
        for chunk in staged.chunks() {
            value.write(chunk.clone()).await?;
        }
        Ok(streamed)
    }

    /// Whether registration and quota are left to the commit, which applies them again
    /// anyway (in the same order, the replay mark first): a body declared small enough
    /// for its entry's row is read whole into memory at once, so refusing it before
    /// reading spares nothing, and asking the database first would cost every small PUT
    /// a round trip to a reader (whose page cache every commit empties) for nothing the
    /// commit does not check again (docs/BENCHMARKS.md "Small PUTs: one read less").
    fn checked_at_commit(&self, declared_len: Option<u64>, too_large: bool) -> bool {
        let inline_max = self.limits.inline_max_bytes;
        !too_large && inline_max > 0 && declared_len.is_some_and(|len| len <= inline_max)
    }

    /// Why a write of `declared_len` bytes by `user` must be refused before its body is
    /// read (not signed up, disabled, over quota), if it must.
    async fn write_refusal(
        &self,
        user: &str,
        path: &StoragePath,
        declared_len: Option<u64>,
    ) -> Result<Option<ServiceError>, ServiceError> {
        let context = self.metadata.write_context(user, path.as_str()).await?;
        Ok(match &context.user {
            None => Some(not_signed_up()),
            Some(u) if u.disabled => Some(disabled()),
            // The rule the commit applies again to the actual size.
            Some(u) => declared_len.and_then(|len| {
                let old = context.existing_size.unwrap_or(0);
                check_quota(u, self.limits.quota_bytes, old, len)
                    .err()
                    .map(quota_exceeded)
            }),
        })
    }

    /// Deletes, in the background, a blob no committed entry ever pointed at.
    fn delete_unused_blob(&self, key: String) {
        let blobs = self.blobs.clone();
        tokio::spawn(async move {
            if let Err(e) = blobs.delete(&key).await {
                tracing::warn!(blob = %key, error = %e, "could not delete an unreferenced blob; the sweep will");
            }
        });
    }

    /// Metadata of one entry.
    pub async fn entry(
        &self,
        space: &PublicKey,
        path: &StoragePath,
    ) -> Result<Entry, ServiceError> {
        self.record(space, path).await.map(Entry)
    }

    async fn record(
        &self,
        space: &PublicKey,
        path: &StoragePath,
    ) -> Result<Arc<EntryRecord>, ServiceError> {
        if let Some(hit) = self.entry_cache.get(space, path.as_str()) {
            return Ok(hit);
        }
        let ticket = self.entry_cache.ticket();
        let record = self
            .metadata
            .entry(&space.to_z32(), path.as_str())
            .await?
            .map(Arc::new)
            .ok_or_else(|| not_found(path))?;
        self.entry_cache
            .insert(ticket, space, path.as_str(), record.clone());
        Ok(record)
    }

    /// Opens an entry's bytes. A concurrent overwrite may delete the blob between the
    /// metadata read and the open; then the entry is read again (a few times at most).
    /// An error while streaming is what a response body reports (the connection ends).
    pub async fn open(
        &self,
        space: &PublicKey,
        path: &StoragePath,
        entry: Entry,
    ) -> Result<(Entry, ValueBytes), ServiceError> {
        let Entry(mut record) = entry;
        for _ in 0..3 {
            match read_value(&self.blobs, &record.stored, record.size).await {
                Ok(bytes) => return Ok((Entry(record), bytes)),
                Err(BlobError::NotFound(_)) => {
                    // The cached row may be the stale one: ask the database.
                    self.entry_cache.invalidate(space, path.as_str());
                    let again = self.record(space, path).await?;
                    if again.stored == record.stored {
                        return Err(ServiceError::Internal(format!(
                            "entry {path} points at a missing blob ({})",
                            record.stored.blob_key().unwrap_or_default()
                        )));
                    }
                    record = again;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(ServiceError::Unavailable(format!(
            "{path} is being overwritten too fast to read; retry"
        )))
    }

    pub async fn delete(
        &self,
        grant: WriteGrant<'_>,
        path: &StoragePath,
    ) -> Result<DeleteResult, ServiceError> {
        let WriteGrant { writer, refusal } = grant;
        let replay = match &writer {
            Writer::Signed { header, target } => {
                auth::verify(header, target, &BodyHash::empty())?;
                Some(auth::replay_mark(header))
            }
            Writer::Session(_) => None,
        };
        let user = writer.user();
        let refusal = match refusal {
            Some(r) => Some(r),
            None => match self.metadata.user(&user).await? {
                None => Some(not_signed_up()),
                Some(u) if u.disabled => Some(disabled()),
                Some(_) => None,
            },
        };
        if let Some(refusal) = refusal {
            if let Some(mark) = replay {
                self.metadata.mark_signature(mark).await?;
            }
            return Err(refusal);
        }
        let now = now_secs();
        match self
            .metadata
            .commit_delete(&user, path.as_str(), now, replay)
            .await?
        {
            // The blob was retired by the commit: the sweep deletes it.
            DeleteOutcome::Deleted { blob_key: _ } => {
                self.entry_cache.invalidate_named(&user, path.as_str());
                self.events.committed();
                Ok(DeleteResult {
                    path: path.to_string(),
                    deleted_at: now,
                })
            }
            DeleteOutcome::NotFound => Err(not_found(path)),
            DeleteOutcome::Replayed => Err(auth::replayed()),
            DeleteOutcome::UnknownUser => Err(not_signed_up()),
            DeleteOutcome::Disabled => Err(disabled()),
        }
    }

    /// Lists entries under `prefix` (a path ending in `/`).
    /// A page of the listing of `prefix` in `space`. With `visible` (a public listing),
    /// paths the policy hides from the public are skipped while the page is read, so
    /// the page's `limit`, `has_more` and cursor count only what the public sees (a
    /// shallow listing shows a sub-folder when the folder and an entry under it are
    /// visible). Hidden rows still cost reading them.
    pub async fn list(
        &self,
        space: &PublicKey,
        prefix: &StoragePath,
        options: ListOptions,
        visible: Option<&PublicFilter>,
    ) -> Result<ListResult, ServiceError> {
        let limit = match options.limit {
            None => DEFAULT_LIST_LIMIT,
            Some(l) if (1..=MAX_LIST_LIMIT).contains(&l) => l,
            Some(l) => {
                return Err(ServiceError::BadRequest(format!(
                    "limit must be between 1 and {MAX_LIST_LIMIT}, got {l}"
                )));
            }
        };
        let prefix = prefix.as_str();
        let resume = options
            .cursor
            .as_deref()
            .map(|c| decode_cursor(c, prefix))
            .transpose()?;
        let user = space.to_z32();
        let subtree_end = format!("{prefix}{ABOVE_PATH_CHARS}");
        // Exclusive bounds of what is still to be listed.
        let (mut after, mut before) = (prefix.to_owned(), subtree_end);
        if let Some(last) = &resume {
            if options.reverse {
                before = last.clone();
            } else if last.ends_with('/') {
                after = format!("{last}{ABOVE_PATH_CHARS}");
            } else {
                after = last.clone();
            }
        }

        // One more than the page, to know has_more exactly.
        let want = limit as usize + 1;
        let mut items: Vec<ListEntry> = Vec::with_capacity(want.min(128));
        'fetch: while items.len() < want {
            let rows = self
                .metadata
                .listing(EntryRange {
                    user: &user,
                    after: &after,
                    before: &before,
                    descending: options.reverse,
                    limit: u32::try_from(want - items.len()).unwrap_or(u32::MAX),
                })
                .await?;
            let full_batch = rows.len() == want - items.len();
            let folder_of = |path: &str| {
                let rest = &path[prefix.len()..];
                rest.find('/')
                    .filter(|_| options.shallow)
                    .map(|slash| format!("{prefix}{}", &rest[..=slash]))
            };
            // With a filter: one question per row and per sub-folder, asked at once.
            let shown = match visible {
                None => None,
                Some(filter) => {
                    let mut questions = Vec::with_capacity(rows.len());
                    for row in &rows {
                        questions.push((user.clone(), row.path.clone()));
                        if let Some(folder) = folder_of(&row.path) {
                            questions.push((user.clone(), folder));
                        }
                    }
                    let answers = filter.visible(questions.clone()).await?;
                    Some(
                        questions
                            .into_iter()
                            .map(|(_, path)| path)
                            .zip(answers)
                            .collect::<std::collections::HashMap<_, _>>(),
                    )
                }
            };
            let is_shown = |path: &str| shown.as_ref().is_none_or(|s| s.get(path) == Some(&true));
            for row in rows {
                if !is_shown(&row.path) {
                    // Hidden: step past it (inside a folder, the next row may show it).
                    if options.reverse {
                        before = row.path.clone();
                    } else {
                        after = row.path.clone();
                    }
                    continue;
                }
                match folder_of(&row.path) {
                    Some(folder) => {
                        // A sub-folder: list it once (unless the folder itself is
                        // hidden) and skip past its contents.
                        if options.reverse {
                            before = folder.clone();
                        } else {
                            after = format!("{folder}{ABOVE_PATH_CHARS}");
                        }
                        if !is_shown(&folder) {
                            continue 'fetch;
                        }
                        items.push(ListEntry {
                            path: folder,
                            size: None,
                            created_at: None,
                            updated_at: None,
                            content_hash: None,
                        });
                        continue 'fetch;
                    }
                    None => {
                        if options.reverse {
                            before = row.path.clone();
                        } else {
                            after = row.path.clone();
                        }
                        items.push(ListEntry {
                            path: row.path,
                            size: Some(row.size),
                            created_at: Some(row.created_at),
                            updated_at: Some(row.updated_at),
                            content_hash: Some(encode_content_hash(&row.content_hash)),
                        });
                    }
                }
            }
            if !full_batch {
                break;
            }
        }
        let has_more = items.len() > limit as usize;
        items.truncate(limit as usize);
        let cursor = items.last().map(|e| URL_SAFE_NO_PAD.encode(&e.path));
        Ok(ListResult {
            entries: items,
            cursor,
            has_more,
        })
    }
}

fn quota_exceeded(e: QuotaExceeded) -> ServiceError {
    ServiceError::QuotaExceeded {
        used: e.used,
        quota: e.quota,
        needed: e.needed,
    }
}

fn not_signed_up() -> ServiceError {
    ServiceError::Forbidden("this key has not signed up on this homeserver".into())
}

fn disabled() -> ServiceError {
    ServiceError::Forbidden("account disabled".into())
}

fn not_found(path: &StoragePath) -> ServiceError {
    ServiceError::NotFound(format!("no entry at {path}"))
}

fn decode_cursor(cursor: &str, prefix: &str) -> Result<String, ServiceError> {
    let invalid = || ServiceError::BadRequest("invalid cursor for this listing".into());
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| invalid())?;
    let path = String::from_utf8(bytes).map_err(|_| invalid())?;
    if !path.starts_with(prefix) || path.len() == prefix.len() || StoragePath::parse(&path).is_err()
    {
        return Err(invalid());
    }
    Ok(path)
}

/// Where a streamed body goes.
enum Sink<'a> {
    /// Only hashed and counted.
    Discard,
    Value(&'a mut ValueWriter),
    Memory(&'a mut StagedBody),
}

/// Streams `body` into `sink`, hashing and counting, refusing more than `max` bytes.
async fn stream_into<S>(
    mut body: S,
    limits: &StorageLimits,
    mut sink: Sink<'_>,
) -> Result<Streamed, ServiceError>
where
    S: Stream<Item = Result<Bytes, BodyError>> + Send + Unpin,
{
    let (max, idle) = (limits.max_value_bytes, limits.body_idle_timeout);
    let deadline = tokio::time::Instant::now() + limits.upload_timeout;
    let mut sha = Sha256::new();
    let mut blake = blake3::Hasher::new();
    let mut size: u64 = 0;
    loop {
        let wait = idle.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        let next = tokio::time::timeout(wait, body.next()).await.map_err(|_| {
            ServiceError::BadRequest(if wait < idle {
                format!(
                    "the upload was not complete within {} s",
                    limits.upload_timeout.as_secs()
                )
            } else {
                format!("the upload sent nothing for {} s", idle.as_secs())
            })
        })?;
        let Some(chunk) = next else { break };
        let chunk = chunk.map_err(|e| ServiceError::BadRequest(e.to_string()))?;
        size += chunk.len() as u64;
        if size > max {
            return Err(ServiceError::PayloadTooLarge { limit: max });
        }
        sha.update(&chunk);
        blake.update(&chunk);
        match &mut sink {
            Sink::Discard => {}
            Sink::Value(w) => w.write(chunk).await?,
            Sink::Memory(staged) => staged.push(chunk)?,
        }
    }
    Ok(Streamed {
        size,
        sha256: BodyHash::from_hasher(sha),
        blake3: *blake.finalize().as_bytes(),
    })
}
