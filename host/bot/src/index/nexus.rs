//! A client of a Nexus indexer (the real network's index), speaking its v0 HTTP API:
//! - `GET /v0/user/{bot}/notifications?limit=N[&start=MS][&end=MS]`: newest first;
//!   each `{"timestamp": ms, "body": {"type": "mention", "mentioned_by", "post_uri"}}`
//!   (other types are skipped). `start` is the newest timestamp wanted, `end` the oldest
//!   (milliseconds, inclusive). An empty list has been 200 `[]`, 204 and 404 over time.
//! - `GET /v0/post/{author}/{id}`: `{"details": {"content", "id", "author", "uri", ...},
//!   "relationships": {"replied": "<parent uri>" | null, ...}, ...}`.
//! - `GET /v0/stream/posts?source=post_replies&author_id=A&post_id=P&limit=N`: a list
//!   of such post views.
//!
//! 429 answers are honoured (`Retry-After`, seconds). The position is the newest
//! notification time seen.

use std::time::Duration;

use async_trait::async_trait;
use homeserver_protocol::retry_after::parse_retry_after;
use reqwest::StatusCode;
use serde::Deserialize;

use super::{Index, IndexError, MentionPage, Post};
use crate::post::PostUri;

/// Notifications asked for per request (Nexus allows 1 to 100).
const PAGE: u32 = 100;
/// Pages read per poll at most: a guard against an index that never ends its list
/// (100 000 notifications within `poller.max_age_secs`).
const MAX_PAGES: usize = 1000;
/// Replies read per post.
const REPLIES: u32 = 100;

pub struct NexusIndex {
    http: reqwest::Client,
    base: String,
    bot: String,
    /// Older notifications are not walked to (the poller would skip them anyway).
    max_age: Duration,
}

#[derive(Debug, Deserialize)]
struct Notification {
    timestamp: i64,
    body: serde_json::Value,
}

#[derive(Debug, Deserialize)]
struct PostView {
    details: PostDetails,
    #[serde(default)]
    relationships: Relationships,
}

#[derive(Debug, Deserialize)]
struct PostDetails {
    content: String,
    id: String,
    author: String,
}

#[derive(Debug, Default, Deserialize)]
struct Relationships {
    #[serde(default)]
    replied: Option<String>,
}

impl NexusIndex {
    /// A client of the Nexus at `base` for the bot `bot`; a backlog is walked back to
    /// `max_age` ago at most.
    pub fn new(
        base: &str,
        bot: &homeserver_protocol::PublicKey,
        timeout: Duration,
        max_age: Duration,
    ) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(timeout)
                .build()
                .unwrap_or_default(),
            base: base.trim_end_matches('/').to_owned(),
            bot: bot.to_z32(),
            max_age,
        }
    }

    /// GETs `path`; None for the empty answers (204, 404), the body otherwise.
    async fn get(&self, path: &str) -> Result<Option<bytes::Bytes>, IndexError> {
        let url = format!("{}{path}", self.base);
        let response = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| IndexError::Unavailable(format!("{url}: {e}")))?;
        match response.status() {
            StatusCode::NO_CONTENT | StatusCode::NOT_FOUND => Ok(None),
            StatusCode::TOO_MANY_REQUESTS => {
                let wait = response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| parse_retry_after(v, std::time::SystemTime::now()))
                    .unwrap_or(Duration::from_secs(30));
                Err(IndexError::RateLimited(wait))
            }
            status if status.is_success() => response
                .bytes()
                .await
                .map(Some)
                .map_err(|e| IndexError::Unavailable(format!("{url}: {e}"))),
            status => Err(IndexError::Unavailable(format!("{url}: {status}"))),
        }
    }

    fn view_to_post(view: PostView) -> Option<Post> {
        Some(Post {
            uri: PostUri::new(view.details.author.parse().ok()?, view.details.id),
            content: view.details.content,
            parent: view
                .relationships
                .replied
                .as_deref()
                .and_then(PostUri::parse),
        })
    }
}

