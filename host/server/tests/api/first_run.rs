//! What a new operator meets first: a broken policy module at start, a second server on
//! the same data, and the messages of the admin API, sessions and signup tokens.

use homeserver::config::{PolicyStartMode, SignupMode};
use homeserver::{Config, Homeserver};
use homeserver_protocol::{ErrorCode, Keypair};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::fixture::*;

/// A config under a fresh dir whose capability-policy module is garbage.
fn broken_policy_config(dir: &std::path::Path) -> Config {
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("broken.wasm"), b"\0asm garbage").unwrap();
    std::fs::write(
        policies.join("policies.toml"),
        "[capability-policy]\nmodule = \"broken.wasm\"\n",
    )
    .unwrap();
    test_config(dir)
}

#[tokio::test]
async fn a_broken_policy_module_at_start_stops_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let config = broken_policy_config(dir.path());
    let error = match Homeserver::start(config).await {
        Ok(_) => panic!("a server with a broken capability policy must not start"),
        Err(e) => e.to_string(),
    };
    assert!(error.contains("capability-policy"), "{error}");
    assert!(error.contains("broken.wasm"), "{error}");
    assert!(error.contains("on_start_error"), "{error}");
    // Nothing is left locked: a fixed start on the same data works.
    std::fs::remove_file(dir.path().join("policies/policies.toml")).unwrap();
    let config = test_config(dir.path());
    let host = TestHost::start_in(dir, config).await;
    host.user().await;
}

#[tokio::test]
async fn safe_default_mode_starts_and_answers_503_until_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = broken_policy_config(dir.path());
    config.policies.on_start_error = PolicyStartMode::SafeDefault;
    let host = TestHost::start_single_in(dir, config).await;

    // Signup is not decided by the policy; reads and writes of one's own data are.
    let alice = host.user().await;
    let body = expect_error(
        host.put(&alice, "/pub/a.txt", b"hi").await,
        503,
        ErrorCode::ServiceUnavailable,
    )
    .await;
    assert!(body.message.contains("capability policy"), "{body:?}");
    assert!(
        !body.message.contains("broken.wasm"),
        "no file paths: {body:?}"
    );
    expect_error(
        host.get(&alice, "/pub/a.txt").await,
        503,
        ErrorCode::ServiceUnavailable,
    )
    .await;

    // The admin API says why.
    let status: Value = expect_ok_json(
        host.admin(Method::GET, "/admin/policies")
            .send()
            .await
            .unwrap(),
    )
    .await;
    let slot = status["slots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["slot"] == "capability-policy")
        .unwrap()
        .clone();
    assert_eq!(slot["serving"], false, "{slot}");
    assert!(
        slot["last_error"].as_str().unwrap().contains("broken.wasm"),
        "{slot}"
    );

    // Fixed (back to the built-in guest) and reloaded: served again.
    std::fs::remove_file(host.dir.path().join("policies/policies.toml")).unwrap();
    let report: Value = expect_ok_json(
        host.admin(Method::POST, "/admin/policies/reload")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(host.put(&alice, "/pub/a.txt", b"hi").await.status(), 200);
}

#[tokio::test]
async fn a_second_server_on_the_same_data_is_refused() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    assert_eq!(host.put(&alice, "/pub/a.txt", b"one").await.status(), 200);

    // Same database and blob folder, other ports.
    let config = test_config(host.dir.path());
    let local_db = !crate::backend::Backend::current().shared();
    let local_blobs = matches!(
        config.storage.blobs,
        homeserver::persistence::BlobsUrl::File(_)
    );
    match Homeserver::start(config).await {
        // PostgreSQL + S3 are made for several instances: nothing to refuse.
        Ok(second) if !local_db && !local_blobs => second.shutdown().await,
        Ok(_) => panic!("two servers on one data directory"),
        Err(e) => {
            let error = e.to_string();
            assert!(error.contains("in use by another homeserver"), "{error}");
            if local_db {
                assert!(error.contains("hs.db"), "{error}");
            }
            assert!(
                error.contains(&format!("pid {}", std::process::id())),
                "{error}"
            );
        }
    }

    // Another database on the same blob folder: refused too (each server's sweep
    // would delete the other's blobs). An object store is made for sharing.
    let mut config = test_config(host.dir.path());
    config.storage.database_url = format!("sqlite://{}/other.db", host.dir.path().display())
        .parse()
        .unwrap();
    if local_blobs {
        let error = match Homeserver::start(config).await {
            Ok(_) => panic!("two servers on one blob folder"),
            Err(e) => e.to_string(),
        };
        assert!(error.contains("blob folder"), "{error}");
    }

    // The first one served on untouched; once it stopped, its data opens again.
    assert_eq!(host.get(&alice, "/pub/a.txt").await.status(), 200);
    let dir = host.stop().await;
    let config = test_config(dir.path());
    let host = TestHost::start_in(dir, config).await;
    let r = host.get(&alice, "/pub/a.txt").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "one");
}

