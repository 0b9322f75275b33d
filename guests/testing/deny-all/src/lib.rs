//! The smallest capability-policy guest: denies every request, owners included. Used
//! by the hot-swap tests, and the template in docs/guests.md.

use exports::homeserver::guest::policy::{Decision, Guest, Request};

wit_bindgen::generate!({
    path: "../../../wit",
    world: "capability-policy",
});

struct DenyAll;

impl Guest for DenyAll {
    fn authorize(req: Request) -> Decision {
        Decision {
            allow: false,
            reason: format!("deny-all policy: {} is closed", req.path),
        }
    }
}

export!(DenyAll);
