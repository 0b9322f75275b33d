//! Runs the stages on the bus: the router on `mention.received.v1`, the summary and
//! factcheck workers (each `WORKER_CONCURRENCY_*` at once) on their request streams,
//! the publisher on `action.completed.v1`; which of them depends on the process's
//! [`Role`]. What a stop or a failure left unfinished is driven again ([`recover`] at
//! start; with the in-process bus also [`redrive`] every `workers.redrive_interval_secs`).
//!
//! A stage that fails is handled by what the bus can do:
//! - in process, it is tried again a few times with a growing pause. A failure that
//!   may pass (a provider or the homeserver unreachable or rate limiting, the database
//!   busy) then leaves the mention where it is: the next re-drive takes it up again,
//!   until the mention is older than `poller.max_age_secs` (then it is failed, saying
//!   why). A reserved reply stays reserved meanwhile: the re-drive publishes that post;
//! - on Redis, each delivery is one try: a failure that may pass leaves the message in
//!   the group's pending list, and another delivery comes after `bus.claim_idle_ms`,
//!   until `bus.max_deliveries`;
//! - any other failure (or a panic), a message delivered too often and one that cannot
//!   be read are dead-lettered (`dead-letter.v1` on Redis, the `dead_letters` table in
//!   process) and the mention is failed with the reason.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::bus::{Consumer, Delivery, MentionReceived, Message, Topic};
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

/// Which stages a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Everything, in one process (the in-process bus).
    All,
    /// The router and the publisher (the poller runs beside them): the lease holder.
    Leader,
    /// The workers of one action type.
    Worker(ActionType),
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Self::All => "all",
            Self::Leader => "leader",
            Self::Worker(ActionType::Summary) => "summary-worker",
            Self::Worker(_) => "factcheck-worker",
        }
    }
}

/// Starts the consumers of `role`'s stages (and, in process, the re-drive) on `tasks`.
pub async fn start(
    ctx: &Arc<BotContext>,
    role: Role,
    tasks: &mut JoinSet<()>,
    stop: &CancellationToken,
) -> Result<(), StageError> {
    let in_flight = Arc::new(InFlight::default());
    if role != Role::Worker(ActionType::Summary) && role != Role::Worker(ActionType::Factcheck) {
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
        )
        .await?;
    }
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
        if role != Role::All && role != Role::Worker(action) {
            continue;
        }
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
        )
        .await?;
    }
    if matches!(role, Role::Worker(_)) {
        return Ok(());
    }
    consume(
        ctx,
        &in_flight,
        tasks,
        stop,
        Topic::ActionCompleted,
        // Replies are reserved per mention in the database first, so publishers running
        // side by side cannot post twice (the router stays one: the caps count its
        // decisions in order).
        ctx.config.workers.publisher_concurrency,
        |ctx, message| async move {
            match message {
                Message::ActionCompleted(done) => publisher::handle(ctx, done).await,
                _ => Ok(()),
            }
        },
    )
    .await?;
    if ctx.bus.redelivers() {
        // The bus's pending lists bring failed messages back.
        return Ok(());
    }
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
    Ok(())
}

/// `concurrency` consumers of `topic`, each handling one message at a time.
async fn consume<F, Fut>(
    ctx: &Arc<BotContext>,
    in_flight: &Arc<InFlight>,
    tasks: &mut JoinSet<()>,
    stop: &CancellationToken,
    topic: Topic,
    concurrency: usize,
    handler: F,
) -> Result<(), StageError>
where
    F: Fn(Arc<BotContext>, Message) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<(), StageError>> + Send + 'static,
{
    for _ in 0..concurrency.max(1) {
        let consumer = ctx.bus.consumer(topic).await?;
        let (ctx, stop, handler, in_flight) = (
            ctx.clone(),
            stop.clone(),
            handler.clone(),
            in_flight.clone(),
        );
        tasks.spawn(async move {
            let mut pause = Duration::from_millis(100);
            loop {
                let delivery = match consumer.next(&stop).await {
                    Ok(Some(d)) => d,
                    Ok(None) => return,
                    Err(e) => {
                        // Redis away: wait (growing) and read again.
                        tracing::warn!(stream = topic.name(), error = %e, "cannot read the bus");
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(pause) => {}
                        }
                        pause = (pause * 2).min(Duration::from_secs(5));
                        continue;
                    }
                };
                pause = Duration::from_millis(100);
                let id = delivery.mention_id().map(str::to_owned);
                if let Some(id) = &id {
                    in_flight.set().insert(id.clone());
                }
                deliver(&ctx, consumer.as_ref(), delivery, &handler).await;
                if let Some(id) = &id {
                    in_flight.set().remove(id);
                }
            }
        });
    }
    Ok(())
}

