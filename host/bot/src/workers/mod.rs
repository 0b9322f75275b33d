//! The action workers: [`summary`] and [`factcheck`], run by [`handle`] for an
//! `action.<type>.requested.v1` message.
//!
//! Each run is recorded in `action_executions` (pending, then success with its reply,
//! duration and tokens, or failed with `error_details`) with its artifacts. An action
//! runs once per mention, whatever is redelivered or re-sent:
//! - a mention whose action succeeded before is not run again: its stored reply is
//!   handed on once more (the publisher's reservation keeps that to one post);
//! - a run takes the action's claim first (`shared`: `action:{type}:{id}`, lasting
//!   `bus.claim_idle_ms`, renewed every third of that while it runs). A copy that finds
//!   the claim held watches it: renewed means its holder is alive and running it, so
//!   the copy is dropped; expired means the holder died, so the copy takes the claim
//!   over and runs the action (the dead run's execution is failed as interrupted);
//! - a run that loses its claim (its process froze past it) stops, and records
//!   nothing; and at most one success per mention and action is ever recorded (a
//!   unique index: a second one is recorded as superseded).

pub mod factcheck;
pub mod summary;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bus::{ActionCompleted, BusError, Message, Topic};
use crate::context::BotContext;
use crate::index::IndexError;
use crate::poller::KEY_LIFETIME;
use crate::providers::ProviderError;
use crate::store::{ActionType, Finished, Mention, MentionStatus, Outcome, StoreError};

/// Why a stage could not finish a message.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error(transparent)]
    Shared(#[from] crate::shared::SharedError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// Writing to the bot's homeserver failed.
    #[error("the homeserver: {0}")]
    Homeserver(#[from] pk_client::ClientError),
    /// The safety filter could not answer (nothing is published meanwhile).
    #[error("the safety filter failed: {0}")]
    SafetyFilter(homeserver_runtime::GuestFailure),
    /// This worker lost the action's claim (it stalled past it): another runs it.
    #[error("the action's claim was taken over by another worker")]
    ClaimLost,
    #[error("{0}")]
    Other(String),
}

impl StageError {
    /// Whether trying the same message again later may work: a provider, the index or
    /// the homeserver unreachable, busy or rate limiting, the database busy. Anything
    /// else (an answer that will not change, a bug) is final.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Store(_) | Self::Bus(_) | Self::Shared(_) => true,
            Self::Index(e) => !matches!(e, IndexError::Invalid(_)),
            Self::Provider(e) => e.is_transient(),
            Self::Homeserver(e) => match e.status() {
                Some(status) => status.is_server_error() || status.as_u16() == 429,
                None => matches!(
                    e,
                    pk_client::ClientError::Unreachable { .. }
                        | pk_client::ClientError::Transport(_)
                ),
            },
            Self::Other(_) => false,
            Self::ClaimLost => true,
            Self::SafetyFilter(failure) => matches!(
                failure,
                homeserver_runtime::GuestFailure::Busy { .. }
                    | homeserver_runtime::GuestFailure::Timeout { .. }
                    | homeserver_runtime::GuestFailure::Instantiate { .. }
            ),
        }
    }

    /// Whether another process has taken this work over (this one lost the leader
    /// lease, or the action's claim): the message is left as it is, neither
    /// acknowledged nor failed, for the process that has it now.
    pub fn is_superseded(&self) -> bool {
        match self {
            Self::ClaimLost | Self::Bus(BusError::Fenced) => true,
            Self::Store(e) => e.is_fenced(),
            _ => false,
        }
    }
}

