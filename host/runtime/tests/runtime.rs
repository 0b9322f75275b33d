//! The runtime through real Wasm: golden cases, fail-closed hostile guests, hot swap
//! under load, the module cache, reload failures, the directory watcher and the tools.
//! Test guests come from build.rs (`HOMESERVER_TEST_GUESTS`).

// Helpers outside #[test] fns unwrap too (clippy.toml only covers the fns themselves).
#![allow(clippy::unwrap_used)]

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use homeserver_runtime::{
    AuthorizeRequest, Caller, GuestFailure, Intent, IntentAction, ModuleSource, Operation,
    PolicyRuntime, ReloadOutcome, RuntimeConfig, RuntimeError, Slot, TestOptions, TestOutcome,
    TestReport, TrapKind, case_files, check_module, eval_lines, install_defaults, test_cases,
};
use tempfile::TempDir;

const TEST_GUESTS: &str = env!("HOMESERVER_TEST_GUESTS");

fn guest(name: &str) -> PathBuf {
    Path::new(TEST_GUESTS).join(format!("{name}.wasm"))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A compiled-module cache shared by the tests (and test runs), so each guest is
/// compiled once instead of once per test.
fn shared_cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("guest-cache")
}

/// A policies directory with the repository's policies.toml and data, no modules (the
/// built-in guests serve).
fn policies_dir() -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = repo().join("policies");
    std::fs::copy(src.join("policies.toml"), dir.path().join("policies.toml")).unwrap();
    for sub in ["wordlists", "keywords"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        for entry in std::fs::read_dir(src.join(sub)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.path().join(sub).join(entry.file_name())).unwrap();
        }
    }
    dir
}

fn config(dir: &Path) -> RuntimeConfig {
    RuntimeConfig {
        policies_dir: dir.to_owned(),
        cache_dir: Some(shared_cache()),
        ..RuntimeConfig::default()
    }
}

fn session(capabilities: &[&str], operation: Operation, path: &str) -> AuthorizeRequest {
    AuthorizeRequest::new(
        operation,
        path,
        Caller::Session {
            capabilities: capabilities.iter().map(|c| (*c).to_owned()).collect(),
        },
        String::new(),
    )
}

fn owner(operation: Operation, path: &str) -> AuthorizeRequest {
    AuthorizeRequest::new(operation, path, Caller::Owner, String::new())
}

/// Replaces a file the way an operator's `cp new.wasm policies/x.wasm` would end up:
/// atomically, via a rename.
fn replace(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp-test");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn golden_cases_pass_through_wasm() {
    for (slot, file) in [
        (Slot::CapabilityPolicy, "capability_policy"),
        (Slot::SafetyFilter, "safety_filter"),
        (Slot::IntentClassifier, "intent_classifier"),
    ] {
        let report = check_module(&guest(file), slot).unwrap();
        assert!(
            report.cases.len() >= 15,
            "{slot}: {} cases",
            report.cases.len()
        );
        let failures: Vec<_> = report.failures().collect();
        assert!(failures.is_empty(), "{slot}: {failures:#?}");
    }
}

#[test]
fn builtin_guests_serve_a_fresh_directory() {
    let dir = policies_dir();
    let runtime = PolicyRuntime::load(config(dir.path())).unwrap();
    for status in runtime.status() {
        assert!(status.serving, "{status:?}");
        assert_eq!(status.source.as_deref(), Some("builtin"));
        assert!(status.last_error.is_none());
    }
    assert!(
        runtime
            .authorize(&owner(Operation::Write, "/pub/x"))
            .unwrap()
            .allow
    );
    let denied = runtime
        .authorize(&session(&["read:/pub/"], Operation::Write, "/pub/x"))
        .unwrap();
    assert!(!denied.allow && !denied.reason.is_empty());
    let verdict = runtime.check_text("f r e e  m 0 n e y");
    assert!(verdict.blocked && !verdict.is_failure());
    assert_eq!(verdict.matches[0].list, "spam");
    assert_eq!(
        runtime.classify("TL;DR?").action(),
        Some(IntentAction::Summary)
    );
    assert!(runtime.classify("hello").is_ambiguous());
}

/// A first start with no module cache (a new machine): the built-in guests come
/// precompiled in the binary for the default engine, so nothing is compiled; with
/// other memory settings (another engine) they are compiled, and still serve.
#[test]
fn builtin_guests_come_precompiled_for_the_default_engine() {
    let dir = policies_dir();
    let started = Instant::now();
    let runtime = PolicyRuntime::load(RuntimeConfig {
        policies_dir: dir.path().to_owned(),
        cache_dir: None,
        ..RuntimeConfig::default()
    })
    .unwrap();
    eprintln!("loaded in {:?}", started.elapsed());
    for status in runtime.status() {
        assert_eq!(status.from_cache, Some(true), "{status:?}");
    }
    assert!(runtime.check_text("claim your prize").blocked);

    let other = PolicyRuntime::load(RuntimeConfig {
        policies_dir: dir.path().to_owned(),
        cache_dir: None,
        memory_limit_bytes: 64 << 20,
        ..RuntimeConfig::default()
    })
    .unwrap();
    for status in other.status() {
        assert!(status.serving, "{status:?}");
        assert_eq!(status.from_cache, Some(false), "{status:?}");
    }
    assert!(other.check_text("claim your prize").blocked);
}

#[test]
fn missing_directory_uses_builtin_guests_and_data() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = PolicyRuntime::load(config(&dir.path().join("nowhere"))).unwrap();
    assert!(runtime.status().iter().all(|s| s.serving));
    assert!(runtime.check_text("claim your prize").blocked);
}

