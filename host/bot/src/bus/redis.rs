//! The bus on Redis Streams, for stages in several processes.
//!
//! Each topic is a stream (`<prefix><topic>`, e.g. `mention.received.v1`) read by one
//! consumer group (`Topic::group`); every consumer has a name of its own
//! (`<host>-<pid>-<n>`). A message is acknowledged (and deleted: each stream has one
//! group) once its stage is done with it. Until then it sits in the group's pending
//! list:
//! - while a consumer works on it, the consumer claims it again every third of
//!   `claim_idle` (XCLAIM JUSTID, which does not count as a delivery), so a slow
//!   action is never taken from a live worker;
//! - a consumer that dies stops claiming: once the message has been idle for
//!   `claim_idle`, another consumer takes it (XAUTOCLAIM) and Redis counts a delivery;
//! - a stage that fails in a way that may pass stops claiming it too, after noting why
//!   in `<prefix>pkbot:failures`: it comes back after `claim_idle`;
//! - a message handed out more than `max_deliveries` times comes with the last reason
//!   (or "its consumers died") in `Delivery::exhausted`, and the pipeline moves it to
//!   `dead-letter.v1`, as one whose payload cannot be read. `pkbot dlq list` shows them, `pkbot dlq replay` puts them
//!   back on their stream.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use prometheus::IntCounterVec;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::streams::{
    StreamAutoClaimReply, StreamId, StreamPendingCountReply, StreamRangeReply, StreamReadReply,
};
use redis::{ErrorKind, RedisError, Value};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::{Bus, BusError, Consumer, Delivery, Message, Topic};

/// How the Redis bus runs (`[bus]` in the configuration).
#[derive(Debug, Clone)]
pub struct RedisBusConfig {
    /// `redis://host:port/db`.
    pub url: String,
    /// Put before every key (streams included); empty by default.
    pub prefix: String,
    /// A message idle this long in a pending list goes to another consumer.
    pub claim_idle: Duration,
    /// Deliveries before a message is dead-lettered.
    pub max_deliveries: u64,
    /// How long one read waits for a new message.
    pub block: Duration,
}

/// Counts one Redis command in `bot_redis_operations_total`.
#[derive(Clone)]
struct Ops(IntCounterVec);

impl Ops {
    fn count(&self, operation: &str) {
        self.0.with_label_values(&[operation]).inc();
    }
}

pub struct RedisBus {
    shared: Arc<Shared>,
}

struct Shared {
    client: redis::Client,
    conn: ConnectionManager,
    config: RedisBusConfig,
    ops: Ops,
    /// Numbers this process's consumers.
    consumers: AtomicUsize,
    /// `<host>-<pid>`: what this process's consumer names start with.
    process: String,
    /// While this process leads: the leader lease's value (`<holder>#<token>`) that
    /// every publish checks, in the same step, is still the lease's.
    fence: Mutex<Option<String>>,
}

impl Shared {
    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.config.prefix)
    }

    fn failures_key(&self) -> String {
        self.key("pkbot:failures")
    }
}

/// The name of this process in consumer names and leases: host and pid.
pub fn process_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    format!("{host}-{}", std::process::id())
}

