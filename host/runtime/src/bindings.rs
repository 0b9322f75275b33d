//! Host bindings generated from WIT, all in this one module: the three slot worlds of
//! `wit/guest.wit` (they share the `config` import, generated once in
//! `capability_policy` and reused by the others) and the WASI subset the sandbox
//! provides (`wit-wasi/sandbox.wit`, implemented in `wasi_shim`).

pub mod capability_policy {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "capability-policy",
    });
}

pub mod safety_filter {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "safety-filter",
        with: {
            "homeserver:guest/config": super::capability_policy::homeserver::guest::config,
        },
    });
}

pub mod intent_classifier {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "intent-classifier",
        with: {
            "homeserver:guest/config": super::capability_policy::homeserver::guest::config,
        },
    });
}

pub mod wasi {
    wasmtime::component::bindgen!({
        path: "wit-wasi",
        world: "homeserver:sandbox/sandbox",
        // These may end the call with a trap: `exit`, and oversized random requests.
        imports: {
            "wasi:cli/exit": trappable,
            "wasi:random": trappable,
        },
    });
}

pub use capability_policy::homeserver::guest::config as guest_config;
