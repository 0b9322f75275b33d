//! The mention poller: asks the index for mentions after where it stopped (kept in the
//! database), records each new one once (idempotency key `mention:{id}`, and the
//! mention row itself), marks those older than `poller.max_age_secs` `skipped_old`,
//! and emits `mention.received.v1` for the others. It polls every
//! `MENTION_POLL_INTERVAL_MS`, and at once when the index says a mention came in.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::bus::{MentionReceived, Message, Topic};
use crate::context::BotContext;
use crate::index::{IndexError, Post};
use crate::store::{Mention, MentionStatus, now_secs};

/// Idempotency keys live this long (the spec's 24 h).
pub const KEY_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// Where the poller stopped, per index kind.
fn position_name(ctx: &BotContext) -> String {
    format!("poller.{}", ctx.index.kind())
}

/// Polls until `stop`.
pub async fn run(ctx: Arc<BotContext>, stop: CancellationToken) {
    let interval = Duration::from_millis(ctx.config.poller.interval_ms);
    let wake = ctx.index.new_mentions();
    loop {
        let wait = match poll_once(&ctx).await {
            Ok(_) => interval,
            Err(IndexError::RateLimited(wait)) => {
                tracing::warn!(
                    waitMs = wait.as_millis() as u64,
                    "the index is rate limiting the poller"
                );
                ctx.status
                    .poll_failed(format!("rate limited for {} s", wait.as_secs()));
                wait.max(interval)
            }
            Err(e) => {
                tracing::warn!(error = %e, "mention poll failed");
                ctx.status.poll_failed(e.to_string());
                interval
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
            _ = async {
                match &wake {
                    Some(wake) => wake.notified().await,
                    None => std::future::pending().await,
                }
            } => {}
        }
    }
}

/// One poll: every mention the index has after the saved position. Returns how many
/// were new.
pub async fn poll_once(ctx: &BotContext) -> Result<usize, IndexError> {
    let waiting = std::mem::take(&mut *ctx.unpublished.lock().unwrap_or_else(|e| e.into_inner()));
    for m in waiting {
        hand_on(ctx, m).await;
    }
    let name = position_name(ctx);
    let mut new = 0;
    loop {
        let position = ctx
            .store
            .position(&name)
            .await
            .map_err(|e| IndexError::Unavailable(e.to_string()))?;
        let page = ctx.index.mentions_after(position.as_deref()).await?;
        let full = !page.mentions.is_empty();
        new += ingest(ctx, page.mentions).await?;
        match page.position {
            // Saved after the mentions are recorded: a crash in between reads them
            // again, and each is recorded once.
            Some(next) if Some(&next) != position.as_ref() => ctx
                .store
                .set_position(&name, &next)
                .await
                .map_err(|e| IndexError::Unavailable(e.to_string()))?,
            _ => break,
        }
        if !full {
            break;
        }
    }
    ctx.status.poll_succeeded(now_secs());
    Ok(new)
}

/// Records a page of mentions and hands the new ones on, in the index's order: their
/// idempotency keys are claimed side by side and the mentions recorded in one
/// transaction (one commit for the page, not one per mention: this is the intake's
/// narrowest point under a burst). Returns how many were new.
async fn ingest(ctx: &BotContext, posts: Vec<Post>) -> Result<usize, IndexError> {
    if posts.is_empty() {
        // No transaction for nothing (a fenced process would still open one).
        return Ok(0);
    }
    let unavailable = |e: String| IndexError::Unavailable(e);
    let keys: Vec<String> = posts
        .iter()
        .map(|post| format!("mention:{}", post.uri.key()))
        .collect();
    let fresh_keys = futures_util::future::try_join_all(
        keys.iter()
            .map(|key| ctx.shared.claim_key(key, KEY_LIFETIME)),
    )
    .await
    .map_err(|e| unavailable(e.to_string()))?;
    let now = now_secs();
    let max_age = i64::try_from(ctx.config.poller.max_age_secs).unwrap_or(i64::MAX);
    let mentions: Vec<Mention> = posts
        .into_iter()
        .map(|post| {
            let posted_at = post.uri.timestamp_micros().map_or(now, |us| us / 1_000_000);
            Mention {
                id: post.uri.key(),
                author: post.uri.author.to_z32(),
                post_id: post.uri.id.clone(),
                post_uri: post.uri.to_string(),
                content: post.content,
                parent_uri: post.parent.map(|p| p.to_string()),
                posted_at,
                status: if now.saturating_sub(posted_at) > max_age {
                    MentionStatus::SkippedOld
                } else {
                    MentionStatus::Pending
                },
            }
        })
        .collect();
    // The rows are the lasting guard (keys expire after 24 h).
    let inserted = ctx
        .store
        .insert_mentions(&mentions)
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    let mut new = 0;
    for ((mention, is_new), fresh_key) in mentions.into_iter().zip(inserted).zip(fresh_keys) {
        let id = mention.id;
        if !is_new {
            if fresh_key {
                tracing::debug!(mentionId = %id, "mention seen before (its key had expired)");
            }
            continue;
        }
        new += 1;
        ctx.metrics.mentions_received.inc();
        if mention.status == MentionStatus::SkippedOld {
            let age = now.saturating_sub(mention.posted_at);
            tracing::info!(mentionId = %id, ageSecs = age, "mention too old: skipped");
            continue;
        }
        tracing::info!(mentionId = %id, author = %mention.author, "mention received");
        crate::failpoint::hit("after-ingest");
        if crate::failpoint::skip("hand-on") {
            tracing::warn!(mentionId = %id, "failpoint skip:hand-on: the mention is not handed on");
            continue;
        }
        hand_on(
            ctx,
            MentionReceived {
                mention_id: id,
                author_pubky: mention.author,
                post_uri: mention.post_uri,
            },
        )
        .await;
    }
    Ok(new)
}

/// Publishes `mention.received.v1`. If the bus cannot take it now, it is kept and
/// published again at the next poll (and, should this process stop first, the leader's
/// re-send of pending mentions no message carries drives it: `pipeline::resend_pending`).
async fn hand_on(ctx: &BotContext, m: MentionReceived) {
    if let Err(e) = ctx
        .bus
        .publish(Topic::MentionReceived, Message::MentionReceived(m.clone()))
        .await
    {
        tracing::warn!(mentionId = %m.mention_id, error = %e, "cannot hand the mention on yet");
        ctx.unpublished
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(m);
    }
}
