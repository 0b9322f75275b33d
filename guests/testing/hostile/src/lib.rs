//! A hostile test guest for the sandbox tests. It exports all three slot interfaces, so
//! it fits any slot, and misbehaves when the input (path or text) contains a trigger:
//! `loop` spins forever, `alloc` allocates without bound, `stack` recurses without
//! bound, `panic` panics (a trap with panic=abort), `exit` calls `exit(1)`, `print`
//! writes to stdout and stderr and then answers normally. Other inputs get a harmless
//! answer (allow / not blocked / summary), so tests can see the slot still works.
//! Never part of the default policies.

use exports::homeserver::guest::intent::{Action, Classification, Guest as IntentGuest, Outcome};
use exports::homeserver::guest::policy::{Decision, Guest as PolicyGuest, Request};
use exports::homeserver::guest::safety::{Guest as SafetyGuest, Verdict};

wit_bindgen::generate!({
    path: "../../../wit",
    inline: "
        package homeserver:hostile;
        world hostile {
            include homeserver:guest/capability-policy@0.2.0;
            include homeserver:guest/safety-filter@0.2.0;
            include homeserver:guest/intent-classifier@0.2.0;
        }
    ",
    world: "homeserver:hostile/hostile",
    generate_all,
});

fn misbehave(input: &str) {
    if input.contains("loop") {
        let mut n: u64 = 0;
        loop {
            n = std::hint::black_box(n.wrapping_add(1));
        }
    }
    if input.contains("alloc") {
        let mut hoard: Vec<Vec<u8>> = Vec::new();
        loop {
            hoard.push(vec![1u8; 1 << 20]);
            std::hint::black_box(&hoard);
        }
    }
    if input.contains("stack") {
        std::hint::black_box(recurse(u64::MAX));
    }
    if input.contains("panic") {
        panic!("hostile guest panics on purpose");
    }
    if input.contains("exit") {
        std::process::exit(1);
    }
    if input.contains("print") {
        println!("hostile guest writes to stdout");
        eprintln!("hostile guest writes to stderr");
    }
}

#[allow(unconditional_recursion)]
fn recurse(n: u64) -> u64 {
    let frame = std::hint::black_box([n; 64]);
    recurse(frame[0].wrapping_sub(1)).wrapping_add(frame[63])
}

struct Hostile;

impl PolicyGuest for Hostile {
    fn authorize(req: Request) -> Decision {
        misbehave(&req.path);
        Decision {
            allow: true,
            reason: "hostile guest: harmless input".to_owned(),
        }
    }
}

impl SafetyGuest for Hostile {
    fn check(text: String) -> Verdict {
        misbehave(&text);
        Verdict {
            matches: Vec::new(),
            blocked: false,
        }
    }
}

impl IntentGuest for Hostile {
    fn classify(text: String) -> Outcome {
        misbehave(&text);
        Outcome::Classified(Classification {
            action: Action::Summary,
            confidence: 1.0,
            matched: Vec::new(),
        })
    }
}

export!(Hostile);
