//! Prometheus metrics: the spec's `hs_*` series, request latency, rate-limit rejections
//! and event-stream subscribers, plus a one-minute request counter for admin stats.
//! Values that live elsewhere (storage bytes, sessions, subscribers) are read at scrape
//! time by the metrics server; guest call counters and latencies come from the Wasm
//! runtime's own lock-free stats through [`GuestCollector`] when scraped.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use homeserver_runtime::PolicyRuntime;
use homeserver_runtime::metrics::GuestCollector;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    duration: HistogramVec,
    /// The request series by method ([`METHODS`]' order), found once each.
    by_method: Box<[MethodSeries; METHODS.len()]>,
    pub storage_bytes: IntGauge,
    pub active_sessions: IntGauge,
    pub users: IntGauge,
    pub stream_subscribers: IntGauge,
    pub unproven_upload_bytes: IntGauge,
    /// pkarr: when every publication last worked (Unix seconds; 0: never), whether the
    /// last round failed, and the users' records republished in it.
    pub pkarr_last_success: IntGauge,
    pub pkarr_failing: IntGauge,
    pub pkarr_users_published: IntGauge,
    open_connections: IntGaugeVec,
    /// The most connections each listener keeps open (`http.max_connections`, after
    /// lowering to the open-files limit): what `hs_open_connections` runs into.
    pub max_connections: IntGauge,
    /// 1 while a backing store (`metadata`, `blobs`) answers, as the readiness check
    /// last saw it; `ready` is 1 while `GET /ready` answers 200.
    backend_up: IntGaugeVec,
    pub ready: IntGauge,
    rate_limited: IntCounterVec,
    window: Mutex<MinuteWindow>,
    started: Instant,
}

/// Requests per second over the last 60 seconds.
struct MinuteWindow {
    buckets: [(u64, u64); 60],
}

impl MinuteWindow {
    fn add(&mut self, second: u64) {
        let slot = &mut self.buckets[(second % 60) as usize];
        if slot.0 != second {
            *slot = (second, 0);
        }
        slot.1 += 1;
    }

    fn last_minute(&self, second: u64) -> u64 {
        self.buckets
            .iter()
            .filter(|(s, _)| second.saturating_sub(*s) < 60)
            .map(|(_, n)| n)
            .sum()
    }
}

/// The method label: the standard methods, or OTHER (bounded label values).
/// The methods the request series name; any other is `OTHER`.
const METHODS: [&str; 7] = ["GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS", "OTHER"];

fn method_index(method: &str) -> usize {
    METHODS[..METHODS.len() - 1]
        .iter()
        .position(|m| *m == method)
        .unwrap_or(METHODS.len() - 1)
}

/// The statuses whose series are kept found (100-599: all HTTP has).
const STATUSES: std::ops::Range<u16> = 100..600;

/// One method's request series, each found in its vector the first time it is used
/// (so a series appears when it counts something, as `with_label_values` makes it), then
/// kept: finding a series by its labels hashes them and takes the vector's lock, which
/// both cores of a busy server took at every request.
struct MethodSeries {
    duration: OnceLock<Histogram>,
    /// `hs_requests_total` by status, from [`STATUSES`]' start.
    by_status: [OnceLock<IntCounter>; STATUSES.end as usize - STATUSES.start as usize],
}

impl MethodSeries {
    fn new() -> Self {
        Self {
            duration: OnceLock::new(),
            by_status: [const { OnceLock::new() }; STATUSES.end as usize - STATUSES.start as usize],
        }
    }
}

