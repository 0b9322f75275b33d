//! The HTTP machinery every listener shares, free of routes and rules: serving
//! connections ([`serve`], with [`tls`] for the raw-public-key and X.509 listeners), the
//! layers around requests ([`request_id`] with [`cors`], [`rate_limit`],
//! [`access_log`], [`unread_body`]), the per-address cap on event streams
//! ([`stream_slots`]), reading requests ([`extract`], [`small_body`]) and the one
//! mapping of every error to a status and JSON body ([`error`]).

pub mod access_log;
pub mod cors;
pub mod error;
pub mod extract;
pub mod rate_limit;
pub mod request_id;
pub mod serve;
pub mod small_body;
pub mod stream_slots;
pub mod tls;
pub mod unread_body;
