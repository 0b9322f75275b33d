//! `homeserver backup DIR` and `homeserver restore DIR` for the embedded store (SQLite
//! and a blob folder), taken while the server runs and writes go on.
//!
//! A backup is a folder:
//! - `hs.db`: a consistent snapshot of the database (`VACUUM INTO` on a read-only
//!   connection: the server keeps writing meanwhile, the source is never changed);
//! - `blobs/<user>/<key>`: every blob the snapshot points at, hard-linked from the blob
//!   folder where the file system allows (values are never changed in place, so a link
//!   is as good as a copy) and copied otherwise, each checked against the content hash
//!   its entry records. A value replaced or deleted after the snapshot is still there:
//!   it is retired, not deleted, for `storage.blob_grace_secs` (see `persistence::blobs`),
//!   so the backup must finish within that time (it says so when it did not). Small
//!   values kept in their rows (`storage.inline_max_bytes`) are in the snapshot itself,
//!   checked against their content hash like the blobs;
//! - `server.key`: the server's identity; `policies/`: the guests and their data;
//! - `manifest.json`, written last (so a backup that was interrupted has none): format,
//!   version, when, which homeserver and schema version made it, the BLAKE3 and size of
//!   every file but the values (the database records theirs), and the number and bytes
//!   of the values.
//!
//! `restore` checks everything before it writes anything (the manifest, every file's
//! hash, every value against its entry), refuses a target that is not empty, then puts
//! the files in place (values by hard link where possible), the database last.
//!
//! The same files beside the stores travel with `homeserver migrate --to`
//! ([`plan_carry`], [`carry`]): the server key (copied where the target has none,
//! refused where it has another) and the policies folder.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::maintenance::Progress;
use super::now_secs;
use crate::config::Config;
use crate::persistence::blobs::local_blob_file;
use crate::persistence::metadata::{EntryRecord, Stored};
use crate::persistence::sqlite::{self, SqliteFile};
use crate::persistence::{BlobsUrl, DatabaseUrl, StoreError};

const FORMAT: &str = "homeserver-backup";
const VERSION: u32 = 1;
pub const MANIFEST: &str = "manifest.json";
const DATABASE: &str = "hs.db";
const SERVER_KEY: &str = "server.key";
const POLICIES: &str = "policies";
const BLOBS: &str = "blobs";
/// Entries read from the snapshot at a time.
const PAGE: u32 = 500;

/// The files of an embedded deployment, from its configuration.
#[derive(Debug, Clone)]
pub struct DataPaths {
    pub database_url: DatabaseUrl,
    pub database: PathBuf,
    pub blobs: PathBuf,
    pub server_key: PathBuf,
    pub policies: PathBuf,
}

