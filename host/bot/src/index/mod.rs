//! Where the bot learns of mentions and reads threads: the [`Index`] boundary, with
//! - [`embedded`]: follows one homeserver's `/events/` feed and reads the pubky.app
//!   posts in it, so a homeserver plus the bot is a complete network;
//! - [`nexus`]: a client of a Nexus indexer, for the real network.

pub mod embedded;
pub mod nexus;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::post::PostUri;

/// A post as the bot reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Post {
    pub uri: PostUri,
    pub content: String,
    /// The post this one replies to.
    pub parent: Option<PostUri>,
}

/// New mentions and where to ask from next time.
#[derive(Debug, Clone, Default)]
pub struct MentionPage {
    /// Oldest first.
    pub mentions: Vec<Post>,
    /// The position after them (None: unchanged).
    pub position: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("the index asks to wait {0:?} (rate limited)")]
    RateLimited(Duration),
    #[error("index unavailable: {0}")]
    Unavailable(String),
    #[error("index answered something unexpected: {0}")]
    Invalid(String),
}

#[async_trait]
pub trait Index: Send + Sync {
    /// The kind, for logs and health.
    fn kind(&self) -> &'static str;

    /// Mentions of the bot after `position` (as returned by an earlier call; None: from
    /// the start), oldest first.
    async fn mentions_after(&self, position: Option<&str>) -> Result<MentionPage, IndexError>;

    /// One post, or None when it does not exist (any more).
    async fn post(&self, uri: &PostUri) -> Result<Option<Post>, IndexError>;

    /// The direct replies to a post, oldest first.
    async fn replies(&self, uri: &PostUri) -> Result<Vec<Post>, IndexError>;

    /// Every post under `root`: replies, replies to replies and so on down every
    /// branch ([`MAX_DEPTH`] levels, [`MAX_THREAD_POSTS`] posts at most, the oldest
    /// kept), oldest first. By default one [`Index::replies`] call per post read.
    async fn descendants(&self, root: &PostUri) -> Result<Vec<Post>, IndexError> {
        let mut found: Vec<Post> = Vec::new();
        let mut level = vec![root.clone()];
        for _ in 0..=MAX_DEPTH {
            let mut next = Vec::new();
            for parent in &level {
                for reply in self.replies(parent).await? {
                    if found.len() >= MAX_THREAD_POSTS {
                        break;
                    }
                    if reply.uri != *root && !found.iter().any(|p| p.uri == reply.uri) {
                        next.push(reply.uri.clone());
                        found.push(reply);
                    }
                }
            }
            if next.is_empty() || found.len() >= MAX_THREAD_POSTS {
                break;
            }
            level = next;
        }
        found.sort_by(|a, b| a.uri.id.cmp(&b.uri.id));
        Ok(found)
    }

    /// Woken when new mentions may be there, if the index can tell (the embedded one can).
    fn new_mentions(&self) -> Option<Arc<Notify>> {
        None
    }
}

/// A thread around a post: its ancestors from the root down to the post, and every
/// other post under the root, down every branch.
#[derive(Debug, Clone, Default)]
pub struct Thread {
    /// The root first, then each ancestor down to the post itself.
    pub ancestors: Vec<Post>,
    /// Every other post under the root (side branches, replies to replies, replies to
    /// the post), oldest first.
    pub replies: Vec<Post>,
}

impl Thread {
    /// The root post's URI (the post itself when it is not a reply).
    pub fn root(&self) -> Option<&PostUri> {
        self.ancestors.first().map(|p| &p.uri)
    }
}

/// Ancestors are followed at most this far up, and branches this far down.
pub const MAX_DEPTH: usize = 32;
/// Posts read under one root, at most.
pub const MAX_THREAD_POSTS: usize = 500;

/// Reads the thread of `uri` from `index`: up the parent chain to the root, then every
/// post under the root.
pub async fn thread(index: &dyn Index, uri: &PostUri) -> Result<Thread, IndexError> {
    let mut ancestors = Vec::new();
    let mut next = Some(uri.clone());
    while let Some(at) = next.take() {
        if ancestors.len() >= MAX_DEPTH {
            break;
        }
        match index.post(&at).await? {
            Some(post) => {
                next = post.parent.clone();
                ancestors.push(post);
            }
            None => break,
        }
    }
    ancestors.reverse();
    let replies = match ancestors.first() {
        Some(root) => index
            .descendants(&root.uri)
            .await?
            .into_iter()
            .filter(|p| !ancestors.iter().any(|a| a.uri == p.uri))
            .collect(),
        None => Vec::new(),
    };
    Ok(Thread { ancestors, replies })
}

/// The root of the thread `uri` is in (following parents), as far as the index knows.
pub async fn thread_root(index: &dyn Index, uri: &PostUri) -> Result<PostUri, IndexError> {
    let mut root = uri.clone();
    for _ in 0..MAX_DEPTH {
        match index.post(&root).await? {
            Some(Post {
                parent: Some(parent),
                ..
            }) => root = parent,
            _ => break,
        }
    }
    Ok(root)
}
