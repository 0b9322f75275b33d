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

    /// Woken when new mentions may be there, if the index can tell (the embedded one can).
    fn new_mentions(&self) -> Option<Arc<Notify>> {
        None
    }
}

/// A thread around a post: its ancestors from the root, the post, and the replies to
/// the root and to the post (each once), in time order.
#[derive(Debug, Clone, Default)]
pub struct Thread {
    /// The root first, then each ancestor down to the post itself.
    pub ancestors: Vec<Post>,
    /// Replies in the thread that are not ancestors, oldest first.
    pub replies: Vec<Post>,
}

impl Thread {
    /// The root post's URI (the post itself when it is not a reply).
    pub fn root(&self) -> Option<&PostUri> {
        self.ancestors.first().map(|p| &p.uri)
    }
}

/// Ancestors are followed at most this far up.
const MAX_DEPTH: usize = 32;
/// Replies read per post, at most.
const MAX_REPLIES: usize = 200;

/// Reads the thread of `uri` from `index`: up the parent chain to the root, then the
/// replies to the root and to every ancestor.
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
    let mut replies: Vec<Post> = Vec::new();
    for ancestor in &ancestors {
        for reply in index.replies(&ancestor.uri).await? {
            let known = ancestors.iter().any(|a| a.uri == reply.uri)
                || replies.iter().any(|r| r.uri == reply.uri);
            if !known && replies.len() < MAX_REPLIES {
                replies.push(reply);
            }
        }
    }
    replies.sort_by(|a, b| a.uri.id.cmp(&b.uri.id));
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