#[test]
fn operator_config_restricts_owners() {
    let dir = policies_dir();
    let toml = std::fs::read_to_string(dir.path().join("policies.toml")).unwrap();
    let toml = toml.replace(
        "read-only-prefixes = []",
        "read-only-prefixes = [\"/pub/archive/\"]",
    );
    std::fs::write(dir.path().join("policies.toml"), toml).unwrap();
    let runtime = PolicyRuntime::load(config(dir.path())).unwrap();
    let write = runtime
        .authorize(&owner(Operation::Write, "/pub/archive/2024"))
        .unwrap();
    assert!(!write.allow, "{write:?}");
    assert!(write.reason.contains("read-only"));
    assert!(
        runtime
            .authorize(&owner(Operation::Read, "/pub/archive/2024"))
            .unwrap()
            .allow
    );
    assert!(
        runtime
            .authorize(&owner(Operation::Write, "/pub/other"))
            .unwrap()
            .allow
    );
}

fn public(path: &str) -> AuthorizeRequest {
    AuthorizeRequest::new(Operation::Read, path, Caller::Public, String::new())
}

/// WIT 0.2.0: the operator's deny-prefixes bind the public too, and public answers are
/// cached with the module (a swap starts afresh).
#[test]
fn the_policy_decides_public_reads() {
    let dir = policies_dir();
    let toml = std::fs::read_to_string(dir.path().join("policies.toml")).unwrap();
    let toml = toml.replace("deny-prefixes = []", "deny-prefixes = [\"/pub/hidden/\"]");
    std::fs::write(dir.path().join("policies.toml"), toml).unwrap();
    let runtime = PolicyRuntime::load(config(dir.path())).unwrap();
    assert_eq!(runtime.status()[0].wit_version, Some("0.2.0"));
    let calls = || runtime.stats()[0].calls;
    let before = calls();
    assert!(!runtime.authorize(&public("/pub/hidden/x")).unwrap().allow);
    assert!(!runtime.authorize(&public("/pub/hidden/")).unwrap().allow);
    assert!(runtime.authorize(&public("/pub/open/x")).unwrap().allow);
    assert_eq!(calls(), before + 3);
    // Asked again: from the cache, the guest is not called.
    for _ in 0..10 {
        assert!(!runtime.authorize(&public("/pub/hidden/x")).unwrap().allow);
        assert!(runtime.authorize(&public("/pub/open/x")).unwrap().allow);
    }
    assert_eq!(calls(), before + 3);
    // Another method or the listing flag is another question.
    let mut head = public("/pub/open/x");
    head.method = Some(homeserver_runtime::Method::Head);
    assert!(runtime.authorize(&head).unwrap().allow);
    assert_eq!(calls(), before + 4);
    // So is another user's space.
    let mut other_user = public("/pub/open/x");
    other_user.user = "8pinxxgqs41n4aididenw5apqp1urfmzdztr8jt4abrkdn435ewo".into();
    assert!(runtime.authorize(&other_user).unwrap().allow);
    assert_eq!(calls(), before + 5);

    // A new policy (deny-all) answers afresh: nothing of the old module's cache stays.
    std::fs::copy(guest("deny_all"), dir.path().join("capability-policy.wasm")).unwrap();
    assert!(runtime.reload().is_ok());
    assert!(!runtime.authorize(&public("/pub/open/x")).unwrap().allow);
}

/// A session's and an owner's reads are cached like the public's (the 0.2.0 contract
/// makes `authorize` a function of its request and config): the same read with the
/// same capabilities is asked once; other capabilities, another caller, and writes
/// (whose answer may depend on their size) are asked.
#[test]
fn reads_of_every_caller_are_cached_and_writes_are_asked() {
    let dir = policies_dir();
    let runtime = PolicyRuntime::load(config(dir.path())).unwrap();
    let calls = || runtime.stats()[0].calls;
    let before = calls();
    let reader = session(&["read:/pub/a/"], Operation::Read, "/pub/a/x");
    let writer = session(&["*:/pub/a/"], Operation::Read, "/pub/a/x");
    let outside = session(&["read:/pub/a/"], Operation::Read, "/pub/b/x");
    for _ in 0..5 {
        assert!(runtime.authorize(&reader).unwrap().allow);
        assert!(runtime.authorize(&writer).unwrap().allow);
        assert!(!runtime.authorize(&outside).unwrap().allow);
        assert!(
            runtime
                .authorize(&owner(Operation::Read, "/pub/a/x"))
                .unwrap()
                .allow
        );
    }
    assert_eq!(calls(), before + 4, "four questions, each asked once");
    for _ in 0..3 {
        assert!(
            runtime
                .authorize(&session(&["*:/pub/a/"], Operation::Write, "/pub/a/x"))
                .unwrap()
                .allow
        );
    }
    assert_eq!(calls(), before + 7, "writes are asked every time");
}

