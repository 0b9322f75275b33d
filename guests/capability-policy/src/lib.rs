//! The default capability-policy guest (WIT 0.2.0): the WIT glue around [`rules`].
//! Asked on every request to a space, public reads included; the rules come from the
//! slot's `config` (operator path rules) and the request (session capabilities). The
//! method, listing flag and size of 0.2.0 are not needed by these rules.

mod rules;

use std::sync::OnceLock;

use exports::homeserver::guest::policy::{Caller, Decision, Guest, Operation, Request};
use homeserver::guest::config;

wit_bindgen::generate!({
    path: "../../wit",
    world: "capability-policy",
});

/// Config never changes during an instance's life (see the WIT), so parse it once.
static RULES: OnceLock<rules::Rules> = OnceLock::new();

struct Policy;

impl Guest for Policy {
    fn authorize(req: Request) -> Decision {
        let rules = RULES.get_or_init(|| rules::Rules::from_config(config::get));
        let operation = match req.operation {
            Operation::Read => rules::Operation::Read,
            Operation::Write => rules::Operation::Write,
        };
        let caller = match &req.caller {
            Caller::Public => rules::Caller::Public,
            Caller::Owner => rules::Caller::Owner,
            Caller::Session(capabilities) => rules::Caller::Session(capabilities),
        };
        let decision = rules.decide(operation, &req.path, caller);
        Decision {
            allow: decision.allow,
            reason: decision.reason,
        }
    }
}

export!(Policy);
