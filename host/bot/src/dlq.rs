//! `pkbot dlq list` and `pkbot dlq replay [ID]`: the operator's side of the dead
//! letters. Every dead letter is a row of the `dead_letters` table (with why, and the
//! mention it is about); with the Redis bus it is also an entry of `dead-letter.v1`,
//! and those entries are what is listed and replayed: replaying one puts its payload
//! back on its stream as a new message (its mention moved back from `failed` first, so
//! the stage takes it up) and removes it from the dead letters (the stream's entry and
//! the row). With the in-process bus, replaying a row moves its mention back to
//! `pending`, and the running bot's re-drive takes it up within
//! `workers.redrive_interval_secs`.

use crate::bus::{DeadLetterEntry, RedisBus, Topic};
use crate::config::{BotConfig, BusKind};
use crate::store::{MentionStatus, Store};

#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("the Redis bus at {url}: {source}")]
    Bus {
        url: String,
        source: crate::bus::BusError,
    },
    #[error("no dead letter with id `{0}` (`pkbot dlq list` shows them)")]
    NoSuchLetter(String),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("{0}")]
    Usage(String),
}

/// The bot's dead letters, wherever its bus keeps them.
pub struct DeadLetters {
    store: Store,
    redis: Option<RedisBus>,
}

impl DeadLetters {
    pub async fn open(config: &BotConfig) -> Result<Self, DlqError> {
        let metrics = crate::metrics::Metrics::new()?;
        let store = Store::open(
            config.storage.database_url.expose(),
            metrics.db_query_duration.clone(),
        )
        .await?;
        let redis = match config.bus.kind {
            BusKind::InProcess => None,
            BusKind::Redis => Some(
                RedisBus::connect(config.bus.redis(), metrics.redis_operations.clone())
                    .await
                    .map_err(|source| DlqError::Bus {
                        url: config.bus.redis_url.redacted(),
                        source,
                    })?,
            ),
        };
        Ok(Self { store, redis })
    }

    fn bus_error(&self, source: crate::bus::BusError) -> DlqError {
        DlqError::Bus {
            url: "redis".into(),
            source,
        }
    }

    /// The bot's database.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The Redis bus, when the bot runs on it.
    pub fn redis(&self) -> Option<&RedisBus> {
        self.redis.as_ref()
    }

    pub async fn list(&self) -> Result<Vec<DeadLetterEntry>, DlqError> {
        match &self.redis {
            Some(bus) => bus.dead_letters().await.map_err(|e| self.bus_error(e)),
            None => Ok(self.store.dead_letters().await?),
        }
    }

    /// Replays the letter `id`, or every letter; returns those replayed.
    pub async fn replay(&self, id: Option<&str>) -> Result<Vec<DeadLetterEntry>, DlqError> {
        let letters = self.list().await?;
        let chosen: Vec<DeadLetterEntry> = match id {
            Some(id) => {
                let letter = letters
                    .into_iter()
                    .find(|l| l.id == id)
                    .ok_or_else(|| DlqError::NoSuchLetter(id.to_owned()))?;
                vec![letter]
            }
            None => letters,
        };
        let mut replayed = Vec::new();
        for letter in chosen {
            // Back from `failed` first, so the stage does not skip it as done.
            if let Some(mention) = letter.mention_id() {
                let status =
                    if letter.stream == Topic::MentionReceived.name() || self.redis.is_none() {
                        MentionStatus::Pending
                    } else {
                        MentionStatus::Processing
                    };
                self.store.reopen_mention(&mention, status).await?;
            }
            match &self.redis {
                Some(bus) => {
                    if bus
                        .replay(&letter.id)
                        .await
                        .map_err(|e| self.bus_error(e))?
                        .is_none()
                    {
                        continue; // replayed by someone else meanwhile
                    }
                    self.store.remove_bus_dead_letter(&letter.id).await?;
                }
                None => {
                    let id = letter.id.parse().unwrap_or(-1);
                    if !self.store.remove_dead_letter(id).await? {
                        continue;
                    }
                }
            }
            replayed.push(letter);
        }
        Ok(replayed)
    }

    pub async fn close(&self) {
        self.store.close().await;
    }
}