fn invalid(what: &str, e: serde_json::Error) -> IndexError {
    IndexError::Invalid(format!("{what}: {e}"))
}

#[async_trait]
impl Index for NexusIndex {
    fn kind(&self) -> &'static str {
        "nexus"
    }

    async fn mentions_after(&self, position: Option<&str>) -> Result<MentionPage, IndexError> {
        let after: i64 = position.and_then(|p| p.parse().ok()).unwrap_or(0);
        // Newest first: page down from now to just above `after`, the whole backlog (the
        // position moves past all of it), but not to what is too old to answer.
        let now_ms = homeserver_protocol::clock::unix_millis();
        let too_old =
            now_ms.saturating_sub(i64::try_from(self.max_age.as_millis()).unwrap_or(i64::MAX));
        let mut found: Vec<(i64, PostUri)> = Vec::new();
        let mut newest = after;
        let mut start: Option<i64> = None;
        let mut pages = 0;
        loop {
            pages += 1;
            if pages > MAX_PAGES {
                tracing::warn!(
                    pages = MAX_PAGES,
                    "the Nexus notification list did not end; older mentions are left out"
                );
                break;
            }
            let mut path = format!(
                "/v0/user/{}/notifications?limit={PAGE}&end={}",
                self.bot,
                after + 1
            );
            if let Some(start) = start {
                path.push_str(&format!("&start={start}"));
            }
            let Some(body) = self.get(&path).await? else {
                break;
            };
            let page: Vec<Notification> =
                serde_json::from_slice(&body).map_err(|e| invalid("notifications", e))?;
            let Some(oldest) = page.iter().map(|n| n.timestamp).min() else {
                break;
            };
            for n in &page {
                newest = newest.max(n.timestamp);
                let is_mention = n.body.get("type").and_then(|t| t.as_str()) == Some("mention");
                let uri = n
                    .body
                    .get("post_uri")
                    .and_then(|u| u.as_str())
                    .and_then(PostUri::parse);
                if let (true, Some(uri), true) = (is_mention, uri, n.timestamp > after) {
                    found.push((n.timestamp, uri));
                }
            }
            if page.len() < PAGE as usize || oldest < too_old {
                break;
            }
            start = Some(oldest - 1);
        }
        found.sort_by_key(|(t, _)| *t);
        found.dedup_by(|a, b| a.1 == b.1);
        let mut mentions = Vec::with_capacity(found.len());
        for (_, uri) in found {
            if let Some(post) = self.post(&uri).await? {
                mentions.push(post);
            }
        }
        Ok(MentionPage {
            mentions,
            position: (newest > after).then(|| newest.to_string()),
        })
    }

    async fn post(&self, uri: &PostUri) -> Result<Option<Post>, IndexError> {
        let path = format!("/v0/post/{}/{}", uri.author.to_z32(), uri.id);
        let Some(body) = self.get(&path).await? else {
            return Ok(None);
        };
        let view: PostView = serde_json::from_slice(&body).map_err(|e| invalid("post", e))?;
        Ok(Self::view_to_post(view))
    }

    async fn replies(&self, uri: &PostUri) -> Result<Vec<Post>, IndexError> {
        let path = format!(
            "/v0/stream/posts?source=post_replies&author_id={}&post_id={}&limit={REPLIES}",
            uri.author.to_z32(),
            uri.id
        );
        let Some(body) = self.get(&path).await? else {
            return Ok(Vec::new());
        };
        let views: Vec<PostView> =
            serde_json::from_slice(&body).map_err(|e| invalid("replies", e))?;
        let mut posts: Vec<Post> = views.into_iter().filter_map(Self::view_to_post).collect();
        posts.sort_by(|a, b| a.uri.id.cmp(&b.uri.id));
        Ok(posts)
    }
}
