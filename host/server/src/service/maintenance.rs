//! Operator maintenance on the stores, whatever their backends: `fsck` (entries whose
//! blob is missing, blobs no entry references, usage that disagrees with the entries;
//! `--repair` fixes them), `export`/`import` of one user as a streamable archive, and
//! `migrate`: copying a whole deployment to other backends (e.g. SQLite + disk to
//! PostgreSQL + S3), resumable.
//!
//! The archive format (`homeserver export`), a POSIX tar stream:
//! - first `manifest.json`: `{"format": "homeserver-export", "version": 1, "user":
//!   "<z32>", "exported_at": <unix>}`;
//! - then one regular file per entry, named by its path without the leading `/`
//!   (`pub/example.com/hello.txt`), whose bytes are the value, with the tar mtime set to
//!   the entry's `updated_at` and two PAX records before it: `homeserver.content_hash`
//!   (the BLAKE3 of the value, standard base64, as the ETag) and `homeserver.created_at`
//!   (Unix seconds).
//!
//! `tar tvf` lists an archive; `tar xf` unpacks the values. Import checks every value
//! against its recorded hash before it commits it, and writes through the same rules as
//! a PUT (quota, one PUT event per value).

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use homeserver_protocol::{PublicKey, StoragePath};
use serde::{Deserialize, Serialize};
use tokio::runtime::Handle;

use super::{ServiceError, now_secs};
use crate::persistence::metadata::{
    BlobState, EntryRange, EntryRecord, EventQuery, NewEntry, PutOutcome, ReplayMark,
    SignupOutcome, Stored,
};
use crate::persistence::{
    BlobError, BlobStore, MetadataStore, MetadataWrites, ValueWriter, read_value,
};

/// Rows read at a time when walking a store.
const PAGE: u32 = 500;
/// Above every character a path may contain: `("", "{")` spans a user's whole space.
const ALL_PATHS: (&str, &str) = ("", "{");

const FORMAT: &str = "homeserver-export";
const MANIFEST: &str = "manifest.json";
const PAX_CONTENT_HASH: &str = "homeserver.content_hash";
const PAX_CREATED_AT: &str = "homeserver.created_at";

/// The stores under the services: what a maintenance task works on, and what the
/// running server's upkeep (replay-mark purge, blob sweep) works on.
#[derive(Clone)]
pub struct Stores {
    pub metadata: Arc<dyn MetadataStore>,
    pub blobs: BlobStore,
}

/// Progress of a long task, for a progress bar: bytes done of a total.
pub trait Progress: Send + Sync {
    fn set_total(&self, _bytes: u64) {}
    fn advance(&self, _bytes: u64) {}
    fn message(&self, _text: &str) {}
}

/// No progress shown.
pub struct Quiet;
impl Progress for Quiet {}

/// All of one user's entries, page by page, in path order.
async fn all_entries(
    metadata: &dyn MetadataStore,
    user: &str,
    mut visit: impl AsyncFnMut(Vec<EntryRecord>) -> Result<(), ServiceError>,
) -> Result<(), ServiceError> {
    let mut after = ALL_PATHS.0.to_owned();
    loop {
        let page = metadata
            .entries(EntryRange {
                user,
                after: &after,
                before: ALL_PATHS.1,
                descending: false,
                limit: PAGE,
            })
            .await?;
        let Some(last) = page.last() else {
            return Ok(());
        };
        after = last.path.clone();
        let full = page.len() == PAGE as usize;
        visit(page).await?;
        if !full {
            return Ok(());
        }
    }
}

/// Every user, page by page, in key order.
async fn all_users(
    metadata: &dyn MetadataStore,
    mut visit: impl AsyncFnMut(
        Vec<crate::persistence::metadata::UserRecord>,
    ) -> Result<(), ServiceError>,
) -> Result<(), ServiceError> {
    let mut after = String::new();
    loop {
        let page = metadata.users_after(&after, PAGE).await?;
        let Some(last) = page.last() else {
            return Ok(());
        };
        after = last.public_key.clone();
        let full = page.len() == PAGE as usize;
        visit(page).await?;
        if !full {
            return Ok(());
        }
    }
}