impl RedisBus {
    /// Connects (failing at once when Redis cannot be reached).
    pub async fn connect(config: RedisBusConfig, ops: IntCounterVec) -> Result<Self, BusError> {
        let client = redis::Client::open(config.url.as_str())?;
        let conn = ConnectionManager::new_with_config(
            client.clone(),
            ConnectionManagerConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(5)))
                .set_response_timeout(Some(Duration::from_secs(10)))
                .set_number_of_retries(2),
        )
        .await?;
        Ok(Self {
            shared: Arc::new(Shared {
                client,
                conn,
                config,
                ops: Ops(ops),
                consumers: AtomicUsize::new(0),
                process: process_name(),
                fence: Mutex::new(None),
            }),
        })
    }

    /// A connection for other users of the same Redis (leases, keys, rate limits).
    pub fn connection(&self) -> ConnectionManager {
        self.shared.conn.clone()
    }

    /// The key `name` with the configured prefix.
    pub fn key(&self, name: &str) -> String {
        self.shared.key(name)
    }

    /// Fences this process's publishes with the leader lease's value (see
    /// `lease`): from now on a publish goes out only while the lease holds it. A
    /// process that lost the lease keeps the old value, so its publishes are refused.
    pub fn set_fence(&self, lease_value: String) {
        *self.shared.fence.lock().unwrap_or_else(|e| e.into_inner()) = Some(lease_value);
    }

    /// Counts one Redis command of another user of this connection.
    pub fn count(&self, operation: &str) {
        self.shared.ops.count(operation);
    }

    /// Every dead letter, oldest first.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetterEntry>, BusError> {
        let mut conn = self.shared.conn.clone();
        self.shared.ops.count("dlq");
        let reply: StreamRangeReply = redis::cmd("XRANGE")
            .arg(self.shared.key(Topic::DeadLetter.name()))
            .arg("-")
            .arg("+")
            .query_async(&mut conn)
            .await?;
        Ok(reply.ids.iter().map(DeadLetterEntry::from_entry).collect())
    }

    /// Puts a dead letter back on its stream (as a new message, counted from one) and
    /// removes it from `dead-letter.v1`, in one transaction. Returns the letter, or
    /// None when there is no such id.
    pub async fn replay(&self, id: &str) -> Result<Option<DeadLetterEntry>, BusError> {
        let mut conn = self.shared.conn.clone();
        let dlq = self.shared.key(Topic::DeadLetter.name());
        self.shared.ops.count("dlq");
        let reply: StreamRangeReply = redis::cmd("XRANGE")
            .arg(&dlq)
            .arg(id)
            .arg(id)
            .query_async(&mut conn)
            .await?;
        let Some(entry) = reply.ids.first().map(DeadLetterEntry::from_entry) else {
            return Ok(None);
        };
        let topic = Topic::from_name(&entry.stream)
            .filter(|t| *t != Topic::DeadLetter)
            .ok_or_else(|| {
                BusError::Invalid(format!(
                    "dead letter {id} names no stream it could go back to: `{}`",
                    entry.stream
                ))
            })?;
        self.shared.ops.count("dlq");
        // Removed and re-published in one step, and only by whoever removed it: two
        // operators replaying the same letter put it back once.
        let replayed: i64 = redis::Script::new(
            r"
if redis.call('XDEL', KEYS[1], ARGV[1]) == 1 then
  redis.call('XADD', KEYS[2], '*', 'payload', ARGV[2])
  return 1
end
return 0",
        )
        .key(&dlq)
        .key(self.shared.key(topic.name()))
        .arg(id)
        .arg(&entry.payload)
        .invoke_async(&mut conn)
        .await?;
        Ok((replayed == 1).then_some(entry))
    }
}

/// One entry of `dead-letter.v1`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetterEntry {
    /// Its id in `dead-letter.v1` (what `pkbot dlq replay` takes).
    pub id: String,
    /// The stream it came from.
    pub stream: String,
    /// Its id there.
    pub message_id: String,
    pub payload: String,
    pub reason: String,
    pub deliveries: u64,
    /// Unix seconds.
    pub at: i64,
}

impl DeadLetterEntry {
    fn from_entry(entry: &StreamId) -> Self {
        let text = |name: &str| entry.get::<String>(name).unwrap_or_default();
        Self {
            id: entry.id.clone(),
            stream: text("stream"),
            message_id: text("id"),
            payload: text("payload"),
            reason: text("reason"),
            deliveries: entry.get("deliveries").unwrap_or(0),
            at: entry.get("at").unwrap_or(0),
        }
    }

    /// The mention the letter is about, when its payload names one.
    pub fn mention_id(&self) -> Option<String> {
        let topic = Topic::from_name(&self.stream)?;
        Message::decode(topic, &self.payload)
            .ok()?
            .mention_id()
            .map(str::to_owned)
    }
}

