//! Results of a run: per-connection tallies, merged into one [`Summary`] that prints as a
//! single `key=value` line (easy to grep and to parse from a shell script) or as JSON.
//!
//! Latencies are recorded in microseconds in an HDR histogram (3 significant digits) and
//! reported in milliseconds.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

/// Largest latency the histogram tracks exactly (larger ones are clamped to it).
pub const MAX_TRACKED_US: u64 = 600_000_000;

/// What one connection (or the whole run, once merged) observed inside the window.
#[derive(Debug)]
pub struct Tally {
    pub latency_us: Histogram<u64>,
    /// Responses by HTTP status.
    pub statuses: BTreeMap<u16, u64>,
    /// Requests sent that got no response (connection reset, protocol error).
    pub transport_errors: u64,
    /// Failed attempts to open a connection (no request was sent: not in `requests`).
    pub connect_errors: u64,
}

impl Default for Tally {
    fn default() -> Self {
        Self::new()
    }
}

impl Tally {
    pub fn new() -> Self {
        Self {
            // Bounds are constants that satisfy the constructor's preconditions.
            latency_us: Histogram::new_with_bounds(1, MAX_TRACKED_US, 3)
                .expect("valid histogram bounds"),
            statuses: BTreeMap::new(),
            transport_errors: 0,
            connect_errors: 0,
        }
    }

    pub fn record_response(&mut self, status: u16, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.latency_us.saturating_record(us.max(1));
        *self.statuses.entry(status).or_default() += 1;
    }

    pub fn record_transport_error(&mut self) {
        self.transport_errors += 1;
    }

    pub fn record_connect_error(&mut self) {
        self.connect_errors += 1;
    }

    pub fn merge(&mut self, other: &Tally) {
        // Same bounds on both sides, so adding cannot fail; saturate rather than panic.
        if self.latency_us.add(&other.latency_us).is_err() {
            for v in other.latency_us.iter_recorded() {
                self.latency_us
                    .saturating_record_n(v.value_iterated_to(), v.count_at_value());
            }
        }
        for (status, n) in &other.statuses {
            *self.statuses.entry(*status).or_default() += n;
        }
        self.transport_errors += other.transport_errors;
        self.connect_errors += other.connect_errors;
    }

    /// Responses plus requests that failed in transport.
    pub fn requests(&self) -> u64 {
        self.statuses.values().sum::<u64>() + self.transport_errors
    }

    /// Non-2xx responses, requests without a response, and failed connection attempts
    /// (so with a dead server `errors` can exceed `requests`).
    pub fn errors(&self) -> u64 {
        let non_2xx: u64 = self
            .statuses
            .iter()
            .filter(|(s, _)| !(200..300).contains(*s))
            .map(|(_, n)| n)
            .sum();
        non_2xx + self.transport_errors + self.connect_errors
    }
}

/// The figures reported for one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub scenario: String,
    pub connections: usize,
    /// Length of the measured window (warm-up excluded).
    pub duration: Duration,
    pub requests: u64,
    pub errors: u64,
    pub transport_errors: u64,
    pub connect_errors: u64,
    pub statuses: BTreeMap<u16, u64>,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

impl Summary {
    pub fn new(scenario: &str, connections: usize, duration: Duration, tally: &Tally) -> Self {
        let h = &tally.latency_us;
        let pct = |q: f64| {
            if h.is_empty() {
                0
            } else {
                h.value_at_quantile(q)
            }
        };
        Self {
            scenario: scenario.to_owned(),
            connections,
            duration,
            requests: tally.requests(),
            errors: tally.errors(),
            transport_errors: tally.transport_errors,
            connect_errors: tally.connect_errors,
            statuses: tally.statuses.clone(),
            p50_us: pct(0.50),
            p90_us: pct(0.90),
            p99_us: pct(0.99),
            max_us: if h.is_empty() { 0 } else { h.max() },
        }
    }

    /// 2xx responses.
    pub fn successes(&self) -> u64 {
        self.statuses
            .iter()
            .filter(|(s, _)| (200..300).contains(*s))
            .map(|(_, n)| n)
            .sum()
    }

    /// Requests completed per second of the measured window.
    pub fn requests_per_sec(&self) -> f64 {
        let secs = self.duration.as_secs_f64();
        if secs > 0.0 {
            self.requests as f64 / secs
        } else {
            0.0
        }
    }

    /// One line, `key=value` separated by spaces; latencies in milliseconds.
    pub fn line(&self) -> String {
        format!(
            "scenario={} connections={} requests={} errors={} req/s={:.1} p50={}ms p90={}ms p99={}ms max={}ms",
            self.scenario,
            self.connections,
            self.requests,
            self.errors,
            self.requests_per_sec(),
            format_ms(self.p50_us),
            format_ms(self.p90_us),
            format_ms(self.p99_us),
            format_ms(self.max_us),
        )
    }