// ---------------------------------------------------------------------------------------
// fsck

/// An entry whose value is gone from the blob store.
#[derive(Debug, Clone, Serialize)]
pub struct MissingBlob {
    pub user: String,
    pub path: String,
    pub blob_key: String,
}

/// An entry whose value, kept in its row, is not what the entry records (size or
/// content hash): a damaged database. fsck reports it; `--repair` leaves it (the bytes
/// are there, only an operator can tell which of them is right).
#[derive(Debug, Clone, Serialize)]
pub struct DamagedValue {
    pub user: String,
    pub path: String,
}

/// A user whose recorded usage is not the sum of their entries.
#[derive(Debug, Clone, Serialize)]
pub struct UsageMismatch {
    pub user: String,
    pub recorded: u64,
    pub actual: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct FsckReport {
    pub users: u64,
    pub entries: u64,
    pub bytes: u64,
    pub blobs: u64,
    /// Entries whose value is in their row (`storage.inline_max_bytes`), not a blob.
    pub inline_values: u64,
    /// Replaced or deleted values kept for the grace period (`storage.blob_grace_secs`)
    /// before the sweep deletes them: expected, neither orphans nor missing.
    pub retired_blobs: u64,
    pub missing_blobs: Vec<MissingBlob>,
    /// Values kept in their rows that do not match their entries.
    pub damaged_values: Vec<DamagedValue>,
    /// Blobs no entry references and that are not retired (older than the minimum age).
    pub orphan_blobs: Vec<String>,
    pub usage_mismatches: Vec<UsageMismatch>,
    /// What `--repair` did: entries removed, orphans deleted, usages corrected.
    pub repaired: Option<Repairs>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Repairs {
    pub entries_removed: u64,
    pub orphans_deleted: u64,
    pub usages_corrected: u64,
}

impl FsckReport {
    pub fn is_clean(&self) -> bool {
        self.missing_blobs.is_empty()
            && self.damaged_values.is_empty()
            && self.orphan_blobs.is_empty()
            && self.usage_mismatches.is_empty()
    }
}

/// Checks the stores against each other; with `repair`, fixes what it found: an entry
/// whose blob is missing is removed (as a DELETE would: usage and a DEL event; its value
/// is lost either way), an orphan blob older than `min_orphan_age` is deleted (younger
/// ones may be uploads in flight on a running server), and a usage is set to the sum of
/// its user's entries (atomically, under the user's lock).
pub async fn fsck(
    stores: &Stores,
    repair: bool,
    min_orphan_age: Duration,
    progress: &dyn Progress,
) -> Result<FsckReport, ServiceError> {
    let Stores { metadata, blobs } = stores;
    let mut report = FsckReport::default();
    if let Ok(stats) = metadata.stats().await {
        progress.set_total(stats.total_storage);
    }
    progress.message("checking entries");
    all_users(metadata.as_ref(), async |users| {
        for user in users {
            report.users += 1;
            let mut sum = 0;
            all_entries(metadata.as_ref(), &user.public_key, async |entries| {
                for entry in entries {
                    report.entries += 1;
                    report.bytes += entry.size;
                    sum += entry.size;
                    progress.advance(entry.size);
                    // An inline value is in the row itself: checked against its entry.
                    let key = match &entry.stored {
                        Stored::Blob(key) => key,
                        Stored::Inline(bytes) => {
                            report.inline_values += 1;
                            if bytes.len() as u64 != entry.size
                                || *blake3::hash(bytes).as_bytes() != entry.content_hash
                            {
                                report.damaged_values.push(DamagedValue {
                                    user: user.public_key.clone(),
                                    path: entry.path.clone(),
                                });
                            }
                            continue;
                        }
                    };
                    if blobs.size_of(key).await?.is_none() {
                        // Re-read: an overwrite may have moved it to a new blob meanwhile.
                        let now = metadata.entry(&user.public_key, &entry.path).await?;
                        if now.is_some_and(|n| n.stored == entry.stored) {
                            report.missing_blobs.push(MissingBlob {
                                user: user.public_key.clone(),
                                path: entry.path.clone(),
                                blob_key: key.to_owned(),
                            });
                        }
                    }
                }
                Ok(())
            })
            .await?;
            if sum != user.used_bytes {
                report.usage_mismatches.push(UsageMismatch {
                    user: user.public_key.clone(),
                    recorded: user.used_bytes,
                    actual: sum,
                });
            }
        }
        Ok(())
    })
    .await?;

    progress.message("checking blobs");
    let cutoff = now_secs().saturating_sub(i64::try_from(min_orphan_age.as_secs()).unwrap_or(0));
    let mut listing = blobs.list(None);
    while let Some(meta) = listing.next().await {
        let meta = meta?;
        report.blobs += 1;
        match metadata.blob_state(&meta.key).await? {
            BlobState::Referenced => {}
            BlobState::Retired { .. } => report.retired_blobs += 1,
            BlobState::Unknown if meta.modified <= cutoff => report.orphan_blobs.push(meta.key),
            BlobState::Unknown => {}
        }
    }

    if repair {
        let mut repairs = Repairs::default();
        for missing in &report.missing_blobs {
            if metadata
                .remove_entry_if_blob(&missing.user, &missing.path, &missing.blob_key, now_secs())
                .await?
            {
                repairs.entries_removed += 1;
            }
        }
        for key in &report.orphan_blobs {
            // Checked again: a commit may have started to reference it since.
            if metadata.blob_state(key).await? == BlobState::Unknown {
                blobs.delete(key).await?;
                repairs.orphans_deleted += 1;
            }
        }
        // After the removals above, which changed usage themselves.
        let mut users = Vec::new();
        all_users(metadata.as_ref(), async |page| {
            users.extend(page.into_iter().map(|u| u.public_key));
            Ok(())
        })
        .await?;
        for user in users {
            if let Some((before, after)) = metadata.recompute_usage(&user).await?
                && before != after
            {
                repairs.usages_corrected += 1;
            }
        }
        report.repaired = Some(repairs);
    }
    Ok(report)
}

// ---------------------------------------------------------------------------------------
// export / import

#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    format: String,
    version: u32,
    user: String,
    exported_at: i64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct TransferSummary {
    pub user: String,
    pub entries: u64,
    pub bytes: u64,
}

fn io_error(e: std::io::Error) -> ServiceError {
    ServiceError::BadRequest(format!("archive: {e}"))
}

fn blob_io(e: BlobError) -> std::io::Error {
    std::io::Error::other(e)
}

/// Writes `user`'s whole space to `out` as an archive (see the module header), value by
/// value, streaming: memory stays small whatever the user stores.
pub async fn export_user<W: Write + Send + 'static>(
    stores: &Stores,
    user: &PublicKey,
    out: W,
    progress: Arc<dyn Progress>,
) -> Result<TransferSummary, ServiceError> {
    let user = user.to_z32();
    let record = stores
        .metadata
        .user(&user)
        .await?
        .ok_or_else(|| ServiceError::NotFound(format!("no user {user} on this homeserver")))?;
    progress.set_total(record.used_bytes);
    let stores = stores.clone();
    let handle = Handle::current();
    tokio::task::spawn_blocking(move || {
        let mut archive = tar::Builder::new(out);
        let manifest = serde_json::to_vec_pretty(&Manifest {
            format: FORMAT.into(),
            version: 1,
            user: user.clone(),
            exported_at: now_secs(),
        })
        .map_err(|e| ServiceError::Internal(e.to_string()))?;
        let mut header = tar::Header::new_gnu();
        header.set_size(manifest.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(u64::try_from(now_secs()).unwrap_or(0));
        archive
            .append_data(&mut header, MANIFEST, &manifest[..])
            .map_err(io_error)?;
        let mut summary = TransferSummary {
            user: user.clone(),
            ..TransferSummary::default()
        };
        // This thread blocks on the archive's writes; the stores' futures run on the
        // runtime through `handle` (one at a time, never nested).
        let mut after = ALL_PATHS.0.to_owned();
        loop {
            let page = handle.block_on(stores.metadata.entries(EntryRange {
                user: &user,
                after: &after,
                before: ALL_PATHS.1,
                descending: false,
                limit: PAGE,
            }))?;
            let full = page.len() == PAGE as usize;
            for entry in &page {
                let stream = handle
                    .block_on(read_value(&stores.blobs, &entry.stored, entry.size))?
                    .into_stream();
                let reader = tokio_util::io::StreamReader::new(stream.map_err(blob_io));
                let reader = tokio_util::io::SyncIoBridge::new_with_handle(reader, handle.clone());
                let hash = STANDARD.encode(entry.content_hash);
                let created_at = entry.created_at.to_string();
                archive
                    .append_pax_extensions([
                        (PAX_CONTENT_HASH, hash.as_bytes()),
                        (PAX_CREATED_AT, created_at.as_bytes()),
                    ])
                    .map_err(io_error)?;
                let mut header = tar::Header::new_gnu();
                header.set_size(entry.size);
                header.set_mode(0o644);
                header.set_mtime(u64::try_from(entry.updated_at).unwrap_or(0));
                archive
                    .append_data(&mut header, &entry.path[1..], reader)
                    .map_err(io_error)?;
                summary.entries += 1;
                summary.bytes += entry.size;
                progress.advance(entry.size);
            }
            match page.last() {
                Some(last) if full => after = last.path.clone(),
                _ => break,
            }
        }
        archive
            .into_inner()
            .and_then(|mut w| w.flush())
            .map_err(io_error)?;
        Ok(summary)
    })
    .await
    .map_err(|e| ServiceError::Internal(format!("export task: {e}")))?
}

/// Reads an archive made by [`export_user`] from `input` and stores its values as the
/// archive's user (signed up here if needed), each checked against its recorded hash
/// before it is committed. Existing values at the same paths are replaced; others stay.
pub async fn import_archive<R: Read + Send + 'static>(
    stores: &Stores,
    input: R,
    default_quota: u64,
    inline_max: u64,
    progress: Arc<dyn Progress>,
) -> Result<TransferSummary, ServiceError> {
    let stores = stores.clone();
    let handle = Handle::current();
    tokio::task::spawn_blocking(move || {
        let mut archive = tar::Archive::new(input);
        let mut summary = TransferSummary::default();
        let mut user: Option<String> = None;
        for entry in archive.entries().map_err(io_error)? {
            let mut entry = entry.map_err(io_error)?;
            let name = entry
                .path()
                .map_err(io_error)?
                .to_str()
                .map(str::to_owned)
                .ok_or_else(|| ServiceError::BadRequest("archive: a name is not UTF-8".into()))?;
            if name == MANIFEST {
                let manifest: Manifest = serde_json::from_reader(&mut entry)
                    .map_err(|e| ServiceError::BadRequest(format!("archive manifest: {e}")))?;
                if manifest.format != FORMAT || manifest.version != 1 {
                    return Err(ServiceError::BadRequest(format!(
                        "not a homeserver export (format {} version {})",
                        manifest.format, manifest.version
                    )));
                }
                let key: PublicKey = manifest.user.parse().map_err(|e| {
                    ServiceError::BadRequest(format!("archive manifest: user: {e}"))
                })?;
                handle.block_on(ensure_user(stores.metadata.as_ref(), &key.to_z32()))?;
                summary.user = key.to_z32();
                user = Some(key.to_z32());
                continue;
            }
            if entry.header().entry_type() != tar::EntryType::Regular {
                continue;
            }
            let Some(user) = &user else {
                return Err(ServiceError::BadRequest(
                    "archive: manifest.json must come first".into(),
                ));
            };
            let path = StoragePath::parse(&format!("/{name}"))
                .map_err(|e| ServiceError::BadRequest(format!("archive: {name}: {e}")))?;
            let expected = entry
                .pax_extensions()
                .map_err(io_error)?
                .and_then(|mut records| {
                    records.find_map(|r| {
                        let r = r.ok()?;
                        (r.key().ok()? == PAX_CONTENT_HASH)
                            .then(|| r.value().ok().map(str::to_owned))?
                    })
                })
                .ok_or_else(|| {
                    ServiceError::BadRequest(format!("archive: {name} has no content hash"))
                })?;
            let size = entry.size();
            let mut writer = ValueWriter::new(&stores.blobs, user, inline_max, Some(size));
            let mut hasher = blake3::Hasher::new();
            let mut buffer = vec![0u8; 256 * 1024];
            let copied: Result<(), ServiceError> = (|| {
                loop {
                    let n = entry.read(&mut buffer).map_err(io_error)?;
                    if n == 0 {
                        return Ok(());
                    }
                    hasher.update(&buffer[..n]);
                    handle.block_on(writer.write(Bytes::copy_from_slice(&buffer[..n])))?;
                }
            })();
            let actual = STANDARD.encode(hasher.finalize().as_bytes());
            let checked = copied.and_then(|()| {
                if actual == expected {
                    Ok(())
                } else {
                    Err(ServiceError::BadRequest(format!(
                        "archive: {name}: the value does not match its hash (damaged archive); \
                         nothing was stored for it"
                    )))
                }
            });
            if let Err(e) = checked {
                handle.block_on(writer.abort());
                return Err(e);
            }
            let stored = handle.block_on(writer.finish())?;
            let content_hash = *hasher.finalize().as_bytes();
            let outcome = handle.block_on(stores.metadata.commit_put(
                NewEntry {
                    user,
                    path: path.as_str(),
                    stored: stored.clone(),
                    size,
                    content_hash,
                    now: now_secs(),
                    default_quota,
                },
                None,
            ));
            match outcome {
                // A replaced value was retired by the commit, for the sweep.
                Ok(PutOutcome::Committed { .. }) => {}
                other => {
                    if let Some(key) = stored.blob_key() {
                        let _ = handle.block_on(stores.blobs.delete(key));
                    }
                    return Err(match other {
                        Ok(PutOutcome::QuotaExceeded(q)) => ServiceError::QuotaExceeded {
                            used: q.used,
                            quota: q.quota,
                            needed: q.needed,
                        },
                        Ok(o) => ServiceError::Forbidden(format!("{name}: {o:?}")),
                        Err(e) => e.into(),
                    });
                }
            }
            summary.entries += 1;
            summary.bytes += size;
            progress.advance(size);
        }
        if user.is_none() {
            return Err(ServiceError::BadRequest(
                "archive: no manifest.json (not a homeserver export)".into(),
            ));
        }
        Ok(summary)
    })
    .await
    .map_err(|e| ServiceError::Internal(format!("import task: {e}")))?
}

/// Signs `user` up if they are not (an import needs no token: the operator runs it).
async fn ensure_user(metadata: &dyn MetadataStore, user: &str) -> Result<(), ServiceError> {
    if metadata.user(user).await?.is_some() {
        return Ok(());
    }
    let mut id = [0u8; 32];
    getrandom::fill(&mut id).map_err(|e| ServiceError::Internal(e.to_string()))?;
    let mark = ReplayMark {
        signature_id: id,
        expires_at: now_secs() + 60,
    };
    match metadata.sign_up(user, None, now_secs(), mark).await? {
        SignupOutcome::Created { .. } | SignupOutcome::AlreadyExists { .. } => Ok(()),
        other => Err(ServiceError::Internal(format!(
            "signing {user} up: {other:?}"
        ))),
    }
}

// ---------------------------------------------------------------------------------------
// migrate

#[derive(Debug, Clone, Default, Serialize)]
pub struct MigrateSummary {
    pub users: u64,
    pub entries: u64,
    pub bytes: u64,
    /// Values already on the target (an earlier, interrupted run copied them).
    pub blobs_skipped: u64,
    pub events: u64,
    pub signup_tokens: u64,
    pub sessions: u64,
    /// Users' pkarr records (what the server republishes for them).
    pub pkarr_records: u64,
}

/// Copies everything from `from` to `to`: users, values (blob keys kept), entries with
/// their timestamps, the event log with its cursors (so feed readers continue where
/// they were), signup tokens, sessions and users' pkarr records. Rows are upserts and a value already on the
/// target (same key and size) is not sent again, so an interrupted run just runs
/// again. Run it with the servers stopped (on local stores the locks make sure).
pub async fn migrate(
    from: &Stores,
    to: &Stores,
    progress: &dyn Progress,
) -> Result<MigrateSummary, ServiceError> {
    let mut summary = MigrateSummary::default();
    let stats = from.metadata.stats().await?;
    progress.set_total(stats.total_storage);

    progress.message("users and values");
    all_users(from.metadata.as_ref(), async |users| {
        // Users first (entries refer to them), with their usage as it will be once
        // their entries are copied.
        to.metadata.copy_users(&users).await?;
        summary.users += users.len() as u64;
        for user in users {
            all_entries(from.metadata.as_ref(), &user.public_key, async |entries| {
                for entry in &entries {
                    // The value before the entry that points at it (an inline value
                    // comes with its row).
                    if let Some(key) = entry.stored.blob_key() {
                        if to.blobs.size_of(key).await? == Some(entry.size) {
                            summary.blobs_skipped += 1;
                        } else {
                            copy_blob(&from.blobs, &to.blobs, key, entry.size).await?;
                        }
                    }
                    summary.bytes += entry.size;
                    progress.advance(entry.size);
                }
                to.metadata.copy_entries(&user.public_key, &entries).await?;
                summary.entries += entries.len() as u64;
                Ok(())
            })
            .await?;
        }
        Ok(())
    })
    .await?;

    progress.message("event log");
    let mut after = to.metadata.latest_cursor().await?;
    loop {
        let events = from
            .metadata
            .events(EventQuery {
                users: &[],
                after,
                up_to: i64::MAX as u64,
                path_prefix: None,
                limit: 1000,
            })
            .await?;
        let Some(last) = events.last() else { break };
        after = last.cursor;
        to.metadata.copy_events(&events).await?;
        summary.events += events.len() as u64;
    }

    progress.message("signup tokens and sessions");
    let mut after = String::new();
    loop {
        let tokens = from.metadata.signup_tokens_after(&after, PAGE).await?;
        let Some(last) = tokens.last() else { break };
        after = last.token.clone();
        to.metadata.copy_signup_tokens(&tokens).await?;
        summary.signup_tokens += tokens.len() as u64;
    }
    let mut after = [0u8; 32];
    loop {
        let sessions = from.metadata.sessions_after(&after, PAGE).await?;
        let Some(last) = sessions.last() else { break };
        after = last.token_hash;
        to.metadata.copy_sessions(&sessions).await?;
        summary.sessions += sessions.len() as u64;
    }
    progress.message("pkarr records");
    let mut after = String::new();
    loop {
        let records = from.metadata.pkarr_packets_after(&after, PAGE).await?;
        let Some(last) = records.last() else { break };
        after = last.0.clone();
        for (user, payload) in &records {
            let timestamp = pkarr_timestamp(user, payload)?;
            to.metadata
                .put_pkarr_packet(user, timestamp, payload)
                .await?;
            summary.pkarr_records += 1;
        }
    }
    Ok(summary)
}

/// The timestamp a stored record was signed with (what orders two records).
fn pkarr_timestamp(user: &str, payload: &[u8]) -> Result<i64, ServiceError> {
    let key = user
        .parse::<pkarr::PublicKey>()
        .map_err(|e| ServiceError::Internal(format!("pkarr record of {user}: {e}")))?;
    let packet = crate::service::pkarr_publish::user_packet(&key, payload)
        .map_err(|e| ServiceError::Internal(format!("pkarr record of {user}: {e}")))?;
    Ok(i64::try_from(packet.timestamp().as_u64()).unwrap_or(i64::MAX))
}

/// What [`verify_copy`] compared.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifySummary {
    pub users: u64,
    pub entries: u64,
    pub bytes: u64,
    pub latest_cursor: u64,
    pub pkarr_records: u64,
}

