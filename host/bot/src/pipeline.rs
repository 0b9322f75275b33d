//! Runs the stages on the bus: the router on `mention.received.v1`, the summary and
//! factcheck workers (each `WORKER_CONCURRENCY_*` at once) on their request streams,
//! the publisher on `action.completed.v1`; which of them depends on the process's
//! [`Role`]. What a stop or a failure left unfinished is driven again ([`recover`] at
//! start; then every `workers.redrive_interval_secs`: [`redrive`] with the in-process
//! bus, [`resend_pending`] on Redis), each mention from where it stands ([`resume`]).
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
//!   be read are dead-lettered (the `dead_letters` table, and `dead-letter.v1` on
//!   Redis) and the mention is failed with the reason;
//! - a stage that finds another process has its work (this one lost the leader lease or
//!   the action's claim) leaves the message to it.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::bus::{Consumer, Delivery, MentionReceived, Message, Topic};
use crate::context::BotContext;
use crate::store::{ActionType, Mention, MentionStatus, now_secs};
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
        consume_in_lanes(
            ctx,
            &in_flight,
            tasks,
            stop,
            Topic::MentionReceived,
            ctx.config.workers.router_concurrency,
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
        // side by side cannot post twice.
        ctx.config.workers.publisher_concurrency,
        |ctx, message| async move {
            match message {
                Message::ActionCompleted(done) => publisher::handle(ctx, done).await,
                _ => Ok(()),
            }
        },
    )
    .await?;
    let (ctx, stop) = (ctx.clone(), stop.clone());
    let every = Duration::from_secs(ctx.config.workers.redrive_interval_secs.max(1));
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.tick().await; // the first is at start: `recover` does that one
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            // On Redis the pending lists bring failed messages back; what no list
            // holds is a mention recorded but never handed on (a leader died in
            // between): those are re-sent. In process, every unfinished mention no
            // stage works on is driven again.
            let driven = if ctx.bus.redelivers() {
                resend_pending(&ctx).await
            } else {
                redrive(&ctx, &in_flight).await
            };
            if let Err(e) = driven {
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
            while let Some(delivery) = next_delivery(&ctx, consumer.as_ref(), &stop, topic).await {
                deliver_tracked(&ctx, &in_flight, consumer.as_ref(), delivery, &handler).await;
            }
        });
    }
    Ok(())
}

/// Deliveries a lane may have waiting (beyond the one it handles). When one lane is
/// full the reader waits, and so do the other lanes: room for a burst of one author
/// keeps the others busy meanwhile. What waits is kept claimed on Redis.
const LANE_QUEUE: usize = 32;

/// The router's consumers: one reader takes the messages in the order they came in and
/// hands each to one of `lanes` lanes, chosen by the mention's author, and each lane
/// handles its messages one at a time. So one author's mentions are decided in the
/// order they came in (the per-user limit and the opt-outs answer the earlier one
/// first), while different authors' are decided side by side. A message tried again
/// after a failure, or taken over from a leader that stopped, comes back later and
/// may then be decided after a newer one of its author.
async fn consume_in_lanes<F, Fut>(
    ctx: &Arc<BotContext>,
    in_flight: &Arc<InFlight>,
    tasks: &mut JoinSet<()>,
    stop: &CancellationToken,
    topic: Topic,
    lanes: usize,
    handler: F,
) -> Result<(), StageError>
where
    F: Fn(Arc<BotContext>, Message) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<(), StageError>> + Send + 'static,
{
    let consumer = ctx.bus.consumer(topic).await?;
    let mut senders = Vec::new();
    for _ in 0..lanes.max(1) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Delivery>(LANE_QUEUE);
        senders.push(tx);
        let mut queue = LaneQueue {
            rx,
            consumer: consumer.clone(),
            in_flight: in_flight.clone(),
        };
        let (ctx, stop, handler, in_flight, consumer) = (
            ctx.clone(),
            stop.clone(),
            handler.clone(),
            in_flight.clone(),
            consumer.clone(),
        );
        tasks.spawn(async move {
            while let Some(delivery) = queue.rx.recv().await {
                let id = delivery.mention_id().map(str::to_owned);
                if stop.is_cancelled() || ctx.store.fence().current().is_err() {
                    // Stopping, or no longer the leader: what waits here is let go
                    // untried (another consumer takes it after the claim time).
                    let _ = consumer.release(&delivery).await;
                } else {
                    deliver(&ctx, consumer.as_ref(), delivery, &handler).await;
                }
                if let Some(id) = &id {
                    in_flight.set().remove(id);
                }
            }
        });
    }
    let (ctx, stop, in_flight) = (ctx.clone(), stop.clone(), in_flight.clone());
    tasks.spawn(async move {
        while let Some(delivery) = next_delivery(&ctx, consumer.as_ref(), &stop, topic).await {
            // In flight from now: a re-drive leaves a mention waiting in a lane alone.
            if let Some(id) = delivery.mention_id() {
                in_flight.set().insert(id.to_owned());
            }
            let lane = &senders[lane_of(&delivery, senders.len())];
            if let Err(unsent) = lane.send(delivery).await {
                // The lane's task ended (its tasks are being stopped): let the message
                // go, and say so, since nothing routes here any more.
                tracing::error!(
                    stream = topic.name(),
                    "a router lane ended: the reader stops"
                );
                if let Some(id) = unsent.0.mention_id() {
                    in_flight.set().remove(id);
                }
                let _ = consumer.release(&unsent.0).await;
                return;
            }
        }
        // Dropping the senders ends the lanes once they have emptied their queues.
    });
    Ok(())
}

