//! The query strings of listings (`GET <prefix>/`), the event feed (`GET /events/`),
//! event streams (`GET /events-stream`) and the admin API's lists (`GET /admin/users`,
//! `/admin/signup_tokens`, `/admin/events`): each parameter's name, its limits, how it
//! is written (clients, the load generator) and how it is read (the server), in one
//! place.
//!
//! Reading refuses what the server refuses, with the message it answers; writing sends
//! what it is given (a limit out of range goes out as it is, so the server's message is
//! what the caller sees), except a stream's path filter, checked first because a path
//! has a local rule.

use form_urlencoded::Serializer;

use crate::keys::{PublicKey, is_z32_prefix};
use crate::path::{PathError, StoragePath};

/// Largest page of a listing.
pub const MAX_LIST_LIMIT: u32 = 1000;
/// Page of a listing without `limit`.
pub const DEFAULT_LIST_LIMIT: u32 = 100;
/// Largest page of the feed.
pub const MAX_FEED_LIMIT: u32 = 1000;
/// Page of the feed without `limit`.
pub const DEFAULT_FEED_LIMIT: u32 = 100;
/// Most events a stream's `limit` may ask for.
pub const MAX_STREAM_LIMIT: u32 = 65535;
/// Most users one stream may follow.
pub const MAX_STREAM_USERS: usize = 50;
/// Largest page of the admin API's lists.
pub const MAX_ADMIN_PAGE: u32 = 1000;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QueryError {
    /// A parameter is not what it must be; the message says which and why.
    #[error("{0}")]
    Invalid(String),
    /// A stream's path filter is not a valid path prefix.
    #[error("invalid path filter `{path}`: {source}")]
    Path { path: String, source: PathError },
}

fn invalid(message: impl Into<String>) -> QueryError {
    QueryError::Invalid(message.into())
}

/// The decoded `name=value` pairs of a query string, in order.
fn pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    form_urlencoded::parse(query.as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned()))
}

/// A boolean parameter: `true`/`1`, `false`/`0`, and no value means true.
fn flag(name: &str, value: &str) -> Result<bool, QueryError> {
    match value {
        "true" | "1" | "" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(invalid(format!(
            "{name} must be true or false, got `{value}`"
        ))),
    }
}

/// A stream's path filter with its leading `/` (added when missing), checked.
fn path_filter(value: &str) -> Result<String, QueryError> {
    let prefix = if value.starts_with('/') {
        value.to_owned()
    } else {
        format!("/{value}")
    };
    StoragePath::parse(&prefix).map_err(|source| QueryError::Path {
        path: value.to_owned(),
        source,
    })?;
    Ok(prefix)
}

/// Paging and shape of a listing: `limit`, `cursor`, `reverse`, `shallow`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// Page size, 1..=[`MAX_LIST_LIMIT`]; [`DEFAULT_LIST_LIMIT`] when `None`.
    pub limit: Option<u32>,
    /// Opaque cursor from the previous page.
    pub cursor: Option<String>,
    /// Descending path order.
    pub reverse: bool,
    /// Immediate children only; sub-folders appear as `name/`.
    pub shallow: bool,
}

impl ListQuery {
    /// The query string (without `?`), or `None` when every option has its default.
    pub fn to_query(&self) -> Option<String> {
        let mut query = Serializer::new(String::new());
        if let Some(limit) = self.limit {
            query.append_pair("limit", &limit.to_string());
        }
        if let Some(cursor) = &self.cursor {
            query.append_pair("cursor", cursor);
        }
        if self.reverse {
            query.append_pair("reverse", "true");
        }
        if self.shallow {
            query.append_pair("shallow", "true");
        }
        let query = query.finish();
        (!query.is_empty()).then_some(query)
    }

    /// Reads a listing's query; unknown parameters are ignored. The limit's range is the
    /// listing's to check (it knows the page it is asked for).
    pub fn parse(query: &str) -> Result<Self, QueryError> {
        let mut options = Self::default();
        for (key, value) in pairs(query) {
            match key.as_str() {
                "limit" => {
                    options.limit = Some(value.parse().map_err(|_| {
                        invalid(format!(
                            "limit must be an integer from 1 to {MAX_LIST_LIMIT}, got `{value}`"
                        ))
                    })?);
                }
                "cursor" => options.cursor = Some(value),
                "reverse" => options.reverse = flag("reverse", &value)?,
                "shallow" => options.shallow = flag("shallow", &value)?,
                _ => {}
            }
        }
        Ok(options)
    }
}

