//! The embedded index: follows one homeserver's `/events/` feed (from where it stopped,
//! kept in the database), reads every pubky.app post written there, and keeps them in
//! the bot's database with whether they name the bot. One homeserver plus the bot is
//! then a complete network: mentions, threads and replies all come from that feed.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use homeserver_protocol::event::EventKind;
use pk_client::PkClient;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{Index, IndexError, MentionPage, Post};
use crate::post::{MentionMatcher, POSTS_PREFIX, PostUri, PubkyAppPost};
use crate::store::{IndexedPost, Store};

/// Where the follower stopped in the event feed.
const FEED_POSITION: &str = "index.feed";
/// Events read per request.
const FEED_PAGE: u32 = 500;
/// Mentions handed to the poller per call.
const MENTION_PAGE: u32 = 100;

/// The embedded index over `client`'s homeserver.
pub struct EmbeddedIndex {
    client: PkClient,
    store: Store,
    matcher: MentionMatcher,
    new_mentions: Arc<Notify>,
}

impl EmbeddedIndex {
    pub fn new(client: PkClient, store: Store, matcher: MentionMatcher) -> Arc<Self> {
        Arc::new(Self {
            client,
            store,
            matcher,
            new_mentions: Arc::new(Notify::new()),
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

    /// Reads one page of the feed; true when it was full (more may be waiting).
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
        let mut mentioned = false;
        for event in &page.events {
            let Some(uri) = PostUri::parse(&event.url) else {
                continue; // not a pubky.app post
            };
            match event.kind {
                EventKind::Put => mentioned |= self.index_post(&uri).await?,
                EventKind::Del => self
                    .store
                    .index_delete(&uri.to_string())
                    .await
                    .map_err(unavailable)?,
            }
        }
        if page.cursor != cursor {
            self.store
                .set_position(FEED_POSITION, &page.cursor.to_string())
                .await
                .map_err(unavailable)?;
        }
        if mentioned {
            self.new_mentions.notify_one();
        }
        Ok(page.events.len() == FEED_PAGE as usize)
    }

    /// Reads a post from its author's space and stores it; true when it names the bot.
    async fn index_post(&self, uri: &PostUri) -> Result<bool, IndexError> {
        let Some(post) = self.fetch(uri).await? else {
            return Ok(false);
        };
        let mentions_bot = self.matcher.mentions(&post.content);
        self.store
            .index_put(&IndexedPost {
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
            })
            .await
            .map_err(unavailable)?;
        Ok(mentions_bot)
    }

    /// A post's value from the homeserver; None when it is gone or not a post.
    async fn fetch(&self, uri: &PostUri) -> Result<Option<PubkyAppPost>, IndexError> {
        match self.client.get_bytes(&uri.path(), Some(uri.author)).await {
            Ok(bytes) => match serde_json::from_slice::<PubkyAppPost>(&bytes) {
                Ok(post) => Ok(Some(post)),
                Err(e) => {
                    tracing::debug!(%uri, error = %e, "embedded index: not a pubky.app post");
                    Ok(None)
                }
            },
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(IndexError::Unavailable(e.to_string())),
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
        Ok(self.fetch(uri).await?.map(|p| Post {
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

    fn new_mentions(&self) -> Option<Arc<Notify>> {
        Some(self.new_mentions.clone())
    }
}

/// Whether a storage path is a pubky.app post.
pub fn is_post_path(path: &str) -> bool {
    path.strip_prefix(POSTS_PREFIX)
        .is_some_and(|id| !id.is_empty() && !id.contains('/'))
}
