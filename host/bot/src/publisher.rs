//! The reply publisher: the last wordlist check, then the reply goes out as a pubky.app
//! post on the bot's homeserver and is stored in `replies`.
//!
//! At most one reply per mention, whatever crashes when: the reply (its post id, text
//! and thread) is reserved in the database before it is written, a reserved reply is
//! always the one written (a restart writes the same post again, which is harmless),
//! and `published_at` is set once the homeserver has it. The reservation, the write and
//! `published_at` happen only while this process holds the leader lease (the fence):
//! a process that resumes after a freeze past its lease publishes nothing.

use std::sync::Arc;

use crate::bus::ActionCompleted;
use crate::context::BotContext;
use crate::index;
use crate::post::{MAX_SHORT_POST_CHARS, PostUri, PubkyAppPost, now_micros, post_id};
use crate::store::{MentionStatus, Reply};
use crate::workers::StageError;
use crate::workers::summary::clip;

/// Publishes the reply of an `action.completed.v1` message.
pub async fn handle(ctx: Arc<BotContext>, done: ActionCompleted) -> Result<(), StageError> {
    let Some(mention) = ctx.store.mention(&done.mention_id).await? else {
        return Ok(());
    };
    if !matches!(
        mention.status,
        MentionStatus::Pending | MentionStatus::Processing
    ) {
        return Ok(());
    }
    let uri = PostUri::parse(&mention.post_uri)
        .ok_or_else(|| StageError::Other(format!("bad post URI {}", mention.post_uri)))?;
    let reply = match ctx.store.reply(&mention.id).await? {
        // Reserved before a crash: that same post, checked already.
        Some(reserved) => reserved,
        None => {
            let content = clip(&done.reply, MAX_SHORT_POST_CHARS);
            if let Some(why) = blocked(&ctx, &content).await? {
                ctx.metrics.replies_blocked.inc();
                tracing::warn!(
                    mentionId = %mention.id,
                    actionType = %done.action_type,
                    blockedContent = %content,
                    matches = %why,
                    "reply blocked by the safety filter; not published"
                );
                ctx.store
                    .set_mention_status(
                        &mention.id,
                        MentionStatus::Failed,
                        Some(&format!("reply blocked by the safety filter ({why})")),
                    )
                    .await?;
                return Ok(());
            }
            let root = index::thread_root(ctx.index.as_ref(), &uri).await?;
            ctx.store
                .reserve_reply(&Reply {
                    mention_id: mention.id.clone(),
                    post_id: post_id(now_micros()),
                    content,
                    thread_root: root.to_string(),
                    published_at: None,
                })
                .await?
        }
    };
    crate::failpoint::hit("after-reserve");
    if reply.published_at.is_none() {
        let post = PubkyAppPost::reply(reply.content.clone(), &uri);
        let body = serde_json::to_vec(&post).map_err(|e| StageError::Other(e.to_string()))?;
        let path = PostUri::new(ctx.key, reply.post_id.clone()).path();
        // Only while this process still leads (fencing): one that resumed after a
        // freeze past its lease writes nothing.
        ctx.store.check_fence().await?;
        // A failure is the pipeline's to retry (and the re-drive's later): the
        // reservation keeps this the same post, so writing it twice is harmless.
        ctx.homeserver
            .put_bytes(&path, bytes::Bytes::from(body))
            .await?;
        crate::failpoint::hit("after-publish");
        ctx.store.mark_published(&mention.id).await?;
        ctx.metrics.replies_published.inc();
        tracing::info!(
            mentionId = %mention.id,
            actionType = %done.action_type,
            postId = %reply.post_id,
            "reply published"
        );
    }
    ctx.store
        .set_mention_status(&mention.id, MentionStatus::Completed, None)
        .await?;
    Ok(())
}

/// Why the safety filter keeps `text` back, if it does (the configured
/// `safety.wordlist`: only matches from its `lists` count, and only when
/// `blockOnMatch`). A filter that could not answer is an error: nothing is published
/// until it does (one that was busy or ran past its deadline, as on a loaded machine,
/// may answer the next time; one that traps or is missing fails the mention into the
/// dead letters, to replay once it is fixed).
async fn blocked(ctx: &BotContext, text: &str) -> Result<Option<String>, StageError> {
    let config = &ctx.config.safety.wordlist;
    if !config.enabled {
        return Ok(None);
    }
    // An async call: a guest that loops yields the worker every millisecond.
    let verdict = ctx.guests.check_text_isolated(text.to_owned()).await;
    if let Some(failure) = verdict.failure {
        return Err(StageError::SafetyFilter(failure));
    }
    let matches: Vec<String> = verdict
        .matches
        .iter()
        .filter(|m| config.lists.contains(&m.list))
        .map(|m| format!("{} in {}", m.term, m.list))
        .collect();
    if matches.is_empty() {
        return Ok(None);
    }
    if !config.block_on_match {
        tracing::info!(matches = %matches.join(", "), "reply matched the wordlists (blockOnMatch is off)");
        return Ok(None);
    }
    Ok(Some(matches.join(", ")))
}