/// Handles one delivery; then acknowledges it, leaves it for another try or
/// dead-letters it.
async fn deliver<F, Fut>(
    ctx: &Arc<BotContext>,
    consumer: &dyn Consumer,
    delivery: Delivery,
    handler: &F,
) where
    F: Fn(Arc<BotContext>, Message) -> Fut,
    Fut: Future<Output = Result<(), StageError>>,
{
    let topic = delivery.topic;
    if let Some(reason) = &delivery.exhausted {
        dead_letter(ctx, consumer, &delivery, reason).await;
        return;
    }
    let message = match &delivery.message {
        Ok(message) => message.clone(),
        Err(why) => {
            dead_letter(ctx, consumer, &delivery, why).await;
            return;
        }
    };
    // Redis brings the message back by itself: one try per delivery.
    let attempts = if ctx.bus.redelivers() { 1 } else { ATTEMPTS };
    let mut last_error = String::new();
    let mut transient = true;
    for attempt in 1..=attempts {
        // A panic in a stage fails this message only, never the consumer.
        let outcome = std::panic::AssertUnwindSafe(handler(ctx.clone(), message.clone()))
            .catch_unwind()
            .await;
        let error = match outcome {
            Ok(Ok(())) => {
                if let Err(e) = consumer.ack(&delivery).await {
                    // It comes back, and its stage finds its own answer.
                    tracing::warn!(stream = topic.name(), error = %e, "could not acknowledge a message");
                }
                return;
            }
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
            deliveries = delivery.deliveries,
            transient,
            error = %last_error,
            "a stage failed"
        );
        if !transient {
            break;
        }
        if attempt < attempts {
            tokio::time::sleep(Duration::from_millis(250 << attempt)).await;
        }
    }
    if transient {
        // It may pass: another delivery (Redis) or the re-drive takes it up later.
        tracing::warn!(
            mentionId = message.mention_id().unwrap_or(""),
            stream = topic.name(),
            error = %last_error,
            "left for a later try"
        );
        if let Err(e) = consumer.failed(&delivery, &last_error).await {
            tracing::warn!(stream = topic.name(), error = %e, "could not note the failure");
        }
        return;
    }
    dead_letter(ctx, consumer, &delivery, &last_error).await;
}

/// Dead-letters a delivery and fails its mention with the reason.
async fn dead_letter(ctx: &BotContext, consumer: &dyn Consumer, delivery: &Delivery, reason: &str) {
    let topic = delivery.topic;
    tracing::error!(
        mentionId = delivery.mention_id().unwrap_or(""),
        stream = topic.name(),
        deliveries = delivery.deliveries,
        error = %reason,
        "message dead-lettered"
    );
    if let Some(id) = delivery.mention_id() {
        let _ = ctx
            .store
            .set_mention_status(id, MentionStatus::Failed, Some(reason))
            .await;
    }
    match consumer.dead_letter(delivery, reason).await {
        Ok(true) => {}
        Ok(false) => {
            let _ = ctx
                .store
                .dead_letter(
                    topic.name(),
                    &delivery.payload,
                    reason,
                    delivery.mention_id(),
                    None,
                )
                .await;
        }
        Err(e) => {
            tracing::warn!(stream = topic.name(), error = %e, "could not dead-letter a message");
        }
    }
}

/// Drives again what a stop left unfinished: executions still pending are failed as
/// interrupted, and every mention that is pending or processing is received again
/// (each stage then finds its own earlier answer and moves on from there). Returns how
/// many mentions it drove again.
pub async fn recover(ctx: &BotContext) -> Result<usize, StageError> {
    if ctx.bus.redelivers() {
        // Workers in other processes may be running actions right now, and messages
        // on their way are in Redis: only mentions the poller recorded without
        // handing them on (it stopped in between) need driving, those still `pending`
        // a claim time after they came in (a younger one is likely still queued).
        let claim = i64::try_from(ctx.config.bus.claim_idle_ms / 1000).unwrap_or(i64::MAX);
        let by = crate::store::now_secs().saturating_sub(claim);
        let driven = drive_unfinished(ctx, &InFlight::default(), Some(by)).await?;
        if driven > 0 {
            tracing::info!(
                mentions = driven,
                "resuming what the last stop left unfinished"
            );
        }
        return Ok(driven);
    }
    let interrupted = ctx.store.fail_interrupted_executions(None).await?;
    let driven = drive_unfinished(ctx, &InFlight::default(), None).await?;
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
    let driven = drive_unfinished(ctx, in_flight, None).await?;
    if driven > 0 {
        tracing::info!(mentions = driven, "trying unfinished mentions again");
    }
    Ok(driven)
}

/// Publishes the unfinished mentions again (see `Store::unfinished_mentions`).
async fn drive_unfinished(
    ctx: &BotContext,
    in_flight: &InFlight,
    pending_received_by: Option<i64>,
) -> Result<usize, StageError> {
    let max_age = i64::try_from(ctx.config.poller.max_age_secs).unwrap_or(i64::MAX);
    let mut driven = 0;
    let mut unfinished = ctx
        .store
        .mentions_in_state(
            MentionStatus::Pending,
            pending_received_by.unwrap_or(i64::MAX),
            u32::MAX,
        )
        .await?;
    if pending_received_by.is_none() {
        unfinished.extend(
            ctx.store
                .mentions_in_state(MentionStatus::Processing, i64::MAX, u32::MAX)
                .await?,
        );
    }
    for m in unfinished {
        let (id, posted_at) = (m.id.clone(), m.posted_at);
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