impl DataPaths {
    /// The embedded store's files, or why `config` names another kind of store.
    pub fn of(config: &Config) -> Result<Self, BackupError> {
        let storage = &config.storage;
        let (Some(database), BlobsUrl::File(blobs)) =
            (sqlite::database_file(&storage.database_url), &storage.blobs)
        else {
            return Err(BackupError::Unsupported(format!(
                "backup and restore cover the embedded store (a sqlite:// database and a \
                 file:// blob folder); this configuration names {} and {}: back up \
                 PostgreSQL with pg_dump and the bucket with a copy tool, as \
                 docs/deploy.md (\"Backups\") shows",
                storage.database_url, storage.blobs
            )));
        };
        Ok(Self {
            database_url: storage.database_url.clone(),
            database,
            blobs: blobs.clone(),
            server_key: config.keys.secret_key_file.clone(),
            policies: config.policies.dir.clone(),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{0}")]
    Unsupported(String),
    /// The backup folder or the restore target is not as it must be.
    #[error("{0}")]
    Target(String),
    /// The backup (or, while backing up, the store) is damaged or incomplete.
    #[error("{0}")]
    Damaged(String),
    #[error("the database: {0}")]
    Store(#[from] StoreError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Task(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BackupError + '_ {
    move |source| BackupError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// What `manifest.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    /// Unix seconds when the database snapshot was taken.
    pub created_at: i64,
    /// The homeserver version that made it.
    pub homeserver: String,
    /// The database's schema version (its last migration).
    pub schema_version: i64,
    /// Every file but the values, with its size and BLAKE3 (hex).
    pub files: Vec<FileRecord>,
    pub values: ValueCount,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// Relative to the backup folder, `/`-separated.
    pub path: String,
    pub size: u64,
    pub blake3: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValueCount {
    pub count: u64,
    pub bytes: u64,
}

/// What a backup or restore did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BackupSummary {
    pub values: ValueCount,
    /// Values hard-linked rather than copied.
    pub linked: u64,
    pub files: u64,
    pub schema_version: i64,
}

/// Backs the deployment at `paths` up into `dir` (created; it must be empty if it
/// exists), beside a running server.
pub async fn backup(
    paths: &DataPaths,
    dir: &Path,
    grace_secs: u64,
    progress: &dyn Progress,
) -> Result<BackupSummary, BackupError> {
    prepare_empty_folder(dir)?;
    let started = now_secs();
    progress.message("database snapshot");
    let snapshot = dir.join(DATABASE);
    sqlite::snapshot_into(&paths.database_url, &snapshot).await?;
    let database = SqliteFile::open(&snapshot).await?;
    let schema_version = database.schema_version().await?;

    progress.message("values");
    let mut summary = BackupSummary {
        schema_version,
        ..BackupSummary::default()
    };
    let outcome = each_value(&database, async |page| {
        let (from, to) = (paths.blobs.clone(), dir.join(BLOBS));
        let page_total: u64 = page.iter().map(|(_, e)| e.size).sum();
        let linked = blocking(move || {
            let mut linked = 0;
            for (user, entry) in &page {
                let Some(blob_key) = blob_or_checked_inline(entry).map_err(|what| {
                    BackupError::Damaged(format!(
                        "the value of {user}{} in the store {what}: the store is damaged \
                         (homeserver fsck)",
                        entry.path
                    ))
                })?
                else {
                    continue;
                };
                let source = local_blob_file(&from, blob_key);
                if !source.exists() {
                    return Err(BackupError::Damaged(format!(
                        "the value of {user}{} (blob {}) is gone from {}: the backup took \
                         longer than storage.blob_grace_secs ({grace_secs} s) after its \
                         snapshot, or the store is damaged (homeserver fsck); nothing \
                         usable was written, start again",
                        entry.path,
                        blob_key,
                        from.display()
                    )));
                }
                let target = local_blob_file(&to, blob_key);
                linked += u64::from(link_or_copy(&source, &target)?);
                let (size, hash) = hash_file(&target)?;
                if size != entry.size || hash != entry.content_hash {
                    return Err(BackupError::Damaged(format!(
                        "the value of {user}{} in the store (blob {blob_key}) does not match \
                         its recorded size and hash: the store is damaged (homeserver fsck)",
                        entry.path
                    )));
                }
            }
            Ok(linked)
        })
        .await?;
        summary.linked += linked;
        progress.advance(page_total);
        Ok(page_total)
    })
    .await;
    database.close().await;
    let values = outcome?;
    summary.values = values;

    progress.message("key and policies");
    let (key_source, policies_source, folder) = (
        paths.server_key.clone(),
        paths.policies.clone(),
        dir.to_owned(),
    );
    let files = blocking(move || {
        if !key_source.exists() {
            return Err(BackupError::Target(format!(
                "no server key at {} (keys.secret_key_file): a server that has started \
                 once has one; without it a restored server would get a new identity",
                key_source.display()
            )));
        }
        copy_file(&key_source, &folder.join(SERVER_KEY))?;
        if policies_source.is_dir() {
            copy_tree(&policies_source, &folder.join(POLICIES))?;
        }
        let mut files = vec![record(&folder, DATABASE)?, record(&folder, SERVER_KEY)?];
        for path in tree_files(&folder.join(POLICIES))? {
            let relative = relative_name(&folder, &path)?;
            files.push(record(&folder, &relative)?);
        }
        Ok(files)
    })
    .await?;
    summary.files = files.len() as u64;
    let manifest = Manifest {
        format: FORMAT.into(),
        version: VERSION,
        created_at: started,
        homeserver: env!("CARGO_PKG_VERSION").into(),
        schema_version,
        files,
        values: summary.values,
    };
    let folder = dir.to_owned();
    blocking(move || write_manifest(&folder, &manifest)).await?;
    Ok(summary)
}

/// Restores the backup in `dir` into the deployment at `paths`, whose database, blob
/// folder, key and policies folder must be empty or absent (a policies folder holding
/// exactly the backup's files is fine). Checks everything before writing anything.
pub async fn restore(
    dir: &Path,
    paths: &DataPaths,
    progress: &dyn Progress,
) -> Result<BackupSummary, BackupError> {
    let manifest = read_manifest(dir)?;
    let known = sqlite::known_schema_version();
    if manifest.schema_version > known {
        return Err(BackupError::Target(format!(
            "{} was made by homeserver {} with database schema version {}; this binary \
             (homeserver {}) knows schema versions up to {known}: restore it with that \
             version or a newer one",
            dir.display(),
            manifest.homeserver,
            manifest.schema_version,
            env!("CARGO_PKG_VERSION")
        )));
    }
    let target = paths.clone();
    let policies_match = {
        let (folder, files) = (dir.to_owned(), manifest.files.clone());
        blocking(move || check_target(&target, &folder, &files)).await?
    };

    progress.message("checking the backup");
    let (folder, files) = (dir.to_owned(), manifest.files.clone());
    blocking(move || {
        for file in &files {
            let (size, hash) = hash_file(&folder.join(&file.path))
                .map_err(|_| damaged(&folder, &format!("{} is missing", file.path)))?;
            if size != file.size || hex::encode(hash) != file.blake3 {
                return Err(damaged(
                    &folder,
                    &format!("{} does not match the hash in its manifest", file.path),
                ));
            }
        }
        Ok(())
    })
    .await?;
    let database = SqliteFile::open(&dir.join(DATABASE)).await?;
    let outcome = async {
        if database.schema_version().await? != manifest.schema_version {
            return Err(damaged(dir, "hs.db is not the database its manifest names"));
        }
        each_value(&database, async |page| {
            let folder = dir.to_owned();
            let page_total: u64 = page.iter().map(|(_, e)| e.size).sum();
            blocking(move || {
                for (user, entry) in &page {
                    let Some(blob_key) = blob_or_checked_inline(entry).map_err(|what| {
                        damaged(
                            &folder,
                            &format!("the value of {user}{} {what}", entry.path),
                        )
                    })?
                    else {
                        continue;
                    };
                    let file = local_blob_file(&folder.join(BLOBS), blob_key);
                    let what = format!("the value of {user}{} ({blob_key})", entry.path);
                    let (size, hash) = hash_file(&file)
                        .map_err(|_| damaged(&folder, &format!("{what} is missing")))?;
                    if size != entry.size || hash != entry.content_hash {
                        return Err(damaged(
                            &folder,
                            &format!("{what} does not match its recorded size and hash"),
                        ));
                    }
                }
                Ok(())
            })
            .await?;
            progress.advance(page_total);
            Ok(page_total)
        })
        .await
    }
    .await;
    let values = match outcome {
        Ok(values) => values,
        Err(e) => {
            database.close().await;
            return Err(e);
        }
    };
    if values != manifest.values {
        database.close().await;
        return Err(damaged(
            dir,
            &format!(
                "the manifest counts {} values ({} bytes), the database {} ({} bytes)",
                manifest.values.count, manifest.values.bytes, values.count, values.bytes
            ),
        ));
    }

    progress.message("restoring");
    let mut summary = BackupSummary {
        values,
        files: manifest.files.len() as u64,
        schema_version: manifest.schema_version,
        ..BackupSummary::default()
    };
    let mut after = (String::new(), String::new());
    loop {
        let page = database.entries_after((&after.0, &after.1), PAGE).await?;
        let Some((user, last)) = page.last() else {
            break;
        };
        after = (user.clone(), last.path.clone());
        let (from, to) = (dir.join(BLOBS), paths.blobs.clone());
        summary.linked += blocking(move || {
            let mut linked = 0;
            for key in page.iter().filter_map(|(_, entry)| entry.stored.blob_key()) {
                linked += u64::from(link_or_copy(
                    &local_blob_file(&from, key),
                    &local_blob_file(&to, key),
                )?);
            }
            Ok(linked)
        })
        .await?;
    }
    database.close().await;
    let (folder, target) = (dir.to_owned(), paths.clone());
    blocking(move || {
        std::fs::create_dir_all(&target.blobs).map_err(io(&target.blobs))?;
        if !policies_match && folder.join(POLICIES).is_dir() {
            copy_tree(&folder.join(POLICIES), &target.policies)?;
        }
        copy_file(&folder.join(SERVER_KEY), &target.server_key)?;
        // The database last, under its name only when whole: a restore cut off before
        // leaves no database a server could start on.
        let partial = target.database.with_extension("db.restoring");
        copy_file(&folder.join(DATABASE), &partial)?;
        std::fs::rename(&partial, &target.database).map_err(io(&target.database))?;
        sync_folder(target.database.parent().unwrap_or(Path::new(".")));
        Ok(())
    })
    .await?;
    Ok(summary)
}

/// Reads and checks `dir/manifest.json`.
pub fn read_manifest(dir: &Path) -> Result<Manifest, BackupError> {
    let path = dir.join(MANIFEST);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(damaged(
                dir,
                "it has no manifest.json: not a backup, or one that did not finish (a \
                 backup writes its manifest last)",
            ));
        }
        Err(e) => return Err(io(&path)(e)),
    };
    let manifest: Manifest = serde_json::from_slice(&text)
        .map_err(|e| damaged(dir, &format!("manifest.json does not read: {e}")))?;
    if manifest.format != FORMAT || manifest.version != VERSION {
        return Err(damaged(
            dir,
            &format!(
                "manifest.json is {} version {}, not {FORMAT} version {VERSION}",
                manifest.format, manifest.version
            ),
        ));
    }
    Ok(manifest)
}

fn damaged(dir: &Path, what: &str) -> BackupError {
    BackupError::Damaged(format!(
        "the backup in {} is damaged or incomplete: {what}; nothing was restored",
        dir.display()
    ))
}

/// Walks every entry of the snapshot a page at a time; `visit` answers the page's bytes.
async fn each_value(
    database: &SqliteFile,
    mut visit: impl AsyncFnMut(Vec<(String, EntryRecord)>) -> Result<u64, BackupError>,
) -> Result<ValueCount, BackupError> {
    let mut count = ValueCount::default();
    let mut after = (String::new(), String::new());
    loop {
        let page = database.entries_after((&after.0, &after.1), PAGE).await?;
        let Some((user, last)) = page.last() else {
            return Ok(count);
        };
        after = (user.clone(), last.path.clone());
        count.count += page.len() as u64;
        count.bytes += visit(page).await?;
    }
}

/// The blob key of a value in the blob store; None for a value kept in its row once it
/// matches its recorded size and hash (it travels inside the database file); what is
/// wrong with it otherwise.
fn blob_or_checked_inline(entry: &EntryRecord) -> Result<Option<&str>, &'static str> {
    match &entry.stored {
        Stored::Blob(key) => Ok(Some(key)),
        Stored::Inline(bytes)
            if bytes.len() as u64 == entry.size
                && *blake3::hash(bytes).as_bytes() == entry.content_hash =>
        {
            Ok(None)
        }
        Stored::Inline(_) => Err("(kept in its row) does not match its recorded size and hash"),
    }
}

/// Runs file work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, BackupError> + Send + 'static,
) -> Result<T, BackupError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| BackupError::Task(e.to_string()))?
}

