//! The bot's Prometheus series (the spec's `bot_*` names), in a registry of their own.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry,
    TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub mentions_received: IntCounter,
    pub actions_executed: IntCounterVec,
    pub action_duration: HistogramVec,
    pub replies_published: IntCounter,
    pub replies_blocked: IntCounter,
    pub ai_api_calls: IntCounterVec,
    pub ai_tokens_used: IntCounterVec,
    pub redis_operations: IntCounterVec,
    pub db_query_duration: Histogram,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let mentions_received = IntCounter::new(
            "bot_mentions_received_total",
            "Mentions of the bot taken in (each once).",
        )?;
        let actions_executed = IntCounterVec::new(
            Opts::new(
                "bot_actions_executed_total",
                "Actions run, by type and outcome.",
            ),
            &["type", "status"],
        )?;
        let action_duration = HistogramVec::new(
            HistogramOpts::new("bot_action_duration_seconds", "How long actions took.").buckets(
                vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
            ),
            &["type"],
        )?;
        let replies_published = IntCounter::new(
            "bot_replies_published_total",
            "Replies published on the homeserver.",
        )?;
        let replies_blocked = IntCounter::new(
            "bot_replies_blocked_total",
            "Replies the safety filter kept from being published.",
        )?;
        let ai_api_calls = IntCounterVec::new(
            Opts::new(
                "bot_ai_api_calls_total",
                "Calls to AI and search providers.",
            ),
            &["provider", "status"],
        )?;
        let ai_tokens_used = IntCounterVec::new(
            Opts::new("bot_ai_tokens_used_total", "Tokens AI calls used."),
            &["provider"],
        )?;
        let redis_operations = IntCounterVec::new(
            Opts::new(
                "bot_redis_operations_total",
                "Redis operations (the Redis bus; none with the in-process bus).",
            ),
            &["operation"],
        )?;
        let db_query_duration = Histogram::with_opts(
            HistogramOpts::new(
                "bot_db_query_duration_seconds",
                "How long database queries took.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
            ]),
        )?;
        registry.register(Box::new(mentions_received.clone()))?;
        registry.register(Box::new(actions_executed.clone()))?;
        registry.register(Box::new(action_duration.clone()))?;
        registry.register(Box::new(replies_published.clone()))?;
        registry.register(Box::new(replies_blocked.clone()))?;
        registry.register(Box::new(ai_api_calls.clone()))?;
        registry.register(Box::new(ai_tokens_used.clone()))?;
        registry.register(Box::new(redis_operations.clone()))?;
        registry.register(Box::new(db_query_duration.clone()))?;
        Ok(Self {
            registry,
            mentions_received,
            actions_executed,
            action_duration,
            replies_published,
            replies_blocked,
            ai_api_calls,
            ai_tokens_used,
            redis_operations,
            db_query_duration,
        })
    }

    /// Creates the series whose labels are known at start at zero, so that a dashboard
    /// (and `rate()`) sees them before the first event.
    pub fn prepare(&self, providers: &[&str]) {
        for action in ["summary", "factcheck"] {
            for status in ["success", "failed"] {
                self.actions_executed.with_label_values(&[action, status]);
            }
            self.action_duration.with_label_values(&[action]);
        }
        for provider in providers {
            for status in ["ok", "error"] {
                self.ai_api_calls.with_label_values(&[provider, status]);
            }
            self.ai_tokens_used.with_label_values(&[provider]);
        }
        for operation in ["publish", "consume", "ack"] {
            self.redis_operations.with_label_values(&[operation]);
        }
    }

    /// Adds the series of the guests this process calls (`bot_guest_*`: the safety
    /// filter and the intent classifier), read from their stats at scrape time.
    pub fn register_guests(
        &self,
        guests: std::sync::Arc<homeserver_runtime::PolicyRuntime>,
    ) -> Result<(), prometheus::Error> {
        let collector = homeserver_runtime::metrics::GuestCollector::new(guests, "bot")?;
        self.registry.register(Box::new(collector))
    }

    /// The text exposition of every series.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}
