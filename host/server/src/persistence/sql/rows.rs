//! Rows and statements, the same on both databases: the column lists, the mapping of a
//! row to a record, the event filters, and a statement builder with `$n` placeholders
//! (both databases read them; sqlx's `QueryBuilder` writes `?` for the Any driver,
//! which PostgreSQL does not read).

use std::fmt::Write as _;

use homeserver_protocol::event::EventKind;
use sqlx::any::{AnyArguments, AnyQueryResult, AnyRow};
use sqlx::error::BoxDynError;
use sqlx::{Any, Arguments, Encode, Executor, Row, Type};

use super::super::metadata::{
    EntryRecord, EventRecord, ListedEntry, Stored, UserCursor, UserRecord,
};

/// The users table's columns, in the order [`copy_users`](super) inserts them.
pub(super) const USER_COLUMNS: &str =
    "public_key, created_at, used_bytes, quota_bytes, disabled, last_activity";
/// The users table's columns as [`user_from_row`] reads them: the flag as an integer
/// (a PostgreSQL BOOLEAN, a SQLite INTEGER; the Any driver reads no flag from SQLite).
pub(super) const USER_SELECT: &str = "public_key, created_at, used_bytes, quota_bytes, \
     CASE WHEN disabled THEN 1 ELSE 0 END AS disabled, last_activity";
/// An inline value is a row with an empty `blob_key` and its bytes in `inline_value`
/// (see [`stored_columns`]).
pub(crate) const ENTRY_COLUMNS: &str =
    "path, blob_key, size, content_hash, created_at, updated_at, inline_value";
/// What a listing reads: not the values.
pub(super) const LISTED_COLUMNS: &str = "path, size, content_hash, created_at, updated_at";
/// [`ENTRY_COLUMNS`] of a database from before inline values (schema 5 on SQLite: a
/// backup made by 0.1.0, read as it is).
pub(super) const ENTRY_COLUMNS_BEFORE_INLINE: &str =
    "path, blob_key, size, content_hash, created_at, updated_at, NULL AS inline_value";
pub(super) const EVENT_COLUMNS: &str = "cursor, owner, path, kind, content_hash, created_at";

/// Rows a multi-row statement carries at most: SQLite allows 32766 bound values a
/// statement, PostgreSQL 65535; the widest row here has 8.
pub(super) const CHUNK: usize = 1000;

pub(super) fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

pub(super) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(super) fn user_from_row(row: &AnyRow) -> Result<UserRecord, sqlx::Error> {
    Ok(UserRecord {
        public_key: row.try_get("public_key")?,
        created_at: row.try_get("created_at")?,
        used_bytes: to_u64(row.try_get("used_bytes")?),
        quota_bytes: row.try_get::<Option<i64>, _>("quota_bytes")?.map(to_u64),
        disabled: row.try_get::<i64, _>("disabled")? != 0,
        last_activity: row.try_get("last_activity")?,
    })
}

pub(super) fn hash32(bytes: Vec<u8>) -> Result<[u8; 32], sqlx::Error> {
    bytes
        .try_into()
        .map_err(|_| sqlx::Error::Decode("a hash column is not 32 bytes".into()))
}

/// The `blob_key` and `inline_value` columns of a [`Stored`]: a blob key never is
/// empty (`BlobStore::new_key`), so an empty one marks an inline value.
pub(super) fn stored_columns(stored: &Stored) -> (&str, Option<&[u8]>) {
    match stored {
        Stored::Blob(key) => (key, None),
        Stored::Inline(bytes) => ("", Some(bytes)),
    }
}

fn stored_from_row(row: &AnyRow) -> Result<Stored, sqlx::Error> {
    let blob_key: String = row.try_get("blob_key")?;
    if !blob_key.is_empty() {
        return Ok(Stored::Blob(blob_key));
    }
    // A zero-length BLOB may read back as NULL.
    let bytes: Option<Vec<u8>> = row.try_get("inline_value")?;
    Ok(Stored::Inline(bytes.unwrap_or_default().into()))
}

