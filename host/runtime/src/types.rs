//! The values the server exchanges with the runtime: requests and answers of the three
//! slots, in plain Rust (the WIT types stay inside the runtime). They serialize to the
//! JSON lines `homeserver policy eval` reads and writes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::GuestFailure;

/// A slot: a place the homeserver loads one guest into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Slot {
    /// Decides every authorized request (world `capability-policy`).
    CapabilityPolicy,
    /// Checks the bot's replies against wordlists (world `safety-filter`).
    SafetyFilter,
    /// Classifies the intent of a mention (world `intent-classifier`).
    IntentClassifier,
}

impl Slot {
    pub const ALL: [Slot; 3] = [
        Slot::CapabilityPolicy,
        Slot::SafetyFilter,
        Slot::IntentClassifier,
    ];

    /// The slot's name, which is also its world's name and its section in policies.toml.
    pub fn name(self) -> &'static str {
        match self {
            Slot::CapabilityPolicy => "capability-policy",
            Slot::SafetyFilter => "safety-filter",
            Slot::IntentClassifier => "intent-classifier",
        }
    }

    /// The interface a guest for this slot exports in the current contract (the host
    /// also loads guests of the versions in [`WIT_VERSIONS`]).
    pub fn interface(self) -> &'static str {
        match self {
            Slot::CapabilityPolicy => "homeserver:guest/policy@0.2.0",
            Slot::SafetyFilter => "homeserver:guest/safety@0.2.0",
            Slot::IntentClassifier => "homeserver:guest/intent@0.2.0",
        }
    }

    /// What a failed call yields.
    pub fn safe_default(self) -> &'static str {
        match self {
            Slot::CapabilityPolicy => "deny",
            Slot::SafetyFilter => "block",
            Slot::IntentClassifier => "ambiguous",
        }
    }
}

/// The versions of the guest contract (`homeserver:guest`) the host loads, newest first:
/// `wit/guest.wit` and the frozen `wit/v0.1.0/guest.wit`.
pub const WIT_VERSIONS: [&str; 2] = ["0.2.0", "0.1.0"];

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown slot name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown slot `{0}` (expected capability-policy, safety-filter or intent-classifier)")]
pub struct UnknownSlot(pub String);

impl FromStr for Slot {
    type Err = UnknownSlot;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Slot::ALL
            .into_iter()
            .find(|slot| slot.name() == s)
            .ok_or_else(|| UnknownSlot(s.to_owned()))
    }
}

/// What a request does: `Read` is GET, HEAD and listing; `Write` is PUT and DELETE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    Read,
    Write,
}

/// The HTTP method of the request (WIT 0.2.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Get,
    Head,
    Put,
    Delete,
}

/// Who asks.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Caller {
    /// Anyone, reading without credentials for the space (WIT 0.2.0; a 0.1.0 policy is
    /// not asked: the host allows).
    Public,
    /// A request signed with the space owner's key.
    Owner,
    /// A session with its capability strings (`<read|write|*>:<path prefix>`).
    Session { capabilities: Vec<String> },
}

/// One question to the capability policy. JSON: `{"operation": "read", "path":
/// "/pub/x", "caller": "public" | "owner" | {"session": {"capabilities": [..]}},
/// "user": "<z32>"}`, optionally with `"method"`, `"listing"` and `"size"` (by default
/// GET for a read, PUT for a write, a listing when the path ends in `/`, no size).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthorizeRequest {
    pub operation: Operation,
    /// The validated storage path.
    pub path: String,
    pub caller: Caller,
    /// z-base-32 public key of the space owner.
    #[serde(default)]
    pub user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<Method>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listing: Option<bool>,
    /// The declared size of the value written (a PUT with `Content-Length`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

impl AuthorizeRequest {
    /// A request with the defaults for the 0.2.0 details (see the type's docs).
    pub fn new(
        operation: Operation,
        path: impl Into<String>,
        caller: Caller,
        user: String,
    ) -> Self {
        Self {
            operation,
            path: path.into(),
            caller,
            user,
            method: None,
            listing: None,
            size: None,
        }
    }

    /// The method, or the default for the operation.
    pub fn method(&self) -> Method {
        self.method.unwrap_or(match self.operation {
            Operation::Read => Method::Get,
            Operation::Write => Method::Put,
        })
    }

    /// Whether this asks about a listing (by default: the path ends in `/`).
    pub fn listing(&self) -> bool {
        self.listing.unwrap_or_else(|| self.path.ends_with('/'))
    }
}

