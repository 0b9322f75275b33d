//! The capability rules, as plain Rust (no WIT types) so they are tested on the host.
//!
//! Order of the checks, first match decides:
//! 1. `deny-prefixes` (operator rule): no operation for anyone, owners included.
//! 2. `read-only-prefixes` (operator rule): no write for anyone, owners included.
//! 3. The owner may do anything else.
//! 4. The public (an anonymous read, WIT 0.2.0) may read anything else; it never
//!    writes (the host does not even ask).
//! 5. A session needs a capability `<read|write|*>:<prefix>` whose action allows the
//!    operation and whose prefix covers the path: a prefix ending in `/` covers every
//!    path under it, any other prefix exactly that path (docs/API.md, "Sessions").
//!    Anything else is denied.

/// What the request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Read,
    Write,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
        }
    }
}

/// Who asks.
#[derive(Debug, Clone, Copy)]
pub enum Caller<'a> {
    /// Anyone, reading without credentials for the space.
    Public,
    Owner,
    Session(&'a [String]),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allow: bool,
    pub reason: String,
}

impl Decision {
    fn allow(reason: String) -> Self {
        Self {
            allow: true,
            reason,
        }
    }

    fn deny(reason: String) -> Self {
        Self {
            allow: false,
            reason,
        }
    }
}

/// The operator's rules, read once from the slot's config.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    /// Path prefixes nobody may read or write.
    pub deny: Vec<String>,
    /// Path prefixes nobody may write.
    pub read_only: Vec<String>,
}

impl Rules {
    /// Reads `deny-prefixes` and `read-only-prefixes` (lists: one prefix a line or
    /// comma separated) through `get`.
    pub fn from_config(get: impl Fn(&str) -> Option<String>) -> Self {
        let list = |key: &str| -> Vec<String> {
            get(key)
                .map(|value| text_fold::config_items(&value).map(str::to_owned).collect())
                .unwrap_or_default()
        };
        Self {
            deny: list("deny-prefixes"),
            read_only: list("read-only-prefixes"),
        }
    }

    /// Decides one request.
    pub fn decide(&self, operation: Operation, path: &str, caller: Caller<'_>) -> Decision {
        if let Some(prefix) = self.deny.iter().find(|p| covers(p, path)) {
            return Decision::deny(format!("{prefix} is closed by the operator"));
        }
        if operation == Operation::Write
            && let Some(prefix) = self.read_only.iter().find(|p| covers(p, path))
        {
            return Decision::deny(format!("{prefix} is read-only by operator policy"));
        }
        match caller {
            Caller::Owner => Decision::allow("owner".to_owned()),
            Caller::Public if operation == Operation::Read => {
                Decision::allow("public read".to_owned())
            }
            Caller::Public => Decision::deny("the public cannot write".to_owned()),
            Caller::Session(capabilities) => {
                match capabilities
                    .iter()
                    .find(|c| capability_allows(c, operation, path))
                {
                    Some(capability) => Decision::allow(format!("session capability {capability}")),
                    None => Decision::deny(format!(
                        "no session capability allows {} on {path}",
                        operation.as_str()
                    )),
                }
            }
        }
    }
}

/// Whether `prefix` covers `path`: a prefix ending in `/` covers its whole subtree,
/// any other prefix exactly that path.
pub fn covers(prefix: &str, path: &str) -> bool {
    if prefix.ends_with('/') {
        path.starts_with(prefix)
    } else {
        path == prefix
    }
}

/// Whether the capability string `<read|write|*>:<prefix>` allows `operation` on
/// `path`. A malformed capability allows nothing.
pub fn capability_allows(capability: &str, operation: Operation, path: &str) -> bool {
    let Some((action, prefix)) = capability.split_once(':') else {
        return false;
    };
    let action_ok = match action {
        "*" => true,
        "read" => operation == Operation::Read,
        "write" => operation == Operation::Write,
        _ => false,
    };
    action_ok && !prefix.is_empty() && covers(prefix, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use golden::{Case, Slot};

    fn caps(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn prefix_and_exact_matching() {
        let c = caps(&["write:/pub/app/", "read:/pub/a.txt"]);
        let rules = Rules::default();
        let s = Caller::Session(&c);
        assert!(rules.decide(Operation::Write, "/pub/app/x", s).allow);
        assert!(rules.decide(Operation::Write, "/pub/app/a/b", s).allow);
        assert!(!rules.decide(Operation::Write, "/pub/application", s).allow);
        assert!(!rules.decide(Operation::Read, "/pub/app/x", s).allow);
        assert!(rules.decide(Operation::Read, "/pub/a.txt", s).allow);
        assert!(!rules.decide(Operation::Read, "/pub/a.txt2", s).allow);
    }

    #[test]
    fn malformed_capabilities_grant_nothing() {
        for bad in ["/pub/", "admin:/pub/", "read", "read:", "*"] {
            assert!(!capability_allows(bad, Operation::Read, "/pub/x"), "{bad}");
        }
    }

    #[test]
    fn operator_rules_bind_owners_too() {
        let rules = Rules::from_config(|key| match key {
            "read-only-prefixes" => Some("/pub/archive/\n# comment\n".to_owned()),
            "deny-prefixes" => Some("/pub/secret/, /pub/exact".to_owned()),
            _ => None,
        });
        let owner = Caller::Owner;
        assert!(rules.decide(Operation::Read, "/pub/archive/x", owner).allow);
        assert!(
            !rules
                .decide(Operation::Write, "/pub/archive/x", owner)
                .allow
        );
        assert!(!rules.decide(Operation::Read, "/pub/secret/x", owner).allow);
        assert!(!rules.decide(Operation::Read, "/pub/exact", owner).allow);
        assert!(rules.decide(Operation::Read, "/pub/exactly", owner).allow);
        assert!(
            !rules
                .decide(Operation::Read, "/pub/secret/x", Caller::Public)
                .allow
        );
        assert!(
            rules
                .decide(Operation::Read, "/pub/archive/x", Caller::Public)
                .allow
        );
        assert!(
            !rules
                .decide(Operation::Write, "/pub/x", Caller::Public)
                .allow
        );
        let all = caps(&["*:/pub/"]);
        assert!(
            !rules
                .decide(Operation::Write, "/pub/archive/y", Caller::Session(&all))
                .allow
        );
    }

    /// The golden cases in testdata/guests/capability-policy, natively.
    #[test]
    fn golden_cases() {
        let cases = golden::cases(Slot::CapabilityPolicy);
        assert!(cases.len() >= 10);
        for Case {
            name,
            config,
            input,
            expect,
        } in cases
        {
            let rules = Rules::from_config(|key| config.get(key).cloned());
            let operation = match input["operation"].as_str() {
                Some("read") => Operation::Read,
                Some("write") => Operation::Write,
                other => panic!("{name}: bad operation {other:?}"),
            };
            let path = input["path"].as_str().expect("path");
            let session: Option<Vec<String>> = input["caller"]["session"]["capabilities"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|v| v.as_str().expect("string").to_owned())
                        .collect()
                });
            let caller = match (&session, input["caller"].as_str()) {
                (Some(c), _) => Caller::Session(c),
                (None, Some("owner")) => Caller::Owner,
                (None, Some("public")) => Caller::Public,
                (None, other) => panic!("{name}: bad caller {other:?}"),
            };
            let decision = rules.decide(operation, path, caller);
            assert_eq!(
                decision.allow,
                expect["allow"].as_bool().expect("allow"),
                "{name}: {decision:?}"
            );
        }
    }
}
