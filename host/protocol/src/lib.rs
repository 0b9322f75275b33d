//! The homeserver's wire protocol: the single implementation of every rule that the
//! server, the client library, the bot and the tests must agree on.
//!
//! - [`keys`]: Ed25519 keys and their z-base-32 text form.
//! - [`signed_request`]: the `Authorization: Pk ...` header, how it is made and verified.
//! - [`path`]: which storage paths are valid, and entry vs listing.
//! - [`capability`]: `<read|write|*>:<path prefix>` strings and their matching rule.
//! - [`error`]: the error codes, their HTTP statuses and the JSON error body.
//! - [`retry_after`]: the `Retry-After` header, both forms.
//! - [`secret`]: settings that never show (passwords, keys, URLs with passwords).
//! - [`wire`]: JSON bodies of the storage API (put/delete/list results, sessions, events).

pub mod capability;
pub mod clock;
pub mod error;
pub mod event;
pub mod keys;
pub mod path;
pub mod query;
pub mod retry_after;
pub mod secret;
pub mod signed_request;
pub mod wire;

pub use capability::{Action, Capability, CapabilityError};
pub use error::{ErrorBody, ErrorCode};
pub use keys::{Keypair, PublicKey, PublicKeyError};
pub use path::{PathError, StoragePath};
pub use signed_request::{
    AuthHeader, AuthHeaderError, BodyHash, CONTENT_DIGEST_HEADER, ContentDigestError,
    MAX_CLOCK_SKEW_SECS, VerifyError,
};