/// Creates `dir`, or accepts it when it exists and is empty.
fn prepare_empty_folder(dir: &Path) -> Result<(), BackupError> {
    if dir.exists() && !is_empty_folder(dir)? {
        return Err(BackupError::Target(format!(
            "{} is not empty: back up into a new folder",
            dir.display()
        )));
    }
    std::fs::create_dir_all(dir).map_err(io(dir))
}

fn is_empty_folder(dir: &Path) -> Result<bool, BackupError> {
    match std::fs::read_dir(dir) {
        Ok(mut items) => Ok(items.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(io(dir)(e)),
    }
}

/// Refuses a target that holds data; answers whether its policies folder already holds
/// exactly the backup's policies (then it is left as it is).
fn check_target(
    target: &DataPaths,
    backup: &Path,
    files: &[FileRecord],
) -> Result<bool, BackupError> {
    let refuse = |what: &str, path: &Path| {
        Err(BackupError::Target(format!(
            "{what} {} is not empty: restore into an empty data folder (stop the server, \
             move the old data aside)",
            path.display()
        )))
    };
    let database = &target.database;
    for file in [database.clone(), database.with_extension("db-wal")] {
        if file.exists() {
            return refuse("the database", &file);
        }
    }
    if !is_empty_folder(&target.blobs)? {
        return refuse("the blob folder", &target.blobs);
    }
    if target.server_key.exists() {
        return refuse("the server key", &target.server_key);
    }
    if is_empty_folder(&target.policies)? {
        return Ok(false);
    }
    // The same files with the same hashes: nothing to restore there.
    let mut present = Vec::new();
    for path in tree_files(&target.policies)? {
        let name = relative_name(&target.policies, &path)?;
        let (size, hash) = hash_file(&path)?;
        present.push(FileRecord {
            path: format!("{POLICIES}/{name}"),
            size,
            blake3: hex::encode(hash),
        });
    }
    let mut wanted: Vec<FileRecord> = files
        .iter()
        .filter(|f| f.path.starts_with(&format!("{POLICIES}/")))
        .cloned()
        .collect();
    present.sort_by(|a, b| a.path.cmp(&b.path));
    wanted.sort_by(|a, b| a.path.cmp(&b.path));
    if present != wanted {
        return Err(BackupError::Target(format!(
            "the policies folder {} holds other files than the backup's {}: empty it (or \
             point policies.dir at an empty folder) to restore the backup's policies",
            target.policies.display(),
            backup.join(POLICIES).display()
        )));
    }
    Ok(true)
}

/// Hard-links `from` as `to` (true), or copies it when the file system does not allow
/// a link (false). `to`'s folder is created.
fn link_or_copy(from: &Path, to: &Path) -> Result<bool, BackupError> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    if std::fs::hard_link(from, to).is_ok() {
        return Ok(true);
    }
    copy_file(from, to)?;
    Ok(false)
}