/// Runs (or re-announces) the action a message asks for.
pub async fn handle(
    ctx: Arc<BotContext>,
    mention_id: String,
    action: ActionType,
) -> Result<(), StageError> {
    let Some(mention) = ctx.store.mention(&mention_id).await? else {
        return Ok(());
    };
    if !matches!(
        mention.status,
        MentionStatus::Pending | MentionStatus::Processing
    ) {
        return Ok(());
    }
    if let Some(done) = ctx.store.successful_execution(&mention.id, action).await? {
        tracing::info!(mentionId = %mention.id, actionType = action.as_str(), "action ran before: its reply goes on");
        return announce(&ctx, &mention, action, done.reply).await;
    }
    let key = format!("action:{}:{}", action.as_str(), mention.id);
    let claim = Claim::new(&ctx, key.clone());
    if !claim.take(&ctx).await? {
        if let Some(done) = ctx.store.successful_execution(&mention.id, action).await? {
            return announce(&ctx, &mention, action, done.reply).await;
        }
        tracing::info!(
            mentionId = %mention.id,
            actionType = action.as_str(),
            "the action is running in another worker (its claim is renewed): this copy is dropped"
        );
        return Ok(());
    }
    // The run that held the claim may have finished just before this copy took it.
    if let Some(done) = ctx.store.successful_execution(&mention.id, action).await? {
        let _ = claim.release(&ctx).await;
        return announce(&ctx, &mention, action, done.reply).await;
    }
    let result = run_claimed(&ctx, &mention, action, &key, &claim).await;
    if let Err(e) = claim.release(&ctx).await {
        tracing::debug!(error = %e, "could not release an action claim (it expires)");
    }
    result
}

/// Runs the action while holding its claim; records and announces the outcome.
async fn run_claimed(
    ctx: &Arc<BotContext>,
    mention: &Mention,
    action: ActionType,
    key: &str,
    claim: &Claim,
) -> Result<(), StageError> {
    // The spec's idempotency key, for 24 h: held already means an earlier run started
    // and died (its claim expired): its execution is failed as interrupted.
    if !ctx.shared.claim_key(key, KEY_LIFETIME).await? {
        tracing::info!(mentionId = %mention.id, actionType = action.as_str(), "running an interrupted action again");
        ctx.store
            .fail_interrupted_executions(Some((&mention.id, action)))
            .await?;
    }
    let execution = ctx.store.start_execution(&mention.id, action).await?;
    let started = Instant::now();
    let result = {
        let _running = ctx.status.running(action);
        let run = async {
            match action {
                ActionType::Summary => summary::run(ctx, mention).await,
                ActionType::Factcheck => factcheck::run(ctx, mention).await,
                ActionType::None => Err(StageError::Other("no action to run".into())),
            }
        };
        tokio::select! {
            result = run => result,
            lost = claim.keep(ctx) => Err(lost),
        }
    };
    let took = started.elapsed();
    let metrics = &ctx.metrics;
    metrics
        .action_duration
        .with_label_values(&[action.as_str()])
        .observe(took.as_secs_f64());
    // Still ours? A run that stalled past its claim records nothing: another has it.
    let result = match result {
        Ok(outcome) if !claim.renew(ctx).await? => {
            ctx.store
                .fail_execution(execution, took, outcome.tokens_used, LOST)
                .await?;
            Err(StageError::ClaimLost)
        }
        other => other,
    };
    match result {
        Ok(outcome) => {
            let reply = match ctx
                .store
                .finish_execution(execution, &mention.id, action, took, &outcome)
                .await?
            {
                Finished::Recorded => outcome.reply,
                Finished::Superseded(first) => {
                    tracing::warn!(mentionId = %mention.id, actionType = action.as_str(), "another run of this action succeeded first: its reply goes on");
                    first.reply
                }
            };
            crate::failpoint::hit("after-action");
            metrics
                .actions_executed
                .with_label_values(&[action.as_str(), "success"])
                .inc();
            tracing::info!(
                mentionId = %mention.id,
                actionType = action.as_str(),
                durationMs = took.as_millis() as u64,
                aiProvider = %ctx.ai_name(),
                tokensUsed = outcome.tokens_used,
                "action done"
            );
            announce(ctx, mention, action, reply).await
        }
        Err(StageError::ClaimLost) => {
            tracing::warn!(mentionId = %mention.id, actionType = action.as_str(), "{LOST}");
            Err(StageError::ClaimLost)
        }
        Err(e) => {
            let error = e.to_string();
            ctx.store.fail_execution(execution, took, 0, &error).await?;
            metrics
                .actions_executed
                .with_label_values(&[action.as_str(), "failed"])
                .inc();
            if e.is_transient() {
                // May pass: the pipeline tries the message again (and the re-drive
                // later); the mention stays unanswered until then.
                tracing::warn!(
                    mentionId = %mention.id,
                    actionType = action.as_str(),
                    aiProvider = %ctx.ai_name(),
                    error = %error,
                    "action failed; it is tried again"
                );
            } else {
                // Will not pass: the pipeline dead-letters the message (replayable)
                // and fails the mention with the reason.
                tracing::error!(
                    mentionId = %mention.id,
                    actionType = action.as_str(),
                    durationMs = took.as_millis() as u64,
                    aiProvider = %ctx.ai_name(),
                    error = %error,
                    "action failed"
                );
            }
            Err(e)
        }
    }
}