/// A lane's waiting deliveries. When the lane's task is aborted (the leader lost its
/// lease: no draining, another process may lead already), what still waits is let go
/// untried, so it does not count as a delivery towards `bus.max_deliveries` when it
/// comes back to the new leader after the claim time.
struct LaneQueue {
    rx: tokio::sync::mpsc::Receiver<Delivery>,
    consumer: Arc<dyn Consumer>,
    in_flight: Arc<InFlight>,
}

impl Drop for LaneQueue {
    fn drop(&mut self) {
        self.rx.close();
        let mut waiting = Vec::new();
        while let Ok(delivery) = self.rx.try_recv() {
            if let Some(id) = delivery.mention_id() {
                self.in_flight.set().remove(id);
            }
            waiting.push(delivery);
        }
        if waiting.is_empty() {
            return;
        }
        // Releasing is a bus call: done on a task of its own (the runtime outlives
        // the aborted lanes; at shutdown the claim time brings the messages back anyway).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let consumer = self.consumer.clone();
            runtime.spawn(async move {
                for delivery in waiting {
                    let _ = consumer.release(&delivery).await;
                }
            });
        }
    }
}

/// The next delivery for a consumer's loop, or None when the loop is to end (stopped,
/// or this process lost the leader lease). While the bus cannot be read, it waits
/// (longer each time) and reads again.
async fn next_delivery(
    ctx: &BotContext,
    consumer: &dyn Consumer,
    stop: &CancellationToken,
    topic: Topic,
) -> Option<Delivery> {
    let mut pause = Duration::from_millis(100);
    loop {
        if let Err(e) = ctx.store.fence().current() {
            // A leader past its lease takes no more messages (its tasks are being
            // stopped; whatever it still holds goes to the new leader).
            tracing::warn!(stream = topic.name(), error = %e, "the consumer stops");
            return None;
        }
        match consumer.next(stop).await {
            Ok(Some(delivery)) => {
                if ctx.store.fence().current().is_err() {
                    // Handed out while this process lost the lease: not tried here.
                    let _ = consumer.release(&delivery).await;
                    return None;
                }
                return Some(delivery);
            }
            Ok(None) => return None,
            Err(e) => {
                // Redis away: wait (growing) and read again.
                tracing::warn!(stream = topic.name(), error = %e, "cannot read the bus");
                tokio::select! {
                    _ = stop.cancelled() => return None,
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// [`deliver`], with the mention in the in-flight set meanwhile.
async fn deliver_tracked<F, Fut>(
    ctx: &Arc<BotContext>,
    in_flight: &InFlight,
    consumer: &dyn Consumer,
    delivery: Delivery,
    handler: &F,
) where
    F: Fn(Arc<BotContext>, Message) -> Fut,
    Fut: Future<Output = Result<(), StageError>>,
{
    let id = delivery.mention_id().map(str::to_owned);
    if let Some(id) = &id {
        in_flight.set().insert(id.clone());
    }
    deliver(ctx, consumer, delivery, handler).await;
    if let Some(id) = &id {
        in_flight.set().remove(id);
    }
}

/// The lane of a delivery: by its mention's author (a message that cannot be read
/// goes to the first lane, which dead-letters it).
fn lane_of(delivery: &Delivery, lanes: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let Ok(Message::MentionReceived(m)) = &delivery.message else {
        return 0;
    };
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    m.author_pubky.hash(&mut hasher);
    (hasher.finish() % lanes.max(1) as u64) as usize
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
        if error.is_superseded() {
            // Another process has this work now (this one lost the leader lease or
            // the action's claim): its message is left to it, untouched.
            tracing::warn!(
                mentionId = message.mention_id().unwrap_or(""),
                stream = topic.name(),
                error = %error,
                "left to the process that took this work over"
            );
            // No longer kept claimed here: the process that has the work takes it.
            if let Err(e) = consumer.release(&delivery).await {
                tracing::warn!(stream = topic.name(), error = %e, "could not let a message go");
            }
            return;
        }
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

/// Dead-letters a delivery and fails its mention with the reason (not from a leader
/// past its lease: the message is left to the new one).
async fn dead_letter(ctx: &BotContext, consumer: &dyn Consumer, delivery: &Delivery, reason: &str) {
    let topic = delivery.topic;
    if let Err(e) = ctx.store.fence().current() {
        tracing::warn!(stream = topic.name(), error = %e, "not dead-lettered: left to the new leader");
        let _ = consumer.release(delivery).await;
        return;
    }
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
        Ok(bus_id) => {
            // The database keeps every dead letter (with its entry in dead-letter.v1
            // when the bus keeps one): the record an operator reads and replays.
            if let Err(e) = ctx
                .store
                .dead_letter(
                    topic.name(),
                    &delivery.payload,
                    reason,
                    delivery.mention_id(),
                    bus_id.as_deref(),
                )
                .await
            {
                tracing::warn!(stream = topic.name(), error = %e, "could not record a dead letter in the database");
            }
        }
        Err(e) => {
            tracing::warn!(stream = topic.name(), error = %e, "could not dead-letter a message");
        }
    }
}

/// Drives again what a stop left unfinished. In process: executions still pending are
/// failed as interrupted, and every mention that is pending or processing is driven
/// again from where it stands ([`resume`]). On Redis, where workers in other processes
/// may be running actions right now and messages on their way are in Redis's lists:
/// the pending mentions no message carries ([`resend_pending`]). Returns how many
/// mentions it drove again.
pub async fn recover(ctx: &BotContext) -> Result<usize, StageError> {
    if ctx.bus.redelivers() {
        return resend_pending(ctx).await;
    }
    let interrupted = ctx.store.fail_interrupted_executions(None).await?;
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

/// Re-sends `mention.received.v1` for mentions still `pending` a claim time after
/// they came in whose message is on no stream (the leader that recorded them stopped
/// before it handed them on, or Redis lost them). The leader does this at start and
/// every `workers.redrive_interval_secs` while it runs.
pub async fn resend_pending(ctx: &BotContext) -> Result<usize, StageError> {
    let claim = i64::try_from(ctx.config.bus.claim_idle_ms / 1000)
        .unwrap_or(i64::MAX)
        .max(1);
    let by = now_secs().saturating_sub(claim);
    let stale = ctx
        .store
        .mentions_in_state(MentionStatus::Pending, by, 1000)
        .await?;
    if stale.is_empty() {
        return Ok(0);
    }
    // Listed after the mentions: one handed on meanwhile is in the list.
    let queued = ctx
        .bus
        .queued_mentions(Topic::MentionReceived)
        .await?
        .unwrap_or_default();
    let mut sent = 0;
    for m in stale.into_iter().filter(|m| !queued.contains(&m.id)) {
        tracing::info!(mentionId = %m.id, "re-sending a pending mention no message carries");
        if resume(ctx, m).await? {
            sent += 1;
        }
    }
    Ok(sent)
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

/// Drives every pending or processing mention no stage is working on ([`resume`]).
async fn drive_unfinished(ctx: &BotContext, in_flight: &InFlight) -> Result<usize, StageError> {
    let mut unfinished = Vec::new();
    for status in [MentionStatus::Pending, MentionStatus::Processing] {
        unfinished.extend(
            ctx.store
                .mentions_in_state(status, i64::MAX, u32::MAX)
                .await?,
        );
    }
    let mut driven = 0;
    for m in unfinished {
        if in_flight.contains(&m.id) {
            continue;
        }
        if resume(ctx, m).await? {
            driven += 1;
        }
    }
    Ok(driven)
}

/// Sends an unfinished mention on from where it stands: a pending one to the router; a
/// processing one (routed) to where its decision says, the worker of its action (which
/// hands on the reply of an action that succeeded) or the publisher (a notice): each
/// stage finds its own earlier answer, and the reply reserved before is the one that is
/// published. A mention older than `poller.max_age_secs` is failed instead. Returns
/// whether a message was sent.
pub async fn resume(ctx: &BotContext, m: Mention) -> Result<bool, StageError> {
    let max_age = i64::try_from(ctx.config.poller.max_age_secs).unwrap_or(i64::MAX);
    if now_secs().saturating_sub(m.posted_at) > max_age {
        // Too old to answer now (and a reserved reply is not published this late).
        ctx.store
            .set_mention_status(
                &m.id,
                MentionStatus::Failed,
                Some("gave up: still unanswered when the mention grew older than poller.max_age_secs"),
            )
            .await?;
        return Ok(false);
    }
    let decision = match m.status {
        MentionStatus::Processing => ctx.store.routing_decision(&m.id).await?,
        _ => None,
    };
    if let Some(decision) = decision {
        return router::hand_on(ctx, &m, &decision).await;
    }
    if m.status == MentionStatus::Processing {
        // Processing without a decision (replayed from a later stage's dead letter
        // whose decision is gone): routed again from the start.
        ctx.store
            .set_mention_status(&m.id, MentionStatus::Pending, None)
            .await?;
    }
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
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::BusError;

    /// A consumer that only counts what is let go.
    #[derive(Default)]
    struct Releases(Mutex<Vec<String>>);

    #[async_trait::async_trait]
    impl Consumer for Releases {
        async fn next(&self, _: &CancellationToken) -> Result<Option<Delivery>, BusError> {
            Ok(None)
        }
        async fn ack(&self, _: &Delivery) -> Result<(), BusError> {
            Ok(())
        }
        async fn failed(&self, _: &Delivery, _: &str) -> Result<(), BusError> {
            Ok(())
        }
        async fn release(&self, delivery: &Delivery) -> Result<(), BusError> {
            let id = delivery.mention_id().unwrap_or_default().to_owned();
            self.0.lock().expect("not poisoned").push(id);
            Ok(())
        }
        async fn dead_letter(&self, _: &Delivery, _: &str) -> Result<Option<String>, BusError> {
            Ok(None)
        }
    }

    fn mention(id: &str) -> Delivery {
        let message = Message::MentionReceived(MentionReceived {
            mention_id: id.into(),
            author_pubky: "author".into(),
            post_uri: format!("pubky://author/pub/pubky.app/posts/{id}"),
        });
        Delivery {
            topic: Topic::MentionReceived,
            payload: message.payload().to_string(),
            message: Ok(message),
            id: id.into(),
            deliveries: 1,
            exhausted: None,
        }
    }

    #[tokio::test]
    async fn an_aborted_lane_lets_what_waits_in_it_go() {
        let releases = Arc::new(Releases::default());
        let in_flight = Arc::new(InFlight::default());
        let (tx, rx) = tokio::sync::mpsc::channel(LANE_QUEUE);
        let mut queue = LaneQueue {
            rx,
            consumer: releases.clone(),
            in_flight: in_flight.clone(),
        };
        for id in ["m1", "m2", "m3"] {
            in_flight.set().insert(id.into());
            tx.send(mention(id)).await.expect("the lane is open");
        }
        // The lane takes the first and is stopped (aborted) while handling it.
        let handled = queue.rx.recv().await.expect("one waits");
        let lane = tokio::spawn(async move {
            let _queue = queue;
            std::future::pending::<()>().await
        });
        tokio::task::yield_now().await;
        lane.abort();
        assert!(lane.await.expect_err("aborted").is_cancelled());
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(*releases.0.lock().expect("not poisoned"), ["m2", "m3"]);
        assert!(!in_flight.contains("m2") && !in_flight.contains("m3"));
        // The reader's next hand-over finds the lane closed (and lets it go itself).
        assert!(tx.send(mention("m4")).await.is_err());
        drop(handled);
    }
}