/// Many askers of the same new public question at once (a new path's event reaching
/// every subscriber of a stream) cost one guest call, not one each.
#[test]
fn a_public_question_asked_by_many_at_once_is_put_to_the_guest_once() {
    let dir = policies_dir();
    let runtime = Arc::new(PolicyRuntime::load(config(dir.path())).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let before = runtime.stats()[0].calls;
    rt.block_on(async {
        let askers: Vec<_> = (0..64)
            .map(|i| {
                let runtime = Arc::clone(&runtime);
                tokio::spawn(async move {
                    // Half ask alone, half as part of a batch with another question.
                    if i % 2 == 0 {
                        vec![
                            runtime
                                .authorize_isolated(&public("/pub/new"))
                                .await
                                .unwrap(),
                        ]
                    } else {
                        runtime
                            .authorize_many_isolated(vec![public("/pub/other"), public("/pub/new")])
                            .await
                            .unwrap()
                    }
                })
            })
            .collect();
        for asker in askers {
            assert!(asker.await.unwrap().iter().all(|d| d.allow));
        }
    });
    assert_eq!(
        runtime.stats()[0].calls,
        before + 2,
        "one call per question"
    );
}

/// A guest built from the frozen WIT 0.1.0 (guests/testing/policy-v0-1) still loads and
/// decides owners and sessions; it is not asked about public reads (they are allowed,
/// as 0.1.0 promised), and /admin/policies says which version serves.
#[test]
fn a_guest_built_for_wit_0_1_still_loads() {
    let dir = policies_dir();
    std::fs::copy(
        guest("policy_v0_1"),
        dir.path().join("capability-policy.wasm"),
    )
    .unwrap();
    let runtime = PolicyRuntime::load(config(dir.path())).unwrap();
    let status = &runtime.status()[0];
    assert!(status.serving, "{status:?}");
    assert_eq!(status.wit_version, Some("0.1.0"));
    assert!(
        status
            .source
            .as_deref()
            .unwrap()
            .ends_with("capability-policy.wasm"),
        "{status:?}"
    );
    let owner_write = runtime
        .authorize(&owner(Operation::Write, "/pub/a"))
        .unwrap();
    assert_eq!(
        (owner_write.allow, owner_write.reason.as_str()),
        (true, "0.1.0 guest: owner")
    );
    let closed = runtime
        .authorize(&owner(Operation::Read, "/pub/frozen-closed/a"))
        .unwrap();
    assert!(!closed.allow && closed.reason == "0.1.0 guest: closed");
    assert!(
        !runtime
            .authorize(&session(&["*:/pub/"], Operation::Write, "/pub/a"))
            .unwrap()
            .allow
    );
    let calls = runtime.stats()[0].calls;
    let public_read = runtime.authorize(&public("/pub/frozen-closed/a")).unwrap();
    assert!(public_read.allow, "{public_read:?}");
    assert_eq!(runtime.stats()[0].calls, calls, "a 0.1.0 policy was asked");

    // `policy check` runs it on the golden cases it can answer (not the public ones).
    let report = check_module(&guest("policy_v0_1"), Slot::CapabilityPolicy).unwrap();
    assert_eq!(report.wit_version, "0.1.0");
    assert!(
        report
            .cases
            .iter()
            .all(|c| c.input.get("caller") != Some(&"public".into()))
    );
}

/// Each misbehaviour fails that call only, with the slot's safe default, and the next
/// call on the same slot works.
#[test]
fn hostile_guests_fail_closed() {
    let dir = policies_dir();
    std::fs::copy(guest("hostile"), dir.path().join("hostile.wasm")).unwrap();
    std::fs::write(
        dir.path().join("policies.toml"),
        "[capability-policy]\nmodule = \"hostile.wasm\"\n\
         [safety-filter]\nmodule = \"hostile.wasm\"\n\
         [intent-classifier]\nmodule = \"hostile.wasm\"\n",
    )
    .unwrap();
    let runtime = PolicyRuntime::load(RuntimeConfig {
        memory_limit_bytes: 16 << 20,
        ..config(dir.path())
    })
    .unwrap();
    assert!(runtime.status().iter().all(|s| s.serving));

    let started = Instant::now();
    let timeout = runtime
        .authorize(&owner(Operation::Read, "/pub/loop"))
        .unwrap_err();
    assert!(matches!(timeout, GuestFailure::Timeout { .. }), "{timeout}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "deadline took {:?}",
        started.elapsed()
    );
    let memory = runtime
        .authorize(&owner(Operation::Read, "/pub/alloc"))
        .unwrap_err();
    assert!(
        matches!(memory, GuestFailure::MemoryLimit { .. }),
        "{memory}"
    );
    for (n, (trigger, kind)) in [
        ("panic", TrapKind::Panic),
        ("stack", TrapKind::Other),
        ("exit", TrapKind::Exit),
    ]
    .into_iter()
    .enumerate()
    {
        let failure = runtime
            .authorize(&owner(Operation::Read, &format!("/pub/{trigger}")))
            .unwrap_err();
        assert!(
            matches!(failure, GuestFailure::Trap { kind: k, .. } if k == kind),
            "{trigger}: {failure} ({failure:?})"
        );
        // A fresh instance answers next (another path each time: reads are cached).
        assert!(
            runtime
                .authorize(&owner(Operation::Read, &format!("/pub/ok{n}")))
                .unwrap()
                .allow
        );
    }
    // Printing is harmless: the output goes to the log.
    assert!(
        runtime
            .authorize(&owner(Operation::Read, "/pub/print"))
            .unwrap()
            .allow
    );

    let blocked = runtime.check_text("loop");
    assert!(blocked.blocked && blocked.is_failure(), "{blocked:?}");
    let memory = runtime.check_text("alloc");
    assert!(memory.blocked && matches!(memory.failure, Some(GuestFailure::MemoryLimit { .. })));
    assert!(!runtime.check_text("fine").blocked);

    assert!(matches!(
        runtime.classify("panic"),
        Intent::Failed(GuestFailure::Trap { .. })
    ));
    assert!(runtime.classify("panic").is_ambiguous());
    assert_eq!(
        runtime.classify("fine").action(),
        Some(IntentAction::Summary)
    );

    let stats = runtime.stats();
    let policy = &stats[0];
    assert_eq!(policy.slot, Slot::CapabilityPolicy);
    assert_eq!(policy.failures.timeout, 1);
    assert_eq!(policy.failures.memory, 1);
    assert_eq!(policy.failures.panic, 1);
    assert_eq!(policy.failures.exit, 1);
    assert_eq!(policy.failures.trap, 1, "the stack overflow");
    assert_eq!(policy.failures.total(), 5);
    assert_eq!(policy.latency.count, 9);
    // The `alloc` call grew its instance up to the cap: the high-water mark shows it.
    let cap = 16 * 1024 * 1024;
    assert!(
        policy.memory_high_water_bytes > cap / 2 && policy.memory_high_water_bytes <= cap,
        "high water {} bytes",
        policy.memory_high_water_bytes
    );
}

#[test]
fn wrong_world_and_garbage_are_rejected() {
    let err = check_module(&guest("wrong_world"), Slot::CapabilityPolicy).unwrap_err();
    assert!(matches!(err, RuntimeError::World { .. }), "{err}");
    assert!(
        err.to_string().contains("homeserver:guest/policy@0.2.0"),
        "{err}"
    );
    let err = check_module(&guest("safety_filter"), Slot::CapabilityPolicy).unwrap_err();
    assert!(matches!(err, RuntimeError::World { .. }), "{err}");
    let garbage = repo().join("testdata/guests/hostile/garbage.wasm");
    let err = check_module(&garbage, Slot::SafetyFilter).unwrap_err();
    assert!(matches!(err, RuntimeError::Compile { .. }), "{err}");

    // At startup a broken module leaves its slot on the safe default, and says why.
    let dir = policies_dir();
    std::fs::copy(&garbage, dir.path().join("capability-policy.wasm")).unwrap();
    std::fs::copy(guest("wrong_world"), dir.path().join("safety-filter.wasm")).unwrap();
    let runtime = PolicyRuntime::load(config(dir.path())).unwrap();
    let status = runtime.status();
    assert!(
        !status[0].serving
            && status[0]
                .last_error
                .as_deref()
                .unwrap()
                .contains("not a valid component")
    );
    assert!(!status[1].serving && status[1].last_error.is_some());
    assert!(status[2].serving);
    let failure = runtime
        .authorize(&owner(Operation::Read, "/pub/x"))
        .unwrap_err();
    assert!(
        matches!(failure, GuestFailure::Unavailable { .. }),
        "{failure}"
    );
    let verdict = runtime.check_text("hello");
    assert!(verdict.blocked && verdict.is_failure());
}

#[test]
fn broken_module_on_reload_keeps_the_old_one() {
    let dir = policies_dir();
    let module = dir.path().join("capability-policy.wasm");
    std::fs::copy(guest("capability_policy"), &module).unwrap();
    let runtime = PolicyRuntime::load(config(dir.path())).unwrap();
    let before = runtime.status()[0].clone();
    assert!(
        before.serving
            && before
                .source
                .as_deref()
                .unwrap()
                .ends_with("capability-policy.wasm")
    );

    for bad in [
        std::fs::read(repo().join("testdata/guests/hostile/garbage.wasm")).unwrap(),
        std::fs::read(guest("wrong_world")).unwrap(),
    ] {
        replace(&module, &bad);
        let report = runtime.reload();
        assert!(
            matches!(
                report.outcome(Slot::CapabilityPolicy),
                Some(ReloadOutcome::Failed { .. })
            ),
            "{report:?}"
        );
        assert_eq!(
            report.outcome(Slot::SafetyFilter),
            Some(&ReloadOutcome::Unchanged)
        );
        let after = runtime.status()[0].clone();
        assert!(after.serving);
        assert_eq!(after.blake3, before.blake3);
        assert!(after.last_error.is_some() && after.last_error_at.is_some());
        assert!(
            runtime
                .authorize(&owner(Operation::Read, "/pub/x"))
                .unwrap()
                .allow
        );
    }
    assert_eq!(runtime.stats()[0].reload_failures, 2);

    // Putting the serving module back is a no-op that clears the error.
    replace(&module, &std::fs::read(guest("capability_policy")).unwrap());
    let report = runtime.reload();
    assert_eq!(
        report.outcome(Slot::CapabilityPolicy),
        Some(&ReloadOutcome::Unchanged)
    );
    assert!(runtime.status()[0].last_error.is_none());
    // A different, valid module swaps in.
    replace(&module, &std::fs::read(guest("deny_all")).unwrap());
    let report = runtime.reload();
    assert!(
        matches!(
            report.outcome(Slot::CapabilityPolicy),
            Some(ReloadOutcome::Loaded { .. })
        ),
        "{report:?}"
    );
    assert!(
        !runtime
            .authorize(&owner(Operation::Read, "/pub/x"))
            .unwrap()
            .allow
    );
}

#[test]
fn broken_policies_toml_keeps_every_slot() {
    let dir = policies_dir();
    let runtime = PolicyRuntime::load(config(dir.path())).unwrap();
    std::fs::write(dir.path().join("policies.toml"), "[capability-policy\n").unwrap();
    let report = runtime.reload();
    assert_eq!(report.slots.len(), 3);
    assert!(!report.is_ok());
    assert!(
        runtime
            .status()
            .iter()
            .all(|s| s.serving && s.last_error.is_some())
    );
    assert!(
        runtime
            .authorize(&owner(Operation::Read, "/pub/x"))
            .unwrap()
            .allow
    );
}

/// Swap a deny-all policy in while threads call `authorize`: no call fails, and every
/// call that started after the swap returned is denied.
#[test]
fn hot_swap_under_concurrent_load() {
    let dir = policies_dir();
    let module = dir.path().join("capability-policy.wasm");
    std::fs::copy(guest("capability_policy"), &module).unwrap();
    let runtime = Arc::new(PolicyRuntime::load(config(dir.path())).unwrap());
    let swapped = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let allowed_after_swap = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let request = session(&["write:/pub/app/"], Operation::Write, "/pub/app/post");

    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (runtime, swapped, stop) = (runtime.clone(), swapped.clone(), stop.clone());
            let (allowed_after_swap, calls, request) =
                (allowed_after_swap.clone(), calls.clone(), request.clone());
            std::thread::spawn(move || {
                let mut saw_allow = false;
                while !stop.load(Ordering::Acquire) {
                    let after_swap = swapped.load(Ordering::Acquire);
                    let decision = runtime
                        .authorize(&request)
                        .expect("no call may fail during a swap");
                    calls.fetch_add(1, Ordering::Relaxed);
                    saw_allow |= decision.allow;
                    if after_swap && decision.allow {
                        allowed_after_swap.fetch_add(1, Ordering::Relaxed);
                    }
                }
                saw_allow
            })
        })
        .collect();

    std::thread::sleep(Duration::from_millis(200));
    replace(&module, &std::fs::read(guest("deny_all")).unwrap());
    let report = runtime.reload();
    assert!(
        matches!(
            report.outcome(Slot::CapabilityPolicy),
            Some(ReloadOutcome::Loaded { .. })
        ),
        "{report:?}"
    );
    swapped.store(true, Ordering::Release);
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Release);
    for worker in workers {
        assert!(
            worker.join().unwrap(),
            "every worker saw the old policy allow"
        );
    }
    assert_eq!(allowed_after_swap.load(Ordering::Relaxed), 0);
    assert!(
        calls.load(Ordering::Relaxed) > 100,
        "{} calls",
        calls.load(Ordering::Relaxed)
    );
    let stats = &runtime.stats()[0];
    assert_eq!(stats.failures.total(), 0);
}