#[async_trait]
impl Bus for RedisBus {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn publish(&self, topic: Topic, message: Message) -> Result<(), BusError> {
        let mut conn = self.shared.conn.clone();
        self.shared.ops.count("publish");
        let fence = self
            .shared
            .fence
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let stream = self.shared.key(topic.name());
        let payload = message.payload().to_string();
        let Some(lease_value) = fence else {
            let _: String = redis::cmd("XADD")
                .arg(stream)
                .arg("*")
                .arg("payload")
                .arg(payload)
                .query_async(&mut conn)
                .await?;
            return Ok(());
        };
        let added: Result<String, RedisError> = redis::Script::new(FENCED_PUBLISH)
            .key(stream)
            .key(self.shared.key("pkbot:leader"))
            .arg(lease_value)
            .arg(payload)
            .invoke_async(&mut conn)
            .await;
        match added {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("FENCED") => Err(BusError::Fenced),
            Err(e) => Err(e.into()),
        }
    }

    async fn queued_mentions(&self, topic: Topic) -> Result<Option<HashSet<String>>, BusError> {
        let mut conn = self.shared.conn.clone();
        let stream = self.shared.key(topic.name());
        let mut ids = HashSet::new();
        let mut start = "-".to_owned();
        loop {
            self.shared.ops.count("scan");
            let page: StreamRangeReply = redis::cmd("XRANGE")
                .arg(&stream)
                .arg(&start)
                .arg("+")
                .arg("COUNT")
                .arg(500)
                .query_async(&mut conn)
                .await?;
            let Some(last) = page.ids.last() else {
                break;
            };
            start = format!("({}", last.id);
            let full = page.ids.len() == 500;
            for entry in &page.ids {
                let payload: String = entry.get("payload").unwrap_or_default();
                if let Some(id) = Message::decode(topic, &payload)
                    .ok()
                    .as_ref()
                    .and_then(Message::mention_id)
                {
                    ids.insert(id.to_owned());
                }
            }
            if !full {
                break;
            }
        }
        Ok(Some(ids))
    }

    async fn consumer(&self, topic: Topic) -> Result<Arc<dyn Consumer>, BusError> {
        Ok(self.redis_consumer(topic).await?)
    }

    async fn ping(&self) -> Result<(), BusError> {
        let mut conn = self.shared.conn.clone();
        self.shared.ops.count("ping");
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok(())
    }

    fn redelivers(&self) -> bool {
        true
    }
}

impl RedisBus {
    async fn redis_consumer(&self, topic: Topic) -> Result<Arc<RedisConsumer>, BusError> {
        let shared = &self.shared;
        let stream = shared.key(topic.name());
        let group = topic.group();
        ensure_group(shared, &stream, group).await?;
        // Reads block, so each consumer has a connection of its own for them; a
        // connection manager, so that it comes back after Redis or the network did.
        let reader = ConnectionManager::new_with_config(
            shared.client.clone(),
            ConnectionManagerConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(5)))
                .set_response_timeout(Some(shared.config.block + Duration::from_secs(10)))
                .set_number_of_retries(2),
        )
        .await?;
        let n = shared.consumers.fetch_add(1, Ordering::Relaxed);
        let consumer = Arc::new(RedisConsumer {
            shared: shared.clone(),
            topic,
            stream,
            group,
            name: format!("{}-{n}", shared.process),
            reader: tokio::sync::Mutex::new(reader),
            last_claim: Mutex::new(None),
            claim_cursor: Mutex::new("0-0".into()),
            working: Arc::new(Mutex::new(HashSet::new())),
        });
        tokio::spawn(keep_claimed(
            Arc::downgrade(&consumer),
            shared.config.claim_idle / 3,
        ));
        Ok(consumer)
    }
}

