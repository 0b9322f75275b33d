//! The figures of a fan-out run: the summary line and its JSON.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

use super::check::CheckCounts;
use crate::summary::{MAX_TRACKED_US, format_ms};

pub(super) fn latency_histogram() -> Histogram<u64> {
    // Bounds are constants that satisfy the constructor's preconditions.
    Histogram::new_with_bounds(1, MAX_TRACKED_US, 3).expect("valid histogram bounds")
}

/// The figures of one fan-out run.
#[derive(Clone, Debug, PartialEq)]
pub struct FanoutSummary {
    pub subscribers: usize,
    pub users: usize,
    /// Subscriptions that got their 200 headers.
    pub opened: usize,
    pub subscribe_errors: usize,
    /// The load generator's count of open subscriptions after the idle pause.
    pub open_idle: usize,
    /// `hs_event_stream_subscribers` once every subscription was open.
    pub server_subscribers: Option<u64>,
    /// The server's `VmRSS` before the subscriptions, and after them and the idle pause.
    pub rss_before: Option<u64>,
    pub rss_idle: Option<u64>,
    pub writes: usize,
    pub writes_sent: u64,
    pub writes_ok: u64,
    /// Non-2xx answers, writes without an answer, failed connects.
    pub write_errors: u64,
    /// From the first PUT sent to the last answer.
    pub write_window: Duration,
    pub put_p50_us: u64,
    pub put_p99_us: u64,
    pub put_max_us: u64,
    /// First deliveries the open subscribers should get (committed writes of their user).
    pub expected: u64,
    /// First deliveries that arrived, and the latency figures over them.
    pub deliveries: u64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    pub check: CheckCounts,
    /// Streams that ended (or failed) before the run stopped them.
    pub streams_ended: u64,
    /// `event: error` events (the server failed mid-stream).
    pub server_error_events: u64,
    /// CPU time the server and the load generator used from the first write to the end
    /// of the drain (who was busy: they share the cores).
    pub server_cpu: Option<Duration>,
    pub loadgen_cpu: Option<Duration>,
    pub timed_out: bool,
    pub elapsed: Duration,
}

pub(super) fn quantile(h: &Histogram<u64>, q: f64) -> u64 {
    if h.is_empty() {
        0
    } else {
        h.value_at_quantile(q)
    }
}

impl FanoutSummary {
    /// Server memory per idle subscription: (idle RSS − RSS before) / opened.
    pub fn idle_bytes_per_subscriber(&self) -> Option<i64> {
        let (before, after) = (self.rss_before?, self.rss_idle?);
        let opened = i64::try_from(self.opened).ok().filter(|n| *n > 0)?;
        let growth = i64::try_from(after).ok()? - i64::try_from(before).ok()?;
        Some(growth / opened)
    }

    /// Committed writes per second of the write window.
    pub fn writes_per_sec(&self) -> f64 {
        let secs = self.write_window.as_secs_f64();
        if secs > 0.0 {
            self.writes_ok as f64 / secs
        } else {
            0.0
        }
    }

    /// Failed subscriptions, failed writes, streams lost early, server-side stream errors.
    pub fn errors(&self) -> u64 {
        self.subscribe_errors as u64
            + self.write_errors
            + self.streams_ended
            + self.server_error_events
    }

    /// Whether everything arrived as it should, in time and without errors.
    pub fn clean(&self) -> bool {
        !self.timed_out
            && self.errors() == 0
            && self.check.missing == 0
            && self.check.duplicates == 0
            && self.check.out_of_order == 0
            && self.check.unexpected == 0
            && self.writes_ok == self.writes as u64
            && self.opened == self.subscribers
    }

    /// One line, `key=value` separated by spaces; latencies in milliseconds, `-` for a
    /// figure not measured.
    pub fn line(&self) -> String {
        let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        format!(
            "scenario=fanout subscribers={} open={} server_subscribers={} users={} writes={} \
             writes_ok={} write/s={:.1} put_p50={}ms put_p99={}ms deliveries={} expected={} \
             p50={}ms p90={}ms p99={}ms max={}ms missing={} duplicates={} out_of_order={} \
             unexpected={} idle_bytes/sub={} server_cpu={}s loadgen_cpu={}s errors={} \
             timed_out={}",
            self.subscribers,
            self.open_idle,
            opt(self.server_subscribers.map(|n| n.to_string())),
            self.users,
            self.writes,
            self.writes_ok,
            self.writes_per_sec(),
            format_ms(self.put_p50_us),
            format_ms(self.put_p99_us),
            self.deliveries,
            self.expected,
            format_ms(self.p50_us),
            format_ms(self.p90_us),
            format_ms(self.p99_us),
            format_ms(self.max_us),
            self.check.missing,
            self.check.duplicates,
            self.check.out_of_order,
            self.check.unexpected,
            opt(self.idle_bytes_per_subscriber().map(|n| n.to_string())),
            opt(self.server_cpu.map(|d| format!("{:.2}", d.as_secs_f64()))),
            opt(self.loadgen_cpu.map(|d| format!("{:.2}", d.as_secs_f64()))),
            self.errors(),
            self.timed_out,
        )
    }

