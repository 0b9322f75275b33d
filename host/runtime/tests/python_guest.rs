//! A capability-policy guest written in Python (guests/python/capability-policy, built by
//! `scripts/build-python-guest` with componentize-py): it passes the slot's golden cases
//! and serves the slot, in the sandbox as it is. Skipped with a printed reason when the
//! component was not built (it needs python3 and PyPI); a failure when CI=true.

// Helpers outside #[test] fns unwrap too (clippy.toml only covers the fns themselves).
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use homeserver_runtime::{
    AuthorizeRequest, Caller, CheckOptions, Operation, PolicyRuntime, RuntimeConfig, Slot,
    check_module_with,
};

fn component() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/python-guest/capability_policy_py.wasm");
    if path.is_file() {
        return Some(path);
    }
    let reason = format!(
        "{} is missing: run scripts/build-python-guest (python3 + PyPI)",
        path.display()
    );
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true and {reason}"
    );
    eprintln!("SKIPPED the Python guest test: {reason}");
    None
}

/// The compiled-module cache the runtime tests share (an 18 MB Python component takes
/// ~40 s to compile in a debug build, ~0.1 s to load from the cache).
fn cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("guest-cache")
}

/// The deadline of each call here: the test is about what the guest answers, and a
/// first call of this 40 MB component under the unoptimized test build, beside the rest
/// of the suite, can take longer than the serving default of 100 ms.
const DEADLINE: Duration = Duration::from_secs(10);

#[test]
fn a_python_policy_passes_the_golden_cases_and_serves_the_slot() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(python_policy());
}

async fn python_policy() {
    let Some(module) = component() else { return };
    let options = CheckOptions {
        cache_dir: Some(cache()),
        call_deadline: DEADLINE,
        ..CheckOptions::default()
    };
    let report = check_module_with(&module, Slot::CapabilityPolicy, options).unwrap();
    let failures: Vec<_> = report.failures().collect();
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(report.cases.len() >= 25, "{} cases", report.cases.len());
    assert_eq!(report.wit_version, "0.2.0");

    // Installed in a policies directory with an operator rule, it serves the slot.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&module, dir.path().join("policy.wasm")).unwrap();
    std::fs::write(
        dir.path().join("policies.toml"),
        "[capability-policy]\nmodule = \"policy.wasm\"\nfallback = \"none\"\n\
         [capability-policy.config]\ndeny-prefixes = [\"/pub/hidden/\"]\n",
    )
    .unwrap();
    let runtime = Arc::new(
        PolicyRuntime::load(RuntimeConfig {
            policies_dir: dir.path().to_owned(),
            cache_dir: Some(cache()),
            call_deadline: DEADLINE,
            ..RuntimeConfig::default()
        })
        .unwrap(),
    );
    let status = &runtime.status()[0];
    assert!(
        status.serving && status.source.as_deref().unwrap().ends_with("policy.wasm"),
        "{status:?}"
    );
    let ask = |operation, path: &str, caller| {
        let runtime = Arc::clone(&runtime);
        let req = AuthorizeRequest::new(operation, path, caller, String::new());
        async move { runtime.authorize_isolated(&req).await.unwrap() }
    };
    let session = || Caller::Session {
        capabilities: vec!["write:/pub/app/".into()],
    };
    let owner = ask(Operation::Write, "/pub/a", Caller::Owner).await;
    assert_eq!((owner.allow, owner.reason.as_str()), (true, "owner"));
    assert!(ask(Operation::Write, "/pub/app/x", session()).await.allow);
    let denied = ask(Operation::Read, "/pub/app/x", session()).await;
    assert!(!denied.allow && denied.reason.contains("no session capability"));
    assert!(ask(Operation::Read, "/pub/x", Caller::Public).await.allow);
    let hidden = ask(Operation::Read, "/pub/hidden/x", Caller::Public).await;
    assert!(!hidden.allow && hidden.reason.contains("closed by the operator"));
    // Many calls on reused instances: no state leaks, no trap.
    for i in 0..200 {
        let path = format!("/pub/app/{i}");
        assert!(ask(Operation::Write, &path, session()).await.allow);
    }
    assert_eq!(runtime.stats()[0].failures.total(), 0);
}
