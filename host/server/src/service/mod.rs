//! Services: the homeserver's rules, free of HTTP types. Routes call these; these call
//! persistence.
//!
//! - [`auth`]: signed requests and replay marks.
//! - [`caller`]: who the request being served proved to be (for the access log).
//! - [`access`]: who a request acts for and whether the capability policy lets it.
//! - [`admin_sign_in`]: the admin password, its brake and the admin page's sessions.
//! - [`sessions`]: capability-limited bearer sessions.
//! - [`storage`]: PUT, GET, DELETE and listing of entries.
//! - [`upload_staging`]: bounded memory for uploads whose signature is not proven yet.
//! - [`visibility`]: the policy's public answers, for listings and event streams.
//! - [`signup`]: registering users.
//! - [`readiness`]: whether the stores answer and the guests serve (`GET /ready`).
//! - [`error`]: [`ServiceError`], mapped to HTTP once in `client_server::error`.

pub mod access;
pub mod admin;
pub mod admin_sign_in;
pub mod auth;
pub mod backup;
pub mod caller;
pub mod entry_cache;
pub mod error;
pub mod events;
pub mod identity;
pub mod maintenance;
pub mod pkarr_publish;
pub mod readiness;
pub mod sessions;
pub mod signup;
pub mod storage;
pub mod upload_staging;
pub mod visibility;

pub use error::ServiceError;

/// Current Unix time in seconds.
pub use homeserver_protocol::clock::unix_secs_i64 as now_secs;