impl Metrics {
    /// The server's metrics; with `guests`, also the Wasm slots' call counters.
    pub fn new(guests: Option<Arc<PolicyRuntime>>) -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        if let Some(runtime) = guests {
            registry.register(Box::new(GuestCollector::new(runtime, "hs")?))?;
        }
        let requests = IntCounterVec::new(
            Opts::new(
                "hs_requests_total",
                "HTTP requests answered, by method and status.",
            ),
            &["method", "status"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "hs_request_duration_seconds",
                "Time from request to response headers, by method.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            &["method"],
        )?;
        let storage_bytes = IntGauge::new("hs_storage_bytes", "Bytes stored, all users.")?;
        let active_sessions = IntGauge::new("hs_active_sessions", "Sessions not yet expired.")?;
        let users = IntGauge::new("hs_users", "Signed-up users.")?;
        let stream_subscribers = IntGauge::new(
            "hs_event_stream_subscribers",
            "Open /events-stream connections.",
        )?;
        let unproven_upload_bytes = IntGauge::new(
            "hs_unproven_upload_bytes",
            "Memory held by signed uploads whose signature is not checked yet.",
        )?;
        let pkarr_last_success = IntGauge::new(
            "hs_pkarr_last_success_timestamp_seconds",
            "When the server's and its users' pkarr records were last all published (0: never).",
        )?;
        let pkarr_failing = IntGauge::new(
            "hs_pkarr_failing",
            "1 when the last pkarr publishing round had an error (the DHT unreachable, say).",
        )?;
        let pkarr_users_published = IntGauge::new(
            "hs_pkarr_user_records",
            "Users' pkarr records republished in the last round.",
        )?;
        let open_connections = IntGaugeVec::new(
            Opts::new("hs_open_connections", "Open connections, by listener."),
            &["listener"],
        )?;
        let max_connections = IntGauge::new(
            "hs_max_connections",
            "Connections each listener keeps open at most (past it, new ones displace idle ones or are refused).",
        )?;
        let backend_up = IntGaugeVec::new(
            Opts::new(
                "hs_backend_up",
                "1 when the backing store answered the last readiness check (every 2 s), by backend.",
            ),
            &["backend"],
        )?;
        let ready = IntGauge::new(
            "hs_ready",
            "1 when GET /ready answers 200: both stores answer and every guest slot the server calls is served.",
        )?;
        let rate_limited = IntCounterVec::new(
            Opts::new(
                "hs_rate_limit_rejections_total",
                "Requests refused with 429, by limit.",
            ),
            &["scope"],
        )?;
        // What runs: one series, always 1 (join it with other series by instance).
        let build_info = IntGaugeVec::new(
            Opts::new(
                "hs_build_info",
                "The homeserver's version and the git commit it was built from; always 1.",
            ),
            &["version", "commit"],
        )?;
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION"), env!("HOMESERVER_COMMIT")])
            .set(1);
        registry.register(Box::new(build_info))?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(storage_bytes.clone()))?;
        registry.register(Box::new(active_sessions.clone()))?;
        registry.register(Box::new(users.clone()))?;
        registry.register(Box::new(stream_subscribers.clone()))?;
        registry.register(Box::new(rate_limited.clone()))?;
        registry.register(Box::new(unproven_upload_bytes.clone()))?;
        registry.register(Box::new(open_connections.clone()))?;
        registry.register(Box::new(max_connections.clone()))?;
        registry.register(Box::new(backend_up.clone()))?;
        registry.register(Box::new(ready.clone()))?;
        registry.register(Box::new(pkarr_last_success.clone()))?;
        registry.register(Box::new(pkarr_failing.clone()))?;
        registry.register(Box::new(pkarr_users_published.clone()))?;
        Ok(Self {
            registry,
            requests,
            duration,
            by_method: Box::new(std::array::from_fn(|_| MethodSeries::new())),
            storage_bytes,
            active_sessions,
            users,
            stream_subscribers,
            unproven_upload_bytes,
            pkarr_last_success,
            pkarr_failing,
            pkarr_users_published,
            open_connections,
            max_connections,
            backend_up,
            ready,
            rate_limited,
            window: Mutex::new(MinuteWindow {
                buckets: [(0, 0); 60],
            }),
            started: Instant::now(),
        })
    }

    /// The open-connections gauge of one listener.
    pub fn open_connections(&self, listener: &str) -> IntGauge {
        self.open_connections.with_label_values(&[listener])
    }

    /// The up gauge of one backing store (`metadata`, `blobs`).
    pub fn backend_up(&self, backend: &str) -> IntGauge {
        self.backend_up.with_label_values(&[backend])
    }

    /// Lets other parts (the Wasm runtime) add their own collectors.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn observe_request(&self, method: &str, status: StatusCode, elapsed: Duration) {
        let index = method_index(method);
        let (label, series) = (METHODS[index], &self.by_method[index]);
        match series
            .by_status
            .get(usize::from(status.as_u16().wrapping_sub(STATUSES.start)))
        {
            Some(counter) => counter
                .get_or_init(|| self.requests.with_label_values(&[label, status.as_str()]))
                .inc(),
            None => self
                .requests
                .with_label_values(&[label, status.as_str()])
                .inc(),
        }
        series
            .duration
            .get_or_init(|| self.duration.with_label_values(&[label]))
            .observe(elapsed.as_secs_f64());
        let second = crate::service::now_secs().max(0) as u64;
        self.window
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(second);
    }

    pub fn observe_rate_limited(&self, scope: &str) {
        self.rate_limited.with_label_values(&[scope]).inc();
    }

    pub fn requests_last_minute(&self) -> u64 {
        let second = crate::service::now_secs().max(0) as u64;
        self.window
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_minute(second)
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// The text exposition format.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_documented_series() {
        let m = Metrics::new(None).unwrap();
        m.observe_request("GET", StatusCode::OK, Duration::from_millis(3));
        m.observe_request(
            "BREW",
            StatusCode::METHOD_NOT_ALLOWED,
            Duration::from_millis(1),
        );
        m.observe_rate_limited("anonymous");
        let text = m.render().unwrap();
        assert!(
            text.contains("hs_requests_total{method=\"GET\",status=\"200\"} 1"),
            "{text}"
        );
        assert!(text.contains("method=\"OTHER\""));
        assert!(text.contains("hs_storage_bytes 0"));
        assert!(text.contains("hs_active_sessions 0"));
        assert!(text.contains("hs_request_duration_seconds_bucket"));
        assert_eq!(m.requests_last_minute(), 2);
        // A series found once counts on; one never used does not appear; a status past
        // the kept range still counts.
        m.observe_request("GET", StatusCode::OK, Duration::from_millis(3));
        m.observe_request("GET", StatusCode::from_u16(799).unwrap(), Duration::ZERO);
        let text = m.render().unwrap();
        assert!(
            text.contains("hs_requests_total{method=\"GET\",status=\"200\"} 2")
                && text.contains("hs_requests_total{method=\"GET\",status=\"799\"} 1")
                && text.contains("hs_request_duration_seconds_count{method=\"GET\"} 3"),
            "{text}"
        );
        assert!(!text.contains("method=\"PUT\""), "{text}");
    }

    #[test]
    fn minute_window_forgets_old_seconds() {
        let mut w = MinuteWindow {
            buckets: [(0, 0); 60],
        };
        w.add(1000);
        w.add(1000);
        w.add(1030);
        assert_eq!(w.last_minute(1030), 3);
        assert_eq!(w.last_minute(1061), 1);
        assert_eq!(w.last_minute(1100), 0);
    }
}
