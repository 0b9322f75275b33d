//! What every stage of the bot needs, built once (see `app`): configuration, the bot's
//! key and homeserver client, the database, the bus, the index, the guests, the
//! providers and the metrics, plus a board of what health reports.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use homeserver_protocol::PublicKey;
use homeserver_runtime::PolicyRuntime;
use pk_client::PkClient;

use crate::bus::Bus;
use crate::config::BotConfig;
use crate::index::Index;
use crate::metrics::Metrics;
use crate::post::MentionMatcher;
use crate::providers::{AiModel, SearchApi};
use crate::shared::SharedState;
use crate::store::{ActionType, Store};

pub struct BotContext {
    pub config: BotConfig,
    /// The bot's public key (its identity on the network).
    pub key: PublicKey,
    /// The bot's homeserver, with requests signed by the bot's key.
    pub homeserver: PkClient,
    pub store: Store,
    /// Idempotency keys and rate limits (Redis with the Redis bus).
    pub shared: SharedState,
    pub bus: Arc<dyn Bus>,
    pub index: Arc<dyn Index>,
    /// The safety filter and the intent classifier.
    pub guests: Arc<PolicyRuntime>,
    /// None: local mode.
    pub ai: Option<Arc<dyn AiModel>>,
    pub search: Option<Arc<dyn SearchApi>>,
    pub matcher: MentionMatcher,
    pub metrics: Arc<Metrics>,
    pub status: Arc<StatusBoard>,
    /// Mentions recorded that the bus could not take yet (the poller tries again).
    pub unpublished: Mutex<Vec<crate::bus::MentionReceived>>,
    /// What the router decides one at a time: mentions of one author, or in one thread.
    pub routing_locks: KeyedLocks,
}

/// Locks by name, made on first use and forgotten when nobody holds or waits for them.
#[derive(Default)]
pub struct KeyedLocks(Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl KeyedLocks {
    /// Holds the locks of every key (taken in sorted order: two callers sharing keys
    /// never wait on each other crosswise) until the guards drop.
    pub async fn lock(&self, keys: &[&str]) -> Vec<tokio::sync::OwnedMutexGuard<()>> {
        let mut keys: Vec<&str> = keys.to_vec();
        keys.sort_unstable();
        keys.dedup();
        let mut guards = Vec::with_capacity(keys.len());
        for key in keys {
            let lock = {
                let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
                // Locks nobody holds or waits for any more go (the map stays small).
                map.retain(|_, l| Arc::strong_count(l) > 1);
                map.entry(key.to_owned()).or_default().clone()
            };
            guards.push(lock.lock_owned().await);
        }
        guards
    }
}

/// What the health endpoint reports that no store holds.
#[derive(Default)]
pub struct StatusBoard {
    /// Unix seconds of the last poll that worked, and the last error.
    last_poll: Mutex<(Option<i64>, Option<String>)>,
    pub signed_up: AtomicBool,
    /// The last AI or search call per provider: (unix seconds, the error if it failed).
    providers: Mutex<std::collections::BTreeMap<String, (i64, Option<String>)>>,
    busy_summary: AtomicUsize,
    busy_factcheck: AtomicUsize,
    /// What this process does now: all, leader, standby, summary-worker,
    /// factcheck-worker.
    role: Mutex<&'static str>,
}

impl StatusBoard {
    pub fn set_role(&self, role: &'static str) {
        *self.role.lock().unwrap_or_else(|e| e.into_inner()) = role;
    }

    pub fn role(&self) -> &'static str {
        *self.role.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this process polls and publishes now (so health expects polls).
    pub fn polls(&self) -> bool {
        matches!(self.role(), "all" | "leader")
    }

    pub fn poll_succeeded(&self, at: i64) {
        *self.last_poll.lock().unwrap_or_else(|e| e.into_inner()) = (Some(at), None);
    }

    pub fn poll_failed(&self, error: String) {
        self.last_poll.lock().unwrap_or_else(|e| e.into_inner()).1 = Some(error);
    }

    /// (last successful poll, last error since then)
    pub fn last_poll(&self) -> (Option<i64>, Option<String>) {
        self.last_poll
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records how a call to a provider went.
    pub fn provider_called(&self, provider: &str, at: i64, error: Option<String>) {
        self.providers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(provider.to_owned(), (at, error));
    }

    /// The last call to each provider: name, (unix seconds, error if it failed).
    pub fn providers(&self) -> std::collections::BTreeMap<String, (i64, Option<String>)> {
        self.providers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn busy(&self, action: ActionType) -> Option<&AtomicUsize> {
        match action {
            ActionType::Summary => Some(&self.busy_summary),
            ActionType::Factcheck => Some(&self.busy_factcheck),
            ActionType::None => None,
        }
    }

    /// Counts an action as running until the guard drops.
    pub fn running(&self, action: ActionType) -> Running<'_> {
        if let Some(n) = self.busy(action) {
            n.fetch_add(1, Ordering::Relaxed);
        }
        Running {
            board: self,
            action,
        }
    }

    pub fn busy_count(&self, action: ActionType) -> usize {
        self.busy(action).map_or(0, |n| n.load(Ordering::Relaxed))
    }
}

pub struct Running<'a> {
    board: &'a StatusBoard,
    action: ActionType,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.board.busy(self.action) {
            n.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl BotContext {
    /// The AI provider's name, or `local`.
    pub fn ai_name(&self) -> String {
        self.ai
            .as_ref()
            .map_or_else(|| "local".to_owned(), |a| a.name().to_owned())
    }
}