#[test]
fn compiled_modules_come_from_the_cache_on_second_load() {
    let dir = policies_dir();
    // Modules from files (the built-in ones come precompiled and skip this cache).
    for (file, slot) in [
        ("capability_policy", "capability-policy"),
        ("safety_filter", "safety-filter"),
        ("intent_classifier", "intent-classifier"),
    ] {
        std::fs::copy(guest(file), dir.path().join(format!("{slot}.wasm"))).unwrap();
    }
    let cache = tempfile::tempdir().unwrap();
    let config = RuntimeConfig {
        cache_dir: Some(cache.path().to_owned()),
        ..config(dir.path())
    };
    let first = PolicyRuntime::load(config.clone()).unwrap();
    assert!(first.status().iter().all(|s| s.from_cache == Some(false)));
    drop(first);
    let entries = std::fs::read_dir(cache.path()).unwrap().count();
    assert_eq!(entries, 3);
    let started = Instant::now();
    let second = PolicyRuntime::load(config).unwrap();
    let elapsed = started.elapsed();
    assert!(
        second.status().iter().all(|s| s.from_cache == Some(true)),
        "{:?}",
        second.status()
    );
    assert!(
        second
            .authorize(&owner(Operation::Read, "/pub/x"))
            .unwrap()
            .allow
    );
    eprintln!("load from cache: {elapsed:?}");
}