#[tokio::test]
async fn admin_messages_say_what_is_wrong() {
    let host = TestHost::start().await;
    let admin = host.server().admin_addr().unwrap();
    let url = format!("http://{admin}/admin/stats");
    let missing = expect_error(
        host.http.get(&url).send().await.unwrap(),
        401,
        ErrorCode::InvalidSignature,
    )
    .await;
    assert!(
        missing.message.contains("needs the admin password"),
        "{missing:?}"
    );
    let wrong = expect_error(
        host.http
            .get(&url)
            .bearer_auth("nope")
            .send()
            .await
            .unwrap(),
        401,
        ErrorCode::InvalidSignature,
    )
    .await;
    assert!(wrong.message.contains("wrong admin password"), "{wrong:?}");
}

#[tokio::test]
async fn an_empty_quota_body_does_not_reset_a_quota() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let admin = host.server().admin_addr().unwrap();
    let url = format!("http://{admin}/admin/users/{}/quota", alice.public_key());
    let set = |body: &'static str| {
        host.http
            .put(&url)
            .bearer_auth(ADMIN_PASSWORD)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let user: Value = expect_ok_json(set(r#"{"quota_bytes": 5}"#).await.unwrap()).await;
    assert_eq!(user["storage_quota"], 5, "{user}");
    for bad in ["", "{}", r#"{"quota": 7}"#] {
        expect_error(set(bad).await.unwrap(), 400, ErrorCode::BadRequest).await;
    }
    let user: Value = expect_ok_json(
        host.admin(Method::GET, &format!("/admin/users/{}", alice.public_key()))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(user["storage_quota"], 5, "unchanged: {user}");
    // null is the explicit way back to the default.
    let user: Value = expect_ok_json(set(r#"{"quota_bytes": null}"#).await.unwrap()).await;
    assert_ne!(user["storage_quota"], 5, "{user}");
}

#[tokio::test]
async fn lower_case_signup_tokens_are_accepted() {
    let host = TestHost::start_with(|c| c.signup.mode = SignupMode::Token).await;
    let body: Value = expect_ok_json(
        host.admin(Method::POST, "/admin/signup_tokens")
            .send()
            .await
            .unwrap(),
    )
    .await;
    let token = body["token"].as_str().unwrap().to_ascii_lowercase();
    let status: Value = expect_ok_json(
        host.request(Method::GET, &format!("/signup_tokens/{token}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status["status"], "valid");
    let key = Keypair::random();
    let r = host
        .signed(
            &key,
            Method::POST,
            &format!("/signup?signup_token={token}"),
            b"",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let status: Value = expect_ok_json(
        host.request(
            Method::GET,
            &format!("/signup_tokens/{}", token.to_uppercase()),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(status["status"], "used");
}

#[tokio::test]
async fn a_revoked_session_says_so() {
    let host = TestHost::start().await;
    let alice = host.user().await;
    let body = br#"{"capabilities": ["read:/pub/"]}"#;
    let session: Value = expect_ok_json(
        host.signed(&alice, Method::POST, "/auth/session", body)
            .header("content-type", "application/json")
            .send()
            .await
            .unwrap(),
    )
    .await;
    let token = session["token"].as_str().unwrap();
    let r = host
        .request(Method::DELETE, "/auth/session")
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let e = expect_error(
        host.request(Method::GET, "/pub/")
            .bearer_auth(token)
            .send()
            .await
            .unwrap(),
        401,
        ErrorCode::InvalidSignature,
    )
    .await;
    assert!(e.message.contains("revoked session"), "{e:?}");
}

/// Every answer carries `X-Request-Id` (the client's own when it sent one, else a new
/// UUID), the id every log line of the request is tagged with.
#[tokio::test]
async fn every_answer_carries_a_request_id() {
    let host = TestHost::start().await;
    let first = host.request(Method::GET, "/pub/x").send().await.unwrap();
    let second = host.request(Method::GET, "/pub/x").send().await.unwrap();
    let id = |r: &reqwest::Response| r.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(first.status(), 401);
    assert_eq!(id(&first).len(), 36, "{}", id(&first));
    assert_ne!(id(&first), id(&second));
    let given = host
        .request(Method::GET, "/events/?limit=1")
        .header("x-request-id", "trace-me-42")
        .send()
        .await
        .unwrap();
    assert_eq!(id(&given), "trace-me-42");
    // An implausible id (too long, or with characters that could fake a log line) is
    // replaced.
    for bad in ["x".repeat(65), "a b".to_owned(), "id\"=\"other".to_owned()] {
        let r = host
            .request(Method::GET, "/events/?limit=1")
            .header("x-request-id", bad.as_str())
            .send()
            .await
            .unwrap();
        assert_eq!(id(&r).len(), 36, "{bad}");
    }
    let admin = host.server().admin_addr().unwrap();
    let r = host
        .http
        .get(format!("http://{admin}/admin/stats"))
        .send()
        .await
        .unwrap();
    assert_eq!(id(&r).len(), 36);
}

/// The real binary with the embedded defaults: started in `/` (a service without a
/// working directory) it refuses before creating anything and names each relative
/// setting; started elsewhere it logs where its files are, as absolute paths.
#[tokio::test]
async fn relative_paths_are_refused_in_the_root_directory_and_resolved_elsewhere() {
    use std::process::{Command, Stdio};

    let server = |dir: &std::path::Path| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_homeserver"));
        command
            .current_dir(dir)
            .env(
                "HOMESERVER__HTTP__LISTEN",
                format!("127.0.0.1:{}", crate::process::free_port()),
            )
            .env("HOMESERVER__METRICS__LISTEN", "")
            .env("HOMESERVER__PKARR__ENABLED", "false")
            .env("RUST_LOG", "info")
            .env_remove("HOMESERVER__ADMIN__PASSWORD")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    };

    let data_existed = std::path::Path::new("/data").exists();
    let out = tokio::task::spawn_blocking(move || server(std::path::Path::new("/")).output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for setting in [
        "storage.database_url = data/hs.db",
        "storage.blobs = data/blobs",
        "keys.secret_key_file = data/server.key",
        "policies.dir = policies",
        "policies.cache_dir = data/guest-cache",
    ] {
        assert!(stderr.contains(setting), "{setting} not named: {stderr}");
    }
    if !data_existed {
        assert!(!std::path::Path::new("/data").exists(), "it created /data");
    }

    // Elsewhere the same defaults serve, and the log says where the files are.
    let dir = tempfile::tempdir().unwrap();
    let mut child = server(dir.path()).stderr(Stdio::null()).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let reader = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find(|line| line.contains("local files:"))
    });
    let line = tokio::time::timeout(std::time::Duration::from_secs(60), reader).await;
    let _ = child.kill();
    let _ = child.wait();
    let line = line
        .expect("no `local files` line within 60 s")
        .unwrap()
        .expect("no `local files` line before the server's output ended");
    let root = dir.path().display();
    assert!(
        line.contains(&format!(
            "database {root}/data/hs.db, blobs {root}/data/blobs, server key {root}/data/server.key, policies {root}/policies"
        )),
        "{line}"
    );
}
