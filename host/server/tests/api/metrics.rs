//! The metrics server: the series it exports after real traffic.

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
    // promtool, when installed (CI installs it): the output must lint clean.
    match std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        Ok(mut child) => {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "promtool check metrics failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "promtool missing in CI: {e}"
            );
            eprintln!(
                "SKIPPED promtool lint: promtool not installed ({e}); apt-get install prometheus"
            );
        }
    }
}
