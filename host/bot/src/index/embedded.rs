//! The embedded index: follows one homeserver's `/events/` feed (from where it stopped,
//! kept in the database), reads every pubky.app post written there, and keeps them in
//! the bot's database with whether they name the bot. One homeserver plus the bot is
//! then a complete network: mentions, threads and replies all come from that feed.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use homeserver_protocol::event::{Event, EventKind};
use pk_client::PkClient;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{Index, IndexError, MentionPage, Post};
use crate::post::{MentionMatcher, POSTS_PREFIX, PostUri, PubkyAppPost};
use crate::store::{IndexChange, IndexedPost, Store};

/// Where the follower stopped in the event feed.
const FEED_POSITION: &str = "index.feed";
/// Events read per request.
const FEED_PAGE: u32 = 500;
/// Mentions handed to the poller per call.
const MENTION_PAGE: u32 = 100;
/// Posts of a feed page read at once.
const READ_AHEAD: usize = 16;
/// Reads of one post the homeserver answered with an error before it is skipped (the
/// feed must not stop at one broken value).
const TRIES_BEFORE_SKIPPING: u32 = 3;

/// The embedded index over `client`'s homeserver.
pub struct EmbeddedIndex {
    client: PkClient,
    store: Store,
    matcher: MentionMatcher,
    new_mentions: Arc<Notify>,
    /// The feed event whose post could not be read last time, and how often in a row.
    failing: std::sync::Mutex<(u64, u32)>,
}

impl EmbeddedIndex {
    pub fn new(client: PkClient, store: Store, matcher: MentionMatcher) -> Arc<Self> {
        Arc::new(Self {
            client,
            store,
            matcher,
            new_mentions: Arc::new(Notify::new()),
            failing: std::sync::Mutex::new((0, 0)),
        })
    }

