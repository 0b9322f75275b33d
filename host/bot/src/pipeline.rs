//! Runs the stages on the bus: the router on `mention.received.v1`, the summary and
//! factcheck workers (each `WORKER_CONCURRENCY_*` at once) on their request streams,
//! the publisher on `action.completed.v1`; and, at start, drives again every mention a
//! stop left unfinished ([`recover`]).
//!
//! A message whose stage fails is retried a few times with a growing pause; then it
//! goes to `dead-letter.v1` with the reason and its mention is marked failed.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::bus::{DeadLetter, MentionReceived, Message, Topic};
use crate::context::BotContext;
use crate::store::{ActionType, MentionStatus};
use crate::workers::StageError;
use crate::{publisher, router, workers};

/// Tries per message before it is dead-lettered.
const ATTEMPTS: u32 = 3;

/// Starts every stage's consumers on `tasks`.
pub fn start(ctx: &Arc<BotContext>, tasks: &mut JoinSet<()>, stop: &CancellationToken) {
    consume(
        ctx,
        tasks,
        stop,
        Topic::MentionReceived,
        1,
        |ctx, message| async move {
            match message {
                Message::MentionReceived(m) => router::handle(ctx, m.mention_id).await,
                _ => Ok(()),
            }
        },
    );
    let workers = &ctx.config.workers;
    for (topic, action, concurrency) in [
        (
            Topic::SummaryRequested,
            ActionType::Summary,
            workers.summary_concurrency,
        ),
        (
            Topic::FactcheckRequested,
            ActionType::Factcheck,
            workers.factcheck_concurrency,
        ),
    ] {
        consume(
            ctx,
            tasks,
            stop,
            topic,
            concurrency,
            move |ctx, message| async move {
                match message {
                    Message::ActionRequested(m) => workers::handle(ctx, m.mention_id, action).await,
                    _ => Ok(()),
                }
            },
        );
    }
    consume(
        ctx,
        tasks,
        stop,
        Topic::ActionCompleted,
        1,
        |ctx, message| async move {
            match message {
                Message::ActionCompleted(done) => publisher::handle(ctx, done).await,
                _ => Ok(()),
            }
        },
    );
}

/// `concurrency` consumers of `topic`, each handling one message at a time.
fn consume<F, Fut>(
    ctx: &Arc<BotContext>,
    tasks: &mut JoinSet<()>,
    stop: &CancellationToken,
    topic: Topic,
    concurrency: usize,
    handler: F,
) where
    F: Fn(Arc<BotContext>, Message) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<(), StageError>> + Send + 'static,
{
    for _ in 0..concurrency.max(1) {
        let consumer = ctx.bus.consumer(topic);
        let (ctx, stop, handler) = (ctx.clone(), stop.clone(), handler.clone());
        tasks.spawn(async move {
            loop {
                let message = tokio::select! {
                    _ = stop.cancelled() => return,
                    next = consumer.next() => match next {
                        Some(m) => m,
                        None => return,
                    },
                };
                deliver(&ctx, topic, message, &handler).await;
            }
        });
    }
}

/// Handles one message, retrying; dead-letters it when every try failed.
async fn deliver<F, Fut>(ctx: &Arc<BotContext>, topic: Topic, message: Message, handler: &F)
where
    F: Fn(Arc<BotContext>, Message) -> Fut,
    Fut: Future<Output = Result<(), StageError>>,
{
    let mut last_error = String::new();
    for attempt in 1..=ATTEMPTS {
        match handler(ctx.clone(), message.clone()).await {
            Ok(()) => return,
            Err(e) => {
                last_error = e.to_string();
                tracing::warn!(
                    mentionId = message.mention_id().unwrap_or(""),
                    stream = topic.name(),
                    attempt,
                    error = %last_error,
                    "a stage failed"
                );
                if attempt < ATTEMPTS {
                    tokio::time::sleep(Duration::from_millis(250 << attempt)).await;
                }
            }
        }
    }
    tracing::error!(
        mentionId = message.mention_id().unwrap_or(""),
        stream = topic.name(),
        error = %last_error,
        "message dead-lettered after {ATTEMPTS} tries"
    );
    if let Some(id) = message.mention_id() {
        let _ = ctx
            .store
            .set_mention_status(id, MentionStatus::Failed, Some(&last_error))
            .await;
    }
    let _ = ctx
        .bus
        .publish(
            Topic::DeadLetter,
            Message::DeadLetter(DeadLetter {
                topic: topic.name().into(),
                payload: message.payload(),
                reason: last_error,
            }),
        )
        .await;
}

/// Drives again what a stop left unfinished: executions still pending are failed as
/// interrupted, and every mention that is pending or processing is received again
/// (each stage then finds its own earlier answer and moves on from there). Returns how
/// many mentions it drove again.
pub async fn recover(ctx: &BotContext) -> Result<usize, StageError> {
    let interrupted = ctx.store.fail_interrupted_executions().await?;
    let unfinished = ctx.store.unfinished_mentions().await?;
    for id in &unfinished {
        let Some(m) = ctx.store.mention(id).await? else {
            continue;
        };
        ctx.bus
            .publish(
                Topic::MentionReceived,
                Message::MentionReceived(MentionReceived {
                    mention_id: m.id,
                    author_pubky: m.author,
                    post_uri: m.post_uri,
                }),
            )
            .await?;
    }
    if interrupted > 0 || !unfinished.is_empty() {
        tracing::info!(
            interruptedActions = interrupted,
            mentions = unfinished.len(),
            "resuming what the last stop left unfinished"
        );
    }
    Ok(unfinished.len())
}