/// A page of the feed: events after `cursor`, at most `limit`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeedQuery {
    pub cursor: u64,
    /// 1..=[`MAX_FEED_LIMIT`]; [`DEFAULT_FEED_LIMIT`] when `None`.
    pub limit: Option<u32>,
}

impl FeedQuery {
    /// `cursor=N[&limit=L]`.
    pub fn to_query(&self) -> String {
        let mut query = Serializer::new(String::new());
        query.append_pair("cursor", &self.cursor.to_string());
        if let Some(limit) = self.limit {
            query.append_pair("limit", &limit.to_string());
        }
        query.finish()
    }

    pub fn parse(query: &str) -> Result<Self, QueryError> {
        let mut feed = Self::default();
        for (key, value) in pairs(query) {
            match key.as_str() {
                "cursor" => {
                    feed.cursor = value.parse().map_err(|_| {
                        invalid(format!("cursor must be an unsigned integer, got `{value}`"))
                    })?;
                }
                "limit" => {
                    feed.limit = Some(
                        value
                            .parse()
                            .ok()
                            .filter(|l| (1..=MAX_FEED_LIMIT).contains(l))
                            .ok_or_else(|| {
                                invalid(format!(
                                    "limit must be from 1 to {MAX_FEED_LIMIT}, got `{value}`"
                                ))
                            })?,
                    );
                }
                _ => {}
            }
        }
        Ok(feed)
    }

    /// The page size asked for, or the default.
    pub fn limit_or_default(&self) -> u32 {
        self.limit.unwrap_or(DEFAULT_FEED_LIMIT)
    }
}

/// What an event stream delivers: `user=<z32>[:<cursor>]` (repeatable), `limit`,
/// `live`, `reverse`, `path`.
///
/// ```
/// # use homeserver_protocol::{Keypair, query::StreamQuery};
/// let (alice, bob) = (Keypair::random().public_key(), Keypair::random().public_key());
/// let request = StreamQuery::new()
///     .user(alice)
///     .user_after(bob, 42)
///     .path("/pub/app/")
///     .live(true);
/// assert_eq!(request.users.len(), 2);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamQuery {
    /// Whose events, each optionally after a cursor (exclusive). At least one, at most
    /// [`MAX_STREAM_USERS`].
    pub users: Vec<(PublicKey, Option<u64>)>,
    /// After the history, keep the stream open and deliver new events as they happen.
    pub live: bool,
    /// Newest first (history only; not together with `live`).
    pub reverse: bool,
    /// Close the stream after this many events (1..=[`MAX_STREAM_LIMIT`]).
    pub limit: Option<u32>,
    /// Only events whose path starts with this prefix, e.g. `/pub/app/`. A missing
    /// leading `/` is added.
    pub path: Option<String>,
}

impl StreamQuery {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `user`, from the beginning of their history.
    pub fn user(mut self, user: PublicKey) -> Self {
        self.users.push((user, None));
        self
    }

    /// Adds `user`, with events after `cursor` only.
    pub fn user_after(mut self, user: PublicKey, cursor: u64) -> Self {
        self.users.push((user, Some(cursor)));
        self
    }

    pub fn live(mut self, live: bool) -> Self {
        self.live = live;
        self
    }

