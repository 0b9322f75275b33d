//! One process per local store: an exclusive lock on the SQLite database and on the
//! local blob folder, taken before either is opened and held until the server stops.
//!
//! Two servers on one data directory would each believe they own it: SQLite would
//! serialize their writes, but each server's blob sweep deletes blobs that its own
//! database does not reference, i.e. the other server's values. So a second process is
//! refused with a message naming the holder. The locks are advisory `flock`s on
//! `<database file>.lock` and `<blob folder>.lock` (beside the folder, so the sweep never
//! sees the lock file as a blob); the operating system releases them when the process
//! ends, also after a crash or `kill -9`, so there is never a stale lock to clean up.
//! Shared backends (PostgreSQL, S3) are made for several instances and take no lock.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use super::url::{BlobsUrl, DatabaseUrl};

/// Held locks; dropping it releases them.
#[derive(Debug)]
pub struct LocalStorageLock {
    _files: Vec<File>,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "{what} {} is in use by another homeserver process{}: stop that one first, or give \
         this one its own storage (storage.database_url, storage.blobs)",
        path.display(),
        holder.as_ref().map(|pid| format!(" (pid {pid})")).unwrap_or_default()
    )]
    InUse {
        what: &'static str,
        path: PathBuf,
        holder: Option<String>,
    },
    #[error("locking {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Locks the local stores among `database` and `blobs` (none for shared backends).
pub fn lock_local_storage(
    database: &DatabaseUrl,
    blobs: &BlobsUrl,
) -> Result<LocalStorageLock, LockError> {
    let mut files = Vec::new();
    if let Some(db_file) = super::sqlite::database_file(database) {
        files.push(lock_beside(&db_file, "database", "lock")?);
    }
    if let BlobsUrl::File(dir) = blobs {
        files.push(lock_beside(dir, "blob folder", "lock")?);
    }
    Ok(LocalStorageLock { _files: files })
}

/// Takes the lock file `<target>.<suffix>`, creating its folder if needed.
fn lock_beside(target: &Path, what: &'static str, suffix: &str) -> Result<File, LockError> {
    let mut name = target
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "data".into());
    name.push(".");
    name.push(suffix);
    let path = target.with_file_name(name);
    let io = |source| LockError::Io {
        path: path.clone(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            return Err(LockError::InUse {
                what,
                path: target.to_owned(),
                holder: (!holder.is_empty()).then(|| holder.to_owned()),
            });
        }
        Err(TryLockError::Error(e)) => return Err(io(e)),
    }
    // Say who holds it, for the message a second process prints.
    file.set_len(0).map_err(io)?;
    file.rewind().map_err(io)?;
    write!(file, "{}", std::process::id()).map_err(io)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let db = DatabaseUrl::parse(&format!("sqlite://{}/hs.db", dir.path().display())).unwrap();
        let blobs = BlobsUrl::parse(&format!("file://{}/blobs", dir.path().display())).unwrap();
        let first = lock_local_storage(&db, &blobs).unwrap();
        let err = lock_local_storage(&db, &blobs).unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, LockError::InUse { .. }), "{message}");
        assert!(message.contains("hs.db"), "{message}");
        assert!(
            message.contains(&format!("pid {}", std::process::id())),
            "{message}"
        );
        // Another database but the same blob folder: still refused (the sweep would
        // delete the other server's blobs).
        let other_db =
            DatabaseUrl::parse(&format!("sqlite://{}/other.db", dir.path().display())).unwrap();
        let err = lock_local_storage(&other_db, &blobs).unwrap_err();
        assert!(err.to_string().contains("blob folder"), "{err}");
        drop(first);
        lock_local_storage(&db, &blobs).unwrap();
    }

    #[test]
    fn shared_backends_take_no_lock() {
        let db = DatabaseUrl::parse("postgres://hs@db.internal/hs").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let blobs = BlobsUrl::parse(&format!("file://{}/blobs", dir.path().display())).unwrap();
        let _a = lock_local_storage(&db, &blobs).unwrap();
        // Only the blob folder was locked.
        assert!(lock_local_storage(&db, &blobs).is_err());
        assert!(!dir.path().join("hs.db.lock").exists());
    }
}