pub(crate) fn entry_from_row(row: &AnyRow) -> Result<EntryRecord, sqlx::Error> {
    Ok(EntryRecord {
        path: row.try_get("path")?,
        stored: stored_from_row(row)?,
        size: to_u64(row.try_get("size")?),
        content_hash: hash32(row.try_get("content_hash")?)?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

pub(super) fn listed_from_row(row: &AnyRow) -> Result<ListedEntry, sqlx::Error> {
    Ok(ListedEntry {
        path: row.try_get("path")?,
        size: to_u64(row.try_get("size")?),
        content_hash: hash32(row.try_get("content_hash")?)?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

pub(super) fn event_from_row(row: &AnyRow) -> Result<EventRecord, sqlx::Error> {
    let kind: String = row.try_get("kind")?;
    Ok(EventRecord {
        cursor: to_u64(row.try_get("cursor")?),
        user: row.try_get("owner")?,
        path: row.try_get("path")?,
        kind: EventKind::parse(&kind)
            .ok_or_else(|| sqlx::Error::Decode(format!("unknown event kind {kind}").into()))?,
        content_hash: row
            .try_get::<Option<Vec<u8>>, _>("content_hash")?
            .map(hash32)
            .transpose()?,
        created_at: row.try_get("created_at")?,
    })
}

/// `public_key`'s row, on a pool or in a write transaction (`lock`: what holds the row
/// until the transaction ends, see `Dialect::lock_row`).
pub(super) async fn user<'e>(
    executor: impl Executor<'e, Database = Any>,
    public_key: &str,
    lock: &str,
) -> Result<Option<UserRecord>, sqlx::Error> {
    let sql = format!("SELECT {USER_SELECT} FROM users WHERE public_key = $1{lock}");
    let row = sqlx::query(&sql)
        .bind(public_key)
        .fetch_optional(executor)
        .await?;
    row.as_ref().map(user_from_row).transpose()
}

/// `user`'s entry at `path`, on a pool or in a write transaction.
pub(super) async fn entry<'e>(
    executor: impl Executor<'e, Database = Any>,
    user: &str,
    path: &str,
) -> Result<Option<EntryRecord>, sqlx::Error> {
    let sql = format!("SELECT {ENTRY_COLUMNS} FROM entries WHERE owner = $1 AND path = $2");
    let row = sqlx::query(&sql)
        .bind(user)
        .bind(path)
        .fetch_optional(executor)
        .await?;
    row.as_ref().map(entry_from_row).transpose()
}

/// Every row through `decode`.
pub(super) fn decode_all<T>(
    rows: &[AnyRow],
    decode: fn(&AnyRow) -> Result<T, sqlx::Error>,
) -> Result<Vec<T>, sqlx::Error> {
    rows.iter().map(decode).collect()
}

/// Appends `AND ((owner = $n AND cursor <op> $m) OR ...)` and the path-prefix range.
/// A per-user cursor of 0 means no bound.
pub(super) fn push_event_filters<'q>(
    sql: &mut Statement<'q>,
    users: &'q [UserCursor],
    cursor_op: &str,
    path_prefix: Option<&'q str>,
) {
    if !users.is_empty() {
        sql.push(" AND (");
        for (i, u) in users.iter().enumerate() {
            if i > 0 {
                sql.push(" OR ");
            }
            sql.push("(owner = ").bind(u.user.as_str());
            if u.cursor != 0 {
                sql.push(" AND cursor ")
                    .push(cursor_op)
                    .push(" ")
                    .bind(to_i64(u.cursor));
            }
            sql.push(")");
        }
        sql.push(")");
    }
    if let Some(prefix) = path_prefix {
        // Every path under `prefix` sorts in [prefix, prefix + '{') bytewise (SQLite's
        // default, PostgreSQL's "C" collation): '{' is above every character a path may
        // contain. Unlike LIKE, `_` needs no escaping.
        sql.push(" AND path >= ")
            .bind(prefix)
            .push(" AND path < ")
            .bind(format!("{prefix}{{"));
    }
}

/// SQL text with `$n` placeholders and the values they stand for, built piece by piece.
pub(super) struct Statement<'q> {
    sql: String,
    args: AnyArguments<'q>,
    count: usize,
    /// The first value that could not be encoded (none of the types used here fails).
    failed: Option<BoxDynError>,
}

impl<'q> Statement<'q> {
    pub fn new(sql: impl Into<String>) -> Self {
        Self {
            sql: sql.into(),
            args: AnyArguments::default(),
            count: 0,
            failed: None,
        }
    }

    pub fn push(&mut self, sql: &str) -> &mut Self {
        self.sql.push_str(sql);
        self
    }

    /// Appends the next placeholder, standing for `value`.
    pub fn bind<T>(&mut self, value: T) -> &mut Self
    where
        T: 'q + Encode<'q, Any> + Type<Any>,
    {
        if let Err(e) = self.args.add(value) {
            self.failed.get_or_insert(e);
        }
        self.count += 1;
        // Writing to a String cannot fail.
        let _ = write!(self.sql, "${}", self.count);
        self
    }

    /// Appends `VALUES (...), (...)`: one tuple an item, its values bound by `row`.
    pub fn push_values<I>(
        &mut self,
        items: impl IntoIterator<Item = I>,
        mut row: impl FnMut(&mut Tuple<'_, 'q>, I),
    ) -> &mut Self {
        self.push("VALUES ");
        for (i, item) in items.into_iter().enumerate() {
            if i > 0 {
                self.push(", ");
            }
            self.push("(");
            row(
                &mut Tuple {
                    statement: self,
                    first: true,
                },
                item,
            );
            self.push(")");
        }
        self
    }

    fn finish(self) -> Result<(String, AnyArguments<'q>), sqlx::Error> {
        match self.failed {
            Some(e) => Err(sqlx::Error::Encode(e)),
            None => Ok((self.sql, self.args)),
        }
    }

    pub async fn execute<'e>(
        self,
        executor: impl Executor<'e, Database = Any>,
    ) -> Result<AnyQueryResult, sqlx::Error> {
        let (sql, args) = self.finish()?;
        sqlx::query_with(&sql, args).execute(executor).await
    }

    pub async fn fetch_all<'e>(
        self,
        executor: impl Executor<'e, Database = Any>,
    ) -> Result<Vec<AnyRow>, sqlx::Error> {
        let (sql, args) = self.finish()?;
        sqlx::query_with(&sql, args).fetch_all(executor).await
    }
}

