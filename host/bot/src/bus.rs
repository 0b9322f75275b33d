//! The event bus between the stages (poller → router → workers → publisher): the
//! spec's streams and their messages, the [`Bus`] boundary, and the in-process bus that
//! is the embedded default. (Redis Streams, for stages in several processes, is the
//! next step behind the same trait.)
//!
//! Delivery is at least once: a stage may see a message again (after a crash the
//! pipeline is driven again from the database, see `pipeline::recover`), so every
//! stage is idempotent: it looks for its own earlier answer first. The in-process bus
//! keeps nothing across a restart; the database does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

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

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("the bus is closed")]
    Closed,
}

/// What stages publish to and consume from.
#[async_trait]
pub trait Bus: Send + Sync {
    /// The kind of bus, for health (`in-process`, `redis`).
    fn kind(&self) -> &'static str;

    async fn publish(&self, topic: Topic, message: Message) -> Result<(), BusError>;

    /// The consumer of `topic` for the group of workers that share it: each message
    /// goes to one of them.
    fn consumer(&self, topic: Topic) -> Consumer;
}

/// One group's side of a stream; cloned by each worker of the group.
#[derive(Clone)]
pub struct Consumer {
    receiver: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Message>>>,
}

impl Consumer {
    /// The next message, or None when the bus closed.
    pub async fn next(&self) -> Option<Message> {
        self.receiver.lock().await.recv().await
    }
}

/// The embedded bus: one queue per stream, in memory.
pub struct InProcessBus {
    streams: Mutex<HashMap<Topic, Stream>>,
}

struct Stream {
    sender: mpsc::UnboundedSender<Message>,
    consumer: Consumer,
}

impl Stream {
    fn new() -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        Self {
            sender,
            consumer: Consumer {
                receiver: Arc::new(tokio::sync::Mutex::new(receiver)),
            },
        }
    }
}

impl Default for InProcessBus {
    fn default() -> Self {
        Self::new()
    }
}

impl InProcessBus {
    pub fn new() -> Self {
        Self {
            streams: Mutex::new(HashMap::new()),
        }
    }

    fn with_stream<T>(&self, topic: Topic, f: impl FnOnce(&mut Stream) -> T) -> T {
        // Nothing panics while the lock is held: a poisoned map is still whole.
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        f(streams.entry(topic).or_insert_with(Stream::new))
    }
}

#[async_trait]
impl Bus for InProcessBus {
    fn kind(&self) -> &'static str {
        "in-process"
    }

    async fn publish(&self, topic: Topic, message: Message) -> Result<(), BusError> {
        self.with_stream(topic, |s| s.sender.send(message))
            .map_err(|_| BusError::Closed)
    }

    fn consumer(&self, topic: Topic) -> Consumer {
        self.with_stream(topic, |s| s.consumer.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_message_goes_to_one_consumer_of_the_group() {
        let bus = InProcessBus::new();
        let (a, b) = (
            bus.consumer(Topic::SummaryRequested),
            bus.consumer(Topic::SummaryRequested),
        );
        for i in 0..4 {
            bus.publish(
                Topic::SummaryRequested,
                Message::ActionRequested(ActionRequested {
                    mention_id: format!("m{i}"),
                    action_type: "summary".into(),
                }),
            )
            .await
            .unwrap();
        }
        let mut seen = Vec::new();
        for consumer in [&a, &b, &a, &b] {
            seen.push(
                consumer
                    .next()
                    .await
                    .unwrap()
                    .mention_id()
                    .unwrap()
                    .to_owned(),
            );
        }
        assert_eq!(seen, ["m0", "m1", "m2", "m3"]);
    }

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
            Topic::FactcheckRequested.name(),
            "action.factcheck.requested.v1"
        );
    }
}
