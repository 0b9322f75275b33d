//! Guests in a running server: guest calls yield the async workers every millisecond
//! and are held to their share of the cores, so a policy that loops until its deadline
//! (or hoards memory) cannot stop the requests it is not asked about, and what it was
//! asked fails closed; the policy decides public
//! reads, listings and feeds (WIT 0.2.0); a new guest goes from template to serving.

use std::sync::Arc;
use std::time::Instant;

use base64::Engine;
use homeserver_protocol::ErrorCode;
use reqwest::Method;

use crate::fixture::*;

/// Two async workers, as a small machine has: before guest calls had threads of their
/// own, two looping calls stopped every request of the server for their deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_guest_does_not_slow_requests_that_do_not_ask_it() {
    let host = Arc::new(
        TestHost::start_single_with(|c| {
            let policies = c.policies.dir.clone();
            std::fs::create_dir_all(&policies).unwrap();
            std::fs::copy(test_guest("hostile"), policies.join("hostile.wasm")).unwrap();
            std::fs::write(
                policies.join("policies.toml"),
                "[capability-policy]\nmodule = \"hostile.wasm\"\n",
            )
            .unwrap();
            c.policies.guest_concurrency = 2;
            // What the figures below assume (the suite's hosts allow 1 s).
            c.policies.call_deadline_ms = 100;
        })
        .await,
    );
    let alice = host.user().await;
    assert_eq!(host.put(&alice, "/pub/data", b"public").await.status(), 200);
    // The policy answers a public read once; later ones come from its cache.
    assert_eq!(host.public_get(&alice, "/pub/data").await.status(), 200);

    // 24 signed reads the policy loops on (100 ms each, two at a time: over a second of
    // guest time), and one that makes it hoard memory.
    let started = Instant::now();
    let hostile: Vec<_> = (0..25)
        .map(|i| {
            let (host, alice) = (host.clone(), alice.clone());
            let path = if i == 0 { "/pub/alloc" } else { "/pub/loop" };
            tokio::spawn(async move {
                let status = host.get(&alice, path).await.status().as_u16();
                (status, Instant::now())
            })
        })
        .collect();
    // Meanwhile, public reads (answered from the policy's cache: the guest is not asked).
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    for _ in 0..50 {
        let response = host.public_get(&alice, "/pub/data").await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.bytes().await.unwrap().as_ref(), b"public");
    }
    let public_done = Instant::now();

    let mut last_hostile = started;
    for task in hostile {
        let (status, at) = task.await.unwrap();
        // Failed closed: 500 (the guest ran past its deadline or memory) or 503 (no
        // place for the call in time); never allowed.
        assert!(status == 500 || status == 503, "{status}");
        last_hostile = last_hostile.max(at);
    }
    // An order, not a timing: fifty public reads finished while the looping calls
    // (over a second of them, two at a time) were still being answered.
    assert!(
        public_done < last_hostile,
        "the public reads waited for the looping guest"
    );
    let addr = host.server().metrics_addr().unwrap();
    let text = host
        .http
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let timeouts: f64 = text
        .lines()
        .filter(|l| l.starts_with("hs_guest_call_failures_total{"))
        .filter(|l| l.contains("slot=\"capability-policy\"") && l.contains("reason=\"timeout\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        timeouts >= 1.0,
        "the looping calls timed out in the guest:\n{text}"
    );
}

