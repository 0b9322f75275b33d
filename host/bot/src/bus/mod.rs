//! The event bus between the stages (poller → router → workers → publisher): the
//! spec's streams and their messages, the [`Bus`] and [`Consumer`] boundary, the
//! in-process bus that is the embedded default ([`in_process`]) and Redis Streams for
//! stages in several processes ([`redis`]).
//!
//! Delivery is at least once: a stage may see a message again (a consumer died before
//! acknowledging it, a re-drive after a crash), so every stage is idempotent: it looks
//! for its own earlier answer first. The in-process bus keeps nothing across a
//! restart (the database does, see `pipeline::recover`); Redis keeps unacknowledged
//! messages in its pending lists, and hands those of a dead consumer to another one.

pub mod in_process;
pub mod redis;

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

pub use in_process::InProcessBus;
pub use redis::{DeadLetterEntry, RedisBus, RedisBusConfig};

use crate::store::ActionType;

/// The streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Topic {
    MentionReceived,
    SummaryRequested,
    FactcheckRequested,
    ActionCompleted,
    DeadLetter,
}

impl Topic {
    /// The stream's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::MentionReceived => "mention.received.v1",
            Self::SummaryRequested => "action.summary.requested.v1",
            Self::FactcheckRequested => "action.factcheck.requested.v1",
            Self::ActionCompleted => "action.completed.v1",
            Self::DeadLetter => "dead-letter.v1",
        }
    }

    /// Every stream, in pipeline order.
    pub const ALL: [Self; 5] = [
        Self::MentionReceived,
        Self::SummaryRequested,
        Self::FactcheckRequested,
        Self::ActionCompleted,
        Self::DeadLetter,
    ];

    /// The stream named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The consumer group that reads the stream: one per stage (and worker type).
    pub fn group(self) -> &'static str {
        match self {
            Self::MentionReceived => "router",
            Self::SummaryRequested => "summary-workers",
            Self::FactcheckRequested => "factcheck-workers",
            Self::ActionCompleted => "publisher",
            Self::DeadLetter => "operators",
        }
    }

    /// The stream that asks for `action`.
    pub fn requesting(action: ActionType) -> Option<Self> {
        match action {
            ActionType::Summary => Some(Self::SummaryRequested),
            ActionType::Factcheck => Some(Self::FactcheckRequested),
            ActionType::None => None,
        }
    }
}

/// `mention.received.v1`: a mention was recorded (status pending).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MentionReceived {
    pub mention_id: String,
    pub author_pubky: String,
    pub post_uri: String,
}

/// `action.<type>.requested.v1`: the router chose an action for a mention.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActionRequested {
    pub mention_id: String,
    pub action_type: String,
}

/// `action.completed.v1`: a reply is ready for the publisher. `action_type` is the
/// action that made it, or `notice` for a reply the router chose (opt-out confirmed,
/// slow down).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActionCompleted {
    pub mention_id: String,
    pub action_type: String,
    pub reply: String,
}

/// `dead-letter.v1`: a message no stage could process, with why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetter {
    pub topic: String,
    pub payload: serde_json::Value,
    pub reason: String,
}

/// A message on a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    MentionReceived(MentionReceived),
    ActionRequested(ActionRequested),
    ActionCompleted(ActionCompleted),
    DeadLetter(DeadLetter),
}

impl Message {
    /// The message's JSON payload.
    pub fn payload(&self) -> serde_json::Value {
        let value = match self {
            Self::MentionReceived(m) => serde_json::to_value(m),
            Self::ActionRequested(m) => serde_json::to_value(m),
            Self::ActionCompleted(m) => serde_json::to_value(m),
            Self::DeadLetter(m) => serde_json::to_value(m),
        };
        value.unwrap_or(serde_json::Value::Null)
    }

    /// The mention it is about (for logs).
    pub fn mention_id(&self) -> Option<&str> {
        match self {
            Self::MentionReceived(m) => Some(&m.mention_id),
            Self::ActionRequested(m) => Some(&m.mention_id),
            Self::ActionCompleted(m) => Some(&m.mention_id),
            Self::DeadLetter(_) => None,
        }
    }
}