/// `INSERT` of `entries` (user, entry) that replaces an existing entry of the same user
/// and path: what a write and an import of entries both send. No two may share a user
/// and path, and at most [`CHUNK`] go in one statement.
pub(super) fn upsert_entries<'q>(
    entries: impl IntoIterator<Item = (&'q str, &'q EntryRecord)>,
) -> Statement<'q> {
    let mut sql = Statement::new(format!("INSERT INTO entries (owner, {ENTRY_COLUMNS}) "));
    sql.push_values(entries, |row, (user, entry)| {
        let (blob_key, inline_value) = stored_columns(&entry.stored);
        row.bind(user)
            .bind(entry.path.as_str())
            .bind(blob_key)
            .bind(to_i64(entry.size))
            .bind(&entry.content_hash[..])
            .bind(entry.created_at)
            .bind(entry.updated_at)
            .bind(inline_value);
    });
    sql.push(
        " ON CONFLICT (owner, path) DO UPDATE SET blob_key = excluded.blob_key, \
         size = excluded.size, content_hash = excluded.content_hash, \
         created_at = excluded.created_at, updated_at = excluded.updated_at, \
         inline_value = excluded.inline_value",
    );
    sql
}

/// One row of a `VALUES` list.
pub(super) struct Tuple<'s, 'q> {
    statement: &'s mut Statement<'q>,
    first: bool,
}

impl<'q> Tuple<'_, 'q> {
    pub fn bind<T>(&mut self, value: T) -> &mut Self
    where
        T: 'q + Encode<'q, Any> + Type<Any>,
    {
        if !self.first {
            self.statement.push(", ");
        }
        self.first = false;
        self.statement.bind(value);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_in_order() {
        let users = [
            UserCursor {
                user: "a".into(),
                cursor: 0,
            },
            UserCursor {
                user: "b".into(),
                cursor: 7,
            },
        ];
        let mut sql = Statement::new("SELECT 1 FROM events WHERE cursor > ");
        sql.bind(1_i64);
        push_event_filters(&mut sql, &users, ">", Some("/pub/"));
        assert_eq!(
            sql.sql,
            "SELECT 1 FROM events WHERE cursor > $1 AND ((owner = $2) OR \
             (owner = $3 AND cursor > $4)) AND path >= $5 AND path < $6"
        );
        let mut values = Statement::new("INSERT INTO t (a, b) ");
        values.push_values([(1_i64, "x"), (2, "y")], |row, (a, b)| {
            row.bind(a).bind(b);
        });
        assert_eq!(values.sql, "INSERT INTO t (a, b) VALUES ($1, $2), ($3, $4)");
        assert_eq!(values.count, 4);
    }
}
