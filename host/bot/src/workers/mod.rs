//! The action workers: [`summary`] and [`factcheck`], run by [`handle`] for an
//! `action.<type>.requested.v1` message.
//!
//! Each run is recorded in `action_executions` (pending, then success with its reply,
//! duration and tokens, or failed with `error_details`) with its artifacts. A mention
//! whose action succeeded before (idempotency key `action:{type}:{id}`) is not run
//! again: its stored reply is handed on once more.

pub mod factcheck;
pub mod summary;

use std::sync::Arc;
use std::time::Instant;

use crate::bus::{ActionCompleted, BusError, Message, Topic};
use crate::context::BotContext;
use crate::index::IndexError;
use crate::poller::KEY_LIFETIME;
use crate::providers::ProviderError;
use crate::store::{ActionType, Mention, MentionStatus, Outcome, StoreError};

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
    if !ctx.shared.claim_key(&key, KEY_LIFETIME).await? {
        // Held, with no success recorded: the run that took it was interrupted.
        tracing::info!(mentionId = %mention.id, actionType = action.as_str(), "running an interrupted action again");
        // On Redis a younger run may be another worker's, alive: left alone.
        ctx.store
            .fail_interrupted_executions(Some((&mention.id, action)))
            .await?;
    }
    let execution = ctx.store.start_execution(&mention.id, action).await?;
    let started = Instant::now();
    let result = {
        let _running = ctx.status.running(action);
        match action {
            ActionType::Summary => summary::run(&ctx, &mention).await,
            ActionType::Factcheck => factcheck::run(&ctx, &mention).await,
            ActionType::None => Err(StageError::Other("no action to run".into())),
        }
    };
    let took = started.elapsed();
    let metrics = &ctx.metrics;
    metrics
        .action_duration
        .with_label_values(&[action.as_str()])
        .observe(took.as_secs_f64());
    match result {
        Ok(outcome) => {
            ctx.store
                .finish_execution(execution, &mention.id, action, took, &outcome)
                .await?;
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
            announce(&ctx, &mention, action, outcome.reply).await
        }
        Err(e) => {
            let error = e.to_string();
            ctx.store.fail_execution(execution, took, 0, &error).await?;
            if e.is_transient() {
                // May pass: the pipeline tries the message again (and the re-drive
                // later); the mention stays unanswered until then.
                metrics
                    .actions_executed
                    .with_label_values(&[action.as_str(), "failed"])
                    .inc();
                tracing::warn!(
                    mentionId = %mention.id,
                    actionType = action.as_str(),
                    aiProvider = %ctx.ai_name(),
                    error = %error,
                    "action failed; it is tried again"
                );
                return Err(e);
            }
            metrics
                .actions_executed
                .with_label_values(&[action.as_str(), "failed"])
                .inc();
            tracing::error!(
                mentionId = %mention.id,
                actionType = action.as_str(),
                durationMs = took.as_millis() as u64,
                aiProvider = %ctx.ai_name(),
                error = %error,
                "action failed"
            );
            ctx.store
                .set_mention_status(&mention.id, MentionStatus::Failed, Some(&error))
                .await?;
            Ok(())
        }
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