/// Creates `group` on `stream` (and the stream) unless it exists, reading from the
/// stream's start: what was published before the group existed is read too.
async fn ensure_group(shared: &Shared, stream: &str, group: &str) -> Result<(), BusError> {
    let mut conn = shared.conn.clone();
    shared.ops.count("group");
    let created: Result<Value, _> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await;
    match created {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Whether Redis lost the group (restarted without its data, or the stream was
/// deleted): it is made again and the read retried.
fn lost_group(e: &RedisError) -> bool {
    e.code() == Some("NOGROUP")
}

struct RedisConsumer {
    shared: Arc<Shared>,
    topic: Topic,
    stream: String,
    group: &'static str,
    name: String,
    reader: tokio::sync::Mutex<ConnectionManager>,
    /// Where the next look for stuck messages starts (XAUTOCLAIM's cursor).
    claim_cursor: Mutex<String>,
    /// When this consumer last looked for stuck messages.
    last_claim: Mutex<Option<Instant>>,
    /// Ids of the messages being worked on (kept claimed).
    working: Arc<Mutex<HashSet<String>>>,
}

impl RedisConsumer {
    fn working(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.working.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn failure_field(&self, id: &str) -> String {
        format!("{}/{id}", self.topic.name())
    }

    fn delivery(&self, entry: &StreamId, deliveries: u64) -> Delivery {
        let payload: String = entry.get("payload").unwrap_or_default();
        let message = Message::decode(self.topic, &payload)
            .map_err(|e| format!("the payload cannot be read: {e}"));
        Delivery {
            topic: self.topic,
            message,
            payload,
            id: entry.id.clone(),
            deliveries,
            exhausted: None,
        }
    }

    /// Whether it is time to look for messages stuck with dead consumers.
    fn claim_due(&self) -> bool {
        let mut last = self.last_claim.lock().unwrap_or_else(|e| e.into_inner());
        let due = last.is_none_or(|at| at.elapsed() >= self.shared.config.claim_idle / 2);
        if due {
            *last = Some(Instant::now());
        }
        due
    }

    /// A message idle for `claim_idle` in the group's pending list, taken over. The
    /// scan goes on from where the last one stopped, so stuck messages behind many in
    /// work are found too.
    async fn claim_stuck(&self) -> Result<Option<Delivery>, BusError> {
        let mut conn = self.shared.conn.clone();
        self.shared.ops.count("claim");
        let start = self
            .claim_cursor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let reply: Result<StreamAutoClaimReply, _> = redis::cmd("XAUTOCLAIM")
            .arg(&self.stream)
            .arg(self.group)
            .arg(&self.name)
            .arg(self.shared.config.claim_idle.as_millis() as u64)
            .arg(&start)
            .arg("COUNT")
            .arg(1)
            .query_async(&mut conn)
            .await;
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) if lost_group(&e) => {
                ensure_group(&self.shared, &self.stream, self.group).await?;
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        *self.claim_cursor.lock().unwrap_or_else(|e| e.into_inner()) = reply.next_stream_id.clone();
        let Some(entry) = reply.claimed.first() else {
            return Ok(None);
        };
        self.shared.ops.count("pending");
        let pending: StreamPendingCountReply = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg(self.group)
            .arg(&entry.id)
            .arg(&entry.id)
            .arg(1)
            .query_async(&mut conn)
            .await?;
        let deliveries = pending.ids.first().map_or(1, |p| p.times_delivered as u64);
        Ok(Some(self.delivery(entry, deliveries)))
    }

    /// A new message, waiting up to `block` for one.
    async fn read_new(&self) -> Result<Option<Delivery>, BusError> {
        let mut reader = self.reader.lock().await;
        self.shared.ops.count("consume");
        let reply: Result<Option<StreamReadReply>, _> = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(self.group)
            .arg(&self.name)
            .arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(self.shared.config.block.as_millis() as u64)
            .arg("STREAMS")
            .arg(&self.stream)
            .arg(">")
            .query_async(&mut *reader)
            .await;
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) if lost_group(&e) => {
                tracing::warn!(
                    stream = self.topic.name(),
                    "the consumer group was gone: made again"
                );
                ensure_group(&self.shared, &self.stream, self.group).await?;
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        Ok(reply
            .and_then(|r| r.keys.into_iter().next())
            .and_then(|k| k.ids.into_iter().next())
            .map(|entry| self.delivery(&entry, 1)))
    }

    /// How many of the message's deliveries went to a process that let it go untried
    /// (it no longer led): those do not count towards `max_deliveries`.
    async fn released(&self, id: &str) -> Result<u64, BusError> {
        let mut conn = self.shared.conn.clone();
        self.shared.ops.count("failure");
        let released: Option<u64> = redis::cmd("HGET")
            .arg(self.shared.failures_key())
            .arg(format!("{}#released", self.failure_field(id)))
            .query_async(&mut conn)
            .await?;
        Ok(released.unwrap_or(0))
    }

    /// The reason noted at the message's last failure.
    async fn last_failure(&self, id: &str) -> Result<Option<String>, BusError> {
        let mut conn = self.shared.conn.clone();
        self.shared.ops.count("failure");
        Ok(redis::cmd("HGET")
            .arg(self.shared.failures_key())
            .arg(self.failure_field(id))
            .query_async(&mut conn)
            .await?)
    }
}

#[async_trait]
impl Consumer for RedisConsumer {
    async fn next(&self, stop: &CancellationToken) -> Result<Option<Delivery>, BusError> {
        loop {
            if stop.is_cancelled() {
                return Ok(None);
            }
            let delivery = if self.claim_due() {
                let claimed = self.claim_stuck().await?;
                if claimed.is_some() {
                    // There may be more: look again at once next time.
                    *self.last_claim.lock().unwrap_or_else(|e| e.into_inner()) = None;
                }
                claimed
            } else {
                None
            };
            let delivery = match delivery {
                Some(d) => Some(d),
                // Not cut short at a stop: a read dropped mid-way may still take a
                // message in Redis, which would then wait `claim_idle` for another
                // consumer. A read waits `block` at most.
                None => self.read_new().await?,
            };
            let Some(delivery) = delivery else { continue };
            let mut delivery = delivery;
            if delivery.deliveries > self.shared.config.max_deliveries
                && delivery.deliveries - self.released(&delivery.id).await?
                    > self.shared.config.max_deliveries
            {
                // The pipeline dead-letters it (and fails its mention), saying why.
                delivery.exhausted = Some(match self.last_failure(&delivery.id).await? {
                    Some(reason) => format!(
                        "failed {} times; the last time: {reason}",
                        delivery.deliveries - 1
                    ),
                    None => format!(
                        "handed out {} times and never acknowledged (its consumers died or \
                         stopped while working on it)",
                        delivery.deliveries - 1
                    ),
                });
            }
            if delivery.deliveries > 1 {
                tracing::info!(
                    stream = self.topic.name(),
                    messageId = %delivery.id,
                    mentionId = delivery.mention_id().unwrap_or(""),
                    deliveries = delivery.deliveries,
                    "took over a message another consumer left unfinished"
                );
            }
            self.working().insert(delivery.id.clone());
            return Ok(Some(delivery));
        }
    }

    async fn ack(&self, delivery: &Delivery) -> Result<(), BusError> {
        self.working().remove(&delivery.id);
        let mut conn = self.shared.conn.clone();
        self.shared.ops.count("ack");
        let acked: i64 = redis::Script::new(ACK)
            .key(&self.stream)
            .key(self.shared.failures_key())
            .arg(self.group)
            .arg(&self.name)
            .arg(&delivery.id)
            .arg(self.failure_field(&delivery.id))
            .invoke_async(&mut conn)
            .await?;
        if acked == 0 {
            tracing::info!(
                stream = self.topic.name(),
                messageId = %delivery.id,
                "not acknowledged: another consumer took the message over meanwhile"
            );
        }
        Ok(())
    }

    async fn release(&self, delivery: &Delivery) -> Result<(), BusError> {
        self.working().remove(&delivery.id);
        let mut conn = self.shared.conn.clone();
        self.shared.ops.count("failure");
        let _: Value = redis::cmd("HINCRBY")
            .arg(self.shared.failures_key())
            .arg(format!("{}#released", self.failure_field(&delivery.id)))
            .arg(1)
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    async fn failed(&self, delivery: &Delivery, reason: &str) -> Result<(), BusError> {
        // No longer kept claimed: after `claim_idle` a consumer takes it again.
        self.working().remove(&delivery.id);
        let mut conn = self.shared.conn.clone();
        self.shared.ops.count("failure");
        let _: Value = redis::cmd("HSET")
            .arg(self.shared.failures_key())
            .arg(self.failure_field(&delivery.id))
            .arg(reason)
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    async fn dead_letter(
        &self,
        delivery: &Delivery,
        reason: &str,
    ) -> Result<Option<String>, BusError> {
        self.working().remove(&delivery.id);
        let mut conn = self.shared.conn.clone();
        self.shared.ops.count("dead_letter");
        let at = homeserver_protocol::clock::unix_secs();
        let letter: String = redis::Script::new(DEAD_LETTER)
            .key(&self.stream)
            .key(self.shared.failures_key())
            .key(self.shared.key(Topic::DeadLetter.name()))
            .arg(self.group)
            .arg(&self.name)
            .arg(&delivery.id)
            .arg(self.failure_field(&delivery.id))
            .arg(self.topic.name())
            .arg(&delivery.payload)
            .arg(reason)
            .arg(delivery.deliveries)
            .arg(at)
            .invoke_async(&mut conn)
            .await?;
        if letter.is_empty() {
            return Err(BusError::Invalid(
                "not dead-lettered: another consumer took the message over meanwhile".into(),
            ));
        }
        Ok(Some(letter))
    }
}

/// Moves message ARGV[3] (of group ARGV[1]) to the dead letters (KEYS[3]) with where it
/// came from, its payload, the reason, its deliveries and the time, and acknowledges
/// it, in one step, unless a consumer other than ARGV[2] took it over meanwhile.
/// Returns the dead letter's id, or '' when it was not this consumer's.
const DEAD_LETTER: &str = r"
local entry = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if entry[1] and entry[1][2] ~= ARGV[2] then
  return ''
end
local letter = redis.call('XADD', KEYS[3], '*', 'stream', ARGV[5], 'id', ARGV[3],
  'payload', ARGV[6], 'reason', ARGV[7], 'deliveries', ARGV[8], 'at', ARGV[9])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[3])
redis.call('HDEL', KEYS[2], ARGV[4], ARGV[4] .. '#released')
return letter";

/// Publishes (XADD) only while the leader lease (KEYS[2]) holds ARGV[1].
const FENCED_PUBLISH: &str = r"
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return redis.error_reply('FENCED this process no longer holds the leader lease')
end
return redis.call('XADD', KEYS[1], '*', 'payload', ARGV[2])";

/// Acknowledges (and deletes) message ARGV[3] of group ARGV[1] and forgets its failure
/// note (KEYS[2], field ARGV[4]), unless another consumer than ARGV[2] took it over
/// meanwhile (this one stalled past the claim time): that one acknowledges it when
/// it is done. Returns 1 when acknowledged.
const ACK: &str = r"
local entry = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if entry[1] and entry[1][2] ~= ARGV[2] then
  return 0
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[3])
redis.call('HDEL', KEYS[2], ARGV[4], ARGV[4] .. '#released')
return 1";

/// Renews the claim on messages still owned by the consumer (ARGV[1] = group, ARGV[2]
/// = consumer, then ids): each is claimed again (JUSTID: its idle time restarts and no
/// delivery is counted) only while its pending entry names this consumer, checked and
/// claimed in one step, so a message another consumer took over is never taken back.
/// Returns the ids still owned.
const KEEP_CLAIMED: &str = r"
local owned = {}
for i = 3, #ARGV do
  local entry = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if entry[1] and entry[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    table.insert(owned, ARGV[i])
  end
end
return owned";

/// Claims the consumer's messages in work again every `every` (resetting their idle
/// time without counting a delivery), until the consumer is dropped.
async fn keep_claimed(consumer: Weak<RedisConsumer>, every: Duration) {
    let every = every.max(Duration::from_millis(100));
    let script = redis::Script::new(KEEP_CLAIMED);
    loop {
        tokio::time::sleep(every).await;
        let Some(consumer) = consumer.upgrade() else {
            return;
        };
        let ids: Vec<String> = consumer.working().iter().cloned().collect();
        if ids.is_empty() {
            continue;
        }
        let mut conn = consumer.shared.conn.clone();
        consumer.shared.ops.count("claim");
        let owned: Result<Vec<String>, _> = script
            .key(&consumer.stream)
            .arg(consumer.group)
            .arg(&consumer.name)
            .arg(&ids)
            .invoke_async(&mut conn)
            .await;
        match owned {
            Ok(owned) => {
                let mut working = consumer.working();
                for id in ids.iter().filter(|id| !owned.contains(id)) {
                    // Stalled past the claim time: another consumer has it now (or it
                    // was acknowledged meanwhile).
                    if working.remove(id) {
                        tracing::debug!(stream = consumer.topic.name(), messageId = %id, "no longer ours to keep claimed");
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::Io => {}
            Err(e) => {
                tracing::warn!(error = %e, stream = consumer.topic.name(), "could not keep messages claimed")
            }
        }
    }
}

#[cfg(test)]
mod tests;
