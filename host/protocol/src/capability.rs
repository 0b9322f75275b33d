//! Capability strings `<read|write|*>:<path prefix>`. A prefix ending in `/` covers every
//! path under it; one that does not covers exactly that path. `read` allows GET, HEAD
//! and listing; `write` allows PUT and DELETE; `*` allows everything.
//!
//! The server never decides a session request with [`Capability::covers`]: the
//! capability-policy guest does. This native copy serves parsing, the client, golden
//! tests and benchmarks that compare the guest with native code.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::path::{PathError, StoragePath};

/// What a request does to a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Read,
    Write,
    All,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Read => "read",
            Action::Write => "write",
            Action::All => "*",
        }
    }

    /// Whether a capability granting `self` allows an operation of kind `op`.
    pub fn allows(self, op: Action) -> bool {
        self == Action::All || self == op
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CapabilityError {
    #[error("capability must be `<read|write|*>:<path>`")]
    Shape,
    #[error("capability action must be read, write or *")]
    Action,
    #[error("capability path: {0}")]
    Path(#[from] PathError),
}

/// One capability.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Capability {
    pub action: Action,
    pub prefix: StoragePath,
}

impl Capability {
    /// Whether this capability allows operation `op` on `path`.
    pub fn covers(&self, op: Action, path: &str) -> bool {
        if !self.action.allows(op) {
            return false;
        }
        let prefix = self.prefix.as_str();
        if prefix.ends_with('/') {
            path.starts_with(prefix)
        } else {
            path == prefix
        }
    }
}

impl FromStr for Capability {
    type Err = CapabilityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (action, path) = s.split_once(':').ok_or(CapabilityError::Shape)?;
        let action = match action {
            "read" => Action::Read,
            "write" => Action::Write,
            "*" => Action::All,
            _ => return Err(CapabilityError::Action),
        };
        Ok(Self {
            action,
            prefix: StoragePath::parse(path)?,
        })
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.action.as_str(), self.prefix)
    }
}

impl fmt::Debug for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Capability({self})")
    }
}

impl Serialize for Capability {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Capability {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(s: &str) -> Capability {
        s.parse().unwrap()
    }

    /// This native copy of the guest's rule must not drift from it: the golden cases
    /// of the capability-policy guest (testdata/guests) with a session caller and the
    /// default config, decided by `covers` (a string that does not parse grants
    /// nothing, as in the guest).
    #[test]
    fn agrees_with_the_guest_golden_cases() {
        let cases = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../testdata/guests/capability-policy/cases.jsonl"
        ))
        .unwrap();
        let mut checked = 0;
        for line in cases.lines().filter(|l| l.starts_with('{')) {
            let case: serde_json::Value = serde_json::from_str(line).unwrap();
            let input = &case["input"];
            let Some(capabilities) = input["caller"]["session"]["capabilities"].as_array() else {
                continue;
            };
            if case.get("config").is_some() {
                continue;
            }
            let op = match input["operation"].as_str() {
                Some("read") => Action::Read,
                Some("write") => Action::Write,
                other => panic!("{other:?}"),
            };
            let path = input["path"].as_str().unwrap();
            let allowed = capabilities.iter().any(|c| {
                c.as_str()
                    .and_then(|c| c.parse::<Capability>().ok())
                    .is_some_and(|c| c.covers(op, path))
            });
            assert_eq!(allowed, case["expect"]["allow"], "{}", case["name"]);
            checked += 1;
        }
        assert!(checked >= 8, "{checked} cases");
    }

    #[test]
    fn parse_and_display() {
        for s in ["read:/pub/", "write:/pub/app/", "*:/pub/a.txt"] {
            assert_eq!(cap(s).to_string(), s);
        }
        assert_eq!(
            "admin:/pub/".parse::<Capability>(),
            Err(CapabilityError::Action)
        );
        assert_eq!("read".parse::<Capability>(), Err(CapabilityError::Shape));
        assert_eq!(
            "read:/etc/".parse::<Capability>(),
            Err(CapabilityError::Path(PathError::Root))
        );
    }

    #[test]
    fn prefix_and_exact_matching() {
        let dir = cap("write:/pub/app/");
        assert!(dir.covers(Action::Write, "/pub/app/x"));
        assert!(dir.covers(Action::Write, "/pub/app/a/b"));
        assert!(!dir.covers(Action::Write, "/pub/application"));
        assert!(!dir.covers(Action::Read, "/pub/app/x"));
        let exact = cap("read:/pub/app");
        assert!(exact.covers(Action::Read, "/pub/app"));
        assert!(!exact.covers(Action::Read, "/pub/app/x"));
        assert!(!exact.covers(Action::Read, "/pub/apple"));
        let all = cap("*:/pub/");
        assert!(all.covers(Action::Read, "/pub/x"));
        assert!(all.covers(Action::Write, "/pub/x"));
    }
}