#[test]
fn instances_are_reused_and_retired() {
    let dir = policies_dir();
    let runtime = PolicyRuntime::load(RuntimeConfig {
        instance_max_calls: 5,
        ..config(dir.path())
    })
    .unwrap();
    // Another path each time: the same read would be answered from the cache.
    for i in 0..20 {
        runtime
            .authorize(&owner(Operation::Read, &format!("/pub/x{i}")))
            .unwrap();
    }
    // The test call's instance served 4 more calls, then one fresh instance per 5 calls.
    assert_eq!(runtime.stats()[0].instantiations, 4);

    let runtime = PolicyRuntime::load(config(dir.path())).unwrap();
    for _ in 0..100 {
        runtime.classify("recap please");
    }
    assert_eq!(
        runtime.stats()[2].instantiations,
        0,
        "one thread reuses the warm instance"
    );
}

#[test]
fn watcher_reloads_a_changed_wordlist() {
    let dir = policies_dir();
    let runtime = Arc::new(
        PolicyRuntime::load(RuntimeConfig {
            watch_debounce: Duration::from_millis(100),
            ..config(dir.path())
        })
        .unwrap(),
    );
    let _watch = runtime.watch().unwrap();
    assert!(!runtime.check_text("a purple elephant").blocked);
    let spam = dir.path().join("wordlists/spam.txt");
    let mut list = std::fs::read_to_string(&spam).unwrap();
    list.push_str("purple elephant\n");
    replace(&spam, list.as_bytes());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !runtime.check_text("a purple elephant").blocked {
        assert!(
            Instant::now() < deadline,
            "the watcher did not reload within 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = &runtime.status()[1];
    assert!(status.serving && status.last_error.is_none());
}

#[test]
fn install_writes_an_editable_directory() {
    let dir = tempfile::tempdir().unwrap();
    let report = install_defaults(dir.path(), false).unwrap();
    assert_eq!(report.written.len(), 9);
    assert!(
        install_defaults(dir.path(), false)
            .unwrap()
            .written
            .is_empty()
    );
    let runtime = PolicyRuntime::load(config(dir.path())).unwrap();
    for status in runtime.status() {
        let source = status.source.unwrap();
        assert!(
            source.ends_with(&format!("{}.wasm", status.slot)),
            "{source}"
        );
        assert_ne!(source, ModuleSource::Builtin.to_string());
    }
}

#[test]
fn eval_reads_and_writes_json_lines() {
    let dir = policies_dir();
    let input = "{\"operation\":\"write\",\"path\":\"/pub/app/x\",\"caller\":{\"session\":{\"capabilities\":[\"write:/pub/app/\"]}}}\n\
                 # a comment\n\
                 {\"operation\":\"read\",\"path\":\"/pub/x\",\"caller\":\"owner\"}\n\
                 not json\n";
    let mut out = Vec::new();
    let summary = eval_lines(
        Slot::CapabilityPolicy,
        None,
        dir.path(),
        Cursor::new(input),
        &mut out,
    )
    .unwrap();
    assert_eq!(
        (summary.lines, summary.bad_input, summary.guest_failures),
        (3, 1, 0)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["allow"], true);
    assert_eq!(lines[1]["allow"], true);
    assert!(lines[2]["error"].is_string());

    let mut out = Vec::new();
    let deny_all = guest("deny_all");
    eval_lines(
        Slot::CapabilityPolicy,
        Some(&deny_all),
        dir.path(),
        Cursor::new("{\"operation\":\"read\",\"path\":\"/pub/x\",\"caller\":\"owner\"}\n"),
        &mut out,
    )
    .unwrap();
    assert!(String::from_utf8(out).unwrap().contains("\"allow\":false"));

    let mut out = Vec::new();
    eval_lines(
        Slot::IntentClassifier,
        None,
        dir.path(),
        Cursor::new("{\"text\":\"Source?\"}\n"),
        &mut out,
    )
    .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(answer["action"], "factcheck");
    assert_eq!(answer["matched"][0], "source * ?");

    let mut out = Vec::new();
    eval_lines(
        Slot::SafetyFilter,
        None,
        dir.path(),
        Cursor::new("{\"text\":\"fr33 m0n3y\"}\n"),
        &mut out,
    )
    .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(answer["blocked"], true);
    assert_eq!(answer["matches"][0]["term"], "free money");

    let err = eval_lines(
        Slot::SafetyFilter,
        Some(&guest("wrong_world")),
        dir.path(),
        Cursor::new(""),
        Vec::new(),
    );
    assert!(matches!(err, Err(RuntimeError::World { .. })));
}

/// A guest's stderr (here: its panic message) reaches the host log.
#[test]
fn guest_panic_message_reaches_the_log() {
    let dir = policies_dir();
    std::fs::copy(guest("hostile"), dir.path().join("capability-policy.wasm")).unwrap();
    let runtime = PolicyRuntime::load(config(dir.path())).unwrap();
    let captured = hs_testkit::CapturedLog::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        assert!(
            runtime
                .authorize(&owner(Operation::Read, "/pub/panic"))
                .is_err()
        );
        assert!(
            runtime
                .authorize(&owner(Operation::Read, "/pub/print"))
                .unwrap()
                .allow
        );
    });
    let log = captured.text();
    assert!(log.contains("hostile guest panics on purpose"), "{log}");
    assert!(
        log.contains("slot=\"capability-policy\"") || log.contains("slot=capability-policy"),
        "{log}"
    );
    assert!(log.contains("hostile guest writes to stderr"), "{log}");
}

