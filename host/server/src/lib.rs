//! The homeserver: a per-user data store over HTTP.
//!
//! Layers, top to bottom: [`client_server`] (HTTP routes) → [`service`] (the rules) →
//! [`persistence`] (sqlx metadata, object_store blobs). [`app`] builds the context and
//! runs the listeners; [`config`] loads settings; `main.rs` only parses the command line.

pub mod app;
pub mod cli;
pub mod client_server;
pub mod config;
pub mod persistence;
pub mod server_key;
pub mod service;

pub use app::{AppContext, Homeserver, StartError};
pub use config::Config;