const LOST: &str = "superseded: this worker lost the action's claim (it stalled past \
                    bus.claim_idle_ms) and another took it over";

/// This run's claim on an action (see the module's documentation).
struct Claim {
    key: String,
    holder: String,
    ttl: Duration,
}

impl Claim {
    fn new(ctx: &BotContext, key: String) -> Self {
        let mut tag = [0u8; 8];
        let _ = getrandom::fill(&mut tag);
        Self {
            key,
            // Per run, not per process: two copies in one process are two holders.
            holder: format!(
                "{}-{:016x}",
                crate::bus::redis::process_name(),
                u64::from_le_bytes(tag)
            ),
            ttl: Duration::from_millis(ctx.config.bus.claim_idle_ms.max(1000)),
        }
    }

    /// Takes the claim; false when a live holder has it. A held claim is watched
    /// until it is either renewed (its holder is alive) or expires (taken over).
    async fn take(&self, ctx: &BotContext) -> Result<bool, StageError> {
        let deadline = Instant::now() + self.ttl * 2;
        let mut seen: Option<Duration> = None;
        loop {
            if ctx
                .shared
                .claim_action(&self.key, &self.holder, self.ttl)
                .await?
            {
                return Ok(true);
            }
            let left = ctx.shared.action_claim_left(&self.key).await?;
            match (left, seen) {
                (None, _) => continue, // expired just now: take it
                (Some(now), Some(before)) if now > before => return Ok(false), // renewed
                _ => {}
            }
            if Instant::now() > deadline {
                return Err(StageError::Other(
                    "the action's claim neither expired nor was renewed in time".into(),
                ));
            }
            seen = left;
            let wait = left
                .unwrap_or_default()
                .min(self.ttl / 6)
                .max(Duration::from_millis(20));
            tokio::time::sleep(wait).await;
        }
    }

    /// Renews the claim every third of its lifetime; returns (the error to stop the
    /// run with) once it is lost.
    async fn keep(&self, ctx: &BotContext) -> StageError {
        loop {
            tokio::time::sleep(self.ttl / 3).await;
            match self.renew(ctx).await {
                Ok(true) => {}
                Ok(false) => return StageError::ClaimLost,
                // Redis away: the claim may still hold; the next try tells.
                Err(e) => tracing::warn!(error = %e, "could not renew an action's claim"),
            }
        }
    }

    async fn renew(&self, ctx: &BotContext) -> Result<bool, StageError> {
        Ok(ctx
            .shared
            .renew_action(&self.key, &self.holder, self.ttl)
            .await?)
    }

    async fn release(&self, ctx: &BotContext) -> Result<(), StageError> {
        Ok(ctx.shared.release_action(&self.key, &self.holder).await?)
    }
}

/// Hands a reply to the publisher.
async fn announce(
    ctx: &BotContext,
    mention: &Mention,
    action: ActionType,
    reply: String,
) -> Result<(), StageError> {
    ctx.bus
        .publish(
            Topic::ActionCompleted,
            Message::ActionCompleted(ActionCompleted {
                mention_id: mention.id.clone(),
                action_type: action.as_str().into(),
                reply,
            }),
        )
        .await?;
    Ok(())
}

/// An outcome with no tokens used.
pub(crate) fn local_outcome(
    reply: String,
    artifacts: Vec<(&'static str, serde_json::Value)>,
) -> Outcome {
    Outcome {
        reply,
        tokens_used: 0,
        artifacts,
    }
}
