//! Builds the guests workspace (`guests/`) for wasm32-wasip2, so the default guests can be
//! compiled into the runtime (`include_bytes!` in src/builtin.rs) and the test guests
//! are at hand for the tests. This keeps `cargo run -p homeserver` working on a fresh
//! clone with nothing but the Rust toolchain.
//!
//! The nested cargo gets its own target directory next to the outer build's profile
//! directories (`<target>/wasm-guests`), shared by debug and release builds, so a clean
//! guest build (~1.5 min on 2 cores) happens once per target directory.
//!
//! rustup installs the `targets` of rust-toolchain.toml only when it installs the
//! toolchain itself, so a machine that already had Rust 1.95 lacks wasm32-wasip2. This
//! script looks for the target in the compiler's sysroot and, when it is missing, adds it
//! with `rustup target add` (a one-time download of ~20 MB) before building the guests.
//! Set `HOMESERVER_NO_TARGET_INSTALL=1` to be told instead.
//!
//! Set `HOMESERVER_SKIP_GUEST_BUILD=1` to skip it (e.g. a machine without the wasm
//! target): the runtime then has no built-in guests and serves only modules found in
//! `policies/` (slots without one keep their safe default).

#[path = "src/engine_config.rs"]
#[allow(dead_code)]
mod engine_config;

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The default guests: (crate file name, slot name).
const DEFAULT_GUESTS: [(&str, &str); 3] = [
    ("capability_policy", "capability-policy"),
    ("safety_filter", "safety-filter"),
    ("intent_classifier", "intent-classifier"),
];

/// Variables of the outer build that must not leak into the nested one: flags meant for
/// the host target, the outer target directory, and clippy's wrapper.
const LEAKY_ENV: [&str; 10] = [
    "RUSTFLAGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_BUILD_RUSTFLAGS",
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET_DIR",
    "CARGO_BUILD_TARGET",
    "RUSTC_WORKSPACE_WRAPPER",
    "CARGO_PROFILE_RELEASE_DEBUG",
    "CARGO_PROFILE_RELEASE_LTO",
    "CARGO_LLVM_COV",
];

/// The target the guests are built for.
const WASM_TARGET: &str = "wasm32-wasip2";

fn main() {
    println!("cargo:rerun-if-env-changed=HOMESERVER_SKIP_GUEST_BUILD");
    println!("cargo:rerun-if-env-changed=HOMESERVER_NO_TARGET_INSTALL");
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let repo = manifest_dir.join("../..");
    let guests = repo.join("guests");
    track(&guests, &repo.join("wit"));

    let skip =
        env::var_os("HOMESERVER_SKIP_GUEST_BUILD").is_some_and(|v| !v.is_empty() && v != "0");
    let target_dir = out_dir
        .ancestors()
        .nth(4)
        .map_or_else(|| out_dir.join("wasm-guests"), |t| t.join("wasm-guests"));
    let built = target_dir.join(WASM_TARGET).join("release");

    if skip {
        println!("cargo:warning=HOMESERVER_SKIP_GUEST_BUILD is set: no built-in guests");
        for (_, slot) in DEFAULT_GUESTS {
            fs::write(out_dir.join(format!("{slot}.wasm")), b"").expect("write placeholder");
            fs::write(out_dir.join(format!("{slot}.cwasm")), b"").expect("write placeholder");
        }
    } else {
        ensure_wasm_target();
        build_guests(&guests, &target_dir);
        for (file, slot) in DEFAULT_GUESTS {
            let from = built.join(format!("{file}.wasm"));
            fs::copy(&from, out_dir.join(format!("{slot}.wasm")))
                .unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
        }
        precompile_guests(&out_dir);
    }
    // Test guests (hostile, deny-all, wrong-world, policy-v0-1) are read from here by the tests.
    println!("cargo:rustc-env=HOMESERVER_TEST_GUESTS={}", built.display());
}