/// Copies a file, durably, keeping its permissions (the key stays 0600).
fn copy_file(from: &Path, to: &Path) -> Result<(), BackupError> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    std::fs::copy(from, to).map_err(io(from))?;
    std::fs::File::open(to)
        .and_then(|f| f.sync_all())
        .map_err(io(to))
}

/// Copies every file under `from` into `to`.
fn copy_tree(from: &Path, to: &Path) -> Result<(), BackupError> {
    for path in tree_files(from)? {
        let name = relative_name(from, &path)?;
        copy_file(&path, &to.join(name))?;
    }
    Ok(())
}

/// Every regular file under `dir` (none when it does not exist), sorted.
fn tree_files(dir: &Path) -> Result<Vec<PathBuf>, BackupError> {
    let mut files = Vec::new();
    let mut folders = vec![dir.to_owned()];
    while let Some(folder) = folders.pop() {
        let items = match std::fs::read_dir(&folder) {
            Ok(items) => items,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(&folder)(e)),
        };
        for item in items {
            let item = item.map_err(io(&folder))?;
            let kind = item.file_type().map_err(io(&item.path()))?;
            if kind.is_dir() {
                folders.push(item.path());
            } else if kind.is_file() {
                files.push(item.path());
            }
        }
    }
    files.sort();
    Ok(files)
}