    /// The same figures as a JSON object (latencies in milliseconds, as numbers).
    pub fn to_json(&self) -> Value {
        let ms = |us: u64| us as f64 / 1000.0;
        json!({
            "scenario": "fanout",
            "subscribers": self.subscribers,
            "users": self.users,
            "opened": self.opened,
            "subscribe_errors": self.subscribe_errors,
            "open_idle": self.open_idle,
            "server_subscribers": self.server_subscribers,
            "server_rss_before_bytes": self.rss_before,
            "server_rss_idle_bytes": self.rss_idle,
            "idle_bytes_per_subscriber": self.idle_bytes_per_subscriber(),
            "writes": self.writes,
            "writes_sent": self.writes_sent,
            "writes_ok": self.writes_ok,
            "write_errors": self.write_errors,
            "write_window_s": self.write_window.as_secs_f64(),
            "writes_per_s": (self.writes_per_sec() * 10.0).round() / 10.0,
            "put_p50_ms": ms(self.put_p50_us),
            "put_p99_ms": ms(self.put_p99_us),
            "put_max_ms": ms(self.put_max_us),
            "expected_deliveries": self.expected,
            "deliveries": self.deliveries,
            "events_received": self.check.events,
            "p50_ms": ms(self.p50_us),
            "p90_ms": ms(self.p90_us),
            "p99_ms": ms(self.p99_us),
            "max_ms": ms(self.max_us),
            "missing": self.check.missing,
            "duplicates": self.check.duplicates,
            "out_of_order": self.check.out_of_order,
            "unexpected": self.check.unexpected,
            "streams_ended": self.streams_ended,
            "server_error_events": self.server_error_events,
            "server_cpu_s": self.server_cpu.map(|d| d.as_secs_f64()),
            "loadgen_cpu_s": self.loadgen_cpu.map(|d| d.as_secs_f64()),
            "errors": self.errors(),
            "timed_out": self.timed_out,
            "elapsed_s": self.elapsed.as_secs_f64(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> FanoutSummary {
        FanoutSummary {
            subscribers: 10,
            users: 1,
            opened: 10,
            subscribe_errors: 0,
            open_idle: 10,
            server_subscribers: Some(10),
            rss_before: Some(1_000_000),
            rss_idle: Some(1_200_000),
            writes: 100,
            writes_sent: 100,
            writes_ok: 100,
            write_errors: 0,
            write_window: Duration::from_secs(2),
            put_p50_us: 1500,
            put_p99_us: 4000,
            put_max_us: 5000,
            expected: 1000,
            deliveries: 1000,
            p50_us: 2000,
            p90_us: 3000,
            p99_us: 4000,
            max_us: 9000,
            check: CheckCounts {
                events: 1000,
                ..CheckCounts::default()
            },
            streams_ended: 0,
            server_error_events: 0,
            server_cpu: Some(Duration::from_millis(1500)),
            loadgen_cpu: None,
            timed_out: false,
            elapsed: Duration::from_secs(5),
        }
    }

    #[test]
    fn summary_line_and_json() {
        let s = summary();
        assert!(s.clean());
        assert_eq!(s.idle_bytes_per_subscriber(), Some(20_000));
        assert_eq!(s.writes_per_sec(), 50.0);
        assert_eq!(
            s.line(),
            "scenario=fanout subscribers=10 open=10 server_subscribers=10 users=1 writes=100 \
             writes_ok=100 write/s=50.0 put_p50=1.500ms put_p99=4.000ms deliveries=1000 \
             expected=1000 p50=2.000ms p90=3.000ms p99=4.000ms max=9.000ms missing=0 \
             duplicates=0 out_of_order=0 unexpected=0 idle_bytes/sub=20000 \
             server_cpu=1.50s loadgen_cpu=-s errors=0 timed_out=false"
        );
        let j = s.to_json();
        assert_eq!(j["idle_bytes_per_subscriber"], 20_000);
        assert_eq!(j["writes_per_s"], 50.0);
        assert_eq!(j["p99_ms"], 4.0);
        assert_eq!(j["missing"], 0);
        assert_eq!(j["server_cpu_s"], 1.5);
        assert!(j["loadgen_cpu_s"].is_null());

        let mut none = summary();
        none.subscribers = 0;
        none.opened = 0;
        none.server_subscribers = None;
        assert_eq!(none.idle_bytes_per_subscriber(), None);
        assert!(none.line().contains("server_subscribers=- "));
        assert!(none.line().contains("idle_bytes/sub=- "));
        assert!(none.to_json()["idle_bytes_per_subscriber"].is_null());

        let mut lossy = summary();
        lossy.check.missing = 1;
        assert!(!lossy.clean());
        lossy.check.missing = 0;
        lossy.streams_ended = 1;
        assert_eq!(lossy.errors(), 1);
        assert!(!lossy.clean());
    }
}