/// A policies folder whose capability policy is the hostile guest (it loops on
/// `/pub/loop`).
fn hostile_policy_dir() -> TempDir {
    let dir = policies_dir();
    std::fs::copy(guest("hostile"), dir.path().join("hostile.wasm")).unwrap();
    std::fs::write(
        dir.path().join("policies.toml"),
        "[capability-policy]\nmodule = \"hostile.wasm\"\n",
    )
    .unwrap();
    dir
}

/// A call whose caller stops waiting (its future dropped: the client went away) is
/// counted as a cancelled call, and its place is free again at once.
#[test]
fn a_call_abandoned_by_its_caller_is_counted_as_cancelled() {
    let dir = hostile_policy_dir();
    let runtime = Arc::new(
        PolicyRuntime::load(RuntimeConfig {
            guest_concurrency: 1,
            call_deadline: Duration::from_secs(5),
            ..config(dir.path())
        })
        .unwrap(),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let before = runtime.stats()[0].clone();
    rt.block_on(async {
        // The looping call is given up after 200 ms, long before its 5 s deadline.
        let gave_up = tokio::time::timeout(
            Duration::from_millis(200),
            runtime.authorize_isolated(&owner(Operation::Read, "/pub/loop")),
        )
        .await;
        assert!(
            gave_up.is_err(),
            "the looping call ended by itself: {gave_up:?}"
        );
        // Its place is free: the next call is answered, not refused as busy.
        let decision = runtime
            .authorize_isolated(&owner(Operation::Read, "/pub/ok"))
            .await
            .unwrap();
        assert!(decision.allow);
    });
    let after = &runtime.stats()[0];
    assert_eq!(after.cancelled - before.cancelled, 1, "{after:?}");
    assert_eq!(
        after.calls - before.calls,
        2,
        "both calls are counted: {after:?}"
    );
    assert_eq!(after.failures.total(), before.failures.total(), "{after:?}");
}

/// Async calls run on the caller's task and yield at every epoch tick: a looping guest
/// holds its slot's place (`guest_concurrency`) until its deadline, and a call finding
/// every place taken for `guest_wait` fails closed as `busy` (counted), while the async
/// runtime's only thread stays free meanwhile.
#[test]
fn async_calls_wait_for_a_place_then_fail_closed() {
    let dir = hostile_policy_dir();
    let runtime = Arc::new(
        PolicyRuntime::load(RuntimeConfig {
            guest_concurrency: 1,
            guest_wait: Duration::from_millis(20),
            // Long enough that the looping call surely holds the thread when the second
            // call is made, however loaded the machine.
            call_deadline: Duration::from_secs(3),
            ..config(dir.path())
        })
        .unwrap(),
    );
    // One async worker thread: if guest code ran on it, nothing else could run.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let busy_again = rt.block_on(async {
        let looping = tokio::spawn({
            let runtime = runtime.clone();
            async move {
                runtime
                    .authorize_isolated(&owner(Operation::Read, "/pub/loop"))
                    .await
            }
        });
        // The looping call holds the only place (from its start to its 3 s deadline);
        // this one gives up waiting.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let busy = runtime
            .authorize_isolated(&owner(Operation::Read, "/pub/ok"))
            .await
            .unwrap_err();
        assert!(matches!(busy, GuestFailure::Busy { .. }), "{busy}");
        // The worker thread was free all along: timers and other tasks ran.
        let looped = looping.await.unwrap().unwrap_err();
        assert!(matches!(looped, GuestFailure::Timeout { .. }), "{looped}");
        // The place is free again, once the timed-out call has let go of it: on a
        // loaded machine (the other tests beside this one) that can take longer than
        // the 20 ms a call waits, so a call refused as busy meanwhile is tried again.
        let started = std::time::Instant::now();
        let mut busy_again = 0;
        let decision = loop {
            match runtime
                .authorize_isolated(&owner(Operation::Read, "/pub/ok"))
                .await
            {
                Err(GuestFailure::Busy { .. }) if started.elapsed() < Duration::from_secs(10) => {
                    busy_again += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                other => break other.unwrap(),
            }
        };
        assert!(decision.allow);
        busy_again
    });
    let stats = runtime.stats();
    let policy = stats
        .iter()
        .find(|s| s.slot == Slot::CapabilityPolicy)
        .unwrap();
    assert_eq!(policy.failures.busy, 1 + busy_again);
    assert_eq!(policy.failures.timeout, 1);
    // The serving module's own figures count the same failures (busy too: it was its
    // calls that held every place).
    let modules = runtime.module_stats();
    let serving = modules
        .iter()
        .find(|(slot, _)| *slot == Slot::CapabilityPolicy)
        .and_then(|(_, modules)| modules.iter().find(|m| m.serving))
        .unwrap();
    assert_eq!(serving.stats.failures, policy.failures);
}

