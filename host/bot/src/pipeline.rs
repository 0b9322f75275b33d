//! Runs the stages on the bus: the router on `mention.received.v1`, the summary and
//! factcheck workers (each `WORKER_CONCURRENCY_*` at once) on their request streams,
//! the publisher on `action.completed.v1`; drives again what a stop or a failure left
//! unfinished ([`recover`] at start, [`redrive`] every `workers.redrive_interval_secs`).
//!
//! A stage that fails is tried again a few times with a growing pause. Then:
//! - a failure that may pass (a provider or the homeserver unreachable or rate
//!   limiting, the database busy) leaves the mention where it is: the next re-drive
//!   takes it up again, until the mention is older than `poller.max_age_secs` (then it
//!   is failed, saying why). A reserved reply stays reserved meanwhile: the re-drive
//!   publishes that same post;
//! - any other failure (or a panic) dead-letters the message (`dead_letters` table, the
//!   `dead-letter.v1` stream's record) and fails the mention with the reason.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::bus::{MentionReceived, Message, Topic};
use crate::context::BotContext;
use crate::store::{ActionType, MentionStatus, now_secs};
use crate::workers::StageError;
use crate::{publisher, router, workers};

/// Tries per message before it is left for a re-drive or dead-lettered.
const ATTEMPTS: u32 = 3;

/// Mentions a stage is working on right now (a re-drive leaves them alone).
#[derive(Default)]
pub struct InFlight(Mutex<HashSet<String>>);

impl InFlight {
    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn contains(&self, id: &str) -> bool {
        self.set().contains(id)
    }
}

/// Starts every stage's consumers, and the re-drive, on `tasks`.
pub fn start(ctx: &Arc<BotContext>, tasks: &mut JoinSet<()>, stop: &CancellationToken) {
    let in_flight = Arc::new(InFlight::default());
    consume(
        ctx,
        &in_flight,
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
            &in_flight,
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
        &in_flight,
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
    let (ctx, stop) = (ctx.clone(), stop.clone());
    let every = Duration::from_secs(ctx.config.workers.redrive_interval_secs);
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.tick().await; // the first is at start: `recover` does that one
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            if let Err(e) = redrive(&ctx, &in_flight).await {
                tracing::warn!(error = %e, "re-driving unfinished mentions failed");
            }
        }
    });
}

/// `concurrency` consumers of `topic`, each handling one message at a time.
fn consume<F, Fut>(
    ctx: &Arc<BotContext>,
    in_flight: &Arc<InFlight>,
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
        let (ctx, stop, handler, in_flight) = (
            ctx.clone(),
            stop.clone(),
            handler.clone(),
            in_flight.clone(),
        );
        tasks.spawn(async move {
            loop {
                let message = tokio::select! {
                    _ = stop.cancelled() => return,
                    next = consumer.next() => match next {
                        Some(m) => m,
                        None => return,
                    },
                };
                let id = message.mention_id().map(str::to_owned);
                if let Some(id) = &id {
                    in_flight.set().insert(id.clone());
                }
                deliver(&ctx, topic, message, &handler).await;
                if let Some(id) = &id {
                    in_flight.set().remove(id);
                }
            }
        });
    }
}

/// Handles one message, retrying; then leaves it for a re-drive or dead-letters it.
async fn deliver<F, Fut>(ctx: &Arc<BotContext>, topic: Topic, message: Message, handler: &F)
where
    F: Fn(Arc<BotContext>, Message) -> Fut,
    Fut: Future<Output = Result<(), StageError>>,
{
    let mut last_error = String::new();
    let mut transient = true;
    for attempt in 1..=ATTEMPTS {
        // A panic in a stage fails this message only, never the consumer.
        let outcome = std::panic::AssertUnwindSafe(handler(ctx.clone(), message.clone()))
            .catch_unwind()
            .await;
        let error = match outcome {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e,
            Err(panic) => StageError::Other(format!(
                "the stage panicked: {}",
                panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default()
            )),
        };
        transient = error.is_transient();
        last_error = error.to_string();
        tracing::warn!(
            mentionId = message.mention_id().unwrap_or(""),
            stream = topic.name(),
            attempt,
            transient,
            error = %last_error,
            "a stage failed"
        );
        if !transient {
            break;
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(Duration::from_millis(250 << attempt)).await;
        }
    }
    if transient {
        // It may pass: the re-drive takes the mention up again later.
        tracing::warn!(
            mentionId = message.mention_id().unwrap_or(""),
            stream = topic.name(),
            error = %last_error,
            "left for a later try"
        );
        return;
    }
    tracing::error!(
        mentionId = message.mention_id().unwrap_or(""),
        stream = topic.name(),
        error = %last_error,
        "message dead-lettered"
    );
    if let Some(id) = message.mention_id() {
        let _ = ctx
            .store
            .set_mention_status(id, MentionStatus::Failed, Some(&last_error))
            .await;
    }
    let _ = ctx
        .store
        .dead_letter(topic.name(), &message.payload().to_string(), &last_error)
        .await;
}

/// Drives again what a stop left unfinished: executions still pending are failed as
/// interrupted, and every mention that is pending or processing is received again
/// (each stage then finds its own earlier answer and moves on from there). Returns how
/// many mentions it drove again.
pub async fn recover(ctx: &BotContext) -> Result<usize, StageError> {
    let interrupted = ctx.store.fail_interrupted_executions().await?;
    let driven = drive_unfinished(ctx, &InFlight::default()).await?;
    if interrupted > 0 || driven > 0 {
        tracing::info!(
            interruptedActions = interrupted,
            mentions = driven,
            "resuming what the last stop left unfinished"
        );
    }
    Ok(driven)
}

/// Drives again the unfinished mentions no stage is working on (those a failure that
/// may pass left behind).
pub async fn redrive(ctx: &BotContext, in_flight: &InFlight) -> Result<usize, StageError> {
    let driven = drive_unfinished(ctx, in_flight).await?;
    if driven > 0 {
        tracing::info!(mentions = driven, "trying unfinished mentions again");
    }
    Ok(driven)
}

async fn drive_unfinished(ctx: &BotContext, in_flight: &InFlight) -> Result<usize, StageError> {
    let max_age = i64::try_from(ctx.config.poller.max_age_secs).unwrap_or(i64::MAX);
    let mut driven = 0;
    for (id, posted_at) in ctx.store.unfinished_mentions().await? {
        if in_flight.contains(&id) {
            continue;
        }
        if now_secs().saturating_sub(posted_at) > max_age {
            // Too old to answer now (and a reserved reply is not published this late).
            ctx.store
                .set_mention_status(
                    &id,
                    MentionStatus::Failed,
                    Some("gave up: still unanswered when the mention grew older than poller.max_age_secs"),
                )
                .await?;
            continue;
        }
        let Some(m) = ctx.store.mention(&id).await? else {
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
        driven += 1;
    }
    Ok(driven)
}