/// Checks that `to` holds what `from` does, after [`migrate`]: every user with the same
/// usage, quota and state; every entry with the same path, size, content hash, blob key
/// and dates, and its value on the target's blob store at its size; the same latest
/// event cursor. Returns what it compared, or the first difference.
pub async fn verify_copy(from: &Stores, to: &Stores) -> Result<VerifySummary, ServiceError> {
    let mut summary = VerifySummary::default();
    let differ = |what: String| ServiceError::Internal(format!("the copy differs: {what}"));
    all_users(from.metadata.as_ref(), async |users| {
        for user in users {
            let key = &user.public_key;
            match to.metadata.user(key).await? {
                Some(copy) if copy == user => {}
                Some(_) => return Err(differ(format!("user {key}"))),
                None => return Err(differ(format!("user {key} is missing"))),
            }
            summary.users += 1;
            all_entries(from.metadata.as_ref(), key, async |entries| {
                for entry in entries {
                    match to.metadata.entry(key, &entry.path).await? {
                        Some(copy) if copy == entry => {}
                        Some(_) => return Err(differ(format!("{key}{}", entry.path))),
                        None => return Err(differ(format!("{key}{} is missing", entry.path))),
                    }
                    if let Some(blob) = entry.stored.blob_key()
                        && to.blobs.size_of(blob).await? != Some(entry.size)
                    {
                        return Err(differ(format!(
                            "the value of {key}{} is missing or cut short",
                            entry.path
                        )));
                    }
                    summary.entries += 1;
                    summary.bytes += entry.size;
                }
                Ok(())
            })
            .await?;
        }
        Ok(())
    })
    .await?;
    let cursor = from.metadata.latest_cursor().await?;
    let copied = to.metadata.latest_cursor().await?;
    if cursor != copied {
        return Err(differ(format!(
            "the latest event is {copied}, the source's {cursor}"
        )));
    }
    let (a, b) = (from.metadata.stats().await?, to.metadata.stats().await?);
    if a != b {
        return Err(differ(format!(
            "{} users and {} bytes, the source {} and {}",
            b.users, b.total_storage, a.users, a.total_storage
        )));
    }
    summary.latest_cursor = cursor;
    // The same pkarr records, page by page in key order.
    let mut after = String::new();
    loop {
        let records = from.metadata.pkarr_packets_after(&after, PAGE).await?;
        let copies = to.metadata.pkarr_packets_after(&after, PAGE).await?;
        if records != copies {
            let user = records
                .iter()
                .zip(
                    copies
                        .iter()
                        .chain(std::iter::repeat(&(String::new(), Vec::new()))),
                )
                .find(|(a, b)| a != b)
                .map_or_else(|| after.clone(), |(a, _)| a.0.clone());
            return Err(differ(format!("the pkarr record of {user}")));
        }
        let Some(last) = records.last() else { break };
        after = last.0.clone();
        summary.pkarr_records += records.len() as u64;
    }
    Ok(summary)
}

/// Streams one value from one blob store to another under the same key.
async fn copy_blob(
    from: &BlobStore,
    to: &BlobStore,
    key: &str,
    size: u64,
) -> Result<(), ServiceError> {
    let mut stream = from.get(key, size).await?;
    let mut writer = to.writer(key);
    let mut copied = 0u64;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) => {
                copied += chunk.len() as u64;
                writer.write(chunk).await?;
            }
            Err(e) => {
                writer.abort().await;
                return Err(e.into());
            }
        }
    }
    if copied != size {
        writer.abort().await;
        return Err(ServiceError::Internal(format!(
            "blob {key} has {copied} bytes, its entry says {size}"
        )));
    }
    writer.finish().await?;
    Ok(())
}
