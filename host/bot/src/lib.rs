//! `pkbot`: the mention bot. It watches the network for posts that name its key,
//! decides what each asks for (a thread summary or a fact-check), does it with an AI
//! model and web search (or locally, with neither), checks the reply against the
//! operator's wordlists and publishes it as a pubky.app reply on its homeserver.
//!
//! The pipeline, each stage on the bus (`bus`) and recorded in the database (`store`):
//! - [`poller`]: new mentions from the [`index`] → `mention.received.v1`;
//! - [`router`]: intent (the classifier guest, then the AI classifier), opt-outs and
//!   limits → `action.<type>.requested.v1` (or a notice, or nothing);
//! - [`workers`]: the summary and factcheck actions with the [`providers`] →
//!   `action.completed.v1`;
//! - [`publisher`]: the safety filter, then the reply post.
//!
//! With the Redis bus the stages run in several processes: one holds the [`lease`] and
//! runs the poller, router and publisher, others run workers (`WORKER_TYPE`); [`shared`]
//! keeps idempotency keys, action claims and rate limits where all of them see them,
//! and [`dlq`] and [`redrive`] are the operator's tools for dead letters and stuck
//! mentions.
//!
//! [`pipeline`] runs the stages and resumes after a crash; [`app`] builds everything
//! ([`context`]), [`health`] serves `/api/health*` and `/metrics` ([`metrics`]);
//! [`config`], [`identity`] (BIP39), [`post`] (pubky.app posts) and [`logging`] (the
//! spec's JSON lines) are the pieces around them.

pub mod app;
pub mod bus;
pub mod cli;
pub mod config;
pub mod context;
pub mod dlq;
pub mod failpoint;
pub mod health;
pub mod identity;
pub mod index;
pub mod lease;
pub mod logging;
pub mod metrics;
pub mod pipeline;
pub mod poller;
pub mod post;
pub mod providers;
pub mod publisher;
pub mod redrive;
pub mod router;
pub mod shared;
pub mod store;
pub mod workers;

pub use app::Bot;
pub use config::BotConfig;