/// The policy's answer. A guest *failure* is not a `Decision`: see
/// [`crate::PolicyRuntime::authorize`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub allow: bool,
    pub reason: String,
}

/// One wordlist term found in a text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TermMatch {
    pub term: String,
    pub list: String,
}

/// The safety filter's answer. When the guest failed, `blocked` is true (the safe
/// default) and `failure` says why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SafetyVerdict {
    pub blocked: bool,
    pub matches: Vec<TermMatch>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "failure_text"
    )]
    pub failure: Option<GuestFailure>,
}

impl SafetyVerdict {
    /// The verdict of a filter call: the guest's answer, or the safe default.
    pub(crate) fn of(result: Result<(bool, Vec<TermMatch>), GuestFailure>) -> Self {
        match result {
            Ok((blocked, matches)) => Self {
                blocked,
                matches,
                failure: None,
            },
            Err(failure) => Self::failed(failure),
        }
    }

    pub(crate) fn failed(failure: GuestFailure) -> Self {
        Self {
            blocked: true,
            matches: Vec::new(),
            failure: Some(failure),
        }
    }

    /// True when this is the safe default after a guest failure, not the guest's answer.
    pub fn is_failure(&self) -> bool {
        self.failure.is_some()
    }
}

/// The actions the bot knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IntentAction {
    Summary,
    Factcheck,
}

impl IntentAction {
    pub fn name(self) -> &'static str {
        match self {
            IntentAction::Summary => "summary",
            IntentAction::Factcheck => "factcheck",
        }
    }
}

/// The intent classifier's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Intent {
    /// Keywords of exactly one action matched.
    Action {
        action: IntentAction,
        confidence: f32,
        matched: Vec<String>,
    },
    /// Keywords of several actions matched (listed), or none: ask the AI classifier.
    Ambiguous { matched: Vec<String> },
    /// The guest failed (trap, timeout, no module). Treat as ambiguous.
    Failed(GuestFailure),
}

impl Intent {
    /// The action, when the heuristic is sure.
    pub fn action(&self) -> Option<IntentAction> {
        match self {
            Intent::Action { action, .. } => Some(*action),
            _ => None,
        }
    }

    /// True for `Ambiguous` and for `Failed` (whose safe default is ambiguous).
    pub fn is_ambiguous(&self) -> bool {
        self.action().is_none()
    }
}

/// JSON: `{"action": "summary"|"factcheck"|"ambiguous", "confidence": f, "matched":
/// [..]}`, plus `"failure": "..."` when the guest failed.
impl Serialize for Intent {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        match self {
            Intent::Action {
                action,
                confidence,
                matched,
            } => {
                map.serialize_entry("action", action.name())?;
                map.serialize_entry("confidence", confidence)?;
                map.serialize_entry("matched", matched)?;
            }
            Intent::Ambiguous { matched } => {
                map.serialize_entry("action", "ambiguous")?;
                map.serialize_entry("matched", matched)?;
            }
            Intent::Failed(failure) => {
                map.serialize_entry("action", "ambiguous")?;
                map.serialize_entry("matched", &Vec::<String>::new())?;
                map.serialize_entry("failure", &failure.to_string())?;
            }
        }
        map.end()
    }
}

fn failure_text<S: serde::Serializer>(
    failure: &Option<GuestFailure>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match failure {
        Some(f) => s.serialize_str(&f.to_string()),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_json_shape() {
        let owner: AuthorizeRequest =
            serde_json::from_str(r#"{"operation":"read","path":"/pub/a","caller":"owner"}"#)
                .unwrap();
        assert_eq!(owner.caller, Caller::Owner);
        assert_eq!(
            (owner.method(), owner.listing(), owner.size),
            (Method::Get, false, None)
        );
        let public: AuthorizeRequest = serde_json::from_str(
            r#"{"operation":"read","path":"/pub/","caller":"public","method":"head"}"#,
        )
        .unwrap();
        assert_eq!(public.caller, Caller::Public);
        assert_eq!((public.method(), public.listing()), (Method::Head, true));
        let session: AuthorizeRequest = serde_json::from_str(
            r#"{"operation":"write","path":"/pub/a","caller":{"session":{"capabilities":["write:/pub/"]}},"user":"u"}"#,
        )
        .unwrap();
        assert_eq!(
            session.caller,
            Caller::Session {
                capabilities: vec!["write:/pub/".into()]
            }
        );
    }

    #[test]
    fn slot_names_round_trip() {
        for slot in Slot::ALL {
            assert_eq!(slot.name().parse::<Slot>(), Ok(slot));
        }
        assert!("policy".parse::<Slot>().is_err());
    }
}
