//! The metrics server: the series it exports after real traffic; and the monitoring
//! examples built on them (docs/examples/alerts.yml with its promtool unit tests, and
//! docs/examples/grafana-dashboard.json) name only series it exports.

use reqwest::Method;

use crate::fixture::*;

#[tokio::test]
async fn metrics_series() {
    let host = TestHost::start_single_with(|_| {}).await;
    let alice = host.user().await;
    host.put(&alice, "/pub/m", &[1; 77]).await;
    host.get(&alice, "/pub/missing").await;
    let addr = host.server().metrics_addr().unwrap();
    let r = host
        .http
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = r.text().await.unwrap();
    for needle in [
        "hs_requests_total{method=\"PUT\",status=\"200\"} 1",
        "hs_requests_total{method=\"GET\",status=\"404\"} 1",
        "hs_requests_total{method=\"POST\",status=\"201\"} 1",
        "hs_storage_bytes 77",
        "hs_active_sessions 0",
        "hs_users 1",
        "hs_event_stream_subscribers 0",
        "hs_request_duration_seconds_bucket{method=\"PUT\"",
    ] {
        assert!(text.contains(needle), "missing {needle} in:\n{text}");
    }
    // promtool (CI installs it): the output must lint clean.
    hs_testkit::promtool::check_metrics("metrics_series", &text);
}

fn examples() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/examples")
}

/// The alert rules load (`promtool check rules`), and each alert fires on the made-up
/// series of alerts.test.yml meant to wake someone and stays quiet on the others
/// (`promtool test rules`).
#[test]
fn the_alert_rules_pass_promtool() {
    let test = "the_alert_rules_pass_promtool";
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts.test.yml"],
    ] {
        let Some(run) = hs_testkit::promtool::promtool(test, &examples(), &args, "") else {
            return;
        };
        assert!(run.success, "promtool {}:\n{}", args.join(" "), run.output);
    }
}

/// The `hs_*` names in `text` (a rule file or a dashboard: queries, and the series
/// their descriptions mention).
fn series_named(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("hs_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
    names
}

/// Every series the alerts and the dashboard name is one a real server exports (a
/// histogram with its `_bucket`, `_sum` and `_count`), after traffic that makes each
/// labelled family appear: requests, a 429 of each limit the alerts watch, guest calls.
#[tokio::test]
async fn the_alerts_and_the_dashboard_name_exported_series() {
    let alerts = std::fs::read_to_string(examples().join("alerts.yml")).unwrap();
    let dashboard = std::fs::read_to_string(examples().join("grafana-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).unwrap();

    // The dashboard is importable: panels with unique ids, a grid position, and
    // queries with a refId against the data source the importer picks.
    let mut ids = std::collections::BTreeSet::new();
    let mut queries = String::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "duplicate panel id"
        );
        assert!(panel["gridPos"]["w"].as_u64().is_some(), "{panel}");
        for target in panel["targets"].as_array().into_iter().flatten() {
            assert!(target["refId"].is_string(), "{target}");
            assert_eq!(target["datasource"]["uid"], "${datasource}");
            queries.push_str(target["expr"].as_str().unwrap());
            queries.push('\n');
        }
        if panel["type"] != "row" {
            assert_eq!(panel["datasource"]["uid"], "${datasource}", "{panel}");
        }
    }
    let mut named = series_named(&alerts);
    named.extend(series_named(&queries));
    named.extend(series_named(&dashboard.to_string()));
    assert!(named.len() >= 15, "{named:?}");

    let host = TestHost::start_single_with(|c| {
        c.rate_limit.enabled = true;
        c.rate_limit.anonymous_per_minute = 5;
        c.rate_limit.signup_token_check_per_minute = 1;
        c.http.max_streams_per_ip = 1;
    })
    .await;
    let alice = host.user().await;
    host.put(&alice, "/pub/m", b"value").await;
    host.get(&alice, "/pub/m").await;
    // Past each limit once: event streams (first: they count against the address's
    // limit of 5 too, as did the signup and the PUT without Content-Digest), anonymous
    // reads, signup-token checks.
    let stream = format!("/events-stream?user={}&live=true", alice.public_key());
    let held = host.request(Method::GET, &stream).send().await.unwrap();
    assert_eq!(held.status(), 200);
    let refused = host.request(Method::GET, &stream).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    for _ in 0..6 {
        host.public_get(&alice, "/pub/m").await;
        host.request(Method::GET, "/signup_tokens/AAAA-BBBB-CCCC")
            .send()
            .await
            .unwrap();
    }
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
    drop(held);
    let exported: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap())
        .collect();
    let histogram = |name: &str| text.contains(&format!("# TYPE {name} histogram"));
    for name in &named {
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix).filter(|b| histogram(b)));
        match base {
            // A histogram's series: the histogram has all three.
            Some(base) => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    let series = format!("{base}{suffix}");
                    assert!(
                        exported.contains(series.as_str()),
                        "{series} missing:\n{text}"
                    );
                }
            }
            None if histogram(name) => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    let series = format!("{name}{suffix}");
                    assert!(
                        exported.contains(series.as_str()),
                        "{series} missing:\n{text}"
                    );
                }
            }
            None => assert!(
                exported.contains(name.as_str()),
                "{name} is named in docs/examples but the server does not export it:\n{text}"
            ),
        }
    }
    // The label values the alerts select on exist too.
    for series in [
        "hs_rate_limit_rejections_total{scope=\"anonymous\"}",
        "hs_rate_limit_rejections_total{scope=\"signup_token_check\"}",
        "hs_rate_limit_rejections_total{scope=\"event_streams\"}",
        "hs_backend_up{backend=\"metadata\"}",
        "hs_backend_up{backend=\"blobs\"}",
        "hs_open_connections{listener=\"http\"}",
        "hs_guest_reloads_total{slot=\"capability-policy\",result=\"failed\"}",
    ] {
        assert!(text.contains(series), "{series} missing:\n{text}");
    }
}