/// The plugin author's loop, for real: `policy new` writes a crate for each slot, cargo
/// builds it for wasm32-wasip2, `policy check --cases` passes it; the capability policy
/// then serves a running server, is edited, rebuilt and reloaded, and the server follows
/// the edit. (The build's target folder is kept under target/, so later runs are quick.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_guest_builds_checks_and_serves_after_an_edit() {
    let homeserver = env!("CARGO_BIN_EXE_homeserver");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/api-xxxx → target/guest-templates
    let target_dir = exe.ancestors().nth(3).unwrap().join("guest-templates");
    let tmp = tempfile::tempdir().unwrap();
    let run = run_ok;
    let build = |dir: &std::path::Path| {
        let started = Instant::now();
        run(std::process::Command::new(&cargo)
            .args(["build", "--release", "--target", "wasm32-wasip2", "--quiet"])
            .current_dir(dir)
            .env("CARGO_TARGET_DIR", &target_dir));
        eprintln!(
            "built {} in {:.1} s",
            dir.display(),
            started.elapsed().as_secs_f64()
        );
    };
    let mut modules = Vec::new();
    for (slot, name) in [
        ("capability-policy", "archive_policy"),
        ("safety-filter", "term_filter"),
        ("intent-classifier", "word_classifier"),
    ] {
        let dir = tmp.path().join(name);
        run(std::process::Command::new(homeserver)
            .args(["policy", "new", "--slot", slot])
            .arg(&dir));
        build(&dir);
        let module = target_dir.join(format!("wasm32-wasip2/release/{name}.wasm"));
        let checked = run(std::process::Command::new(homeserver)
            .args(["policy", "check", "--report"])
            .arg(&module)
            .args(["--slot", slot, "--cases"])
            .arg(dir.join("cases.jsonl")));
        assert!(checked.contains("passed, 0 failed\n"), "{checked}");
        assert!(checked.contains("your cases"), "{checked}");
        // --report: a line per case, golden and own, with its call time and memory.
        let yours = checked.lines().filter(|l| l.starts_with("yours ")).count();
        assert!(yours > 0, "{checked}");
        let cases = std::fs::read_to_string(dir.join("cases.jsonl")).unwrap();
        let written = cases.lines().map(str::trim);
        assert_eq!(
            yours,
            written
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .count()
        );
        assert!(
            checked
                .lines()
                .filter(|l| {
                    let words: Vec<&str> = l.split_whitespace().take(2).collect();
                    matches!(words[..], ["golden" | "yours", "ok" | "FAIL"])
                })
                .all(|l| l.contains(" µs ") && l.contains(" ticks ") && l.contains(" KiB ")),
            "{checked}"
        );
        // The harness: the template's cases, each on a fresh instance, strict (the
        // templates read no config they do not declare and use no host import), as JSON.
        let tested = std::process::Command::new(homeserver)
            .args(["policy", "test", "--strict", "--json", "--module"])
            .arg(&module)
            .arg(&dir)
            .output()
            .unwrap();
        assert!(tested.status.success(), "{tested:?}");
        let report: serde_json::Value = serde_json::from_slice(&tested.stdout).unwrap();
        assert_eq!(report["slot"].as_str(), Some(slot), "{report}");
        assert_eq!(report["failed"], 0, "{report}");
        assert_eq!(report["passed"].as_u64(), Some(yours as u64), "{report}");
        modules.push((dir, module));
    }

    // The new policy serves a running server.
    let (policy_dir, policy_module) = &modules[0];
    let host = TestHost::start_single_with(|c| {
        std::fs::create_dir_all(&c.policies.dir).unwrap();
        std::fs::copy(policy_module, c.policies.dir.join("archive_policy.wasm")).unwrap();
        std::fs::write(
            c.policies.dir.join("policies.toml"),
            "[capability-policy]\nmodule = \"archive_policy.wasm\"\n",
        )
        .unwrap();
    })
    .await;
    let alice = host.user().await;
    assert_eq!(host.put(&alice, "/pub/archive/1", b"x").await.status(), 403);
    assert_eq!(host.put(&alice, "/pub/frozen/1", b"x").await.status(), 200);

    // Edit, build, copy, reload: the server follows the edit.
    let started = Instant::now();
    let source = policy_dir.join("src/lib.rs");
    let text = std::fs::read_to_string(&source).unwrap();
    std::fs::write(
        &source,
        text.replace("\"/pub/archive/\"", "\"/pub/frozen/\""),
    )
    .unwrap();
    build(policy_dir);
    let policies = host.dir.path().join("policies");
    std::fs::copy(policy_module, policies.join("archive_policy.wasm")).unwrap();
    let report = host
        .admin_json(Method::POST, "/admin/policies/reload")
        .await;
    assert_eq!(report["ok"], true, "{report}");
    eprintln!(
        "edit → build → reload: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(host.put(&alice, "/pub/archive/2", b"x").await.status(), 200);
    assert_eq!(host.put(&alice, "/pub/frozen/2", b"x").await.status(), 403);
}

