//! A capability-policy guest built against the frozen WIT 0.1.0 (`wit/v0.1.0`), as a
//! guest built before 0.2.0 was: the host must keep loading it through its adapter.
//! Owners may do anything except under `/pub/frozen-closed/`; sessions may only read.
//! Every reason names the version, so tests can tell which guest answered.

use exports::homeserver::guest::policy::{Caller, Decision, Guest, Operation, Request};

wit_bindgen::generate!({
    path: "../../../wit/v0.1.0",
    world: "capability-policy",
});

struct PolicyV01;

impl Guest for PolicyV01 {
    fn authorize(req: Request) -> Decision {
        let (allow, why) = if req.path.starts_with("/pub/frozen-closed/") {
            (false, "closed")
        } else {
            match (&req.caller, req.operation) {
                (Caller::Owner, _) => (true, "owner"),
                (Caller::Session(_), Operation::Read) => (true, "session read"),
                (Caller::Session(_), Operation::Write) => (false, "sessions only read"),
            }
        };
        Decision {
            allow,
            reason: format!("0.1.0 guest: {why}"),
        }
    }
}

export!(PolicyV01);
