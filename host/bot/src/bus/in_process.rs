//! The embedded bus: one queue per stream, in memory, shared by the consumers of the
//! stream's group. Nothing is kept across a restart and nothing is redelivered: the
//! pipeline drives unfinished mentions again from the database instead.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Bus, BusError, Consumer, Delivery, Message, Topic};

pub struct InProcessBus {
    streams: Mutex<HashMap<Topic, Stream>>,
}

struct Stream {
    sender: mpsc::UnboundedSender<Message>,
    receiver: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Message>>>,
}

impl Stream {
    fn new() -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        Self {
            sender,
            receiver: Arc::new(tokio::sync::Mutex::new(receiver)),
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

    async fn consumer(&self, topic: Topic) -> Result<Arc<dyn Consumer>, BusError> {
        let receiver = self.with_stream(topic, |s| s.receiver.clone());
        Ok(Arc::new(InProcessConsumer { topic, receiver }))
    }

    async fn ping(&self) -> Result<(), BusError> {
        Ok(())
    }

    fn redelivers(&self) -> bool {
        false
    }
}

struct InProcessConsumer {
    topic: Topic,
    receiver: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Message>>>,
}

#[async_trait]
impl Consumer for InProcessConsumer {
    async fn next(&self, stop: &CancellationToken) -> Result<Option<Delivery>, BusError> {
        let message = tokio::select! {
            _ = stop.cancelled() => return Ok(None),
            message = async { self.receiver.lock().await.recv().await } => message,
        };
        Ok(message.map(|message| Delivery {
            topic: self.topic,
            payload: message.payload().to_string(),
            message: Ok(message),
            id: String::new(),
            deliveries: 1,
            exhausted: None,
        }))
    }

    async fn ack(&self, _: &Delivery) -> Result<(), BusError> {
        Ok(())
    }

    async fn failed(&self, _: &Delivery, _: &str) -> Result<(), BusError> {
        Ok(())
    }

    async fn release(&self, _: &Delivery) -> Result<(), BusError> {
        Ok(())
    }

    async fn dead_letter(&self, _: &Delivery, _: &str) -> Result<Option<String>, BusError> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::ActionRequested;

    #[tokio::test]
    async fn each_message_goes_to_one_consumer_of_the_group() {
        let bus = InProcessBus::new();
        let a = bus.consumer(Topic::SummaryRequested).await.unwrap();
        let b = bus.consumer(Topic::SummaryRequested).await.unwrap();
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
        let stop = CancellationToken::new();
        let mut seen = Vec::new();
        for consumer in [&a, &b, &a, &b] {
            let delivery = consumer.next(&stop).await.unwrap().unwrap();
            seen.push(delivery.mention_id().unwrap().to_owned());
        }
        assert_eq!(seen, ["m0", "m1", "m2", "m3"]);
        stop.cancel();
        assert!(a.next(&stop).await.unwrap().is_none());
    }
}