impl Message {
    /// Reads a message of `topic` from its JSON payload.
    pub fn decode(topic: Topic, payload: &str) -> Result<Self, serde_json::Error> {
        Ok(match topic {
            Topic::MentionReceived => Self::MentionReceived(serde_json::from_str(payload)?),
            Topic::SummaryRequested | Topic::FactcheckRequested => {
                Self::ActionRequested(serde_json::from_str(payload)?)
            }
            Topic::ActionCompleted => Self::ActionCompleted(serde_json::from_str(payload)?),
            Topic::DeadLetter => Self::DeadLetter(serde_json::from_str(payload)?),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("the bus is closed")]
    Closed,
    #[error("redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    #[error("the bus: {0}")]
    Invalid(String),
    /// A publish of a process that no longer holds the leader lease.
    #[error("refused: this process no longer holds the leader lease")]
    Fenced,
}

/// A message as a consumer received it.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub topic: Topic,
    /// The message, or why its payload could not be read (a poison message: it is
    /// dead-lettered as it is).
    pub message: Result<Message, String>,
    /// The raw payload (what a dead letter keeps).
    pub payload: String,
    /// The stream entry's id (Redis); empty in process.
    pub id: String,
    /// How many times the message was handed out, this time included.
    pub deliveries: u64,
    /// Set when the message was handed out more often than the bus allows: why it
    /// kept failing. It is to be dead-lettered, not handled.
    pub exhausted: Option<String>,
}

impl Delivery {
    /// The mention it is about (for logs and the in-flight set).
    pub fn mention_id(&self) -> Option<&str> {
        self.message.as_ref().ok().and_then(Message::mention_id)
    }
}

/// What stages publish to.
#[async_trait]
pub trait Bus: Send + Sync {
    /// The kind of bus, for health (`in-process`, `redis`).
    fn kind(&self) -> &'static str;

    async fn publish(&self, topic: Topic, message: Message) -> Result<(), BusError>;

    /// A consumer of `topic` in the topic's group: each message goes to one consumer
    /// of the group, whichever process it runs in.
    async fn consumer(&self, topic: Topic) -> Result<Arc<dyn Consumer>, BusError>;

    /// Whether the bus is reachable (health).
    async fn ping(&self) -> Result<(), BusError>;

    /// Whether a message that was not acknowledged comes back by itself (Redis's
    /// pending lists). When false, the pipeline's re-drive from the database does it.
    fn redelivers(&self) -> bool;

    /// The mentions whose messages are on `topic` now (queued, or taken and not yet
    /// acknowledged), when the bus can tell (Redis); None when it cannot.
    async fn queued_mentions(&self, _topic: Topic) -> Result<Option<HashSet<String>>, BusError> {
        Ok(None)
    }
}

/// One consumer of a group.
#[async_trait]
pub trait Consumer: Send + Sync {
    /// The next message, or None once `stop` is cancelled (or the bus closed).
    async fn next(&self, stop: &CancellationToken) -> Result<Option<Delivery>, BusError>;

    /// The message is done with: it is not handed out again.
    async fn ack(&self, delivery: &Delivery) -> Result<(), BusError>;

    /// Handling failed in a way that may pass: the bus keeps the message for another
    /// delivery (after the claim time) and remembers why, for the dead letter it
    /// becomes after too many.
    async fn failed(&self, delivery: &Delivery, reason: &str) -> Result<(), BusError>;

    /// Lets the message go untried (this process no longer has the work: it lost the
    /// leader lease or the action's claim): it comes back to another consumer after the
    /// claim time, and this delivery does not count towards the bus's limit.
    async fn release(&self, delivery: &Delivery) -> Result<(), BusError>;

    /// Moves the message to `dead-letter.v1` with `reason`. Returns the dead letter's
    /// id there, or None when this bus keeps no dead letters (the database's table is
    /// then the only record).
    async fn dead_letter(
        &self,
        delivery: &Delivery,
        reason: &str,
    ) -> Result<Option<String>, BusError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_serialize_with_the_spec_names() {
        let m = Message::MentionReceived(MentionReceived {
            mention_id: "a:b".into(),
            author_pubky: "a".into(),
            post_uri: "pubky://a/pub/pubky.app/posts/b".into(),
        });
        assert_eq!(
            m.payload(),
            serde_json::json!({"mentionId": "a:b", "authorPubky": "a", "postUri": "pubky://a/pub/pubky.app/posts/b"})
        );
        assert_eq!(
            Message::decode(Topic::MentionReceived, &m.payload().to_string()).unwrap(),
            m
        );
        assert!(Message::decode(Topic::SummaryRequested, "{}").is_err());
        assert_eq!(
            Topic::FactcheckRequested.name(),
            "action.factcheck.requested.v1"
        );
        for topic in Topic::ALL {
            assert_eq!(Topic::from_name(topic.name()), Some(topic));
        }
    }
}