/// WIT 0.2.0: the operator's `deny-prefixes` hide paths from the public: a public GET
/// or HEAD is 404 as if nothing were there, listings (deep and shallow) leave them
/// out, and so do the feed and the event stream. The owner's requests under the
/// prefix are refused with the reason (403), as before.
#[tokio::test]
async fn the_policy_hides_denied_paths_from_the_public() {
    // One instance: the reload below reaches the instance it is sent to.
    let host = TestHost::start_single_with(|_| {}).await;
    let alice = host.user().await;
    for path in ["/pub/hidden/a", "/pub/hidden/b", "/pub/open/c"] {
        assert_eq!(host.put(&alice, path, b"data").await.status(), 200);
    }
    assert_eq!(host.public_get(&alice, "/pub/hidden/a").await.status(), 200);

    // The operator closes /pub/hidden/ and reloads.
    let policies = host.dir.path().join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(
        policies.join("policies.toml"),
        "[capability-policy.config]\ndeny-prefixes = [\"/pub/hidden/\"]\n",
    )
    .unwrap();
    let report = host
        .admin_json(Method::POST, "/admin/policies/reload")
        .await;
    assert_eq!(report["ok"], true, "{report}");

    let hidden = host.public_get(&alice, "/pub/hidden/a").await;
    let body = expect_error(hidden, 404, ErrorCode::NotFound).await;
    assert!(!body.message.contains("operator"), "{}", body.message);
    let head = host
        .request(Method::HEAD, "/pub/hidden/a")
        .header("Pubky-Host", alice.public_key().to_z32())
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), 404);
    assert_eq!(host.public_get(&alice, "/pub/open/c").await.status(), 200);
    // The folder itself is hidden: an empty folder, like one that does not exist.
    let hidden_folder: serde_json::Value =
        expect_ok_json(host.public_get(&alice, "/pub/hidden/").await).await;
    let nowhere: serde_json::Value =
        expect_ok_json(host.public_get(&alice, "/pub/nowhere/").await).await;
    assert_eq!(hidden_folder, nowhere);
    // A listing of its parent leaves it out.
    for query in ["", "?shallow=true"] {
        let page: serde_json::Value =
            expect_ok_json(host.public_get(&alice, &format!("/pub/{query}")).await).await;
        let paths: Vec<&str> = page["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap())
            .collect();
        let open = if query.is_empty() {
            "/pub/open/c"
        } else {
            "/pub/open/"
        };
        assert_eq!(paths, [open], "{query}: {page}");
    }
    // Paging a page at a time, either way: no page and no cursor names a hidden path,
    // and the last page says there is no more.
    for order in ["", "&reverse=true"] {
        let (mut cursor, mut seen) = (None::<String>, Vec::new());
        for _ in 0..10 {
            let query = match &cursor {
                Some(c) => format!("/pub/?limit=1{order}&cursor={c}"),
                None => format!("/pub/?limit=1{order}"),
            };
            let page: serde_json::Value =
                expect_ok_json(host.public_get(&alice, &query).await).await;
            for entry in page["entries"].as_array().unwrap() {
                seen.push(entry["path"].as_str().unwrap().to_owned());
            }
            cursor = page["cursor"].as_str().map(str::to_owned);
            if let Some(c) = &cursor {
                let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(c)
                    .unwrap();
                let decoded = String::from_utf8(decoded).unwrap();
                assert!(!decoded.contains("hidden"), "{order}: cursor {decoded}");
            }
            if page["has_more"] != true {
                break;
            }
        }
        assert_eq!(seen, ["/pub/open/c"], "{order}");
    }
    // The owner is refused with the reason; the public never sees it.
    let owner = host.get(&alice, "/pub/hidden/a").await;
    let body = expect_error(owner, 403, ErrorCode::InsufficientPermissions).await;
    assert!(body.message.contains("/pub/hidden/"), "{}", body.message);

    // Events name paths: the feed and the stream leave the hidden ones out.
    let feed: serde_json::Value =
        expect_ok_json(host.request(Method::GET, "/events/").send().await.unwrap()).await;
    let urls: Vec<&str> = feed["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["url"].as_str().unwrap())
        .collect();
    assert!(
        urls.iter().any(|u| u.ends_with("/pub/open/c"))
            && !urls.iter().any(|u| u.contains("/hidden/")),
        "{feed}"
    );
    let stream = host
        .request(
            Method::GET,
            &format!("/events-stream?user={}", alice.public_key().to_z32()),
        )
        .send()
        .await
        .unwrap();
    let text = tokio::time::timeout(std::time::Duration::from_secs(10), stream.text())
        .await
        .unwrap()
        .unwrap();
    assert!(
        text.contains("/pub/open/c") && !text.contains("/hidden/"),
        "{text}"
    );
    // Hidden events do not count against a stream's limit, either way.
    for order in ["", "&reverse=true"] {
        let stream = host
            .request(
                Method::GET,
                &format!(
                    "/events-stream?user={}&limit=1{order}",
                    alice.public_key().to_z32()
                ),
            )
            .send()
            .await
            .unwrap();
        let text = tokio::time::timeout(std::time::Duration::from_secs(10), stream.text())
            .await
            .unwrap()
            .unwrap();
        assert!(
            text.contains("/pub/open/c") && !text.contains("/hidden/"),
            "{order}: {text}"
        );
    }
}

/// A policy built for WIT 0.1.0 serves a running server: it decides owners, is not
/// asked about public reads (all allowed, listings whole), and /admin/policies says
/// which version it was built for.
#[tokio::test]
async fn a_policy_built_for_wit_0_1_serves_and_public_reads_stay_open() {
    let host = TestHost::start_single_with(|c| {
        std::fs::create_dir_all(&c.policies.dir).unwrap();
        std::fs::copy(
            test_guest("policy_v0_1"),
            c.policies.dir.join("capability-policy.wasm"),
        )
        .unwrap();
    })
    .await;
    let alice = host.user().await;
    assert_eq!(host.put(&alice, "/pub/a", b"x").await.status(), 200);
    let closed = host.put(&alice, "/pub/frozen-closed/a", b"x").await;
    let body = expect_error(closed, 403, ErrorCode::InsufficientPermissions).await;
    assert_eq!(body.message, "0.1.0 guest: closed");
    assert_eq!(host.public_get(&alice, "/pub/a").await.status(), 200);
    let page: serde_json::Value = expect_ok_json(host.public_get(&alice, "/pub/").await).await;
    assert_eq!(page["entries"][0]["path"], "/pub/a", "{page}");
    let status = host.admin_json(Method::GET, "/admin/policies").await;
    let policy = &status["slots"][0];
    assert_eq!(
        (&policy["slot"], &policy["wit_version"]),
        (&"capability-policy".into(), &"0.1.0".into()),
        "{status}"
    );
}

/// Runs `cmd` to success; its stdout then stderr.
fn run_ok(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

/// The folder `under_tools` of target/tools that holds a template's builder (`made_by`
/// installs it; `holds` is a path inside that shows it is there), or `None` when the
/// test is skipped: on the suite's PostgreSQL + S3 run (no server here, the first run
/// covers it), or, with the reason, without the builder (a failure when CI=true).
fn template_builder(
    language: &str,
    under_tools: &str,
    holds: &str,
    made_by: &str,
) -> Option<std::path::PathBuf> {
    if std::env::var_os("HS_TEST_BACKEND").is_some() {
        eprintln!("skipped on HS_TEST_BACKEND: it runs no server, the first run covers it");
        return None;
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/tools")
        .join(under_tools)
        .canonicalize();
    match dir {
        Ok(dir) if dir.join(holds).exists() => Some(dir),
        _ => {
            let reason = format!("no {holds} under target/tools ({made_by})");
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true: {reason}"
            );
            eprintln!("SKIPPED the {language} template test: {reason}");
            None
        }
    }
}

/// `policy new --lang javascript`: the JavaScript template builds with its own build.sh
/// (componentize-js, from what scripts/build-js-tools installed), and passes its cases
/// through `policy test --strict` (it imports nothing but `config`, and reads none) and
/// `policy check`. Skipped with a reason without componentize-js; a failure when CI=true.
#[test]
fn a_javascript_guest_from_the_template_builds_and_passes_its_cases() {
    let Some(node_modules) = template_builder(
        "JavaScript",
        "componentize-js/node_modules",
        "@bytecodealliance/componentize-js",
        "scripts/build-js-tools",
    ) else {
        return;
    };
    let homeserver = env!("CARGO_BIN_EXE_homeserver");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("js-policy");
    let run = run_ok;
    run(std::process::Command::new(homeserver)
        .args([
            "policy",
            "new",
            "--slot",
            "capability-policy",
            "--lang",
            "js",
        ])
        .arg(&dir));
    // The template's build.sh installs componentize-js into node_modules once: lend it
    // ours.
    std::os::unix::fs::symlink(&node_modules, dir.join("node_modules")).unwrap();
    let built = run(&mut std::process::Command::new(dir.join("build.sh")));
    assert!(built.contains("built js_policy.wasm"), "{built}");
    // The module is found in the folder, the slot from its world; the first call of
    // this 12 MB component under the unoptimized test build can outlast 100 ms.
    // One compile for both commands (the cache): ~40 s each in a debug build.
    let cache = tmp.path().join("guest-cache");
    let tested = run(std::process::Command::new(homeserver)
        .args([
            "policy",
            "test",
            "--strict",
            "--deadline-ms",
            "10000",
            "--cache-dir",
        ])
        .arg(&cache)
        .arg(&dir));
    assert!(
        tested.contains("slot capability-policy (WIT 0.2.0"),
        "{tested}"
    );
    assert!(tested.contains("\n6 passed, 0 failed\n"), "{tested}");
    let checked = run(std::process::Command::new(homeserver)
        .args(["policy", "check"])
        .arg(dir.join("js_policy.wasm"))
        .args(["--slot", "capability-policy", "--cases"])
        .arg(dir.join("cases.jsonl"))
        .args(["--deadline-ms", "10000", "--cache-dir"])
        .arg(&cache));
    assert!(
        checked.contains("cases.jsonl): 6 passed, 0 failed"),
        "{checked}"
    );
}

/// `policy new --lang python`: the Python template builds with its own build.sh
/// (componentize-py, from the venv scripts/build-python-guest made) and passes
/// `policy check` with its cases. Skipped with a reason without componentize-py; a
/// failure when CI=true.
#[test]
fn a_python_guest_from_the_template_builds_and_passes_its_cases() {
    let Some(venv) = template_builder(
        "Python",
        "componentize-py",
        "bin/componentize-py",
        "scripts/build-python-guest",
    ) else {
        return;
    };
    let homeserver = env!("CARGO_BIN_EXE_homeserver");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("py-policy");
    let run = run_ok;
    run(std::process::Command::new(homeserver)
        .args([
            "policy",
            "new",
            "--slot",
            "capability-policy",
            "--lang",
            "python",
        ])
        .arg(&dir));
    // The template's build.sh installs componentize-py into .venv once: lend it ours.
    std::os::unix::fs::symlink(&venv, dir.join(".venv")).unwrap();
    run(&mut std::process::Command::new(dir.join("build.sh")));
    let checked = run(std::process::Command::new(homeserver)
        .args(["policy", "check"])
        .arg(dir.join("py_policy.wasm"))
        .args(["--slot", "capability-policy", "--cases"])
        .arg(dir.join("cases.jsonl"))
        // The test is about the answers: the first call of this 40 MB component under
        // the unoptimized test build, beside the rest of the suite, can outlast 100 ms.
        // One compile for both commands (the cache).
        .args(["--deadline-ms", "10000", "--cache-dir"])
        .arg(tmp.path().join("guest-cache")));
    assert!(checked.contains("(WIT 0.2.0"), "{checked}");
    assert!(
        checked.contains("cases.jsonl): 6 passed, 0 failed"),
        "{checked}"
    );
    // The harness finds the module in the folder, and the slot from its world.
    let tested = run(std::process::Command::new(homeserver)
        .args(["policy", "test", "--deadline-ms", "10000", "--cache-dir"])
        .arg(tmp.path().join("guest-cache"))
        .arg(&dir));
    assert!(tested.contains("slot capability-policy"), "{tested}");
    assert!(tested.contains("\n6 passed, 0 failed\n"), "{tested}");
}
