//! The probes: `GET /health` and `GET /ready` on the client listeners (plain and
//! raw-public-key TLS) and the metrics listener; never rate limited; `/ready` turning
//! 503 when PostgreSQL (behind a cut proxy), the S3 server (stopped) or the capability
//! policy (a broken module started on its safe default) is not there, naming it, and
//! back to 200 by itself; and the `hs_backend_up` gauges following.
//!
//! Tests that need PostgreSQL or the S3 server skip with a printed reason when those
//! are missing, and fail when `CI=true`.

use std::time::Duration;

use homeserver::config::PolicyStartMode;
use homeserver::persistence::DatabaseUrl;
use homeserver_protocol::{ErrorBody, ErrorCode};
use pk_client::tls::pinned_key_config;
use reqwest::Method;
use serde_json::Value;

use crate::backend::{PgDatabase, S3Server};
use crate::fixture::*;
use crate::tcp_proxy::TcpProxy;

/// How long a store going down or coming back may take to show: the check interval
/// plus the storage timeout the tests set (2 s), with room for a loaded machine.
const NOTICED: Duration = Duration::from_secs(30);

/// The base URLs that serve the probes: the client listener and the metrics listener.
fn probe_bases(host: &TestHost) -> Vec<String> {
    let metrics = host.server().metrics_addr().expect("metrics listener");
    vec![
        format!("http://{}", host.server().http_addr()),
        format!("http://{metrics}"),
    ]
}

/// `GET {base}{path}`: the status and the body.
async fn probe(http: &reqwest::Client, base: &str, path: &str) -> (u16, String) {
    let r = http.get(format!("{base}{path}")).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.text().await.unwrap())
}

/// Whether `/ready` answers 200 on every probe listener.
async fn ready_everywhere(host: &TestHost) -> bool {
    for base in probe_bases(host) {
        if probe(&host.http, &base, "/ready").await.0 != 200 {
            return false;
        }
    }
    true
}

/// Whether `/ready` answers 503 naming `what` on every probe listener (checked in
/// full: the JSON error shape, `details.{part}` = `state`).
async fn not_ready_everywhere(host: &TestHost, what: &str, part: &str, state: &str) -> bool {
    for base in probe_bases(host) {
        let (status, text) = probe(&host.http, &base, "/ready").await;
        if status != 503 {
            return false;
        }
        let body: ErrorBody = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(body.error, ErrorCode::ServiceUnavailable, "{text}");
        assert!(body.message.contains(what), "{text}");
        let details: Value = serde_json::from_str(&text).unwrap();
        let got = &details["details"];
        let got = match part.split_once('.') {
            Some((outer, inner)) => &got[outer][inner],
            None => &got[part],
        };
        assert_eq!(got, state, "{text}");
    }
    true
}

/// `/health` answers 200 on every probe listener.
async fn assert_healthy(host: &TestHost) {
    for base in probe_bases(host) {
        let (status, text) = probe(&host.http, &base, "/health").await;
        assert_eq!(status, 200, "{base}/health: {text}");
        let body: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(body["status"], "ok", "{text}");
    }
}

/// The value of one series on the metrics page (`name{labels}` as printed).
async fn metric(host: &TestHost, series: &str) -> Option<String> {
    let metrics = host.server().metrics_addr().unwrap();
    let text = host
        .http
        .get(format!("http://{metrics}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(str::to_owned)
}

#[tokio::test]
async fn probes_answer_on_every_listener_without_credentials_or_rate_limits() {
    let host = TestHost::start_single_with(|c| {
        c.tls.listen = Some("127.0.0.1:0".parse().unwrap());
        c.rate_limit.enabled = true;
        c.rate_limit.anonymous_per_minute = 3;
    })
    .await;
    assert_healthy(&host).await;
    assert!(ready_everywhere(&host).await);
    let (_, text) = probe(&host.http, &host.url, "/ready").await;
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["status"],
        "ready"
    );

    // Far past the anonymous limit (3 a minute): a balancer probes often.
    for _ in 0..40 {
        for path in ["/health", "/ready"] {
            let r = host.request(Method::GET, path).send().await.unwrap();
            assert_eq!(r.status(), 200, "{path}");
            assert!(
                r.headers().get("x-ratelimit-limit").is_none(),
                "{path} is not rate limited"
            );
            assert!(
                r.headers().get("x-request-id").is_some(),
                "{path} has an id"
            );
        }
    }
    // The limit is in force for everything else.
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let r = host.request(Method::GET, "/info").send().await.unwrap();
        statuses.push(r.status().as_u16());
    }
    assert!(statuses.contains(&429), "/info is limited: {statuses:?}");

    // HEAD too; other methods are 405 with the JSON error shape.
    for path in ["/health", "/ready"] {
        let r = host.request(Method::HEAD, path).send().await.unwrap();
        assert_eq!(r.status(), 200, "HEAD {path}");
        expect_error(
            host.request(Method::POST, path).send().await.unwrap(),
            405,
            ErrorCode::MethodNotAllowed,
        )
        .await;
    }

    // The raw-public-key TLS listener serves them too.
    let tls = reqwest::Client::builder()
        .use_preconfigured_tls(pinned_key_config(host.server().server_key()))
        .build()
        .unwrap();
    let tls_url = format!("https://{}", host.server().tls_addr().unwrap());
    for path in ["/health", "/ready"] {
        assert_eq!(probe(&tls, &tls_url, path).await.0, 200, "TLS {path}");
    }

    // The gauges alerts use; probes are not counted as requests.
    assert_eq!(
        metric(&host, "hs_backend_up{backend=\"metadata\"}")
            .await
            .as_deref(),
        Some("1")
    );
    assert_eq!(
        metric(&host, "hs_backend_up{backend=\"blobs\"}")
            .await
            .as_deref(),
        Some("1")
    );
    assert_eq!(metric(&host, "hs_ready").await.as_deref(), Some("1"));
    assert_eq!(
        metric(&host, "hs_requests_total{method=\"HEAD\",status=\"200\"}").await,
        None,
        "probes stay out of the request metrics"
    );
}

