//! Client library for the homeserver API, shared by the `pk` tool, the bot and the tests.
//!
//! [`PkClient`] talks to one homeserver as (optionally) one user. Every wire rule comes
//! from `homeserver-protocol`: keys and their text form, the signed `Authorization: Pk`
//! header, path validation and the JSON bodies. This crate adds only what a client needs
//! on top: building request targets, choosing timestamps so that no write is refused as
//! a replay, streaming bodies in and out, and turning error responses into typed errors.
//!
//! - [`client`]: [`PkClient`] and its operations (signup, account, put, get, head, list,
//!   delete), and how it retries requests turned away for load ([`RetryPolicy`]).
//! - [`events`]: the event feed ([`PkClient::events`]) and event streams
//!   ([`PkClient::stream`], Server-Sent Events).
//! - [`target`]: request targets (path plus `?query`), the exact string that is signed.
//! - [`clock`]: timestamps for signed writes.
//! - [`response`]: streamed GET answers and entry metadata from headers.
//! - [`transfer`]: values to and from local files, checked against their content hash.
//! - [`tls`]: TLS to a homeserver named by its public key (RFC 7250 raw public keys).
//! - [`pkarr`]: finding homeservers by key on the mainline DHT, and users' records.
//! - [`error`]: the [`ClientError`] type.
//! - [`app`]: pubky.app posts (ids, URIs, the post value), for `pk post` and the bot.

// Tests may unwrap: a panic is the failure report there.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod app;
pub mod client;
pub mod clock;
pub mod error;
pub mod events;
pub mod pkarr;
pub mod response;
pub mod target;
pub mod tls;
pub mod transfer;

pub use client::{
    AccountInfo, DEFAULT_HOMESERVER, PUBKY_HOST_HEADER, PkClient, Progress, RetryNotice,
    RetryPolicy, SignupStatus,
};
pub use error::ClientError;
pub use events::StreamRequest;
pub use response::{EntryMeta, GetResponse};
pub use target::ListOptions;
pub use transfer::{DownloadOptions, Downloaded};

/// The protocol crate, re-exported so users of the client need no second dependency.
pub use homeserver_protocol as protocol;
pub use homeserver_protocol::event::{Event, EventKind, EventPage};
pub use homeserver_protocol::wire::{DeleteResult, ListEntry, ListResult, PutResult, SignupResult};
pub use homeserver_protocol::{ErrorBody, ErrorCode, Keypair, PublicKey, StoragePath};
