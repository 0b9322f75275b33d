//! The runtime's per-slot figures as Prometheus series (feature `prometheus`): one
//! collector, read at scrape time from the lock-free stats, used by the homeserver
//! (`hs_guest_*`) and by pkbot (`bot_guest_*`) for the slots each calls.

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};

use crate::PolicyRuntime;

/// Exports the runtime's per-slot stats at scrape time.
pub struct GuestCollector {
    runtime: Arc<PolicyRuntime>,
    names: Names,
    descs: Vec<Desc>,
}

/// The series' names under a process's prefix.
struct Names {
    calls: String,
    failures: String,
    duration: String,
    reloads: String,
    memory: String,
}

const CALLS_HELP: &str = "Calls into a Wasm guest, by slot.";
const FAILURES_HELP: &str =
    "Guest calls that failed and gave the slot's safe default, by slot and reason.";
const DURATION_HELP: &str = "Guest call latency, by slot.";
const RELOADS_HELP: &str = "Loads of a new guest module or data, by slot and result.";
const MEMORY_HELP: &str =
    "The most linear memory an instance of the slot's guest was given, in bytes.";

impl GuestCollector {
    /// The series of `runtime`'s slots, named `{prefix}_guest_*` (`hs` for the
    /// homeserver, `bot` for pkbot).
    pub fn new(runtime: Arc<PolicyRuntime>, prefix: &str) -> Result<Self, prometheus::Error> {
        let names = Names {
            calls: format!("{prefix}_guest_calls_total"),
            failures: format!("{prefix}_guest_call_failures_total"),
            duration: format!("{prefix}_guest_call_duration_seconds"),
            reloads: format!("{prefix}_guest_reloads_total"),
            memory: format!("{prefix}_guest_memory_high_water_bytes"),
        };
        let descs = vec![
            Desc::new(
                names.calls.clone(),
                CALLS_HELP.into(),
                vec!["slot".into()],
                Default::default(),
            )?,
            Desc::new(
                names.failures.clone(),
                FAILURES_HELP.into(),
                vec!["slot".into(), "reason".into()],
                Default::default(),
            )?,
            Desc::new(
                names.duration.clone(),
                DURATION_HELP.into(),
                vec!["slot".into()],
                Default::default(),
            )?,
            Desc::new(
                names.reloads.clone(),
                RELOADS_HELP.into(),
                vec!["slot".into(), "result".into()],
                Default::default(),
            )?,
            Desc::new(
                names.memory.clone(),
                MEMORY_HELP.into(),
                vec!["slot".into()],
                Default::default(),
            )?,
        ];
        Ok(Self {
            runtime,
            names,
            descs,
        })
    }
}

fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
    pairs
        .iter()
        .map(|(k, v)| {
            let mut l = LabelPair::default();
            l.set_name((*k).into());
            l.set_value((*v).into());
            l
        })
        .collect()
}

fn counter_metric(pairs: &[(&str, &str)], value: u64) -> Metric {
    let mut c = Counter::default();
    c.set_value(value as f64);
    let mut m = Metric::default();
    m.set_label(labels(pairs));
    m.set_counter(c);
    m
}

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.into());
    f.set_help(help.into());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

impl Collector for GuestCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let stats = self.runtime.stats();
        let mut calls = Vec::new();
        let mut failures = Vec::new();
        let mut durations = Vec::new();
        let mut reloads = Vec::new();
        let mut memory = Vec::new();
        for s in &stats {
            let slot = s.slot.name();
            calls.push(counter_metric(&[("slot", slot)], s.calls));
            for (reason, n) in s.failures.by_reason() {
                failures.push(counter_metric(&[("slot", slot), ("reason", reason)], n));
            }
            reloads.push(counter_metric(
                &[("slot", slot), ("result", "ok")],
                s.reloads.saturating_sub(s.reload_failures),
            ));
            reloads.push(counter_metric(
                &[("slot", slot), ("result", "failed")],
                s.reload_failures,
            ));
            let mut high_water = Gauge::default();
            high_water.set_value(s.memory_high_water_bytes as f64);
            let mut m = Metric::default();
            m.set_label(labels(&[("slot", slot)]));
            m.set_gauge(high_water);
            memory.push(m);
            let mut h = Histogram::default();
            h.set_sample_count(s.latency.count);
            h.set_sample_sum(s.latency.sum_seconds);
            h.set_bucket(
                s.latency
                    .cumulative()
                    .into_iter()
                    .map(|(bound, count)| {
                        let mut b = Bucket::default();
                        b.set_upper_bound(bound);
                        b.set_cumulative_count(count);
                        b
                    })
                    .collect(),
            );
            let mut m = Metric::default();
            m.set_label(labels(&[("slot", slot)]));
            m.set_histogram(h);
            durations.push(m);
        }
        vec![
            family(&self.names.calls, CALLS_HELP, MetricType::COUNTER, calls),
            family(
                &self.names.failures,
                FAILURES_HELP,
                MetricType::COUNTER,
                failures,
            ),
            family(
                &self.names.duration,
                DURATION_HELP,
                MetricType::HISTOGRAM,
                durations,
            ),
            family(
                &self.names.reloads,
                RELOADS_HELP,
                MetricType::COUNTER,
                reloads,
            ),
            family(&self.names.memory, MEMORY_HELP, MetricType::GAUGE, memory),
        ]
    }
}