    /// The same figures as a JSON object (latencies in milliseconds, as numbers), plus the
    /// status breakdown.
    pub fn to_json(&self) -> Value {
        let ms = |us: u64| us as f64 / 1000.0;
        let statuses: serde_json::Map<String, Value> = self
            .statuses
            .iter()
            .map(|(s, n)| (s.to_string(), json!(n)))
            .collect();
        json!({
            "scenario": self.scenario,
            "connections": self.connections,
            "duration_s": self.duration.as_secs_f64(),
            "requests": self.requests,
            "errors": self.errors,
            "transport_errors": self.transport_errors,
            "connect_errors": self.connect_errors,
            "req_per_s": (self.requests_per_sec() * 10.0).round() / 10.0,
            "p50_ms": ms(self.p50_us),
            "p90_ms": ms(self.p90_us),
            "p99_ms": ms(self.p99_us),
            "max_ms": ms(self.max_us),
            "statuses": statuses,
        })
    }
}

/// Microseconds as milliseconds with three decimals (`1234` → `1.234`).
pub fn format_ms(us: u64) -> String {
    format!("{}.{:03}", us / 1000, us % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(latencies_us: impl IntoIterator<Item = u64>, status: u16) -> Tally {
        let mut t = Tally::new();
        for us in latencies_us {
            t.record_response(status, Duration::from_micros(us));
        }
        t
    }

    #[test]
    fn formats_milliseconds() {
        assert_eq!(format_ms(0), "0.000");
        assert_eq!(format_ms(7), "0.007");
        assert_eq!(format_ms(1234), "1.234");
        assert_eq!(format_ms(250_000), "250.000");
    }

    #[test]
    fn percentiles_of_a_uniform_spread() {
        // 1..=1000 µs: p50 ≈ 500 µs, p90 ≈ 900 µs, p99 ≈ 990 µs, max 1000 µs.
        let t = tally(1..=1000, 200);
        let s = Summary::new("get-1k", 4, Duration::from_secs(2), &t);
        assert_eq!(s.requests, 1000);
        assert_eq!(s.errors, 0);
        assert_eq!(
            (s.p50_us, s.p90_us, s.p99_us, s.max_us),
            (500, 900, 990, 1000)
        );
        assert_eq!(s.requests_per_sec(), 500.0);
        assert_eq!(
            s.line(),
            "scenario=get-1k connections=4 requests=1000 errors=0 req/s=500.0 \
             p50=0.500ms p90=0.900ms p99=0.990ms max=1.000ms"
        );
    }

    #[test]
    fn errors_count_non_2xx_and_transport_failures() {
        let mut t = tally([100, 100, 100], 201);
        t.merge(&tally([5000], 401));
        t.merge(&tally([200], 204));
        t.record_transport_error();
        t.record_connect_error();
        let s = Summary::new("put-1k", 2, Duration::from_secs(1), &t);
        assert_eq!(s.requests, 6);
        assert_eq!(s.errors, 3);
        assert_eq!(s.successes(), 4);
        // HDR values are exact to 3 significant digits.
        assert!((5000..=5005).contains(&s.max_us), "{}", s.max_us);
        let j = s.to_json();
        assert_eq!(j["requests"], 6);
        assert_eq!(j["errors"], 3);
        assert_eq!(j["transport_errors"], 1);
        assert_eq!(j["connect_errors"], 1);
        assert_eq!(j["statuses"]["201"], 3);
        assert_eq!(j["statuses"]["401"], 1);
        assert_eq!(j["req_per_s"], 6.0);
        assert_eq!(j["scenario"], "put-1k");
    }

    #[test]
    fn empty_run_reports_zeros() {
        let s = Summary::new("static", 1, Duration::from_secs(3), &Tally::new());
        assert_eq!((s.requests, s.p50_us, s.max_us), (0, 0, 0));
        assert!(s.line().contains("req/s=0.0 p50=0.000ms"));
        assert_eq!(
            Summary::new("static", 1, Duration::ZERO, &Tally::new()).requests_per_sec(),
            0.0
        );
    }

    #[test]
    fn huge_latencies_are_clamped_not_lost() {
        let mut t = Tally::new();
        t.record_response(200, Duration::from_secs(10_000));
        let s = Summary::new("put-1m", 1, Duration::from_secs(1), &t);
        assert_eq!(s.requests, 1);
        assert!(s.max_us >= MAX_TRACKED_US);
    }
}