    /// Follows the feed until `stop`, reading it every `interval` (at once again while
    /// a page comes back full).
    pub async fn follow(self: Arc<Self>, interval: Duration, stop: CancellationToken) {
        loop {
            let more = match self.follow_once().await {
                Ok(more) => more,
                Err(e) => {
                    tracing::warn!(error = %e, "embedded index: cannot read the event feed");
                    false
                }
            };
            if !more {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(interval) => {}
                }
            } else if stop.is_cancelled() {
                return;
            }
        }
    }

    /// Reads one page of the feed; true when it was full (more may be waiting). The
    /// page's posts are read side by side ([`READ_AHEAD`] at once) and stored, with
    /// the position after them, in one transaction.
    pub async fn follow_once(&self) -> Result<bool, IndexError> {
        let cursor = self
            .store
            .position(FEED_POSITION)
            .await
            .map_err(unavailable)?
            .and_then(|p| p.parse().ok())
            .unwrap_or(0u64);
        let page = self
            .client
            .events(cursor, Some(FEED_PAGE))
            .await
            .map_err(|e| IndexError::Unavailable(e.to_string()))?;
        // Futures collected first: a closure inside the stream would make the
        // follower's future not `Send` for every lifetime (a known compiler limit).
        let reading: Vec<_> = page.events.iter().map(|e| self.read_event(e)).collect();
        let reads: Vec<Result<Option<IndexChange>, IndexError>> =
            futures_util::stream::iter(reading)
                .buffered(READ_AHEAD)
                .collect()
                .await;
        let mut changes = Vec::new();
        let mut mentioned = false;
        let mut done = cursor;
        let mut failure = None;
        for (event, read) in page.events.iter().zip(reads) {
            match read {
                Ok(change) => {
                    if let Some(IndexChange::Put(post)) = &change {
                        mentioned |= post.mentions_bot;
                    }
                    changes.extend(change);
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
            done = event.cursor;
        }
        // What was read before a failure is kept.
        let next = if failure.is_none() {
            page.cursor.max(done)
        } else {
            done
        };
        if next != cursor {
            self.store
                .index_apply(&changes, FEED_POSITION, &next.to_string())
                .await
                .map_err(unavailable)?;
        }
        if mentioned {
            self.new_mentions.notify_one();
        }
        if let Some(e) = failure {
            return Err(e);
        }
        Ok(page.events.len() == FEED_PAGE as usize)
    }

    /// What a feed event changes in the index (None: not a post).
    async fn read_event(&self, event: &Event) -> Result<Option<IndexChange>, IndexError> {
        let Some(uri) = PostUri::parse(&event.url) else {
            return Ok(None);
        };
        match event.kind {
            EventKind::Put => self.read_post(&uri, event.cursor).await,
            EventKind::Del => Ok(Some(IndexChange::Delete(uri.to_string()))),
        }
    }

    /// Reads a post from its author's space: what to store, or None (gone, not a post).
    /// A post the homeserver keeps answering with an error for is skipped after
    /// [`TRIES_BEFORE_SKIPPING`] reads (an unreachable homeserver never skips anything).
    async fn read_post(&self, uri: &PostUri, at: u64) -> Result<Option<IndexChange>, IndexError> {
        let post = match self.fetch(uri).await {
            Ok(Some(post)) => post,
            Ok(None) => return Ok(None),
            Err(e) if e.status().is_none() => {
                return Err(IndexError::Unavailable(e.to_string()));
            }
            Err(e) => {
                let tries = {
                    let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
                    *failing = if failing.0 == at {
                        (at, failing.1 + 1)
                    } else {
                        (at, 1)
                    };
                    failing.1
                };
                if tries < TRIES_BEFORE_SKIPPING {
                    return Err(IndexError::Unavailable(format!("reading {uri}: {e}")));
                }
                tracing::warn!(%uri, error = %e, tries, "embedded index: skipping a post the homeserver cannot serve");
                return Ok(None);
            }
        };
        let mentions_bot = self.matcher.mentions(&post.content);
        Ok(Some(IndexChange::Put(IndexedPost {
            seq: 0,
            uri: uri.to_string(),
            author: uri.author.to_z32(),
            post_id: uri.id.clone(),
            content: post.content,
            kind: post.kind,
            parent_uri: post
                .parent
                .and_then(|p| PostUri::parse(&p))
                .map(|p| p.to_string()),
            mentions_bot,
        })))
    }

    /// A post's value from the homeserver; None when it is gone or not a post.
    async fn fetch(&self, uri: &PostUri) -> Result<Option<PubkyAppPost>, pk_client::ClientError> {
        match self.client.get_bytes(&uri.path(), Some(uri.author)).await {
            Ok(bytes) => match serde_json::from_slice::<PubkyAppPost>(&bytes) {
                Ok(post) => Ok(Some(post)),
                Err(e) => {
                    tracing::debug!(%uri, error = %e, "embedded index: not a pubky.app post");
                    Ok(None)
                }
            },
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

fn unavailable(e: crate::store::StoreError) -> IndexError {
    IndexError::Unavailable(e.to_string())
}

fn to_post(p: IndexedPost) -> Option<Post> {
    Some(Post {
        uri: PostUri::parse(&p.uri)?,
        content: p.content,
        parent: p.parent_uri.as_deref().and_then(PostUri::parse),
    })
}

#[async_trait]
impl Index for EmbeddedIndex {
    fn kind(&self) -> &'static str {
        "embedded"
    }

    async fn mentions_after(&self, position: Option<&str>) -> Result<MentionPage, IndexError> {
        let after = position.and_then(|p| p.parse().ok()).unwrap_or(0i64);
        let rows = self
            .store
            .index_mentions_after(after, MENTION_PAGE)
            .await
            .map_err(unavailable)?;
        let position = rows.last().map(|r| r.seq.to_string());
        Ok(MentionPage {
            mentions: rows.into_iter().filter_map(to_post).collect(),
            position,
        })
    }

    async fn post(&self, uri: &PostUri) -> Result<Option<Post>, IndexError> {
        if let Some(row) = self
            .store
            .index_post(&uri.to_string())
            .await
            .map_err(unavailable)?
        {
            return Ok(to_post(row));
        }
        // Not followed yet (or the feed is behind): read it from the homeserver.
        let fetched = self
            .fetch(uri)
            .await
            .map_err(|e| IndexError::Unavailable(e.to_string()))?;
        Ok(fetched.map(|p| Post {
            uri: uri.clone(),
            content: p.content,
            parent: p.parent.as_deref().and_then(PostUri::parse),
        }))
    }

    async fn replies(&self, uri: &PostUri) -> Result<Vec<Post>, IndexError> {
        let rows = self
            .store
            .index_replies(&uri.to_string(), 500)
            .await
            .map_err(unavailable)?;
        Ok(rows.into_iter().filter_map(to_post).collect())
    }

    /// One query: the database walks the tree (a recursive query).
    async fn descendants(&self, root: &PostUri) -> Result<Vec<Post>, IndexError> {
        let rows = self
            .store
            .index_descendants(
                &root.to_string(),
                super::MAX_DEPTH as u32,
                super::MAX_THREAD_POSTS as u32,
            )
            .await
            .map_err(unavailable)?;
        Ok(rows.into_iter().filter_map(to_post).collect())
    }

    fn new_mentions(&self) -> Option<Arc<Notify>> {
        Some(self.new_mentions.clone())
    }
}

/// Whether a storage path is a pubky.app post.
pub fn is_post_path(path: &str) -> bool {
    path.strip_prefix(POSTS_PREFIX)
        .is_some_and(|id| !id.is_empty() && !id.contains('/'))
}
