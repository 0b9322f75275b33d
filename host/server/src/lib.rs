//! The homeserver: a per-user data store over HTTP.
//!
//! Layers, top to bottom: the HTTP servers ([`client_server`], [`admin_server`],
//! [`metrics_server`]) → [`service`] (the rules) → [`persistence`] (sqlx metadata,
//! object_store blobs). [`app`] builds the context and runs the listeners ([`serve`],
//! with [`tls`] for the raw-public-key and X.509 listeners);
//! [`config`] loads settings and [`local_paths`] says where its files are; [`rate_limit`]
//! and [`metrics`] wrap client requests, [`cors`] answers browsers on other origins (in
//! [`request_id`]'s layer), [`access_log`] writes a line per request, and
//! [`stream_slots`] caps each address's open event streams;
//! [`pkarr_publish`] keeps the server's and its users' records on the mainline DHT;
//! [`policy_cli`] and [`maintenance_cli`] are the command-line tools (guests; fsck,
//! export, import, migrate); `main.rs` only parses the command line.

pub mod access_log;
pub mod admin_server;
pub mod app;
pub mod cli;
pub mod client_server;
pub mod config;
pub mod cors;
pub mod local_paths;
pub mod maintenance_cli;
pub mod metrics;
pub mod metrics_server;
pub mod persistence;
pub mod pkarr_publish;
pub mod policy_cli;
pub mod policy_template;
pub mod rate_limit;
pub mod request_id;
pub mod serve;
pub mod server_key;
pub mod service;
pub mod stream_slots;
pub mod tls;

pub use app::{AppContext, Homeserver, StartError};
pub use config::Config;
