//! SQLite's own tools, for the embedded store's files: which file a URL names, a
//! consistent snapshot beside a running server, and reading a snapshot back (backups,
//! `persistence::local_lock`). The store itself is `persistence::sql`, one
//! implementation over SQLite and PostgreSQL.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};

use super::metadata::StoreError;

pub use super::sql::SqliteFile;
pub use super::sql::known_sqlite_schema_version as known_schema_version;

/// The database file a `sqlite://` URL names (None for other backends and for
/// in-memory databases).
pub fn database_file(url: &super::DatabaseUrl) -> Option<std::path::PathBuf> {
    let super::DatabaseUrl::Sqlite(text) = url else {
        return None;
    };
    let options = SqliteConnectOptions::from_str(text).ok()?;
    let file = options.get_filename();
    (!file.as_os_str().is_empty() && file != std::path::Path::new(":memory:"))
        .then(|| file.to_owned())
}

/// Writes a consistent copy of the database at `url` to `target` (a new file), beside a
/// running server: `VACUUM INTO` on a read-only connection reads one snapshot (WAL lets
/// the server keep committing meanwhile) and changes nothing in the source.
pub async fn snapshot_into(url: &super::DatabaseUrl, target: &Path) -> Result<(), StoreError> {
    let options = SqliteConnectOptions::from_str(url.expose_secret())
        .map_err(|e| StoreError::Internal(format!("database url: {e}")))?
        .read_only(true)
        .busy_timeout(Duration::from_secs(30));
    let mut connection = options.connect().await.map_err(map_err)?;
    let target = target
        .to_str()
        .ok_or_else(|| StoreError::Internal(format!("{} is not UTF-8", target.display())))?;
    let done = sqlx::query("VACUUM INTO ?")
        .bind(target)
        .execute(&mut connection)
        .await
        .map_err(map_err);
    let _ = connection.close().await;
    done.map(|_| ())
}

fn map_err(e: sqlx::Error) -> StoreError {
    // SQLITE_BUSY / SQLITE_LOCKED after the busy timeout: the server holds the file.
    let busy =
        matches!(&e, sqlx::Error::Database(db) if db.code().is_some_and(|c| c == "5" || c == "6"));
    StoreError::database(e, busy)
}