/// Compiles the built-in guests to native code for the engine the runtime makes with its
/// default settings (`<slot>.cwasm`), so a first start serves without compiling them
/// (~0.5 s on 2 cores). The engine here is made without the pooling allocator, which
/// does not enter wasmtime's compatibility check (the runtime test
/// `builtin_guests_come_precompiled_for_the_default_engine` would see if it did). The
/// runtime checks each artifact against its engine and compiles the guest itself when
/// they differ (other memory settings, or a binary moved to a CPU without the features
/// this one has). Cross builds get none.
fn precompile_guests(out_dir: &Path) {
    let host = env::var("HOST").unwrap_or_default();
    let target = env::var("TARGET").unwrap_or_default();
    let engine = (host == target)
        .then(|| {
            let config =
                engine_config::engine_config(engine_config::DEFAULT_MEMORY_LIMIT_BYTES, 0, false);
            wasmtime::Engine::new(&config)
                .map_err(|e| println!("cargo:warning=guests not precompiled: {e:#}"))
                .ok()
        })
        .flatten();
    for (_, slot) in DEFAULT_GUESTS {
        let wasm = fs::read(out_dir.join(format!("{slot}.wasm"))).expect("read guest");
        let artifact = engine.as_ref().and_then(|engine| {
            engine
                .precompile_component(&wasm)
                .map_err(|e| println!("cargo:warning={slot} not precompiled: {e:#}"))
                .ok()
        });
        fs::write(
            out_dir.join(format!("{slot}.cwasm")),
            artifact.unwrap_or_default(),
        )
        .expect("write precompiled guest");
    }
}

/// Makes sure the compiler has the standard library of [`WASM_TARGET`], installing it
/// through rustup when it is missing.
fn ensure_wasm_target() {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let Some(sysroot) = sysroot else {
        // Cannot tell; the guest build below reports a missing target itself.
        return;
    };
    let target_lib = sysroot.join("lib/rustlib").join(WASM_TARGET);
    // Not a rerun-if-changed path: installing the target below makes its folder newer
    // than this run's start, so cargo would run this script again (and rebuild every
    // crate that embeds the guests) on the next command. The target is needed only
    // when the guests are built, and this script runs whenever they change.
    if target_lib.is_dir() {
        return;
    }
    let subject = format!("the {WASM_TARGET} target (the Wasm guests are built for it)");
    let hint = format!(
        "{subject} is not installed for the compiler at {}",
        sysroot.display()
    );
    if env::var_os("HOMESERVER_NO_TARGET_INSTALL").is_some_and(|v| !v.is_empty() && v != "0") {
        panic!(
            "{hint}. Install it with `rustup target add {WASM_TARGET}`, or set \
             HOMESERVER_SKIP_GUEST_BUILD=1 to build without built-in guests."
        );
    }
    let mut rustup = Command::new("rustup");
    rustup.args(["target", "add", WASM_TARGET]);
    // The toolchain this build runs on (set by rustup's proxies), so the target lands
    // in the right toolchain even when several are installed.
    if let Ok(toolchain) = env::var("RUSTUP_TOOLCHAIN") {
        rustup.args(["--toolchain", &toolchain]);
    }
    match rustup.status() {
        // Said after the fact: cargo shows a build script's warnings again on every
        // build that reuses its output, so the line must stay true then.
        Ok(status) if status.success() => println!(
            "cargo:warning={subject} was not installed for the compiler at {}: installed \
             it with `rustup target add {WASM_TARGET}`",
            sysroot.display()
        ),
        Ok(status) => panic!(
            "{hint}, and `rustup target add {WASM_TARGET}` failed ({status}). Run it by hand \
             (it needs network access once), or set HOMESERVER_SKIP_GUEST_BUILD=1 to build \
             without built-in guests."
        ),
        Err(e) => panic!(
            "{hint}, and rustup could not be run ({e}). Install the target for this \
             compiler (with rustup: `rustup target add {WASM_TARGET}`), or set \
             HOMESERVER_SKIP_GUEST_BUILD=1 to build without built-in guests."
        ),
    }
}

fn build_guests(guests: &Path, target_dir: &Path) {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(cargo);
    command
        .args([
            "build",
            "--release",
            "--target",
            WASM_TARGET,
            "--manifest-path",
        ])
        .arg(guests.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir);
    for name in LEAKY_ENV {
        command.env_remove(name);
    }
    let status = command
        .status()
        .unwrap_or_else(|e| panic!("could not run cargo to build the guests: {e}"));
    if !status.success() {
        panic!(
            "building the guests failed ({status}). Is the wasm32-wasip2 target installed \
             (`rustup target add wasm32-wasip2`)? Set HOMESERVER_SKIP_GUEST_BUILD=1 to build \
             without built-in guests."
        );
    }
}

/// Rebuild when the guests' sources or the WIT change. Directories are scanned by cargo;
/// the guests' own `target/` (from a manual build) is left out so it does not retrigger.
fn track(guests: &Path, wit: &Path) {
    println!("cargo:rerun-if-changed={}", wit.display());
    let Ok(entries) = fs::read_dir(guests) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.file_name().is_some_and(|n| n == "target") {
            continue;
        }
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
