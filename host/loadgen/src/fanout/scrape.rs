//! The server's metrics page, read during a run: how many subscribers it counts.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::HOST;
use hyper::{Request, StatusCode};
use tokio::time::{Instant, sleep, timeout_at};

use super::POLL;
use crate::driver::connect;
use crate::target::Target;

/// `hs_event_stream_subscribers` (or any unlabelled sample) from a Prometheus text page.
pub fn metric_value(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let mut parts = line.split_whitespace();
            (parts.next()? == name).then(|| parts.next()?.parse().ok())?
        })
}

/// Polls the metrics endpoint until it counts at least `want` subscribers (or `until`);
/// returns the last count read.
pub(super) async fn wait_for_server_count(
    metrics: &Target,
    want: u64,
    until: Instant,
) -> Option<u64> {
    let mut last = None;
    loop {
        match timeout_at(until, fetch_text(metrics, "/metrics")).await {
            Err(_) => break,
            Ok(Err(error)) => eprintln!("hs-load fanout: reading metrics: {error}"),
            Ok(Ok(page)) => match metric_value(&page, "hs_event_stream_subscribers") {
                Some(n) => last = Some(n as u64),
                None => {
                    eprintln!("hs-load fanout: no hs_event_stream_subscribers in the metrics");
                    break;
                }
            },
        }
        if last.is_some_and(|n| n >= want) || Instant::now() + POLL * 10 >= until {
            break;
        }
        sleep(POLL * 10).await;
    }
    last
}

/// `GET path` on its own connection; the body as text when the answer is 200.
pub(super) async fn fetch_text(target: &Target, path: &str) -> Result<String, String> {
    let mut sender = connect(target).await.map_err(|e| e.to_string())?;
    let request = Request::get(path)
        .header(HOST, target.authority.as_str())
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if status != StatusCode::OK {
        return Err(format!("GET {path} answered {status}"));
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_sample_from_a_metrics_page() {
        let page = "# HELP hs_event_stream_subscribers Open /events-stream connections.\n\
                    # TYPE hs_event_stream_subscribers gauge\n\
                    hs_event_stream_subscribers_total 9\n\
                    hs_event_stream_subscribers 1000\n\
                    hs_users 3\n";
        assert_eq!(
            metric_value(page, "hs_event_stream_subscribers"),
            Some(1000.0)
        );
        assert_eq!(metric_value(page, "hs_users"), Some(3.0));
        assert_eq!(metric_value(page, "hs_missing"), None);
    }
}
