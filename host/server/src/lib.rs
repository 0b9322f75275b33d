//! The homeserver: a per-user data store over HTTP.
//!
//! Layers, top to bottom: the listeners' routes ([`client_server`], [`admin_server`],
//! [`metrics_server`]) → [`service`] (the rules) → [`persistence`] (sqlx metadata,
//! object_store blobs). [`http`] is the machinery the listeners share (serving
//! connections, TLS, request ids, CORS, rate limits, the access log, extractors, the one
//! error mapping). [`context`] builds the [`AppContext`] the routes are handed;
//! [`app`], the orchestrator, builds it, binds the listeners, runs the upkeep and owns
//! shutdown. [`config`] loads settings and [`local_paths`] says where its files are;
//! [`metrics`] are the server's Prometheus metrics; [`server_key`] its key; [`cli`] the
//! command line and its tools (guests; fsck, export, import, migrate), `main.rs` only
//! parses and dispatches. docs/ARCHITECTURE.md draws the whole.

pub mod admin_server;
pub mod app;
pub mod cli;
pub mod client_server;
pub mod config;
pub mod context;
pub mod http;
pub mod local_paths;
pub mod metrics;
pub mod metrics_server;
pub mod persistence;
pub mod server_key;
pub mod service;

pub use app::Homeserver;
pub use config::Config;
pub use context::{AppContext, StartError};