    pub fn reverse(mut self, reverse: bool) -> Self {
        self.reverse = reverse;
        self
    }

    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = Some(limit);
        self
    }

    pub fn path(mut self, prefix: impl Into<String>) -> Self {
        self.path = Some(prefix.into());
        self
    }

    /// The query string (without `?`): `user=<z32>[:<cursor>]` once per user, in order,
    /// then `limit`, `live`, `reverse` and `path` when set. The path prefix is checked
    /// with the protocol's path rules first; the other rules (user count, limit range,
    /// live with reverse) are the server's, so its message is what the caller sees.
    pub fn to_query(&self) -> Result<String, QueryError> {
        let mut query = Serializer::new(String::new());
        for (user, cursor) in &self.users {
            let value = match cursor {
                Some(cursor) => format!("{}:{cursor}", user.to_z32()),
                None => user.to_z32(),
            };
            query.append_pair("user", &value);
        }
        if let Some(limit) = self.limit {
            query.append_pair("limit", &limit.to_string());
        }
        if self.live {
            query.append_pair("live", "true");
        }
        if self.reverse {
            query.append_pair("reverse", "true");
        }
        if let Some(path) = &self.path {
            query.append_pair("path", &path_filter(path)?);
        }
        Ok(query.finish())
    }

    /// Reads a stream's query and applies every rule: at least one and at most
    /// [`MAX_STREAM_USERS`] users, valid keys and cursors, `limit` in range, a valid
    /// path filter (stored with its leading `/`), not `live` with `reverse`.
    pub fn parse(query: &str) -> Result<Self, QueryError> {
        let mut stream = Self::default();
        for (key, value) in pairs(query) {
            match key.as_str() {
                "user" => {
                    let (key, cursor) = match value.split_once(':') {
                        Some((k, c)) => (
                            k,
                            Some(c.parse::<u64>().map_err(|_| {
                                invalid(format!(
                                    "user cursor must be an unsigned integer, got `{c}`"
                                ))
                            })?),
                        ),
                        None => (value.as_str(), None),
                    };
                    let user: PublicKey = key
                        .parse()
                        .map_err(|e| invalid(format!("invalid user `{key}`: {e}")))?;
                    stream.users.push((user, cursor));
                }
                "limit" => {
                    stream.limit = Some(
                        value
                            .parse()
                            .ok()
                            .filter(|l| (1..=MAX_STREAM_LIMIT).contains(l))
                            .ok_or_else(|| {
                                invalid(format!(
                                    "limit must be from 1 to {MAX_STREAM_LIMIT}, got `{value}`"
                                ))
                            })?,
                    );
                }
                "live" => stream.live = flag("live", &value)?,
                "reverse" => stream.reverse = flag("reverse", &value)?,
                "path" => stream.path = Some(path_filter(&value)?),
                _ => {}
            }
        }
        if stream.users.is_empty() {
            return Err(invalid(
                "at least one user is required (user=<z32>[:cursor])",
            ));
        }
        if stream.users.len() > MAX_STREAM_USERS {
            return Err(invalid(format!(
                "at most {MAX_STREAM_USERS} users per stream, got {}",
                stream.users.len()
            )));
        }
        if stream.live && stream.reverse {
            return Err(invalid("live and reverse cannot be combined"));
        }
        Ok(stream)
    }
}

/// Paging of an admin API list: `limit`, `cursor` and, for users, `prefix` (the start
/// of a key). Each list takes some of them; the admin API refuses any other parameter
/// (an operator's typo would otherwise list everything).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminListQuery {
    /// Page size, 1..=[`MAX_ADMIN_PAGE`]; the list's default when `None`.
    pub limit: Option<u32>,
    /// The last key or token of the previous page; empty is none.
    pub cursor: Option<String>,
    /// Keys starting with this z-base-32 text.
    pub prefix: Option<String>,
}

impl AdminListQuery {
    /// The query string (without `?`), or `None` when every option has its default.
    pub fn to_query(&self) -> Option<String> {
        let mut query = Serializer::new(String::new());
        if let Some(limit) = self.limit {
            query.append_pair("limit", &limit.to_string());
        }
        if let Some(cursor) = &self.cursor {
            query.append_pair("cursor", cursor);
        }
        if let Some(prefix) = &self.prefix {
            query.append_pair("prefix", prefix);
        }
        let query = query.finish();
        (!query.is_empty()).then_some(query)
    }