/// `path` relative to `base`, `/`-separated.
fn relative_name(base: &Path, path: &Path) -> Result<String, BackupError> {
    let relative = path.strip_prefix(base).map_err(|_| {
        BackupError::Task(format!("{} is outside {}", path.display(), base.display()))
    })?;
    let parts: Option<Vec<&str>> = relative.iter().map(|p| p.to_str()).collect();
    parts
        .map(|p| p.join("/"))
        .ok_or_else(|| BackupError::Target(format!("{} is not UTF-8", path.display())))
}

fn hash_file(path: &Path) -> Result<(u64, [u8; 32]), BackupError> {
    let file = std::fs::File::open(path).map_err(io(path))?;
    let mut hasher = blake3::Hasher::new();
    let size = std::io::copy(
        &mut std::io::BufReader::with_capacity(256 * 1024, file),
        &mut hasher,
    )
    .map_err(io(path))?;
    Ok((size, *hasher.finalize().as_bytes()))
}

fn record(folder: &Path, name: &str) -> Result<FileRecord, BackupError> {
    let (size, hash) = hash_file(&folder.join(name))?;
    Ok(FileRecord {
        path: name.to_owned(),
        size,
        blake3: hex::encode(hash),
    })
}

/// Writes the manifest durably, under its name only when whole.
fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<(), BackupError> {
    let text = serde_json::to_vec_pretty(manifest).map_err(|e| BackupError::Task(e.to_string()))?;
    let partial = dir.join("manifest.json.partial");
    let mut file = std::fs::File::create(&partial).map_err(io(&partial))?;
    file.write_all(&text)
        .and_then(|()| file.sync_all())
        .map_err(io(&partial))?;
    let path = dir.join(MANIFEST);
    std::fs::rename(&partial, &path).map_err(io(&path))?;
    sync_folder(dir);
    Ok(())
}