#[tokio::test]
async fn ready_names_a_policy_slot_that_is_not_serving_until_a_reload_fixes_it() {
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("broken.wasm"), b"\0asm garbage").unwrap();
    std::fs::write(
        policies.join("policies.toml"),
        "[capability-policy]\nmodule = \"broken.wasm\"\n",
    )
    .unwrap();
    let mut config = test_config(dir.path());
    config.policies.on_start_error = PolicyStartMode::SafeDefault;
    let host = TestHost::start_single_in(dir, config).await;

    assert_healthy(&host).await;
    assert!(
        not_ready_everywhere(
            &host,
            "capability-policy",
            "policy_slots.capability-policy",
            "not_serving"
        )
        .await
    );
    let (_, text) = probe(&host.http, &host.url, "/ready").await;
    assert!(!text.contains("broken.wasm"), "no file names: {text}");
    assert_eq!(metric(&host, "hs_ready").await.as_deref(), Some("0"));
    // The stores are fine and say so.
    let details: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(details["details"]["metadata"], "ok", "{text}");
    assert_eq!(details["details"]["blobs"], "ok", "{text}");

    // Fixed (the built-in guest again) and reloaded: ready by itself.
    std::fs::remove_file(host.dir.path().join("policies/policies.toml")).unwrap();
    let report: Value = expect_ok_json(
        host.admin(Method::POST, "/admin/policies/reload")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(report["ok"], true, "{report}");
    eventually("/ready answers 200 again", NOTICED, || {
        ready_everywhere(&host)
    })
    .await;
    assert_eq!(metric(&host, "hs_ready").await.as_deref(), Some("1"));
}

#[tokio::test]
async fn ready_follows_postgres_going_away_and_coming_back() {
    let Some(db) = PgDatabase::or_skip("ready_follows_postgres_going_away_and_coming_back") else {
        return;
    };
    let real: url::Url = db.url.expose_secret().parse().unwrap();
    let upstream = format!(
        "{}:{}",
        real.host_str().unwrap(),
        real.port().unwrap_or(5432)
    )
    .parse()
    .unwrap();
    let proxy = TcpProxy::start(upstream).await;
    let mut through = real.clone();
    through.set_port(Some(proxy.addr.port())).unwrap();
    let host = TestHost::start_single_with(|c| {
        c.storage.database_url = DatabaseUrl::parse(through.as_str()).unwrap();
        c.storage.timeout_secs = 2;
    })
    .await;
    assert!(ready_everywhere(&host).await);

    proxy.cut();
    eventually("/ready names the metadata store", NOTICED, || {
        not_ready_everywhere(&host, "metadata store", "metadata", "down")
    })
    .await;
    let (_, text) = probe(&host.http, &host.url, "/ready").await;
    assert!(
        !text.contains(&proxy.addr.port().to_string()),
        "no addresses: {text}"
    );
    assert_healthy(&host).await;
    assert_eq!(
        metric(&host, "hs_backend_up{backend=\"metadata\"}")
            .await
            .as_deref(),
        Some("0")
    );
    assert_eq!(
        metric(&host, "hs_backend_up{backend=\"blobs\"}")
            .await
            .as_deref(),
        Some("1")
    );

    proxy.restore().await;
    eventually("/ready answers 200 again", NOTICED, || {
        ready_everywhere(&host)
    })
    .await;
    assert_healthy(&host).await;
    assert_eq!(
        metric(&host, "hs_backend_up{backend=\"metadata\"}")
            .await
            .as_deref(),
        Some("1")
    );
}

#[tokio::test]
async fn ready_follows_the_s3_server_stopping_and_starting() {
    let Some(s3) = S3Server::private_or_skip("ready_follows_the_s3_server_stopping_and_starting")
    else {
        return;
    };
    let bucket = s3.new_bucket();
    let host = TestHost::start_single_with(|c| {
        c.storage.blobs = format!("s3://{bucket}").parse().unwrap();
        c.s3 = s3.settings();
        c.storage.timeout_secs = 2;
    })
    .await;
    assert!(ready_everywhere(&host).await);

    s3.stop();
    eventually("/ready names the blob store", NOTICED, || {
        not_ready_everywhere(&host, "blob store", "blobs", "down")
    })
    .await;
    assert_healthy(&host).await;
    assert_eq!(
        metric(&host, "hs_backend_up{backend=\"blobs\"}")
            .await
            .as_deref(),
        Some("0")
    );

    // Back (moto keeps nothing across a restart: the bucket is made again, empty).
    s3.restart();
    reqwest::Client::new()
        .put(format!("{}/{bucket}", s3.endpoint))
        .send()
        .await
        .unwrap();
    eventually("/ready answers 200 again", NOTICED, || {
        ready_everywhere(&host)
    })
    .await;
    assert_healthy(&host).await;
    assert_eq!(
        metric(&host, "hs_backend_up{backend=\"blobs\"}")
            .await
            .as_deref(),
        Some("1")
    );
}