    /// Reads a list's query, taking only the parameters in `allowed`.
    pub fn parse(query: &str, allowed: &[&str]) -> Result<Self, QueryError> {
        let mut options = Self::default();
        for (key, value) in pairs(query) {
            if !allowed.contains(&key.as_str()) {
                return Err(invalid(format!(
                    "unknown query parameter `{key}` (allowed: {})",
                    allowed.join(", ")
                )));
            }
            match key.as_str() {
                "limit" => {
                    let limit = value
                        .parse::<u32>()
                        .ok()
                        .filter(|l| (1..=MAX_ADMIN_PAGE).contains(l))
                        .ok_or_else(|| {
                            invalid(format!(
                                "limit must be an integer from 1 to {MAX_ADMIN_PAGE}, got `{value}`"
                            ))
                        })?;
                    options.limit = Some(limit);
                }
                "cursor" => options.cursor = Some(value).filter(|v| !v.is_empty()),
                "prefix" => {
                    if !is_z32_prefix(&value) {
                        return Err(invalid(format!(
                            "prefix must be the start of a z-base-32 public key (at most 52 \
                             of `ybndrfg8ejkmcpqxot1uwisza345h769`), got `{value}`"
                        )));
                    }
                    options.prefix = Some(value);
                }
                _ => {}
            }
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Keypair;

    #[test]
    fn admin_lists_refuse_what_they_do_not_take() {
        let all = ["prefix", "cursor", "limit"];
        for bad in ["limit=0", "limit=1001", "limit=x", "prefix=l", "prefix=YB"] {
            assert!(AdminListQuery::parse(bad, &all).is_err(), "{bad}");
        }
        let Err(QueryError::Invalid(message)) = AdminListQuery::parse("cursor=a", &["limit"])
        else {
            panic!("an unknown parameter is refused");
        };
        assert_eq!(message, "unknown query parameter `cursor` (allowed: limit)");
        let query = AdminListQuery::parse("limit=5&cursor=&prefix=yb", &all).unwrap();
        assert_eq!(
            query,
            AdminListQuery {
                limit: Some(5),
                cursor: None,
                prefix: Some("yb".into())
            }
        );
        assert_eq!(query.to_query().unwrap(), "limit=5&prefix=yb");
        assert_eq!(
            AdminListQuery::parse(&query.to_query().unwrap(), &all).unwrap(),
            query
        );
        assert_eq!(AdminListQuery::default().to_query(), None);
    }

    fn key(seed: u8) -> PublicKey {
        Keypair::from_seed(&[seed; 32]).public_key()
    }

    #[test]
    fn what_is_written_reads_back() {
        let list = ListQuery {
            limit: Some(10),
            cursor: Some("L3B1Yi9h".into()),
            reverse: true,
            shallow: true,
        };
        assert_eq!(ListQuery::parse(&list.to_query().unwrap()).unwrap(), list);
        assert_eq!(ListQuery::default().to_query(), None);

        let feed = FeedQuery {
            cursor: 17,
            limit: Some(1000),
        };
        assert_eq!(feed.to_query(), "cursor=17&limit=1000");
        assert_eq!(FeedQuery::parse(&feed.to_query()).unwrap(), feed);

        let stream = StreamQuery::new()
            .user(key(1))
            .user_after(key(2), 42)
            .limit(10)
            .reverse(true)
            .path("pub/app/");
        let read = StreamQuery::parse(&stream.to_query().unwrap()).unwrap();
        assert_eq!(read.users, stream.users);
        assert_eq!(read.path.as_deref(), Some("/pub/app/"));
        assert_eq!(
            (read.limit, read.reverse, read.live),
            (Some(10), true, false)
        );
    }

    #[test]
    fn reading_applies_the_servers_rules() {
        let a = key(1).to_z32();
        let refused = |query: &str| StreamQuery::parse(query).unwrap_err().to_string();
        assert!(refused("live=true").contains("at least one user"));
        assert!(refused(&format!("user={a}&live=true&reverse=1")).contains("cannot be combined"));
        assert!(refused(&format!("user={a}&limit=0")).contains("from 1 to 65535"));
        assert!(refused(&format!("user={a}&limit=65536")).contains("from 1 to 65535"));
        assert!(refused(&format!("user={a}:x")).contains("user cursor"));
        assert!(refused("user=nope").contains("invalid user `nope`"));
        assert!(refused(&format!("user={a}&path=/etc/")).contains("invalid path filter `/etc/`"));
        let many: Vec<String> = (0..=MAX_STREAM_USERS)
            .map(|i| format!("user={}", key(i as u8).to_z32()))
            .collect();
        assert!(refused(&many.join("&")).contains("at most 50 users"));
        assert!(StreamQuery::parse(&format!("user={a}&live")).unwrap().live);

        assert!(FeedQuery::parse("limit=1001").is_err());
        assert!(FeedQuery::parse("cursor=-1").is_err());
        assert_eq!(FeedQuery::parse("").unwrap().limit_or_default(), 100);
        assert!(ListQuery::parse("limit=x").is_err());
        assert!(ListQuery::parse("shallow=maybe").is_err());
        assert!(ListQuery::parse("reverse=").unwrap().reverse);
    }

    #[test]
    fn writing_checks_only_the_path() {
        assert_eq!(StreamQuery::new().limit(0).to_query().unwrap(), "limit=0");
        for bad in ["/etc/", "/pub/a b", "/pub/../x"] {
            assert!(matches!(
                StreamQuery::new().user(key(1)).path(bad).to_query(),
                Err(QueryError::Path { .. })
            ));
        }
    }
}
