//! Host bindings generated from WIT, all in this one module: the three slot worlds of
//! `wit/guest.wit` (they share the `config` import, generated once in
//! `capability_policy` and reused by the others), the same worlds of the frozen 0.1.0
//! contract (`wit/v0.1.0`, module [`v0_1`]: guests built for it still load; `module`
//! maps their types), and the WASI subset the sandbox provides (`wit-wasi/sandbox.wit`,
//! implemented in `wasi_shim`).
//!
//! Exports are async: a call runs on a fiber and yields to the async runtime at epoch
//! ticks (see `sandbox`), so a guest that loops holds no worker thread. Imports stay
//! synchronous: they answer from memory and never wait.

pub mod capability_policy {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "capability-policy",
        exports: { default: async },
    });
}

pub mod safety_filter {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "safety-filter",
        exports: { default: async },
        with: {
            "homeserver:guest/config": super::capability_policy::homeserver::guest::config,
        },
    });
}

pub mod intent_classifier {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "intent-classifier",
        exports: { default: async },
        with: {
            "homeserver:guest/config": super::capability_policy::homeserver::guest::config,
        },
    });
}

/// WIT 0.1.0, frozen: never regenerate from anything but `wit/v0.1.0`.
pub mod v0_1 {
    pub mod capability_policy {
        wasmtime::component::bindgen!({
            path: "../../wit/v0.1.0",
            world: "capability-policy",
            exports: { default: async },
        });
    }

    pub mod safety_filter {
        wasmtime::component::bindgen!({
            path: "../../wit/v0.1.0",
            world: "safety-filter",
            exports: { default: async },
            with: {
                "homeserver:guest/config": super::capability_policy::homeserver::guest::config,
            },
        });
    }

    pub mod intent_classifier {
        wasmtime::component::bindgen!({
            path: "../../wit/v0.1.0",
            world: "intent-classifier",
            exports: { default: async },
            with: {
                "homeserver:guest/config": super::capability_policy::homeserver::guest::config,
            },
        });
    }

    pub use capability_policy::homeserver::guest::config as guest_config;
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