/// Async calls together are held to `guest_cpu_share`: four calls of a policy that
/// loops, running side by side until their 1 s deadline, get the share's epoch ticks
/// (here 2% of the cores: ~20 ticks a second per core), not whole cores, and sleep the
/// rest of the time (counted); a call into another slot made meanwhile is answered. The
/// bound is the limiter's arithmetic, not a timing: unbounded, the loops would run
/// about 1,000 ticks a second on each core they got.
#[test]
fn looping_calls_are_held_to_their_share_of_the_cores() {
    let dir = policies_dir();
    std::fs::copy(guest("hostile"), dir.path().join("hostile.wasm")).unwrap();
    let toml = std::fs::read_to_string(dir.path().join("policies.toml")).unwrap();
    let toml = toml.replacen(
        "module = \"capability-policy.wasm\"",
        "module = \"hostile.wasm\"",
        1,
    );
    std::fs::write(dir.path().join("policies.toml"), toml).unwrap();
    let share = 0.02;
    let runtime = Arc::new(
        PolicyRuntime::load(RuntimeConfig {
            guest_cpu_share: share,
            call_deadline: Duration::from_secs(1),
            ..config(dir.path())
        })
        .unwrap(),
    );
    assert!(
        runtime.status().iter().all(|s| s.serving),
        "{:?}",
        runtime.status()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    rt.block_on(async {
        let loops: Vec<_> = (0..4)
            .map(|_| {
                let runtime = runtime.clone();
                tokio::spawn(async move {
                    runtime
                        .authorize_isolated(&owner(Operation::Read, "/pub/loop"))
                        .await
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let verdict = runtime.check_text_isolated("hello world".into()).await;
        assert!(verdict.failure.is_none() && !verdict.blocked, "{verdict:?}");
        for task in loops {
            let failure = task.await.unwrap().unwrap_err();
            assert!(matches!(failure, GuestFailure::Timeout { .. }), "{failure}");
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    let policy = runtime
        .stats()
        .into_iter()
        .find(|s| s.slot == Slot::CapabilityPolicy)
        .unwrap();
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    let per_second = (share * cores * 1000.0).round();
    // The burst (20 ticks per started core of the share), the rate over the run, and
    // one unpaid tick per call (the one it runs into its deadline).
    let bound = 20.0 * (share * cores).ceil() + per_second * elapsed + 4.0;
    assert!(
        (policy.epoch_ticks as f64) <= bound,
        "{} ticks in {elapsed:.2} s, bound {bound:.0}",
        policy.epoch_ticks
    );
    assert!(
        policy.epoch_ticks >= 4,
        "each loop ran: {}",
        policy.epoch_ticks
    );
    assert!(
        policy.throttled_seconds > 2.0,
        "the loops slept most of their second: {}",
        policy.throttled_seconds
    );
    assert_eq!(policy.failures.timeout, 4);
}

/// Writes `files` (relative path, text) under a new folder.
fn folder_with(files: &[(&str, &str)]) -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

fn test_options(strict: bool) -> TestOptions {
    TestOptions {
        slot: None,
        strict,
        budget_ticks: None,
        call_deadline: Duration::from_millis(100),
        cache_dir: Some(shared_cache()),
    }
}

fn outcome<'r>(report: &'r TestReport, name: &str) -> &'r TestOutcome {
    report
        .cases
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("{name} in {report:?}"))
}

/// `policy test`: the cases of a guest's folder (cases.jsonl, then tests/*.jsonl) run
/// each on a fresh instance; a wrong answer fails its case; in strict mode the guest
/// sees only the config keys a case declares, and reading another fails the case.
#[test]
fn the_harness_holds_cases_to_their_answers_and_declared_config() {
    let module = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        module.path(),
        homeserver_runtime::builtin_module(Slot::CapabilityPolicy).unwrap(),
    )
    .unwrap();
    let owner_reads = r#"{"name": "owner reads", "input": {"operation": "read", "path": "/pub/a", "caller": "owner"}, "expect": {"allow": true}}"#;
    let wrong = r#"{"name": "wrong on purpose", "input": {"operation": "read", "path": "/pub/a", "caller": "owner"}, "expect": {"allow": false}}"#;
    let declared = r#"{"name": "declared", "config": {"read-only-prefixes": ["/pub/archive/"], "deny-prefixes": []}, "input": {"operation": "write", "path": "/pub/archive/x", "caller": "owner"}, "expect": {"allow": false}}"#;
    let dir = folder_with(&[
        (
            "cases.jsonl",
            &format!("# a comment\n{owner_reads}\n\n{wrong}\n"),
        ),
        ("tests/config.jsonl", declared),
        ("tests/notes.txt", "not a case file"),
    ]);
    let files = case_files(dir.path()).unwrap();
    assert_eq!(
        files,
        [
            dir.path().join("cases.jsonl"),
            dir.path().join("tests/config.jsonl")
        ]
    );

    let report = test_cases(module.path(), &files, &test_options(false)).unwrap();
    assert_eq!(report.slot, Slot::CapabilityPolicy, "found by its world");
    assert_eq!((report.passed, report.failed), (2, 1), "{report:#?}");
    let failed = outcome(&report, "wrong on purpose");
    assert!(failed.problems[0].starts_with("expected"), "{failed:?}");
    let read = outcome(&report, "owner reads");
    assert_eq!(read.config_read, ["deny-prefixes", "read-only-prefixes"]);
    assert!(read.imports.contains(&"config"), "{read:?}");

    // Strict: the undeclared reads fail the case that declares nothing; the case that
    // declares its keys (config implies the `config` import) passes if it uses nothing
    // else.
    let strict = test_cases(module.path(), &files, &test_options(true)).unwrap();
    let read = outcome(&strict, "owner reads");
    assert!(!read.passed);
    assert!(
        read.problems
            .iter()
            .any(|p| p.contains("config key `deny-prefixes`") && p.contains("strict")),
        "{read:?}"
    );
    let declared = outcome(&strict, "declared");
    let others: Vec<_> = declared
        .imports
        .iter()
        .filter(|i| **i != "config")
        .collect();
    assert_eq!(declared.passed, others.is_empty(), "{declared:?}");

    // A case file with a misspelt field is refused, naming the line.
    let typo = folder_with(&[(
        "cases.jsonl",
        r#"{"name": "x", "input": {}, "expect": {}, "expected": {}}"#,
    )]);
    let error = test_cases(
        module.path(),
        &case_files(typo.path()).unwrap(),
        &test_options(false),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("line 1: unknown field `expected`"),
        "{error}"
    );
}

/// `policy test` budgets and imports: a case over its tick budget fails (a guest that
/// loops runs through its whole deadline), and in strict mode a guest that writes to
/// stdout passes only where the case declares the `log` import.
#[test]
fn the_harness_holds_cases_to_their_budget_and_declared_imports() {
    let prints = r#"{"name": "prints", "input": {"operation": "read", "path": "/pub/print", "caller": "owner"}, "expect": {"allow": true}}"#;
    let declares = r#"{"name": "declares log", "imports": ["log"], "input": {"operation": "read", "path": "/pub/print", "caller": "owner"}, "expect": {"allow": true}}"#;
    let loops = r#"{"name": "loops", "budget_ticks": 5, "input": {"operation": "read", "path": "/pub/loop", "caller": "owner"}, "expect": {"allow": false}}"#;
    let dir = folder_with(&[("cases.jsonl", &format!("{prints}\n{declares}\n{loops}\n"))]);
    let files = case_files(dir.path()).unwrap();
    let report = test_cases(&guest("hostile"), &files, &test_options(true)).unwrap();
    let loops = outcome(&report, "loops");
    assert!(!loops.passed);
    assert!(loops.ticks > 5, "{loops:?}");
    assert!(
        loops
            .problems
            .iter()
            .any(|p| p.contains("over its budget of 5")),
        "{loops:?}"
    );
    let prints = outcome(&report, "prints");
    assert!(prints.imports.contains(&"log"), "{prints:?}");
    assert!(
        prints
            .problems
            .iter()
            .any(|p| p.contains("host import `log`")),
        "{prints:?}"
    );
    let declares = outcome(&report, "declares log");
    let undeclared: Vec<_> = declares.imports.iter().filter(|i| **i != "log").collect();
    assert_eq!(declares.passed, undeclared.is_empty(), "{declares:?}");
    assert!(report.failed >= 2, "{report:#?}");
}

/// `module` with a custom section appended: the same guest under another BLAKE3.
fn renamed(module: &[u8], name: &str) -> Vec<u8> {
    let mut section = vec![u8::try_from(name.len()).unwrap()];
    section.extend_from_slice(name.as_bytes());
    let mut bytes = module.to_vec();
    bytes.push(0); // a custom section
    bytes.push(u8::try_from(section.len()).unwrap());
    bytes.extend(section);
    bytes
}

/// Figures per module (issue 31, point 4): each module swapped into a slot has its own,
/// the slot's are their sum, a module swapped back in carries on with its own, and a
/// slot keeps those of its last `MODULES_KEPT` modules only.
#[test]
fn each_module_keeps_its_own_figures_up_to_a_bound() {
    let dir = tempfile::tempdir().unwrap();
    let builtin = homeserver_runtime::builtin_module(Slot::CapabilityPolicy).unwrap();
    let swap_to = |name: &str| {
        std::fs::write(
            dir.path().join(format!("{name}.wasm")),
            renamed(builtin, name),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("policies.toml"),
            format!("[capability-policy]\nmodule = \"{name}.wasm\"\n"),
        )
        .unwrap();
    };
    swap_to("m0");
    let runtime = PolicyRuntime::load(config(dir.path())).unwrap();
    let policy_modules = || {
        runtime
            .module_stats()
            .into_iter()
            .find(|(slot, _)| *slot == Slot::CapabilityPolicy)
            .unwrap()
            .1
    };
    // Writes are always asked: n writes are n calls.
    let write = |n: usize| {
        for _ in 0..n {
            runtime
                .authorize(&owner(Operation::Write, "/pub/x"))
                .unwrap();
        }
    };
    write(2);
    swap_to("m1");
    assert!(runtime.reload().is_ok());
    write(3);
    let modules = policy_modules();
    let figures: Vec<(bool, u64, u64)> = modules
        .iter()
        .map(|m| (m.serving, m.stats.calls, m.stats.reloads))
        .collect();
    assert_eq!(figures, [(true, 3, 1), (false, 2, 1)]);
    assert_ne!(modules[0].blake3, modules[1].blake3);
    assert!(
        modules[0].source.ends_with("m1.wasm"),
        "{}",
        modules[0].source
    );
    assert_eq!(runtime.stats()[0].calls, 5, "the slot's: the sum");
    // m0 again: its figures carry on.
    swap_to("m0");
    assert!(runtime.reload().is_ok());
    write(1);
    let figures: Vec<(bool, u64, u64)> = policy_modules()
        .iter()
        .map(|m| (m.serving, m.stats.calls, m.stats.reloads))
        .collect();
    assert_eq!(figures, [(true, 3, 2), (false, 3, 1)]);
    // More modules than a slot keeps: the oldest swapped in go.
    for i in 2..=homeserver_runtime::MODULES_KEPT + 1 {
        swap_to(&format!("m{i}"));
        assert!(runtime.reload().is_ok());
    }
    let modules = policy_modules();
    assert_eq!(modules.len(), homeserver_runtime::MODULES_KEPT);
    assert!(modules[0].serving && modules.iter().skip(1).all(|m| !m.serving));
    let kept: Vec<&str> = modules.iter().map(|m| m.source.as_str()).collect();
    assert!(
        kept.iter()
            .all(|s| !s.ends_with("m0.wasm") && !s.ends_with("m1.wasm")),
        "{kept:?}"
    );
    assert_eq!(
        runtime.stats()[0].calls,
        6,
        "the slot's figures keep everything"
    );
}