/// Makes a folder's new names durable (best effort: not every file system allows it).
fn sync_folder(dir: &Path) {
    if let Ok(folder) = std::fs::File::open(dir) {
        let _ = folder.sync_all();
    }
}

// ---------------------------------------------------------------------------------------
// The server key and the policies folder of `homeserver migrate --to`

/// What `migrate` does with the files beside the stores, decided before it copies any
/// data (so a refusal leaves the target untouched).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CarryPlan {
    /// Copy the source's key to the target's `keys.secret_key_file` (absent there).
    pub copy_key: Option<(PathBuf, PathBuf)>,
    /// Copy the source's policies folder into the target's (absent or empty there).
    pub copy_policies: Option<(PathBuf, PathBuf)>,
}

/// The key and policies of the deployment at `from` must be the target's: refuses when
/// the target's `keys.secret_key_file` holds another key (the server would get a new
/// identity) or its policies folder holds other files, naming both paths.
pub fn plan_carry(
    from_key: &Path,
    from_policies: &Path,
    to_key: &Path,
    to_policies: &Path,
) -> Result<CarryPlan, BackupError> {
    let source = std::fs::read_to_string(from_key).map_err(|e| {
        BackupError::Target(format!(
            "the server key {} (keys.secret_key_file of the source): {e}; the copy would \
             get a new identity without it",
            from_key.display()
        ))
    })?;
    let copy_key = match std::fs::read_to_string(to_key) {
        Ok(target) if target.trim() == source.trim() => None,
        Ok(_) => {
            return Err(BackupError::Target(format!(
                "the target's keys.secret_key_file {} holds another key than the source's \
                 {}: the servers would get a new identity (clients that pinned the key and \
                 the pkarr records would no longer match). Point the target's \
                 keys.secret_key_file at a path without a key (it is copied there), or \
                 remove {} if nothing uses it",
                to_key.display(),
                from_key.display(),
                to_key.display()
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Some((from_key.to_owned(), to_key.to_owned()))
        }
        Err(e) => return Err(io(to_key)(e)),
    };
    let same_folder = match (from_policies.canonicalize(), to_policies.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    let copy_policies = if same_folder || is_empty_folder(from_policies)? {
        None
    } else if is_empty_folder(to_policies)? {
        Some((from_policies.to_owned(), to_policies.to_owned()))
    } else if same_files(from_policies, to_policies)? {
        None
    } else {
        return Err(BackupError::Target(format!(
            "the target's policies folder {} holds other files than the source's {}: \
             empty it (it is then copied) or make them the same",
            to_policies.display(),
            from_policies.display()
        )));
    };
    Ok(CarryPlan {
        copy_key,
        copy_policies,
    })
}

/// Does what [`plan_carry`] decided.
pub fn carry(plan: &CarryPlan) -> Result<(), BackupError> {
    if let Some((from, to)) = &plan.copy_key {
        copy_file(from, to)?;
    }
    if let Some((from, to)) = &plan.copy_policies {
        copy_tree(from, to)?;
    }
    Ok(())
}

/// Whether two folders hold the same files with the same bytes.
fn same_files(a: &Path, b: &Path) -> Result<bool, BackupError> {
    let listing = |dir: &Path| -> Result<Vec<(String, u64, [u8; 32])>, BackupError> {
        let mut files = Vec::new();
        for path in tree_files(dir)? {
            let (size, hash) = hash_file(&path)?;
            files.push((relative_name(dir, &path)?, size, hash));
        }
        Ok(files)
    };
    Ok(listing(a)? == listing(b)?)
}
